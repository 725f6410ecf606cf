"""GET /healthz (the process answers) and GET /readyz (the store is reachable and current)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from api.deps import State
from api.error_responses import ApiError, responses
from api.respond import json_ok
from api.schemas import Health, Ready
from core.errors import StoreError
from store.tables import SCHEMA_VERSION

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, responses=responses(400))
def healthz() -> Response:
    """The process is up (it does not touch the store)."""
    return json_ok({"status": "ok"})


@router.get("/readyz", response_model=Ready, responses=responses(400, 503))
def readyz(state: State) -> Response:
    """The store is reachable and its schema is the one this kvscope writes; else 503 with
    the reason."""
    try:
        version = state.store().schema_version()
    except StoreError as exc:
        raise ApiError(503, f"store unavailable: {exc}") from exc
    if version != SCHEMA_VERSION:
        found = "no kvscope schema" if version is None else f"schema version {version}"
        hint = "upgrade kvscope" if (version or 0) > SCHEMA_VERSION else "run `kvscope db migrate`"
        raise ApiError(
            503, f"store not ready: {found}, this kvscope needs {SCHEMA_VERSION}: {hint}"
        )
    return json_ok({"status": "ready", "schema_version": version})
