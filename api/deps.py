"""What routes depend on: the app's state (settings, store, pool, cache), auth, clusters.

The store is opened on first use, not at start-up: the API starts (and /readyz answers 503
with the reason) while the database is down, and recovers when it comes back.

Auth: writes need ``Authorization: Bearer <token>``, compared with ``hmac.compare_digest``
(constant time); no token configured means writes are disabled (403), never open. Reads are
open unless ``reads_require_token``. The token is never logged or echoed.
"""

from __future__ import annotations

import asyncio
import hmac
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Path, Request

from api.cache import TTLCache
from api.error_responses import ApiError
from api.pool import Busy, HeavyPool
from api.request_metrics import ApiTelemetry
from api.respond import dumps
from api.settings import ApiSettings
from core.durations import parse_duration
from core.errors import StoreError
from store.store import Store

_BEARER = "bearer"
DOCUMENTS_KEPT = 64  # encoded plan documents kept (a few per cluster and group)
T = TypeVar("T")


@dataclass(eq=False)
class AppState:
    """Everything a request needs beyond its inputs; one per app (create_app)."""

    settings: ApiSettings
    pool: HeavyPool
    cache: TTLCache[Any]
    telemetry: ApiTelemetry  # the API's own request metrics (GET /metrics)
    coverage: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    # encoded plan documents by (plan id, created_at): a stored plan is written once and
    # read on every GET …/plan, so its JSON is parsed and encoded once (a re-save of the
    # same window range changes created_at, hence the key)
    documents: OrderedDict[tuple[int, float], bytes] = field(default_factory=OrderedDict)
    _store: Store | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def store(self) -> Store:
        """The store, opened on first use (StoreError: the database cannot be reached)."""
        with self._lock:
            if self._store is None:
                self._store = Store(self.settings.db)
            return self._store

    def plan_document(self, plan_id: int, created_at: float) -> bytes | None:
        """The stored plan's document as JSON bytes (None: it was deleted meanwhile)."""
        key = (plan_id, created_at)
        with self._lock:
            cached = self.documents.get(key)
            if cached is not None:
                self.documents.move_to_end(key)
                return cached
        doc = self.store().plan_document(plan_id)
        if doc is None:
            return None
        encoded = dumps(doc)
        with self._lock:
            self.documents[key] = encoded
            while len(self.documents) > DOCUMENTS_KEPT:
                self.documents.popitem(last=False)
        return encoded

    def remember_coverage(
        self, cluster: str, coverage: dict[tuple[str, str], tuple[float, float]]
    ) -> None:
        """The closed loop's latest coverage of ``cluster`` (served on /metrics)."""
        with self._lock:
            self.coverage = {k: v for k, v in self.coverage.items() if k[0] != cluster}
            self.coverage.update(coverage)

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None
        self.pool.shutdown()


def busy(exc: Busy, what: str) -> ApiError:
    """The 429 of a full pool, with Retry-After."""
    return ApiError(
        429,
        f"busy: the heavy-work pool is full ({what}); retry after {exc.retry_after_s} s",
        None,
        {"Retry-After": str(exc.retry_after_s)},
    )


async def await_shared(future: Future[T]) -> T:
    """Await a pool future; a client going away does not cancel work others may share."""
    return await asyncio.shield(asyncio.wrap_future(future))


async def cached_heavy(state: AppState, key: str, fn: Callable[[], Any], what: str) -> Any:
    """``fn()`` on the pool unless ``key``'s answer is cached or in flight (api/cache.py)."""
    try:
        future, _hit = state.cache.get_or_submit(key, lambda: state.pool.submit(fn))
    except Busy as exc:
        raise busy(exc, what) from exc
    return await await_shared(future)


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.kvscope
    return state


State = Annotated[AppState, Depends(app_state)]


def get_store(state: State) -> Store:
    try:
        return state.store()
    except StoreError as exc:
        raise ApiError(503, f"store unavailable: {exc}") from exc


StoreDep = Annotated[Store, Depends(get_store)]


def _check_token(request: Request, token: str | None) -> None:
    """401 unless the request carries ``Authorization: Bearer <token>``."""
    challenge = {"WWW-Authenticate": 'Bearer realm="kvscope"'}
    header = request.headers.get("authorization")
    if not header:
        raise ApiError(401, "missing Authorization: Bearer <token>", "Authorization", challenge)
    scheme, _, given = header.partition(" ")
    if scheme.lower() != _BEARER or not given.strip():
        raise ApiError(401, "Authorization must be 'Bearer <token>'", "Authorization", challenge)
    expected = (token or "").encode()
    if token is None or not hmac.compare_digest(given.strip().encode(), expected):
        challenge["WWW-Authenticate"] += ', error="invalid_token"'
        raise ApiError(401, "wrong bearer token", "Authorization", challenge)


def require_write(request: Request, state: State) -> None:
    """Writes: 403 when no token is configured, else the bearer token (module docstring)."""
    token = state.settings.token
    if token is None:
        raise ApiError(
            403, "writes disabled: no API token configured (KVSCOPE_API_TOKEN or --token-file)"
        )
    _check_token(request, token)


def require_read(request: Request, state: State) -> None:
    """Reads: open, or the bearer token when ``reads_require_token``."""
    if state.settings.reads_require_token:
        _check_token(request, state.settings.token)


ClusterPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=200,
        description="cluster name (GET /v1/clusters lists them)",
        examples=["prod-a"],
    ),
]


def known_cluster(cluster: ClusterPath, store: StoreDep) -> str:
    """The path's cluster, 404 when the store does not know it."""
    if cluster not in store.clusters():
        raise ApiError(404, f"unknown cluster {cluster!r} (GET /v1/clusters lists them)", "cluster")
    return cluster


Cluster = Annotated[str, Depends(known_cluster)]


def duration_s(text: str, what: str = "since") -> float:
    """Seconds of a duration the schema's pattern accepted (core.durations.API_PATTERN)."""
    return parse_duration(text, what)
