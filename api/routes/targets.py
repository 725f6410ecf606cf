"""GET/POST /v1/targets and DELETE /v1/targets/{name}: the collector's scrape targets.

Targets live in the store's targets table, which the collector reads. Registration refuses
unsafe URLs (collector.urlguard: only http/https; link-local and metadata addresses always;
loopback and private ranges unless in ``allowed_target_networks``); writes need the token.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import Response

from api.deps import State, StoreDep, require_read, require_write
from api.error_responses import ApiError, responses
from api.respond import json_ok
from api.schemas import TargetIn, TargetOut, TargetsOut
from collector.urlguard import check_target_url
from core.errors import ConfigError

router = APIRouter(prefix="/v1", tags=["targets"])
_WRITE_ERRORS = responses(400, 401, 403, 404, 422, 503)


def _out(name: str, url: str, kind: str, cluster: str) -> dict[str, str]:
    return {"name": name, "url": url, "kind": kind, "cluster": cluster}


@router.get(
    "/targets",
    response_model=TargetsOut,
    responses=responses(400, 401, 422, 503),
    dependencies=[Depends(require_read)],
)
def list_targets(
    store: StoreDep,
    cluster: Annotated[str | None, Query(min_length=1, max_length=200, examples=["prod-a"])] = None,
) -> Response:
    """Registered scrape targets (of one cluster, or all), by cluster and name."""
    found = store.targets(cluster)
    return json_ok({"targets": [_out(t.name, t.url, t.kind, t.cluster) for t in found]})


@router.post(
    "/targets",
    response_model=TargetOut,
    status_code=201,
    responses={
        200: {"model": TargetOut, "description": "an existing target updated"},
        **_WRITE_ERRORS,
    },
    dependencies=[Depends(require_write)],
)
def add_target(body: TargetIn, store: StoreDep, state: State) -> Response:
    """Register (201) or update (200) a scrape target; its URL must pass the SSRF checks."""
    try:
        check_target_url(body.url, allow=state.settings.allowed_target_networks)
    except ConfigError as exc:
        raise ApiError(422, f"url: {exc}", "url") from exc
    existed = any(t.name == body.name for t in store.targets())
    try:
        store.upsert_target(body.name, body.url, body.kind, body.cluster)
    except ConfigError as exc:
        raise ApiError(422, str(exc), "name") from exc
    return json_ok(_out(body.name, body.url, body.kind, body.cluster), 200 if existed else 201)


@router.delete(
    "/targets/{name}",
    status_code=204,
    response_class=Response,
    responses=_WRITE_ERRORS,
    dependencies=[Depends(require_write)],
)
def delete_target(
    name: Annotated[str, Path(min_length=1, max_length=200, examples=["engine-0"])],
    store: StoreDep,
) -> Response:
    """Unregister a scrape target (its windows stay in the store)."""
    if not store.delete_target(name):
        raise ApiError(404, f"unknown target {name!r} (GET /v1/targets lists them)", "name")
    return Response(status_code=204)
