"""The advisory API: ``create_app(settings) -> FastAPI``, thin over the store and the planner.

Paths (a contract; dashboards, alert rules and compose rely on them): /healthz, /readyz,
/v1/clusters[/{cluster}/engines|signals|plan|plans|forecast|accuracy|report], POST
/v1/advise, POST /v1/costmodel/compare-tiers|savings, GET/POST /v1/targets, DELETE
/v1/targets/{name}, /metrics. Errors: api/error_responses.py; auth: api/deps.py; heavy work:
api/pool.py and api/cache.py.

Nothing here reads the environment or opens the store at import or at creation: settings
come from api.settings.load_settings (or the caller), the store opens on first use.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import error_responses
from api.cache import TTLCache
from api.deps import AppState
from api.pool import HeavyPool
from api.request_metrics import REFUSED, UNMATCHED, ApiTelemetry
from api.respond import dumps
from api.routes import advise, clusters, costmodel, health, metrics, plans, report, signals
from api.routes import targets as targets_routes
from api.settings import ApiSettings, load_settings, resolve
from core.kvscope_metrics import kvscope_version

access_log = logging.getLogger("kvscope.api.access")

# Query parameters that carry a credential: refused (400) on every path, never read. A
# token in a URL ends up in proxy logs, browser history and Referer headers.
CREDENTIAL_PARAMS = frozenset(
    {"token", "access_token", "api_token", "api_key", "apikey", "bearer", "auth",
     "authorization", "password", "secret"}
)  # fmt: skip
WRITES = {("post", "/v1/targets"), ("delete", "/v1/targets/{name}")}
OPEN_PATHS = ("/healthz", "/readyz")
SECURITY_SCHEME = {"bearer": {"type": "http", "scheme": "bearer"}}


# Request size limits, checked before any route runs. The largest legitimate body (an advise
# what-if, a target registration) is a few KB; nginx's default client_max_body_size is 1 MB
# and its default large_client_header_buffers 8 KB, which these follow.
MAX_BODY_BYTES = 1024 * 1024
MAX_QUERY_BYTES = 8 * 1024


class EdgeMiddleware:
    """Refuses credentials in the query string, query strings over MAX_QUERY_BYTES (414) and
    bodies over MAX_BODY_BYTES (413: by Content-Length before reading, else while reading a
    chunked body); logs each request as method, path (no query string, no headers: nothing
    that could hold a token), status and milliseconds."""

    def __init__(self, app: ASGIApp, telemetry: ApiTelemetry | None = None) -> None:
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        try:
            status = await self._answer(scope, receive, send)
        finally:
            seconds = time.perf_counter() - start
            if self.telemetry is not None:
                self.telemetry.observe(_route_of(scope), scope["method"], status, seconds)
            if access_log.isEnabledFor(logging.INFO):
                access_log.info("%s %s %d %.1fms", scope["method"], scope["path"], status,
                                seconds * 1000)  # fmt: skip

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> int:
        """Serve the request (or refuse it); return the status sent (500 if none was)."""
        query = scope.get("query_string", b"")
        if len(query) > MAX_QUERY_BYTES:
            return await _refuse(send, 414, f"query string over {MAX_QUERY_BYTES} bytes", None)
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            return await _refuse(send, 413, f"request body over {MAX_BODY_BYTES} bytes", None)
        raw = query.decode("latin-1")
        names = {k.lower() for k, _ in parse_qsl(raw, keep_blank_values=True)}
        refused = sorted(names & CREDENTIAL_PARAMS)
        if refused:
            body = dumps(
                {
                    "error": "credentials are not accepted in the query string: send "
                    "Authorization: Bearer <token>",
                    "field": refused[0],
                }
            )
            headers = [(b"content-type", b"application/json"),
                       (b"content-length", str(len(body)).encode())]  # fmt: skip
            await send({"type": "http.response.start", "status": 400, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return 400
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        if scope["method"] in ("POST", "PUT", "PATCH") and not length.isdigit():
            # A chunked body has no length to check first: read it here, up to the limit
            # (bounded memory), then hand the route the same messages.
            messages: list[Message] = []
            received, more = 0, True
            while more:
                message = await receive()
                messages.append(message)
                if message["type"] != "http.request":
                    break
                received += len(message.get("body", b""))
                if received > MAX_BODY_BYTES:
                    return await _refuse(
                        send, 413, f"request body over {MAX_BODY_BYTES} bytes", None
                    )
                more = bool(message.get("more_body", False))
            replay = iter(messages)

            async def receive_buffered() -> Message:
                return next(replay, None) or await receive()

            receive = receive_buffered
        scope["kvscope_routed"] = True  # past the edge's checks: the router decides
        await self.app(scope, receive, send_status)
        return status


def _route_of(scope: Scope) -> str:
    """The template of the route that answered (FastAPI puts it in the scope), else
    api.request_metrics's UNMATCHED or, when no route was tried, REFUSED."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    return UNMATCHED if scope.get("kvscope_routed") else REFUSED


async def _refuse(send: Send, status: int, error: str, field: str | None) -> int:
    """Answer ``status`` with the API's error body before any route ran."""
    body = dumps({"error": error, "field": field})
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), (b"connection", b"close")]  # fmt: skip
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    return status


def _openapi(app: FastAPI, settings: ApiSettings) -> dict[str, Any]:
    """FastAPI's document plus the bearer scheme on writes (and reads when they need it)."""
    if app.openapi_schema is not None:
        return app.openapi_schema

    doc = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    doc.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEME
    error_content = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    for path, ops in doc.get("paths", {}).items():
        for method, op in ops.items():
            for code, response in op.get("responses", {}).items():
                if code.startswith(("4", "5")):  # JSON even where the 200 is HTML or text
                    response["content"] = error_content
            guarded = (method, path) in WRITES or (
                settings.reads_require_token and path not in OPEN_PATHS
            )
            if guarded:
                op["security"] = [{"bearer": []}]
    app.openapi_schema = doc
    return doc


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    """The API of ``settings`` (default: :func:`api.settings.load_settings`, read now)."""
    settings = resolve(settings if settings is not None else load_settings())
    state = AppState(
        settings=settings,
        pool=HeavyPool(
            settings.advise_workers, settings.advise_queue, retry_floor_s=settings.retry_after_s
        ),
        cache=TTLCache(settings.cache_ttl_s, settings.cache_entries),
        telemetry=ApiTelemetry(kvscope_version()),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        state.close()

    app = FastAPI(
        title="kvscope",
        version=kvscope_version(),
        description="Observability and capacity planning for vLLM + LMCache clusters: "
        "what is happening, whether KV offload pays and which kind, when KV runs out. Every "
        'error is `{"error": …, "field": …}`.',
        lifespan=lifespan,
    )
    app.state.kvscope = state
    error_responses.install(app)
    for module in (health, clusters, signals, plans, report, advise, costmodel, metrics):
        app.include_router(module.router)
    app.include_router(targets_routes.router)
    app.add_middleware(EdgeMiddleware, telemetry=state.telemetry)
    app.openapi = lambda: _openapi(app, settings)  # type: ignore[method-assign]
    return app
