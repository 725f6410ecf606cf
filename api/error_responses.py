"""Every error the API answers is JSON ``{"error": …, "field": …}`` with the right status.

400 a credential in the query string; 401 a missing or wrong bearer token; 403 writes
disabled; 404 unknown cluster, plan, target or path; 405 a method the path lacks; 422 a bad
field (validation errors reshaped, a domain ConfigError); 413 / 414 a body over 1 MiB / a
query over 8 KiB (api/app.py); 429 the heavy-work pool is full (Retry-After); 503 the store
is down or its schema not current, or a feature this build lacks. Anything unexpected is
logged with its traceback and answered 500 with no detail.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from api.schemas import ErrorBody
from core.errors import ConfigError, KvscopeError, StoreError

log = logging.getLogger("kvscope.api")

DESCRIPTIONS: dict[int, str] = {
    400: "a credential in the query string (send it as Authorization: Bearer)",
    401: "missing or wrong bearer token",
    403: "writes disabled: no API token is configured",
    404: "unknown cluster, plan or target",
    422: "a bad field (named in `field`)",
    429: "the heavy-work pool is full: retry after Retry-After seconds",
    503: "the store is down or its schema is not current, or a feature this build lacks",
}
_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    429: {
        "Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}},
    },
}


class ApiError(Exception):
    """An error answered as ErrorBody with ``status`` (and extra ``headers``)."""

    def __init__(
        self,
        status: int,
        error: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.field = field
        self.headers = headers or {}


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` entry declaring these error statuses."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        entry: dict[str, Any] = {"model": ErrorBody, "description": DESCRIPTIONS[code]}
        if code in _HEADERS:
            entry["headers"] = _HEADERS[code]
        out[code] = entry
    return out


def error_response(
    status: int, error: str, field: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": error, "field": field}, status_code=status, headers=headers)


def _field(loc: tuple[int | str, ...]) -> str:
    """``("body", "tiers", 0)`` -> ``tiers.0``; the location alone when nothing follows it."""
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def _validation(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if not errors:
        return error_response(422, "invalid request", None)
    first = errors[0]
    field = _field(tuple(first.get("loc", ())))
    message = str(first.get("msg", "invalid value"))
    if first.get("type") == "json_invalid":
        field, message = "body", "the body is not valid JSON"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return error_response(422, f"{field}: {message}{more}", field)


def _api_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.error, exc.field, exc.headers)


def _allowed(request: Request) -> str:
    """Every method of every route of the request's path (Starlette's 405 names only the
    first route's, and GET and POST of one path are two routes)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = _allowed(request)
    return error_response(exc.status_code, str(exc.detail), None, headers)


def _store(_request: Request, exc: Exception) -> JSONResponse:
    log.warning("store unavailable: %s", exc)
    return error_response(503, f"store unavailable: {exc}", None)


def _config(_request: Request, exc: Exception) -> JSONResponse:
    return error_response(422, str(exc), None)


def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal error (logged on the server)", None)


def install(app: FastAPI) -> None:
    """Answer every error as ErrorBody (module docstring)."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(StoreError, _store)
    app.add_exception_handler(ConfigError, _config)
    app.add_exception_handler(KvscopeError, _config)
    app.add_exception_handler(Exception, _unexpected)
