"""The collector's own health metrics and their HTTP endpoint
(``kvscope collect --metrics-addr HOST:PORT``).

:class:`CollectorHealth` holds a registry of the metrics core.kvscope_metrics names, fed
per scrape and per tick; :func:`serve_metrics` serves it from a daemon thread, with
``GET /healthz`` answering 503 once the loop has neither scraped nor ticked for
``stale_after_s``. Design: collector/DESIGN.md#self_metrics
"""

from __future__ import annotations

import contextlib
import math
import socket
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import make_wsgi_app

from core.errors import ConfigError
from core.kvscope_metrics import (
    BUILD_INFO,
    COLLECTOR_ANOMALIES,
    COLLECTOR_INFO,
    COLLECTOR_LAST_SUCCESSFUL_TICK,
    COLLECTOR_SCRAPE_DURATION,
    COLLECTOR_SCRAPES,
    COLLECTOR_SKIPPED_TICKS,
    COLLECTOR_SPOOL_DROPPED,
    COLLECTOR_SPOOL_REPLAYED,
    COLLECTOR_SPOOLED_WINDOWS,
    COLLECTOR_STORE_ERRORS,
    COLLECTOR_TARGET_UP,
    COLLECTOR_TARGETS,
    COLLECTOR_TICK_LAG,
    COLLECTOR_TICKS,
    COLLECTOR_WINDOWS_WRITTEN,
    SCRAPE_DURATION_BUCKETS,
)
from core.records import Anomaly

if TYPE_CHECKING:
    from collections.abc import Iterator

HealthCheck = Callable[[], tuple[bool, str]]  # (alive, one line saying why)

__all__ = [
    "CollectorHealth",
    "LoopStats",
    "MetricsServer",
    "SpoolTotals",
    "parse_listen_addr",
    "serve_metrics",
]


class LoopStats(Protocol):
    """The collect loop's running totals (collector.run.CollectStats satisfies it)."""

    @property
    def ticks(self) -> int: ...
    @property
    def skipped_ticks(self) -> int: ...
    @property
    def windows_written(self) -> int: ...
    @property
    def store_errors(self) -> int: ...
    @property
    def loop_errors(self) -> int: ...
    @property
    def last_lag_s(self) -> float: ...


class SpoolTotals(Protocol):
    """The spool's running totals (collector.spool.SpoolCounts satisfies it)."""

    @property
    def pending_windows(self) -> int: ...
    @property
    def replayed_windows(self) -> int: ...
    @property
    def dropped_windows(self) -> int: ...


class CollectorHealth:
    """The collector's own metrics in a registry of their own (not prometheus_client's global
    one). The loop calls :meth:`scraped` per scrape and :meth:`ticked` after every tick."""

    def __init__(
        self,
        *,
        version: str,
        cluster: str,
        mode: str,
        targets: Iterable[str] = (),
        shard: str = "0/1",
        stale_after_s: float | None = None,
    ) -> None:
        self.stale_after_s = stale_after_s
        self._started = time.monotonic()
        self._last_beat: float | None = None  # monotonic: the last scrape or tick, any outcome
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._scrapes = Counter(
            COLLECTOR_SCRAPES.name, COLLECTOR_SCRAPES.help, COLLECTOR_SCRAPES.labels, registry=r
        )
        self._anomalies = Counter(
            COLLECTOR_ANOMALIES.name, COLLECTOR_ANOMALIES.help, COLLECTOR_ANOMALIES.labels,
            registry=r,
        )  # fmt: skip
        self._duration = Histogram(
            COLLECTOR_SCRAPE_DURATION.name,
            COLLECTOR_SCRAPE_DURATION.help,
            COLLECTOR_SCRAPE_DURATION.labels,
            registry=r,
            buckets=SCRAPE_DURATION_BUCKETS,
        )
        self._up = Gauge(
            COLLECTOR_TARGET_UP.name, COLLECTOR_TARGET_UP.help, COLLECTOR_TARGET_UP.labels,
            registry=r,
        )  # fmt: skip
        self._targets = Gauge(COLLECTOR_TARGETS.name, COLLECTOR_TARGETS.help, registry=r)
        self._windows = Counter(
            COLLECTOR_WINDOWS_WRITTEN.name, COLLECTOR_WINDOWS_WRITTEN.help, registry=r
        )
        self._store_errors = Counter(
            COLLECTOR_STORE_ERRORS.name, COLLECTOR_STORE_ERRORS.help, registry=r
        )
        self._ticks = Counter(COLLECTOR_TICKS.name, COLLECTOR_TICKS.help, registry=r)
        self._skipped = Counter(
            COLLECTOR_SKIPPED_TICKS.name, COLLECTOR_SKIPPED_TICKS.help, registry=r
        )
        self._lag = Gauge(COLLECTOR_TICK_LAG.name, COLLECTOR_TICK_LAG.help, registry=r)
        self._spooled = Gauge(
            COLLECTOR_SPOOLED_WINDOWS.name, COLLECTOR_SPOOLED_WINDOWS.help, registry=r
        )
        self._replayed = Counter(
            COLLECTOR_SPOOL_REPLAYED.name, COLLECTOR_SPOOL_REPLAYED.help, registry=r
        )
        self._dropped = Counter(
            COLLECTOR_SPOOL_DROPPED.name, COLLECTOR_SPOOL_DROPPED.help, registry=r
        )
        self._spool_seen = (0, 0)
        self._last_ok = Gauge(
            COLLECTOR_LAST_SUCCESSFUL_TICK.name, COLLECTOR_LAST_SUCCESSFUL_TICK.help, registry=r
        )
        info = Gauge(COLLECTOR_INFO.name, COLLECTOR_INFO.help, COLLECTOR_INFO.labels, registry=r)
        info.labels(cluster=cluster, mode=mode, shard=shard).set(1)
        build = Gauge(BUILD_INFO.name, BUILD_INFO.help, BUILD_INFO.labels, registry=r)
        build.labels(version=version).set(1)
        self._seen: dict[str, int] = {}
        self._outcomes: dict[str, set[str]] = {}  # target -> outcomes with a series
        self._anomaly_kinds: dict[str, set[str]] = {}  # target -> anomaly kinds with a series
        self._lock = threading.Lock()
        self.set_targets(targets)

    def set_targets(self, targets: Iterable[str]) -> None:
        """The targets scraped from now on (the loop calls it at every tick, as targets
        registered in the store come and go): their count; a new one gets a zero ``up``
        scrape count and an empty duration histogram, so rates exist before its first scrape
        ends; a gone one's series are removed."""
        names = set(targets)
        self._targets.set(len(names))
        with self._lock:
            new, gone = names - self._outcomes.keys(), self._outcomes.keys() - names
            for name in gone:
                for outcome in self._outcomes.pop(name):
                    self._scrapes.remove(name, outcome)
                for kind in self._anomaly_kinds.pop(name, ()):
                    self._anomalies.remove(name, kind)
            for name in new:
                self._outcomes[name] = {"up"}
        for name in sorted(gone):
            self._duration.remove(name)
            self._up.remove(name)
        for name in sorted(new):
            self._scrapes.labels(target=name, outcome="up")
            self._duration.labels(target=name)

    def scraped(self, target: str, outcome: str, duration_s: float) -> None:
        """One scrape of ``target``: ``outcome`` is "up" or its error kind."""
        with self._lock:
            self._outcomes.setdefault(target, set()).add(outcome)
        self._last_beat = time.monotonic()
        self._scrapes.labels(target=target, outcome=outcome).inc()
        if math.isfinite(duration_s) and duration_s >= 0:
            self._duration.labels(target=target).observe(duration_s)
        self._up.labels(target=target).set(1 if outcome == "up" else 0)

    def anomalies(self, target: str, anomalies: Iterable[Anomaly]) -> None:
        """The value anomalies collector.parse found in one scrape of ``target`` that was up
        (NaN counters, duplicate series, …), counted by kind. A kind gets its series at its
        first anomaly (not one per kind and target in advance: they are meant to stay rare)."""
        counts = Tally(a.kind for a in anomalies)
        if not counts:
            return
        with self._lock:
            self._anomaly_kinds.setdefault(target, set()).update(counts)
        for kind, n in sorted(counts.items()):
            self._anomalies.labels(target=target, kind=kind).inc(n)

    def ticked(self, stats: LoopStats, *, at: float | None = None) -> None:
        """After a tick: move the counters to the loop's totals, set the lag, and stamp the
        tick successful (at ``at``, default now) when it raised no internal or store error."""
        totals = {
            "ticks": stats.ticks,
            "skipped": stats.skipped_ticks,
            "windows": stats.windows_written,
            "store_errors": stats.store_errors,
            "loop_errors": stats.loop_errors,
        }
        with self._lock:
            delta = {k: max(0, v - self._seen.get(k, 0)) for k, v in totals.items()}
            self._seen = totals
        self._ticks.inc(delta["ticks"])
        self._skipped.inc(delta["skipped"])
        self._windows.inc(delta["windows"])
        self._store_errors.inc(delta["store_errors"])
        self._lag.set(max(0.0, stats.last_lag_s))
        if delta["ticks"]:
            self._last_beat = time.monotonic()
        if delta["ticks"] and not delta["store_errors"] and not delta["loop_errors"]:
            self._last_ok.set(time.time() if at is None else at)

    def alive(self, now: float | None = None) -> tuple[bool, str]:
        """Whether the loop scraped or ticked (or started) within ``stale_after_s`` (monotonic
        ``now``); without a bound it is alive while the process serves."""
        now = time.monotonic() if now is None else now
        if self._last_beat is None:
            since, what = now - self._started, "nothing scraped yet, started"
        else:
            since, what = now - self._last_beat, "last scrape or tick"
        if self.stale_after_s is not None and since > self.stale_after_s:
            return False, f"stale: {what} {since:.0f} s ago (limit {self.stale_after_s:.0f} s)"
        return True, f"ok: {what} {since:.0f} s ago"

    def spooled(self, spool: SpoolTotals) -> None:
        """After a tick: the spool's windows waiting, and its replayed and dropped totals
        (collector.spool.SpoolCounts)."""
        with self._lock:
            replayed, dropped = self._spool_seen
            self._spool_seen = (spool.replayed_windows, spool.dropped_windows)
        self._spooled.set(spool.pending_windows)
        self._replayed.inc(max(0, spool.replayed_windows - replayed))
        self._dropped.inc(max(0, spool.dropped_windows - dropped))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def parse_listen_addr(text: str, what: str = "metrics address") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) as (host, port); port 0 picks a free one."""
    host, sep, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{what}: {text!r} is not HOST:PORT (e.g. 127.0.0.1:9464)")
    return host, int(port)


class MetricsServer:
    """A registry served over HTTP (prometheus_client's WSGI server, daemon thread); a context
    manager: leaving it stops the server and releases the port."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        address = server.server_address
        self.host, self.port = str(address[0]), int(address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self._server.server_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log (prometheus_client's server keeps none either)."""


def _app(registry: CollectorRegistry, check: HealthCheck | None) -> Callable[..., Any]:
    """``GET /healthz`` answered by ``check``; every other path: the registry's exposition."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
        if check is not None and environ.get("PATH_INFO") == "/healthz":
            ok, text = check()
            status = "200 OK" if ok else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return iter([text.encode() + b"\n"])
        return iter(metrics(environ, start_response))

    return app


def serve_metrics(
    addr: str,
    registry: CollectorRegistry,
    *,
    what: str = "metrics address",
    check: HealthCheck | None = None,
) -> MetricsServer:
    """Serve ``registry`` on ``addr`` (HOST:PORT), and ``/healthz`` from ``check`` when given,
    until the returned server is closed (threads per request, as prometheus_client's)."""
    host, port = parse_listen_addr(addr, what)
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server_cls = type("_Server", (ThreadingMixIn, WSGIServer),
                          {"daemon_threads": True, "address_family": family})  # fmt: skip
        server: WSGIServer = make_server(
            host, port, _app(registry, check), server_cls, handler_class=_Quiet
        )
    except OSError as exc:
        raise ConfigError(f"{what} {addr}: cannot listen: {exc.strerror or exc}") from exc
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return MetricsServer(server, thread)
