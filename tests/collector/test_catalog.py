"""The catalogue: table invariants, buckets against real expositions, PromQL helpers
(checked by promtool's PromQL engine), and the exporter round trip a simulator relies on."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from collector.parse import read_exposition
from collector.signal_index import build_index
from core import catalog
from core.catalog import (
    DERIVED_RATIOS,
    FACTS,
    SIGNALS,
    export_sample_name,
    export_spelling,
    exposed_names,
    promql_expr,
    promql_selector,
    token_buckets,
)
from core.errors import ConfigError

METRICS = Path(__file__).resolve().parent.parent / "fixtures" / "metrics"


def test_signals_table_every_signal_consistent() -> None:
    assert len(SIGNALS) >= 40
    for name, sig in SIGNALS.items():
        assert sig.name == name
        assert sig.kind in ("counter", "gauge", "histogram")
        assert sig.spellings[0].rank == 0, name
        assert sig.exported == sig.spellings[0].family
        assert sig.exported not in sig.aliases
        assert [s.rank for s in sig.spellings] == sorted(s.rank for s in sig.spellings)
        if sig.kind == "counter":
            # families are spelled as given to prometheus_client: no `_total` suffix
            assert not any(s.family.endswith("_total") for s in sig.spellings), name
        if sig.kind == "histogram":
            assert sig.buckets, name
            assert list(sig.buckets) == sorted(set(sig.buckets)), name
            assert all(math.isfinite(b) for b in sig.buckets), name
        else:
            assert sig.buckets == (), name


def test_signals_required_names_present() -> None:
    required = [
        "preemptions_total",
        "kv_cache_usage_ratio",
        "prefix_cache_queries_total",
        "prefix_cache_hits_total",
        "external_prefix_cache_queries_total",
        "external_prefix_cache_hits_total",
        "prompt_tokens_total",
        "generation_tokens_total",
        "request_success_total",
        "requests_running",
        "requests_waiting",
        "ttft_seconds",
        "e2e_latency_seconds",
        "queue_time_seconds",
        "inter_token_latency_seconds",
        "prefill_time_seconds",
        "decode_time_seconds",
        "request_prompt_tokens",
        "request_generation_tokens",
        "request_num_preemptions",
        "offload_bytes_total",
        "offload_seconds_total",
        "offload_cpu_usage_ratio",
        "offload_allocation_failures_total",
        "lmcache_requested_tokens_total",
        "lmcache_hit_tokens_total",
        "lmcache_hit_l1_tokens_total",
        "lmcache_hit_l2_tokens_total",
        "lmcache_l1_usage_bytes",
        "lmcache_l1_usage_ratio",
        "lmcache_l1_read_chunks_total",
        "lmcache_l1_write_chunks_total",
        "lmcache_l1_evicted_chunks_total",
        "lmcache_l1_allocation_failures_total",
        "lmcache_l2_store_completed_chunks_total",
        "lmcache_l2_load_completed_chunks_total",
        "lmcache_l2_evicted_chunks_total",
        "lmcache_l2_store_throughput_gbps",
        "lmcache_l2_load_throughput_gbps",
        "lmcache_retrieve_seconds",
        "lmcache_store_seconds",
        "lmcache_healthy",
        "router_requests_running",
        "router_requests_waiting",
        "prompt_tokens_cached_total",
        "prompt_tokens_by_source_total",
    ]
    assert sorted(set(required) - set(SIGNALS)) == []


def test_derived_ratios_reference_counter_signals() -> None:
    for ratio, num, den in DERIVED_RATIOS:
        assert ratio not in SIGNALS
        assert SIGNALS[num].kind == SIGNALS[den].kind == "counter"
    assert ("prefix_cache_hit_ratio", "prefix_cache_hits_total", "prefix_cache_queries_total") in (
        DERIVED_RATIOS
    )


def test_build_index_every_sample_name_one_signal() -> None:
    index, families = build_index()  # raises when two signals claim one sample name
    assert index["vllm:num_preemptions_total"][1] == "preemptions_total"
    assert index["vllm_num_preemptions_total"][1] == "preemptions_total"
    assert index["vllm:num_preemptions"][1] == "preemptions_total"
    assert index["vllm:gpu_cache_usage_perc"][1] == "kv_cache_usage_ratio"
    assert "vllm:time_to_first_token_seconds" in families
    for key, family in FACTS.items():
        assert index[family][1] == key


def test_exposed_names_counter_and_histogram_spellings() -> None:
    assert exposed_names("preemptions_total") == (
        "vllm:num_preemptions_total",
        "vllm_num_preemptions_total",
    )
    assert exposed_names("ttft_seconds", "count") == (
        "vllm:time_to_first_token_seconds_count",
        "vllm_time_to_first_token_seconds_count",
    )
    names = exposed_names("lmcache_hit_tokens_total")
    assert names[0] == "lmcache_mp_lookup_hit_tokens_total"
    assert "lmcache:num_hit_tokens_total" in names and "lmcache_num_hit_tokens_total" in names
    # a gauge whose name ends in `_total` keeps it as is
    assert exposed_names("router_healthy_pods")[0] == "vllm:healthy_pods_total"


def test_promql_selector_old_and_new_names_and_matchers() -> None:
    sel = promql_selector("kv_cache_usage_ratio", 'model_name="m"')
    assert sel.startswith('{__name__=~"vllm:kv_cache_usage_perc|vllm_kv_cache_usage_perc|')
    assert "vllm:gpu_cache_usage_perc" in sel and sel.endswith(',model_name="m"}')
    assert 'server=""' not in sel


@pytest.mark.parametrize(
    ("signal", "matcher"),
    [
        ("requests_running", 'server=""'),
        ("requests_waiting", 'server=""'),
        ("prefix_cache_hits_total", 'server=""'),  # router's vllm:gpu_prefix_cache_hits_total
        ("router_requests_running", 'server!=""'),
    ],
)
def test_promql_selector_router_collision_gets_server_matcher(signal: str, matcher: str) -> None:
    assert f",{matcher}" in promql_selector(signal)


def test_export_sample_name_current_spelling() -> None:
    assert export_sample_name("preemptions_total") == "vllm:num_preemptions_total"
    assert export_sample_name("kv_cache_usage_ratio") == "vllm:kv_cache_usage_perc"
    assert export_sample_name("ttft_seconds") == "vllm:time_to_first_token_seconds"
    assert export_sample_name("offload_bytes_total", {"direction": "store"}) == (
        "vllm:kv_offload_store_bytes_total"
    )
    assert export_sample_name("offload_bytes_total", {"direction": "load"}) == (
        "vllm:kv_offload_load_bytes_total"
    )
    assert catalog.CACHE_CONFIG_INFO == "vllm:cache_config_info"


def test_helpers_unknown_signal_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="no_such_signal"):
        promql_selector("no_such_signal")


def test_token_buckets_max_model_len_4096_ends_at_2000() -> None:
    assert token_buckets(4096)[-3:] == (500.0, 1000.0, 2000.0)
    assert token_buckets(10) == (1.0, 2.0, 5.0, 10.0)


@pytest.mark.parametrize(
    "fixture",
    [
        "vllm-0.33.0-metrics-full.txt",
        "vllm-0.11.0-metrics-hidden.txt",
        "lmcache-0.5.6-legacy-metrics.txt",
        "production-stack-router-metrics.txt",
    ],
)
def test_signal_buckets_match_real_exporter(fixture: str) -> None:
    snap = read_exposition((METRICS / fixture).read_text(), fixture, 0.0)
    checked = 0
    for s in snap.samples:
        if s.kind == "histogram":
            bounds = tuple(b for b, _ in s.buckets)
            assert bounds == (*SIGNALS[s.signal].buckets, math.inf), s.signal
            checked += 1
    assert checked > 0


def _render(signal: str, value: float, labels: dict[str, str], openmetrics: bool) -> str:
    """Render one canonical series the way a simulator would: through export_spelling()."""
    sig = SIGNALS[signal]
    spelling = export_spelling(signal, labels)
    names = list(spelling.labels)
    reg = CollectorRegistry()
    if sig.kind == "counter":
        c = Counter(spelling.family, sig.help, names, registry=reg)
        (c.labels(**{n: labels[n] for n in names}) if names else c).inc(value)
    elif sig.kind == "gauge":
        g = Gauge(spelling.family, sig.help, names, registry=reg)
        (g.labels(**{n: labels[n] for n in names}) if names else g).set(value)
    else:
        h = Histogram(spelling.family, sig.help, names, registry=reg, buckets=sig.buckets)
        (h.labels(**{n: labels[n] for n in names}) if names else h).observe(value)
    out: bytes = generate_openmetrics(reg) if openmetrics else generate_latest(reg)  # type: ignore[no-untyped-call]
    return out.decode()


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text-0.0.4", "openmetrics"])
def test_export_spelling_round_trip_every_signal(openmetrics: bool) -> None:
    for name, sig in SIGNALS.items():
        labels = {n: f"v-{n}" for n in sig.labels}
        if "direction" in labels:
            labels["direction"] = "store"
        text = _render(name, 2.5, labels, openmetrics)
        snap = read_exposition(text, name, 0.0)
        got = [s for s in snap.samples if s.signal == name]
        assert len(got) == 1, (name, text)
        assert dict(got[0].labels) == labels, name
        assert got[0].value == (1.0 if sig.kind == "histogram" else 2.5), name
        assert snap.unknown_families == (), name


def _promtool_test(
    tmp_path: Path, series: list[tuple[str, str]], expr: str, expect: list[dict[str, object]]
) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (make test installs it)")
    doc = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "promql_expr_test": [
                    {"expr": expr, "eval_time": "10m", "exp_samples": expect},
                ],
            }
        ],
    }
    path = tmp_path / "t.yml"
    path.write_text(yaml.safe_dump(doc))
    proc = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promql_expr_deprecated_offload_names_not_double_counted(tmp_path: Path) -> None:
    series = [
        ('vllm:kv_offload_load_bytes_total{engine="0",model_name="m"}', "0+10x10"),
        ('vllm:kv_offload_store_bytes_total{engine="0",model_name="m"}', "0+1x10"),
        # deprecated duplicates of engine 0 (different values: must lose) ...
        ('vllm:kv_offload_total_bytes_total{engine="0",model_name="m",transfer_type="CPU_to_GPU"}',
         "0+99x10"),
        ('vllm:kv_offload_total_bytes_total{engine="0",model_name="m",transfer_type="GPU_to_CPU"}',
         "0+99x10"),
        # ... and engine 1 exposing only the 0.16-era names (must be used)
        ('vllm:kv_offload_total_bytes_total{engine="1",model_name="m",transfer_type="GPU_to_CPU"}',
         "0+7x10"),
    ]  # fmt: skip
    expr = f"sum by (direction, engine) ({promql_expr('offload_bytes_total')})"
    expect = [
        {"labels": '{direction="load",engine="0"}', "value": 100},
        {"labels": '{direction="store",engine="0"}', "value": 10},
        {"labels": '{direction="store",engine="1"}', "value": 70},
    ]
    _promtool_test(tmp_path, series, expr, expect)
    rate_expr = promql_expr("offload_bytes_total", 'engine="1"', range_fn="rate", window="5m")
    _promtool_test(
        tmp_path,
        series,
        f"sum by (direction) ({rate_expr})",
        [{"labels": '{direction="store"}', "value": 7 / 60}],
    )


def test_promql_expr_engine_signal_excludes_router_series(tmp_path: Path) -> None:
    series = [
        ('vllm:num_requests_running{engine="0",model_name="m"}', "3x10"),
        ('vllm:num_requests_running{server="http://10.0.0.5:8000"}', "40x10"),
        ('vllm_num_requests_running{engine="1",model_name="m"}', "2x10"),
    ]
    _promtool_test(
        tmp_path, series, f"sum({promql_expr('requests_running')})", [{"labels": "{}", "value": 5}]
    )
    _promtool_test(
        tmp_path,
        series,
        f"sum({promql_selector('router_requests_running')})",
        [{"labels": "{}", "value": 40}],
    )


def test_promql_expr_old_gauge_name_dropped_where_new_exists(tmp_path: Path) -> None:
    series = [
        ('vllm:kv_cache_usage_perc{engine="0",model_name="m"}', "0.4x10"),
        ('vllm:gpu_cache_usage_perc{engine="0",model_name="m"}', "0.9x10"),
        ('vllm:gpu_cache_usage_perc{engine="1",model_name="m"}', "0.7x10"),
    ]
    expr = promql_expr("kv_cache_usage_ratio", 'model_name="m"')
    _promtool_test(
        tmp_path,
        series,
        f"max by (engine) ({expr})",
        [{"labels": '{engine="0"}', "value": 0.4}, {"labels": '{engine="1"}', "value": 0.7}],
    )


def _matrix(name: str) -> dict[str, object]:
    data = json.loads((METRICS / name).read_text())
    assert isinstance(data, dict)
    return data


# OTel -> Prometheus: the exporter appends the instrument's unit unless already a suffix.
_OTEL_UNIT_SUFFIXES = ("", "_chunks", "_tokens", "_requests", "_bytes", "_seconds",
                       "_GB_per_second")  # fmt: skip


def test_catalogue_spellings_exist_in_vendor_source() -> None:
    """Every vLLM/LMCache family in the catalogue is a literal in some release's source
    (vllm 0.11-0.33, lmcache 0.5.0-0.5.6, from the name matrices): catches typos."""
    vllm_literals: set[str] = set()
    for names in _matrix("vllm-metric-name-matrix.json")["literal"].values():  # type: ignore[attr-defined]
        vllm_literals.update(names)
    lmcache_literals: set[str] = set()
    for names in _matrix("lmcache-metric-name-matrix.json").values():
        lmcache_literals.update(names)  # type: ignore[arg-type]
    otel = {n.replace(".", "_") for n in lmcache_literals if n.startswith("lmcache_mp.")}
    checked = 0
    for sig in SIGNALS.values():
        for sp in sig.spellings:
            family = sp.family
            if sig.source == "router":
                continue  # the router is not in the matrices (production-stack repository)
            if family.startswith("lmcache_mp_"):
                ok = any(family == base + sfx for base in otel for sfx in _OTEL_UNIT_SUFFIXES)
            elif family.startswith("lmcache:"):
                ok = family in lmcache_literals
            else:
                ok = family in vllm_literals or family in lmcache_literals
            assert ok, f"{sig.name}: {family} is not a metric name in any release"
            checked += 1
    assert checked >= 60
    for family in (catalog.CACHE_CONFIG_INFO, catalog.KV_OFFLOAD_CONFIG_INFO):
        assert family in vllm_literals
