"""collector.self_metrics: the collector's health registry, its counters against real collect
loops, served over real HTTP on 127.0.0.1, and promtool's lint of its exposition."""

from __future__ import annotations

import asyncio
import re
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from collector.promsource import PrometheusSource
from collector.run import DirectParts, LoopParts, collect_direct
from collector.run_config import DirectConfig, PrometheusConfig
from collector.run_prometheus import collect_prometheus
from collector.scrape import Target, TargetSet
from collector.self_metrics import CollectorHealth, parse_listen_addr, serve_metrics
from core import kvscope_metrics as sm
from core.errors import ConfigError
from store.store import Store
from tests.collector.conftest import LiveProm
from tests.collector.exposerver import expo_server
from tests.samples import PROMTOOL, assert_promtool_clean, labelsets, parse, value
from tests.services import free_port

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "metrics" / "vllm-0.33.0-metrics-default.txt"
NOW = 1_764_000_000.0
# --------------------------------------------------------------------------- collector health


@dataclass
class _Stats:
    ticks: int = 0
    skipped_ticks: int = 0
    windows_written: int = 0
    store_errors: int = 0
    loop_errors: int = 0
    last_lag_s: float = 0.0


def test_collector_health_ticks_move_counters_and_stamp_only_clean_ticks() -> None:
    h = CollectorHealth(version="9.9.9", cluster="c", mode="direct", targets=["a", "b"])
    s = parse(h.render())
    assert value(s, sm.COLLECTOR_SCRAPES.name, target="a", outcome="up") == 0.0
    assert value(s, sm.COLLECTOR_TARGETS.name) == 2
    assert value(s, sm.BUILD_INFO.name, version="9.9.9") == 1
    assert value(s, sm.COLLECTOR_INFO.name, cluster="c", mode="direct") == 1
    assert sm.COLLECTOR_TARGET_UP.name not in s  # unknown until scraped
    h.scraped("a", "up", 0.01)
    h.scraped("b", "http_status", 0.02)
    h.ticked(_Stats(ticks=1, windows_written=5, last_lag_s=0.003), at=100.0)
    h.ticked(_Stats(ticks=2, windows_written=5, store_errors=1), at=200.0)
    h.ticked(_Stats(ticks=3, skipped_ticks=2, windows_written=9, store_errors=1, last_lag_s=0.25),
             at=300.0)  # fmt: skip
    s = parse(h.render())
    assert value(s, sm.COLLECTOR_SCRAPES.name, target="b", outcome="http_status") == 1
    assert value(s, sm.COLLECTOR_TARGET_UP.name, target="a") == 1
    assert value(s, sm.COLLECTOR_TARGET_UP.name, target="b") == 0
    assert value(s, f"{sm.COLLECTOR_SCRAPE_DURATION}_count", target="b") == 1
    assert value(s, f"{sm.COLLECTOR_SCRAPE_DURATION}_sum", target="a") == 0.01
    assert value(s, sm.COLLECTOR_TICKS.name) == 3
    assert value(s, sm.COLLECTOR_SKIPPED_TICKS.name) == 2
    assert value(s, sm.COLLECTOR_WINDOWS_WRITTEN.name) == 9
    assert value(s, sm.COLLECTOR_STORE_ERRORS.name) == 1
    assert value(s, sm.COLLECTOR_TICK_LAG.name) == 0.25
    assert value(s, sm.COLLECTOR_LAST_SUCCESSFUL_TICK.name) == 300.0  # 200: a store error
    h.ticked(_Stats(ticks=4, windows_written=9, store_errors=1, last_lag_s=-0.5), at=400.0)
    assert value(parse(h.render()), sm.COLLECTOR_TICK_LAG.name) == 0.0  # early: no lag


def test_collector_health_targets_change_drops_gone_series() -> None:
    h = CollectorHealth(version="1", cluster="c", mode="direct", targets=["a", "b"])
    h.scraped("b", "timeout", 1.0)
    h.set_targets(["a", "c"])
    s = parse(h.render())
    assert value(s, sm.COLLECTOR_TARGETS.name) == 2
    assert {lab["target"] for lab in labelsets(s, sm.COLLECTOR_SCRAPES)} == {"a", "c"}
    assert labelsets(s, sm.COLLECTOR_TARGET_UP) == []


def test_collect_direct_with_health_counts_match_the_loop(tmp_path: Path) -> None:
    h = CollectorHealth(version="1", cluster="t", mode="direct")
    with expo_server() as srv, Store(f"sqlite:///{tmp_path / 'k.db'}") as store:
        store.migrate()
        targets = TargetSet("t", (
            Target("up0", srv.add("/m", FIXTURE.read_bytes()), "vllm"),
            Target("err", srv.add("/500", b"no\n", status=500), "vllm"),
        ))  # fmt: skip
        stats = asyncio.run(
            # 0.5 s ticks: a scrape's deadline is the tick's, and a 0.05 s one timed out the
            # 554-line fixture under a loaded CI machine (an "up" counted as a timeout)
            collect_direct(
                targets,
                store,
                DirectConfig(
                    interval_s=0.5,
                    window_s=1.0,
                    timeout_s=5,
                    concurrency=4,
                    max_body_bytes=1 << 24,
                    max_ticks=4,
                ),
                DirectParts(health=h),
            )
        )
    s = parse(h.render())
    # every tick scrapes both targets once; under a loaded machine a scrape can still miss
    # its tick's deadline (a timeout), so the counts are checked against the loop's own
    by: dict[tuple[str, str], float] = {
        (lab["target"], lab["outcome"]): v for lab, v in s[sm.COLLECTOR_SCRAPES.name]
    }
    assert {o for (t, o), v in by.items() if t == "up0" and v} <= {"up", "timeout"}
    assert {o for (t, o), v in by.items() if t == "err" and v} <= {"http_status", "timeout"}
    assert sum(v for (t, _), v in by.items() if t == "up0") == 4
    assert sum(v for (t, _), v in by.items() if t == "err") == 4
    assert by[("up0", "up")] >= 1 and by[("err", "http_status")] >= 1
    failed = sum(v for (_, o), v in by.items() if o != "up")
    assert failed == sum(stats.failures.values())
    assert sum(by.values()) == stats.scrapes == 8
    assert value(s, sm.COLLECTOR_TICKS.name) == stats.ticks == 4
    assert value(s, sm.COLLECTOR_WINDOWS_WRITTEN.name) == stats.windows_written > 0
    assert value(s, sm.COLLECTOR_TARGETS.name) == 2
    assert value(s, sm.COLLECTOR_LAST_SUCCESSFUL_TICK.name) > 0


@pytest.mark.prometheus
def test_collect_prometheus_with_health_counts_each_query(
    tmp_path: Path, live_prometheus: LiveProm
) -> None:
    h = CollectorHealth(version="1", cluster="prom", mode="prometheus")
    with (
        PrometheusSource(live_prometheus.url) as source,
        Store(f"sqlite:///{tmp_path / 'k.db'}") as store,
    ):
        store.migrate()
        h.set_targets([source.url])
        stats = asyncio.run(
            collect_prometheus(
                source,
                store,
                PrometheusConfig(
                    cluster="prom", window_s=2, since_s=60, interval_s=0.5, settle_s=0, max_polls=2
                ),
                LoopParts(health=h),
            )
        )
    s = parse(h.render())
    queries = value(s, sm.COLLECTOR_SCRAPES.name, target=source.url, outcome="up")
    assert queries >= 1 and value(s, f"{sm.COLLECTOR_SCRAPE_DURATION}_count") == queries
    assert value(s, sm.COLLECTOR_WINDOWS_WRITTEN.name) == stats.windows_written > 0
    assert value(s, sm.COLLECTOR_TICKS.name) == 2
    assert value(s, sm.COLLECTOR_TARGET_UP.name, target=source.url) == 1


# --------------------------------------------------------------------------- serving


@pytest.mark.parametrize(
    ("text", "expected"),
    [("127.0.0.1:9464", ("127.0.0.1", 9464)), ("[::1]:9464", ("::1", 9464)),
     ("localhost:0", ("localhost", 0)), (" 0.0.0.0:80 ", ("0.0.0.0", 80))],
)  # fmt: skip
def test_parse_listen_addr_host_port_gives_pair(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen_addr(text) == expected


@pytest.mark.parametrize("text", ["9464", ":9464", "host:", "host:port", "h:70000", "[]:1", ""])
def test_parse_listen_addr_malformed_raises_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="is not HOST:PORT"):
        parse_listen_addr(text, "--x")


def _get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, resp.headers["Content-Type"], resp.read().decode()


def test_serve_metrics_real_http_serves_registry_then_releases_port() -> None:
    h = CollectorHealth(version="1", cluster="c", mode="direct", targets=["a"])
    port = free_port()
    with serve_metrics(f"127.0.0.1:{port}", h.registry) as server:
        assert server.url == f"http://127.0.0.1:{port}/metrics"
        status, ctype, body = _get(server.url)
        assert status == 200 and ctype.startswith("text/plain")
        assert value(parse(body), sm.COLLECTOR_TARGETS.name) == 1
    with pytest.raises(urllib.error.URLError):
        _get(f"http://127.0.0.1:{port}/metrics")
    with socket.socket() as sock:  # the port is free again for the next server
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()


def _status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_serve_metrics_healthz_follows_the_check_and_metrics_stay_served() -> None:
    h = CollectorHealth(version="1", cluster="c", mode="direct", targets=["a"])
    verdict = [(True, "ok: fine")]
    with serve_metrics(f"127.0.0.1:{free_port()}", h.registry, check=lambda: verdict[0]) as srv:
        base = srv.url.removesuffix("/metrics")
        assert _status(base + "/healthz") == (200, "ok: fine\n")
        verdict[0] = (False, "stale: no")
        assert _status(base + "/healthz") == (503, "stale: no\n")
        status, body = _status(srv.url)  # the exposition is unaffected
        assert status == 200 and sm.COLLECTOR_TARGETS.name in body
    # without a check /healthz is just another path of the exposition
    with serve_metrics(f"127.0.0.1:{free_port()}", h.registry) as srv:
        status, body = _status(srv.url.removesuffix("/metrics") + "/healthz")
        assert status == 200 and sm.COLLECTOR_TARGETS.name in body


def test_serve_metrics_ipv6_loopback_serves_healthz() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    h = CollectorHealth(version="1", cluster="c", mode="direct", stale_after_s=60.0)
    try:
        srv = serve_metrics(f"[::1]:{free_port()}", h.registry, check=h.alive)
    except ConfigError as exc:
        pytest.skip(f"::1 not bindable here: {exc}")
    with srv:
        assert srv.url.startswith("http://[::1]:")
        assert _status(srv.url.removesuffix("/metrics") + "/healthz")[0] == 200


@pytest.mark.parametrize(
    ("beats", "now", "alive", "text"),
    [
        ([], 100.0, True, "ok: nothing scraped yet, started 100 s ago"),
        ([], 301.0, False, "stale: nothing scraped yet, started 301 s ago (limit 300 s)"),
        (["scrape@250"], 500.0, True, "ok: last scrape or tick 250 s ago"),
        (["tick@100"], 401.0, False, "stale: last scrape or tick 301 s ago (limit 300 s)"),
        (["tick@100", "scrape@390"], 401.0, True, "ok: last scrape or tick 11 s ago"),
    ],
)
def test_collector_health_alive_after_stale_after_s_without_a_scrape_or_tick(
    beats: list[str], now: float, alive: bool, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [0.0]
    monkeypatch.setattr("collector.self_metrics.time.monotonic", lambda: clock[0])
    h = CollectorHealth(version="1", cluster="c", mode="direct", stale_after_s=300.0)
    ticks = 0
    for beat in beats:
        kind, at = beat.split("@")
        clock[0] = float(at)
        if kind == "scrape":
            h.scraped("a", "connection_refused", 0.1)  # a failed scrape still proves the loop
        else:
            ticks += 1
            h.ticked(_Stats(ticks=ticks, store_errors=ticks))  # a tick with a store error too
    assert h.alive(now) == (alive, text)
    assert CollectorHealth(version="1", cluster="c", mode="d").alive(1e9)[0]  # no bound


def test_serve_metrics_port_in_use_raises_config_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        addr = f"127.0.0.1:{busy.getsockname()[1]}"
        with pytest.raises(ConfigError, match=rf"--m {re.escape(addr)}: cannot listen"):
            serve_metrics(addr, CollectorHealth(version="1", cluster="c", mode="d").registry,
                          what="--m")  # fmt: skip


@pytest.mark.skipif(not PROMTOOL.exists(), reason="promtool not installed")
def test_health_exposition_passes_promtool_lint() -> None:
    h = CollectorHealth(version="0.1.0", cluster="c", mode="direct", targets=["a", "b"])
    h.scraped("a", "up", 0.01)
    h.scraped("b", "connect", 0.5)
    h.ticked(_Stats(ticks=1, windows_written=3), at=NOW)
    assert_promtool_clean(h.render())
