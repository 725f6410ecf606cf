"""collector.run_prometheus under real faults, against Debian's Prometheus 2.42 on 127.0.0.1.

* Prometheus restarted mid-run: the process is stopped (SIGTERM) and a new one started on the
  same port and TSDB directory (tests/services.py restartable_prometheus);
* one query that times out, answers an error status, a truncated body, or a Thanos-style
  partial response (some series left out, a ``warnings`` entry) — injected by a real HTTP
  proxy on 127.0.0.1 in front of Prometheus (:class:`FaultProxy`), not a mock of the client;
* an engine-facts query that fails.

The oracle in every case: after the fault the store holds exactly the windows a fault-free
read of the covered range gives (same keys, same samples and deltas): the failed range was
re-queried by the next poll, never skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http.client
import json
import logging
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from collector.promsource import PrometheusSource, missing_data_warnings
from collector.run import CollectStats, LoopParts
from collector.run_config import PrometheusConfig
from collector.run_prometheus import collect_prometheus
from core.catalog import CACHE_CONFIG_INFO, exposed_names
from core.records import Window
from store.store import Store
from tests import services
from tests.collector.conftest import METRICS, PROM_CONFIG, LiveProm, moving_vllm_body
from tests.collector.exposerver import expo_server

WINDOW_S = 1.0
POLL_S = 0.25
SETTLE_S = 1.5  # > Prometheus' 1 s scrape + ingestion: a window is complete when queried
QUERY_TIMEOUT_S = 0.4
# The PromQL of one signal's range query (it names the exposed counter) and of one facts query.
PREEMPTIONS = "num_preemptions"
Key = tuple[str, str, tuple[tuple[str, str], ...], float]
# The proxy tests read these (a counter, a gauge, a histogram, a derived ratio's two counters):
# every catalogue signal is ~40 range queries a poll, ~1 s here; the restart test reads all.
FEW = (
    "preemptions_total",
    "kv_cache_usage_ratio",
    "ttft_seconds",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
)


class FewSignals(PrometheusSource):
    """The collector's source, reading the FEW signals only (same queries, same HTTP)."""

    def windows(
        self, start: float, end: float, window_s: float, signals: Iterable[str] | None = None
    ) -> list[Window]:
        names = FEW if signals is None else [s for s in signals if s in FEW]
        return super().windows(start, end, window_s, names)


# --------------------------------------------------------------------------- the fault proxy


@dataclasses.dataclass
class Fault:
    """What the proxy does to the next ``times`` requests of ``path`` whose PromQL contains
    ``query`` once armed: ``status`` (answer it, Prometheus not asked), ``delay_s`` (answer
    late), ``truncate`` (cut the body in half, Content-Length of the cut), ``rewrite`` (edit
    the JSON answer)."""

    path: str
    query: str
    times: int = 1
    status: tuple[int, bytes] | None = None
    delay_s: float = 0.0
    truncate: bool = False
    rewrite: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    used: int = 0

    @property
    def spent(self) -> bool:
        return self.used >= self.times


class _ProxyHandler(BaseHTTPRequestHandler):
    server: _ProxyServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # headers and body are two writes: without this, Nagle + the client's delayed ACK
        # hold each answer ~40 ms
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        self._proxy(b"")

    def do_POST(self) -> None:
        self._proxy(self.rfile.read(int(self.headers.get("Content-Length", "0"))))

    def _proxy(self, form: bytes) -> None:
        url = urllib.parse.urlsplit(self.path)
        params = urllib.parse.parse_qs(url.query) | urllib.parse.parse_qs(form.decode())
        fault = self.server.take(url.path, params.get("query", [""])[0])
        if fault is not None and fault.status is not None:
            self._send(*fault.status)
            return
        if fault is not None and fault.delay_s:
            self.server.closing.wait(fault.delay_s)
        status, body = self.server.forward(self.command, self.path, form, self.headers)
        if fault is not None and fault.truncate:
            body = body[: len(body) // 2]
        if fault is not None and fault.rewrite is not None:
            body = json.dumps(fault.rewrite(json.loads(body))).encode()
        with contextlib.suppress(OSError):  # the client gave up on a late answer
            self._send(status, body)

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        parts = urllib.parse.urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str]] = []

    def take(self, path: str, query: str) -> Fault | None:
        with self.lock:
            self.requests.append((path, query))
            for fault in self.faults:
                if not fault.spent and fault.path == path and fault.query in query:
                    fault.used += 1
                    return fault
        return None

    def forward(self, method: str, path: str, body: bytes, headers: Any) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=10)
        try:
            keep = {k: v for k, v in headers.items() if k.lower() in ("content-type", "accept")}
            conn.request(method, path, body=body or None, headers=keep)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that hung up on a delayed answer


class FaultProxy:
    """A real HTTP proxy on 127.0.0.1 in front of a Prometheus; :meth:`arm` a fault."""

    def __init__(self, upstream: str) -> None:
        self._srv = _ProxyServer(upstream)
        host, port = self._srv.server_address[:2]
        self.url = f"http://{host!s}:{port}"
        self._thread = threading.Thread(
            target=self._srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def arm(self, fault: Fault) -> None:
        with self._srv.lock:
            self._srv.faults.append(fault)

    def disarm(self) -> None:
        with self._srv.lock:
            self._srv.faults.clear()

    def close(self) -> None:
        self._srv.closing.set()
        self._srv.shutdown()
        self._srv.server_close()
        self._thread.join(timeout=5)


@pytest.fixture(scope="module")
def proxy(live_prometheus: LiveProm) -> Iterator[FaultProxy]:
    p = FaultProxy(live_prometheus.url)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(f"sqlite:///{tmp_path / 'kvscope.db'}") as s:
        s.migrate()
        yield s


# --------------------------------------------------------------------------- helpers


def _key(w: Window) -> Key:
    return (w.source, w.signal, w.labels, w.start)


def _same_windows(
    store: Store, cluster: str, prom_url: str, signals: Iterable[str] | None = FEW
) -> list[Window]:
    """Assert the store holds exactly what a fault-free read of its covered range gives
    (keys, samples, deltas); return the stored windows."""
    got = store.read_windows(cluster=cluster)
    assert got, "no windows written"
    first, last = min(w.start for w in got), max(w.start for w in got)
    with PrometheusSource(prom_url, timeout_s=10) as clean:
        want = clean.windows(first, last + WINDOW_S, WINDOW_S, signals)
    missing = sorted({_key(w) for w in want} - {_key(w) for w in got})
    extra = sorted({_key(w) for w in got} - {_key(w) for w in want})
    assert not missing and not extra, (missing[:5], extra[:5], len(missing), len(extra))
    by = {_key(w): w for w in want}
    assert [(w.samples, w.delta) for w in got] == [
        (by[_key(w)].samples, by[_key(w)].delta) for w in got
    ]
    return got


def _under_fault(
    store: Store,
    proxy: FaultProxy,
    fault: Fault,
    *,
    cluster: str,
    on_first: Callable[[], None] | None = None,
    deadline_s: float = 20,
) -> CollectStats:
    """Collect through ``proxy``: back-fill the last few seconds (a clean first poll: a first
    poll failing is fatal by design), arm ``fault`` for the polls after (``on_first`` runs
    before), and stop after the first poll that wrote windows once the fault was spent."""
    stop = asyncio.Event()
    spent_at: list[int] = []  # windows_written when the fault was spent
    began = time.monotonic()

    def progress(stats: CollectStats) -> None:
        if stats.ticks == 1:
            if on_first is not None:
                on_first()
            proxy.arm(fault)
        elif fault.spent and not spent_at:
            spent_at.append(stats.windows_written)
        elif spent_at and stats.windows_written > spent_at[0]:
            stop.set()
        if time.monotonic() - began > deadline_s:
            stop.set()

    try:
        with FewSignals(proxy.url, timeout_s=QUERY_TIMEOUT_S) as source:
            stats = asyncio.run(
                collect_prometheus(
                    source,
                    store,
                    PrometheusConfig(
                        cluster=cluster,
                        window_s=WINDOW_S,
                        since_s=6,
                        interval_s=POLL_S,
                        settle_s=SETTLE_S,
                    ),
                    LoopParts(progress=progress),
                    stop=stop,
                )
            )
    finally:
        proxy.disarm()
    assert fault.spent, f"the fault never fired: {fault}"
    assert spent_at and stats.windows_written > spent_at[0], "no poll wrote after the fault"
    return stats


def _edit(warning: str, drop: str | None = None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A rewrite adding ``warning`` to the answer and leaving out the series of statistic
    ``drop`` (``"*"``: every series) — what Thanos answers with partial_response on and a
    StoreAPI unreachable: the series of the stores that answered, and a warning."""

    def rewrite(doc: dict[str, Any]) -> dict[str, Any]:
        result = doc["data"]["result"]
        doc["data"]["result"] = [
            s for s in result if drop != "*" and s["metric"].get("kvscope_stat", "") != drop
        ]
        doc["warnings"] = [*doc.get("warnings", []), warning]
        return doc

    return rewrite


THANOS_PARTIAL = (
    'fetch series for {__name__="vllm:num_preemptions"} Addr: 10.0.3.7:10901 LabelSets: '
    '{replica="b"} MinTime: 0 MaxTime: 9223372036854775807: receive series from Addr: '
    "10.0.3.7:10901: rpc error: code = Unavailable desc = connection error"
)
PROMQL_INFO = (
    "PromQL info: metric might not be a counter, name does not end in _total/_sum/_count/"
    '_bucket: "vllm:num_preemptions"'
)
ERROR_422 = (
    422,
    b'{"status":"error","errorType":"execution","error":"query processing would load too '
    b'many samples into memory in query execution"}',
)
NO_STORE = "No StoreAPIs matched for this query"
RANGE = "/api/v1/query_range"
# urllib3 retries a read timeout twice (promsource: Retry(total=2)): 3 late answers fail a poll
FAULTS: dict[str, tuple[Fault, str | None]] = {
    "timeout": (Fault(RANGE, PREEMPTIONS, times=3, delay_s=3 * QUERY_TIMEOUT_S), "timeout"),
    "error-status": (Fault(RANGE, PREEMPTIONS, status=ERROR_422), "http_status"),
    "truncated-json": (Fault(RANGE, PREEMPTIONS, truncate=True), "parse"),
    "partial-with-warning": (
        Fault(RANGE, PREEMPTIONS, rewrite=_edit(THANOS_PARTIAL, drop="samples")),
        "partial",
    ),
    "promql-info-annotation": (Fault(RANGE, PREEMPTIONS, rewrite=_edit(PROMQL_INFO)), None),
    "thanos-no-store-matched": (Fault(RANGE, PREEMPTIONS, rewrite=_edit(NO_STORE)), None),
}


# --------------------------------------------------------------------------- tests


@pytest.mark.prometheus
@pytest.mark.parametrize("case", list(FAULTS))
def test_collect_prometheus_query_fault_next_poll_fills_range(
    case: str,
    store: Store,
    proxy: FaultProxy,
    live_prometheus: LiveProm,
    caplog: pytest.LogCaptureFixture,
) -> None:
    template, kind = FAULTS[case]
    fault = dataclasses.replace(template, used=0)  # a fresh copy per test
    with caplog.at_level(logging.INFO, logger="collector"):
        stats = _under_fault(store, proxy, fault, cluster=case)
    messages = [r.getMessage() for r in caplog.records]
    if kind is None:  # a warning that is no missing data: the poll is accepted, noted once
        assert not stats.failures, stats.failures
        assert sum("accepted: no data missing" in m for m in messages) == 1, messages
    else:
        assert set(stats.failures) == {kind}, (stats.failures, stats.last_error)
        assert stats.last_error is not None and "preemptions_total" in stats.last_error
        assert sum("prometheus poll failed (1 in a row)" in m for m in messages) == 1
        assert sum("answers again after 1 failed poll(s)" in m for m in messages) == 1
    _same_windows(store, case, live_prometheus.url)


FACTS_FAULTS = {
    "error-status": (
        Fault("/api/v1/query", CACHE_CONFIG_INFO, status=(500, b"broke")),
        "http_status",
    ),
    "partial-no-series": (
        Fault("/api/v1/query", CACHE_CONFIG_INFO, rewrite=_edit(THANOS_PARTIAL, drop="*")),
        "partial",
    ),
}


@pytest.mark.prometheus
@pytest.mark.parametrize("case", list(FACTS_FAULTS))
def test_collect_prometheus_facts_query_fails_windows_kept_facts_stay(
    case: str,
    store: Store,
    proxy: FaultProxy,
    live_prometheus: LiveProm,
    caplog: pytest.LogCaptureFixture,
) -> None:
    template, kind = FACTS_FAULTS[case]
    fault = dataclasses.replace(template, used=0)  # a fresh copy per test
    before: list[dict[str, Any]] = []

    def facts() -> dict[str, Any]:
        (engine,) = store.engines("facts")
        return {"offload": engine.offload, "facts": engine.facts, "changes": engine.changes}

    with caplog.at_level(logging.ERROR, logger="collector.run_prometheus"):
        stats = _under_fault(
            store, proxy, fault, cluster="facts", on_first=lambda: before.append(facts())
        )
    assert stats.failures == {kind: 1}, stats.failures
    assert any("engine facts" in r.getMessage() for r in caplog.records)
    assert before and before[0]["facts"].get("num_gpu_blocks"), before
    # the failed read (no series: "this engine exposes no facts") overwrote nothing stored
    assert facts() == before[0]
    _same_windows(store, "facts", live_prometheus.url)


def _raw_timestamps(url: str, name: str, at: float) -> list[float]:
    """The scrape timestamps Prometheus holds for ``name`` in the 60 s before ``at``."""
    q = urllib.parse.urlencode({"query": f"{name}[60s]", "time": f"{at:.3f}"})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10) as resp:
        doc = json.load(resp)
    (series,) = doc["data"]["result"]
    return [float(t) for t, _ in series["values"]]


@pytest.mark.slow  # ~20 s: a (re)started Prometheus scrapes first after ~5 s (SD throttle)
@pytest.mark.prometheus
def test_collect_prometheus_restarted_mid_run_next_poll_fills_gap(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    text = (METRICS / "vllm-0.33.0-metrics-default.txt").read_text()
    (name,) = [n for n in exposed_names("preemptions_total") if f"\n{n}{{" in text][:1]
    stop = asyncio.Event()
    marks: dict[str, Any] = {}
    with expo_server() as srv:
        srv.add("/metrics", moving_vllm_body(text))
        config = PROM_CONFIG.replace("{hostport}", srv.base.removeprefix("http://"))
        with services.restartable_prometheus(config) as prom:
            deadline = time.monotonic() + 15
            while srv.route("/metrics").hits < 3:
                assert time.monotonic() < deadline, "Prometheus did not scrape"
                time.sleep(0.1)

            async def scenario(source: PrometheusSource) -> CollectStats:
                task = asyncio.ensure_future(
                    collect_prometheus(
                        source,
                        store,
                        PrometheusConfig(
                            cluster="r",
                            window_s=WINDOW_S,
                            since_s=8,
                            interval_s=POLL_S,
                            settle_s=2.0,
                            keep=None,  # every signal: each series of the engine is checked
                        ),
                        stop=stop,
                    )
                )
                await asyncio.sleep(2.0)
                marks["stopped"] = time.time()
                await asyncio.to_thread(prom.stop)
                await asyncio.sleep(2.0)  # polls fail: connection refused
                marks["down"] = {_key(w) for w in store.read_windows(cluster="r")}
                hits = srv.route("/metrics").hits
                await asyncio.to_thread(prom.start)
                marks["up"] = time.time()
                while srv.route("/metrics").hits < hits + 2:  # scraping again
                    assert time.time() < marks["up"] + 20, "restarted Prometheus did not scrape"
                    await asyncio.sleep(0.1)
                scraping = time.time()

                def read_past() -> bool:  # a window after the resumed scrapes is stored
                    windows = store.read_windows(cluster="r", signals=["preemptions_total"])
                    return any(w.start > scraping for w in windows)

                # the gap's far side read (settle + a window, longer on a loaded machine)
                while not await asyncio.to_thread(read_past):
                    assert time.time() < scraping + 30, "nothing read after the restart"
                    await asyncio.sleep(0.25)
                stop.set()
                return await task

            with (
                caplog.at_level(logging.WARNING, logger="collector.run_prometheus"),
                PrometheusSource(prom.url, timeout_s=2) as source,
            ):
                stats = asyncio.run(scenario(source))
            assert prom.starts == 2
            got = _same_windows(store, "r", prom.url, signals=None)
            stamps = _raw_timestamps(prom.url, name, time.time())
    # refused while down; a query caught by the shutdown answers 422 "closed head"
    assert stats.failures and set(stats.failures) <= {"connect", "timeout", "http_status"}
    assert stats.failures["connect"] >= 1, stats.failures
    assert sum(stats.failures.values()) < stats.ticks
    messages = [r.getMessage() for r in caplog.records]
    assert any("prometheus poll failed" in m for m in messages)
    assert sum("answers again" in m for m in messages) == 1, messages
    # windows that closed before the stop but were not yet written (settle) came after it
    filled = [k for k in map(_key, got) if k not in marks["down"] and k[3] < marks["stopped"]]
    assert filled, "nothing of the pre-stop range was left for the next poll to fill"
    # per series: one window per WINDOW_S over the covered range, but where Prometheus was
    # down (no scrape in [start, start + WINDOW_S]: range selectors include both ends)
    first, last = min(w.start for w in got), max(w.start for w in got)
    slots = [first + i * WINDOW_S for i in range(int((last - first) / WINDOW_S) + 1)]
    scraped = [s for s in slots if any(s <= t <= s + WINDOW_S for t in stamps)]
    gap = [s for s in slots if s not in scraped]
    # the gap: from the stop to the restarted Prometheus' first scrape (its discovery
    # manager hands the scrape manager its targets ~5 s after start)
    assert gap and marks["stopped"] - 1 <= gap[0] and gap[-1] <= marks["up"] + 7, (gap, marks)
    assert gap == slots[slots.index(gap[0]) : slots.index(gap[-1]) + 1]  # one hole
    assert last > marks["up"] + 1, "nothing read after the restart"
    series: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = {}
    for w in got:
        series.setdefault((w.signal, w.labels), []).append(w.start)
    counter = [s for (signal, _), s in series.items() if signal == "preemptions_total"]
    assert len(counter) == 1 and counter[0] == scraped, (counter, scraped)
    for (signal, labels), starts in series.items():  # every series of the engine alike
        assert starts == scraped, (signal, labels, sorted(set(scraped) ^ set(starts)))


@pytest.mark.parametrize(
    ("warning", "missing"),
    [
        (THANOS_PARTIAL, True),
        # Prometheus' fanout storage: a remote-read querier that failed is a warning
        (
            'error sending request: Post "http://remote:9201/read": dial tcp: connection refused',
            True,
        ),
        (PROMQL_INFO, False),
        ('PromQL warning: encountered a mix of histograms and floats for metric name "x"', False),
        (NO_STORE, False),
        ("  no storeapis matched for this query ", False),
        ("PromQL-ish: not an annotation", True),
    ],
)
def test_missing_data_warnings_only_data_loss_is_partial(warning: str, missing: bool) -> None:
    got_missing, benign = missing_data_warnings([warning])
    assert (got_missing, benign) == (
        ([warning.strip()], []) if missing else ([], [warning.strip()])
    )
