"""GET /metrics: kvscope's own metrics in the Prometheus text format.

The planner gauges of the latest stored plan of every (cluster, group), named once in
core.kvscope_metrics; the closed loop's realised coverage appears for a cluster once its
``/accuracy`` has been computed (scoring re-plans history: too heavy for every scrape); then
the API's own requests, latencies and build (api/request_metrics.py).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from api.deps import State, StoreDep, require_read
from api.error_responses import responses
from api.plan_metrics import render_plan_metrics

router = APIRouter(tags=["metrics"], dependencies=[Depends(require_read)])


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition (version 0.0.4)",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **responses(400, 401, 503),
    },
)
def metrics(store: StoreDep, state: State) -> Response:
    """kvscope_plan_* gauges and the API's own request metrics and build (README:
    kvscope's own metrics)."""
    body = render_plan_metrics(store, coverage=dict(state.coverage)) + state.telemetry.render()
    return Response(body, media_type=CONTENT_TYPE_LATEST)
