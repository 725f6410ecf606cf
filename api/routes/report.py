"""GET /v1/clusters/{cluster}/report: the HTML report of `kvscope report`, on the pool."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import HTMLResponse, Response

from api.deps import Cluster, State, StoreDep, cached_heavy, require_read
from api.error_responses import ApiError, responses
from core.errors import ConfigError

router = APIRouter(prefix="/v1", tags=["report"], dependencies=[Depends(require_read)])


@router.get(
    "/clusters/{cluster}/report",
    response_class=HTMLResponse,
    responses={
        200: {"content": {"text/html": {"schema": {"type": "string"}}}},
        **responses(400, 401, 404, 422, 429, 503),
    },
)
async def report(cluster: Cluster, store: StoreDep, state: State) -> Response:
    """One self-contained HTML page (images inline): the fits, the forecast band against
    HBM capacity, the decision with its sources and the closed-loop table; built from the
    cluster's windows now (its plan is not stored); the same page for cache_ttl_s."""
    from planner.plan import NoData  # noqa: PLC0415 - start-up: planner.plan (numpy, pandas: ~0.3 s) loads on the first request, not on the API's start-up
    from planner.report import render_report  # noqa: PLC0415 - start-up: planner.report (numpy, pandas: ~0.3 s) loads on the first request, not on the API's start-up

    seconds = state.settings.forecast_seconds

    def work() -> str:
        return render_report(store, cluster, forecast_seconds=seconds)

    try:
        html = str(await cached_heavy(state, f"report\x00{cluster}", work, "reports"))
    except NoData as exc:
        raise ApiError(404, str(exc), "cluster") from exc
    except ConfigError as exc:
        raise ApiError(422, str(exc), "cluster") from exc
    return HTMLResponse(html)
