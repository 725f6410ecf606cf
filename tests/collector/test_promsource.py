"""collector.promsource against a real Prometheus 2.42 scraping a real exporter on 127.0.0.1."""

from __future__ import annotations

import math
import time

import pytest

from collector.promsource import PrometheusSource, derive_ratios, signal_query
from core.catalog import SIGNALS
from core.errors import ConfigError, ScrapeError
from core.records import Window
from tests import services
from tests.collector.conftest import PREEMPTIONS_START, PREEMPTIONS_STEP, SCRAPE_S, LiveProm
from tests.collector.exposerver import expo_server

STEP = PREEMPTIONS_STEP
WINDOW = 2  # seconds


@pytest.mark.prometheus
def test_windows_counter_gauge_histogram_match_exporter(
    live_prometheus: LiveProm,
) -> None:
    url, hostport, t0 = live_prometheus.url, live_prometheus.hostport, live_prometheus.t0
    end = time.time()
    with PrometheusSource(url, timeout_s=5) as prom:
        prom.check()
        got = prom.windows(
            t0 - 10, end, WINDOW,
            signals=["preemptions_total", "kv_cache_usage_ratio", "ttft_seconds",
                     "prefix_cache_queries_total", "prefix_cache_hits_total"],
        )  # fmt: skip
    assert got, "no windows"
    assert {w.source for w in got} == {hostport}
    for w in got:
        assert w.start % WINDOW == 0 and w.length_s == WINDOW
        assert w.start + WINDOW <= end
        assert w.start >= math.floor((t0 - 10) / WINDOW) * WINDOW
        assert dict(w.labels) == {"engine": "0", "model_name": "tiny-llama"}, w.labels

    pre = [w for w in got if w.signal == "preemptions_total" and w.samples >= 2]
    assert len(pre) >= 2
    for w in pre:
        assert w.kind == "counter" and w.resets == 0
        assert w.delta is not None and w.rate is not None
        # 2 s window, +5 per 1 s scrape: 10 expected; increase() extrapolates over scrape jitter.
        assert w.delta == pytest.approx(STEP * WINDOW / SCRAPE_S, rel=0.35)
        assert w.rate == pytest.approx(w.delta / WINDOW)
        assert w.last is not None and w.last >= PREEMPTIONS_START
        assert (w.last - PREEMPTIONS_START) % STEP == 0

    kv = [w for w in got if w.signal == "kv_cache_usage_ratio" and w.samples >= 2]
    assert kv
    for w in kv:
        assert w.kind == "gauge" and w.min == 0.25 and w.max == 0.5
        assert w.mean is not None and 0.25 <= w.mean <= 0.5

    ttft = [w for w in got if w.signal == "ttft_seconds"]
    assert ttft and all(w.kind == "histogram" for w in ttft)
    # The fixture's histogram never moves: no observations in any window, no quantiles.
    assert all(w.delta == 0 and w.p50 is None and w.p99 is None for w in ttft if w.samples >= 2)
    assert all(w.last is not None and w.last > 0 for w in ttft)

    ratios = [w for w in got if w.signal == "prefix_cache_hit_ratio"]
    assert ratios and all(w.kind == "ratio" for w in ratios)
    assert all(w.delta == 0 and w.mean is None for w in ratios if w.samples >= 2)


@pytest.mark.prometheus
def test_windows_long_range_is_chunked_same_result(live_prometheus: LiveProm) -> None:
    url, t0 = live_prometheus.url, live_prometheus.t0
    end = time.time()
    with PrometheusSource(url) as whole, PrometheusSource(url, max_points=2) as chunked:
        a = whole.windows(t0 - 20, end, 1, signals=["preemptions_total"])
        b = chunked.windows(t0 - 20, end, 1, signals=["preemptions_total"])
    assert a and a == b
    starts = [w.start for w in a]
    assert starts == sorted(set(starts))  # one window per second, none lost at chunk edges


@pytest.mark.prometheus
def test_windows_job_instance_source_and_matchers(live_prometheus: LiveProm) -> None:
    url, hostport, t0 = live_prometheus.url, live_prometheus.hostport, live_prometheus.t0
    end = time.time()
    with PrometheusSource(url, source_from="job/instance") as prom:
        got = prom.windows(t0, end, WINDOW, signals=["requests_running"])
    assert got and {w.source for w in got} == {f"vllm/{hostport}"}
    with PrometheusSource(url, matchers='model_name="another-model"') as prom:
        assert prom.windows(t0, end, WINDOW, signals=["requests_running"]) == []


@pytest.mark.prometheus
def test_every_catalogue_query_is_valid_promql(live_prometheus: LiveProm) -> None:
    url, t0 = live_prometheus.url, live_prometheus.t0
    with PrometheusSource(url) as prom:
        got = prom.windows(t0, time.time(), WINDOW)  # all signals: none may be refused
    assert {w.signal for w in got} >= {"preemptions_total", "requests_running", "ttft_seconds"}


def test_check_unreachable_prometheus_raises_scrape_error() -> None:
    url = f"http://127.0.0.1:{services.free_port()}"
    with PrometheusSource(url, timeout_s=1) as prom, pytest.raises(ScrapeError) as info:
        prom.check()
    assert info.value.kind == "connect" and url in str(info.value)


def test_check_not_prometheus_raises_scrape_error() -> None:
    with expo_server() as srv:
        srv.add("/api/v1/query", b"hello", status=404)
        with PrometheusSource(srv.base, timeout_s=1) as prom, pytest.raises(ScrapeError) as info:
            prom.check()
    assert info.value.kind == "http_status" and "404" in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": "localhost:9090"}, "must start with http"),
        ({"url": "http://127.0.0.1:1", "max_points": 1}, "max_points"),
    ],
)
def test_source_bad_settings_raise_config_error(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PrometheusSource(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("window", "signals", "message"),
    [(1.5, None, "whole number"), (0, None, "whole number"), (60, ["nope"], "unknown signal")],
)
def test_windows_bad_arguments_raise_config_error(
    window: float, signals: list[str] | None, message: str
) -> None:
    with PrometheusSource("http://127.0.0.1:1") as prom, pytest.raises(ConfigError, match=message):
        prom.windows(0, 600, window, signals=signals)


def test_signal_query_tags_every_statistic() -> None:
    assert signal_query("preemptions_total", 60).count('"kvscope_stat"') == 4
    assert signal_query("kv_cache_usage_ratio", 60).count('"kvscope_stat"') == 5
    q = signal_query("ttft_seconds", 60)
    assert q.count("histogram_quantile(") == 3 and "[60s]" in q
    assert all(SIGNALS[s].kind in ("counter", "gauge", "histogram") for s in SIGNALS)


def test_derive_ratios_matches_rollup_semantics() -> None:
    def c(signal: str, delta: float | None, labels: tuple[tuple[str, str], ...] = ()) -> Window:
        return Window("s", signal, labels, 0.0, 60.0, "counter", 3, delta=delta)

    got = derive_ratios(
        [
            c("prefix_cache_hits_total", 30.0),
            c("prefix_cache_queries_total", 120.0),
            c("lmcache_hit_tokens_total", 5.0),
            c("lmcache_requested_tokens_total", 0.0),
            c("external_prefix_cache_hits_total", 1.0, (("engine", "1"),)),
            c("external_prefix_cache_queries_total", 4.0, (("engine", "0"),)),
        ]
    )
    by = {w.signal: w for w in got}
    assert set(by) == {"prefix_cache_hit_ratio", "lmcache_hit_ratio"}  # engine 0/1 never pair
    assert by["prefix_cache_hit_ratio"].mean == 0.25 and by["prefix_cache_hit_ratio"].delta == 120
    assert by["lmcache_hit_ratio"].mean is None and by["lmcache_hit_ratio"].delta == 0
