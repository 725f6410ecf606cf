"""The collector under faults: one real direct-mode run (collector.run.collect_direct, SQLite in
tmp_path) over real local servers on 127.0.0.1, one target per fault beside three healthy ones.

Each fault's outcome must be recorded with its kind; the healthy targets' windows must hold
exactly what their servers served (bad neighbours steal nothing); a target whose exposition
has value anomalies (NaN, ±Inf, negative counters, a duplicate series, a conflicting TYPE,
a counter reset) stays up and keeps every signal Prometheus would keep, its anomalies counted
per target and kind in the collector's own metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import itertools
import math
import random
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector.parse import read_exposition
from collector.run import CollectStats, DirectParts, collect_direct
from collector.run_config import DirectConfig
from collector.scrape import Target, TargetSet
from collector.self_metrics import CollectorHealth
from core import kvscope_metrics as sm
from core.catalog import exposed_names
from core.records import Labels, ScrapeOutcome, Window
from store.store import Store
from tests.collector.exposerver import TEXT_004, Body, ExpoServer, expo_server, set_sample
from tests.services import free_port

METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
TEXT = (METRICS / "vllm-0.33.0-metrics-default.txt").read_text()
START, STEP = 100.0, 5.0  # the preemption counter: START + STEP * hit
TICKS = 5
INTERVAL_S = 0.9
# Per target: a round with slow targets ends well before the next tick; a healthy scrape beside
# 20 others took up to 0.42 s on a loaded 2-core machine (the first round most: it makes the
# targets' HTTP clients), and once, in 40 runs, two took more than 0.5 s.
TIMEOUT_S = 0.65
MAX_BODY = 256 << 10  # a healthy exposition is 24 KB
RESET_AT = 3  # the reset target's engine restarts before its 4th answer


def preemptions(n: int) -> float:
    return START + STEP * n


def _served(n: int) -> str:
    text = set_sample(TEXT, "preemptions_total", preemptions(n))
    return set_sample(text, "kv_cache_usage_ratio", 0.5 if n % 2 else 0.25)


# Made once: the servers run in this process and must not take the GIL from the collector
# for long (a regex pass over the exposition per hit, times 20 targets, delayed scrapes).
SERVED = [_served(n) for n in range(TICKS + 4)]


def served(n: int) -> str:
    """What a healthy engine answers at its n-th hit: preemptions move, KV use flips."""
    return SERVED[n]


def bodies(make: Callable[[int], str]) -> Callable[[int], bytes]:
    """A route body of what ``make`` gives for each hit, computed before the run."""
    made = [make(n).encode() for n in range(TICKS + 4)]
    return lambda n: made[n]


def nan_body(n: int) -> str:
    # prometheus_client lets Counter.inc(nan) through: the counter is NaN from then on.
    text = set_sample(served(n), "prompt_tokens_total", math.nan)
    text = set_sample(text, "generation_tokens_total", -1.0)
    text = set_sample(text, "requests_waiting", -math.inf)
    return set_sample(text, "kv_cache_usage_ratio", math.inf)


def reset_value(n: int) -> float:
    return preemptions(n) if n < RESET_AT else 1.0 + STEP * (n - RESET_AT)


def reset_body(n: int) -> str:
    return set_sample(served(n), "preemptions_total", reset_value(n))


def dup_body(n: int) -> str:
    line = next(ln for ln in served(n).splitlines() if ln.startswith(PRE + "{"))
    return served(n) + line.rsplit(" ", 1)[0] + " 1e9\n"  # the same series again, later


def type_body(n: int) -> str:
    return served(n) + f"# TYPE {PRE_FAMILY} gauge\n"  # a second TYPE, after the counter one


PRE = exposed_names("preemptions_total")[0]
# The family the exposition's TYPE line declares for it (prometheus_client: with _total).
PRE_FAMILY = next(
    fam
    for fam in (PRE, PRE.removesuffix("_total"))
    if re.search(rf"^# TYPE {re.escape(fam)} counter$", TEXT, flags=re.MULTILINE)
)


# --------------------------------------------------------------------------- a raw server


Answer = Callable[[socket.socket, int], None]


class RawServer:
    """An HTTP/1.1 server on 127.0.0.1 that answers each path with raw bytes (one request per
    connection): the faults exposerver cannot make (bodies cut short, a slow drip, a TLS
    client spoken to in plain text, a gzip bomb, a status that flaps)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.routes: dict[str, Answer] = {}
        self.hits: Counter[str] = Counter()
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def add(self, path: str, answer: Answer) -> str:
        self.routes[path] = answer
        return self.base + path

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(5)
            head = b""
            while b"\r\n\r\n" not in head:
                got = conn.recv(65536)
                if not got:
                    return
                head += got
            path = head.split(b" ", 2)[1].decode()
            with self._lock:
                n = self.hits[path]
                self.hits[path] += 1
            self.routes[path](conn, n)

    def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self.sock.close()
        self._thread.join(timeout=5)


def http(status: str, body: bytes, ctype: str = TEXT_004, **headers: str) -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Type: {ctype}", f"Content-Length: {len(body)}"]
    lines += ["Connection: close", *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def cut_short(conn: socket.socket, n: int) -> None:
    body = served(n).encode()
    conn.sendall(http("200 OK", body)[: -len(body) // 2])  # Content-Length says all of it


def chunked_cut_short(conn: socket.socket, n: int) -> None:
    body = served(n).encode()
    head = f"HTTP/1.1 200 OK\r\nContent-Type: {TEXT_004}\r\nTransfer-Encoding: chunked\r\n\r\n"
    half = body[: len(body) // 2]
    conn.sendall(head.encode() + f"{len(half):x}\r\n".encode() + half + b"\r\n")  # no 0 chunk


def drip(stop: threading.Event) -> Answer:
    def answer(conn: socket.socket, n: int) -> None:
        data = http("200 OK", served(n).encode())
        for i in range(0, len(data), 16):  # 16 bytes every 50 ms: ~7 minutes for the body
            if stop.wait(0.05):
                return
            conn.sendall(data[i : i + 16])

    return answer


def flapping(conn: socket.socket, n: int) -> None:
    if n % 2:
        conn.sendall(http("503 Service Unavailable", b"restarting\n"))
    else:
        conn.sendall(http("200 OK", served(n).encode()))


BOMB_INFLATED = 2 << 20  # 2 MiB of zeros: 2 KiB on the wire


def gzip_bomb(bomb: bytes) -> Answer:
    def answer(conn: socket.socket, n: int) -> None:
        conn.sendall(http("200 OK", bomb, Content_Encoding="gzip"))

    return answer


def json_typed(conn: socket.socket, n: int) -> None:
    conn.sendall(http("200 OK", served(n).encode(), ctype="application/json"))


def html_page(conn: socket.socket, n: int) -> None:
    page = b"<html><body><h1>502 Bad Gateway</h1></body></html>\n"
    conn.sendall(http("200 OK", page, ctype="text/html"))


@contextlib.contextmanager
def raw_server() -> Iterator[RawServer]:
    srv = RawServer()
    try:
        yield srv
    finally:
        srv.close()


@contextlib.contextmanager
def garbage_speaker() -> Iterator[int]:
    """A plain TCP server that answers whatever comes (a TLS ClientHello) with garbage."""
    sock = socket.create_server(("127.0.0.1", 0))

    def loop() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:  # closed
                return
            with conn, contextlib.suppress(OSError):
                conn.sendall(b"220 this is not TLS\r\n")

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1]
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        thread.join(timeout=5)


# --------------------------------------------------------------------------- the run


HEALTHY = ("ok0", "ok1", "ok2")
# target -> the error kind of every scrape (None: up at every scrape)
FAULTS: dict[str, str | None] = {
    "timeout": "timeout",
    "refused": "connect",
    "http_5xx": "http_status",
    "cut_short": "truncated",
    "chunked_cut_short": "truncated",
    "garbage": "parse",
    "huge_declared": "too_large",
    "huge_streamed": "too_large",
    "gzip_bomb": "too_large",
    "html_page": "parse",
    "slow_drip": "timeout",
    "tls_garbage": "connect",
    "json_typed": None,  # Prometheus 2.42 reads an unknown Content-Type as text, so do we
    "nan_inf": None,
    "counter_reset": None,
    "duplicate": None,
    "type_conflict": None,
}
FLAP = "flapping"


@dataclass
class Run:
    stats: CollectStats
    outcomes: dict[str, list[ScrapeOutcome]]
    windows: dict[str, list[Window]]
    hits: dict[str, int]
    health: dict[tuple[str, str], float]  # (target, kind) -> anomalies counted


class Spread:
    """Routes spread over several exposervers, a few each: socketserver listens with a backlog
    of 5, and a first round opening 13 connections to one server at once would see some
    connects dropped and retried a second later (a timeout that is the test's, not the
    collector's)."""

    def __init__(self, servers: list[ExpoServer], per_server: int = 4) -> None:
        self.servers = servers
        self.per_server = per_server
        self.where: dict[str, ExpoServer] = {}

    def add(self, path: str, body: Body | bytes | str, **kw: object) -> str:
        srv = self.servers[len(self.where) // self.per_server]
        self.where[path] = srv
        return srv.add(path, body, **kw)

    def hits(self, path: str) -> int:
        return self.where[path].route(path).hits


def _targets(srv: Spread, raw: RawServer, tls_port: int) -> tuple[Target, ...]:
    huge = b"# padding\n" * (5 << 20)  # 50 MiB
    garbage = random.Random(7).randbytes(64 << 10)
    bomb = gzip.compress(b"\0" * BOMB_INFLATED, compresslevel=9)
    assert len(bomb) < MAX_BODY // 64
    urls = {name: srv.add(f"/{name}", bodies(served)) for name in HEALTHY}
    urls |= {
        "timeout": srv.add("/timeout", served(0), delay_s=1.5),
        "refused": f"http://127.0.0.1:{free_port()}/metrics",
        "http_5xx": srv.add("/http_5xx", b"upstream down\n", status=503),
        "cut_short": raw.add("/cut_short", cut_short),
        "chunked_cut_short": raw.add("/chunked_cut_short", chunked_cut_short),
        "garbage": srv.add("/garbage", garbage),
        "huge_declared": srv.add("/huge_declared", huge),
        "huge_streamed": srv.add("/huge_streamed", huge, chunks=800),  # 64 KiB chunks
        "gzip_bomb": raw.add("/gzip_bomb", gzip_bomb(bomb)),
        "html_page": raw.add("/html_page", html_page),
        "slow_drip": raw.add("/slow_drip", drip(raw.stop)),
        "tls_garbage": f"https://127.0.0.1:{tls_port}/metrics",
        "json_typed": raw.add("/json_typed", json_typed),
        "nan_inf": srv.add("/nan_inf", bodies(nan_body)),
        "counter_reset": srv.add("/counter_reset", bodies(reset_body)),
        "duplicate": srv.add("/duplicate", bodies(dup_body)),
        "type_conflict": srv.add("/type_conflict", bodies(type_body)),
        FLAP: raw.add(f"/{FLAP}", flapping),
    }
    return tuple(Target(name, url, "vllm") for name, url in urls.items())


def _health_values(health: CollectorHealth, metric: sm.MetricDef) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(health.render().decode()):
        for s in family.samples:
            if s.name == metric.name:
                out[(s.labels["target"], s.labels[metric.labels[1]])] = s.value
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    db = tmp_path_factory.mktemp("faults") / "kvscope.db"
    health = CollectorHealth(version="t", cluster="faults", mode="direct")
    with contextlib.ExitStack() as stack:
        srv = Spread([stack.enter_context(expo_server()) for _ in range(4)])
        raw = stack.enter_context(raw_server())
        targets = TargetSet("faults", _targets(srv, raw, stack.enter_context(garbage_speaker())))
        with Store(f"sqlite:///{db}") as store:
            store.migrate()
            # the first round runs at once: start it just after a tick boundary, so that it
            # has the whole interval before the second
            while time.time() % INTERVAL_S > 0.05:
                time.sleep(0.01)
            stats = asyncio.run(
                collect_direct(
                    targets,
                    store,
                    DirectConfig(
                        interval_s=INTERVAL_S,
                        window_s=1.2,
                        timeout_s=TIMEOUT_S,
                        concurrency=len(targets),
                        max_body_bytes=MAX_BODY,
                        max_ticks=TICKS,
                        keep=None,  # every signal: each series of TEXT is checked
                    ),
                    DirectParts(health=health),
                )
            )
            outcomes: dict[str, list[ScrapeOutcome]] = {}
            for o in store.outcomes():
                outcomes.setdefault(o.target, []).append(o)
            windows: dict[str, list[Window]] = {}
            for w in store.read_windows():
                windows.setdefault(w.source, []).append(w)
        hits = {name.lstrip("/"): srv.hits(name) for name in srv.where}
        hits |= {t.name: raw.hits[f"/{t.name}"] for t in targets if t.url.startswith(raw.base)}
    return Run(stats, outcomes, windows, hits, _health_values(health, sm.COLLECTOR_ANOMALIES))


def by_series(
    windows: list[Window], signal: str | None = None
) -> dict[tuple[str, Labels], list[Window]]:
    out: dict[tuple[str, Labels], list[Window]] = {}
    for w in windows:
        if w.kind != "ratio" and (signal is None or w.signal == signal):
            out.setdefault((w.signal, w.labels), []).append(w)
    return out


CLEAN = {(s.signal, s.labels) for s in read_exposition(TEXT, "clean", 0.0).samples}


def assert_complete(
    run: Run, target: str, *, served_up: int, lost: frozenset[str] = frozenset()
) -> None:
    """Every canonical series of the exposition (less ``lost`` signals) has windows, holding
    exactly one sample per answer the target served up; no other series has any."""
    series = by_series(run.windows.get(target, []))
    expected = {key for key in CLEAN if key[0] not in lost}
    assert set(series) == expected, (target, sorted(set(series) ^ expected))
    counts = {key: sum(w.samples for w in ws) for key, ws in series.items()}
    assert set(counts.values()) == {served_up}, (target, Counter(counts.values()))


def test_fault_matrix_every_target_scraped_every_tick(run: Run) -> None:
    assert run.stats.ticks == TICKS and run.stats.loop_errors == 0 and run.stats.store_errors == 0
    names = {*HEALTHY, *FAULTS, FLAP}
    assert {t: len(os) for t, os in run.outcomes.items()} == {t: TICKS for t in names}


@pytest.mark.parametrize("target", sorted(k for k, v in FAULTS.items() if v is not None))
def test_fault_matrix_failing_target_outcome_has_its_kind(run: Run, target: str) -> None:
    kinds = [o.error_kind for o in run.outcomes[target]]
    assert kinds == [FAULTS[target]] * TICKS, [
        (o.error_kind, o.error) for o in run.outcomes[target]
    ]
    assert not any(o.up for o in run.outcomes[target])
    assert target not in run.windows  # nothing half-read was rolled up
    if target == "tls_garbage":
        assert all("SSL" in (o.error or "") for o in run.outcomes[target])
    if target.endswith("cut_short"):
        assert all("cut short" in (o.error or "") for o in run.outcomes[target])
    if target == "gzip_bomb":  # a few KiB on the wire, inflated at most one byte past the cap
        assert all(o.bytes == MAX_BODY + 1 for o in run.outcomes[target])
    if target == "huge_declared":  # refused on its Content-Length, before reading any body
        assert all(
            "Content-Length" in (o.error or "") and o.bytes == 0 for o in run.outcomes[target]
        )


def test_fault_matrix_healthy_targets_windows_complete(run: Run) -> None:
    for name in HEALTHY:
        assert run.hits[name] == TICKS
        assert all(o.up for o in run.outcomes[name])
        assert_complete(run, name, served_up=TICKS)
        (pre,) = by_series(run.windows[name], "preemptions_total").values()
        assert sum(w.delta or 0.0 for w in pre) == STEP * (TICKS - 1)
        assert max(pre, key=lambda w: w.start).last == preemptions(TICKS - 1)
        assert sum(w.resets for w in pre) == 0


def test_fault_matrix_anomalous_targets_stay_up_good_signals_complete(run: Run) -> None:
    for name in ("json_typed", "nan_inf", "duplicate", "type_conflict", "counter_reset"):
        assert run.hits[name] == TICKS and all(o.up for o in run.outcomes[name]), name
    # NaN and negative counters are dropped, ±Inf gauges are kept in the snapshot but have no
    # finite sample to roll up: those four series only are missing.
    lost = frozenset({"prompt_tokens_total", "generation_tokens_total", "kv_cache_usage_ratio",
                      "requests_waiting"})  # fmt: skip
    assert_complete(run, "nan_inf", served_up=TICKS, lost=lost)
    for name in ("json_typed", "duplicate", "type_conflict", "counter_reset"):
        assert_complete(run, name, served_up=TICKS)
    (dup,) = by_series(run.windows["duplicate"], "preemptions_total").values()
    assert sum(w.delta or 0.0 for w in dup) == STEP * (TICKS - 1)  # the first line stood
    assert max(w.last or 0.0 for w in dup) == preemptions(TICKS - 1)


def test_fault_matrix_counter_reset_counted_increase_as_promql(run: Run) -> None:
    (pre,) = by_series(run.windows["counter_reset"], "preemptions_total").values()
    values = [reset_value(n) for n in range(TICKS)]
    increase = sum(b if b < a else b - a for a, b in itertools.pairwise(values))
    assert sum(w.resets for w in pre) == 1
    assert sum(w.delta or 0.0 for w in pre) == increase
    assert max(pre, key=lambda w: w.start).last == values[-1]


def test_fault_matrix_flapping_target_alternates_up_windows_kept(run: Run) -> None:
    outcomes = sorted(run.outcomes[FLAP], key=lambda o: o.started)
    assert [o.error_kind for o in outcomes] == [
        None if n % 2 == 0 else "http_status" for n in range(TICKS)
    ]
    ups = [n for n in range(TICKS) if n % 2 == 0]
    assert_complete(run, FLAP, served_up=len(ups))
    (pre,) = by_series(run.windows[FLAP], "preemptions_total").values()
    assert sum(w.delta or 0.0 for w in pre) == preemptions(ups[-1]) - preemptions(ups[0])


def _lines_of(text: str, signal: str) -> int:
    names = "|".join(re.escape(n) for n in exposed_names(signal))
    return len(re.findall(rf"^(?:{names})(?:\{{[^}}]*\}})? ", text, flags=re.MULTILINE))


def test_fault_matrix_anomalies_counted_per_target_and_kind(run: Run) -> None:
    per_scrape = {
        ("nan_inf", "nan"): _lines_of(TEXT, "prompt_tokens_total"),
        ("nan_inf", "negative_counter"): _lines_of(TEXT, "generation_tokens_total"),
        ("nan_inf", "inf"): _lines_of(TEXT, "kv_cache_usage_ratio")
        + _lines_of(TEXT, "requests_waiting"),
        ("duplicate", "duplicate_series"): 1,
        ("type_conflict", "type_conflict"): 1,
    }
    assert all(per_scrape.values())
    assert run.health == {key: float(n * TICKS) for key, n in per_scrape.items()}


def test_collector_health_anomalies_gone_target_series_removed() -> None:
    health = CollectorHealth(version="t", cluster="c", mode="direct", targets=["a", "b"])
    snap = read_exposition(dup_body(0), "a", 0.0)
    assert [a.kind for a in snap.anomalies] == ["duplicate_series"]
    health.scraped("a", "up", 0.01)
    health.anomalies("a", snap.anomalies)
    health.anomalies("a", snap.anomalies)
    health.anomalies("b", ())
    assert _health_values(health, sm.COLLECTOR_ANOMALIES) == {("a", "duplicate_series"): 2.0}
    health.set_targets(["b"])
    assert _health_values(health, sm.COLLECTOR_ANOMALIES) == {}
