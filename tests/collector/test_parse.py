"""read_exposition on every real exposition in tests/fixtures/metrics and on malformed input.

Expected values were read from the fixture text by eye (e.g. line 489 of
vllm-0.33.0-metrics-full.txt: ``vllm:num_preemptions_total{engine="0",…} 3.0``).
"""

from __future__ import annotations

import math
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from collector.parse import ExpositionReader, read_exposition, thread_reader
from core.catalog import SIGNALS, exposed_names
from core.errors import ParseError
from core.records import SignalSample, Snapshot

METRICS = Path(__file__).resolve().parent.parent / "fixtures" / "metrics"
ENGINE0 = {"engine": "0", "model_name": "tiny-llama"}
LEGACY = {"model_name": "tiny-llama", "role": "worker", "served_model_name": "tiny-llama",
          "worker_id": "0"}  # fmt: skip


def read(name: str) -> Snapshot:
    return read_exposition((METRICS / name).read_text(), name, 1_800_000_000.0)


def series(snap: Snapshot, signal: str) -> dict[frozenset[tuple[str, str]], SignalSample]:
    return {frozenset(s.labels): s for s in snap.samples if s.signal == signal}


def one(snap: Snapshot, signal: str, **labels: str) -> SignalSample:
    got = series(snap, signal)
    return got[frozenset(labels.items())]


def signals(snap: Snapshot) -> set[str]:
    return {s.signal for s in snap.samples}


# ---- every fixture -----------------------------------------------------------------------

ALL_FIXTURES = sorted(p.name for p in METRICS.glob("*.txt"))


def test_fixture_list_complete() -> None:
    assert len(ALL_FIXTURES) == 12


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_read_exposition_fixture_no_created_no_duplicates(name: str) -> None:
    snap = read(name)
    assert snap.target == name and snap.timestamp == 1_800_000_000.0
    keys = [(s.signal, s.labels) for s in snap.samples]
    assert len(keys) == len(set(keys))
    assert all(s.signal in SIGNALS and s.kind == SIGNALS[s.signal].kind for s in snap.samples)
    assert not any("created" in s.signal for s in snap.samples)
    assert not any(f.endswith("_created") for f in snap.unknown_families)
    assert list(snap.unknown_families) == sorted(set(snap.unknown_families))
    for s in snap.samples:
        if s.kind == "histogram":
            bounds = [b for b, _ in s.buckets]
            assert bounds == sorted(bounds) and bounds[-1] == math.inf
            assert s.value == s.buckets[-1][1]


# (fixture, number of canonical series, {signal: value for ENGINE0})
VLLM_DEFAULTS = [
    ("vllm-0.11.0-metrics-default.txt", 22, 1.0),
    ("vllm-0.11.0-metrics-hidden.txt", 22, 1.0),
    ("vllm-0.15.0-metrics-default.txt", 26, 1.0),
    ("vllm-0.20.0-metrics-default.txt", 33, 2.0),
    ("vllm-0.26.0-metrics-default.txt", 33, 2.0),
    ("vllm-0.33.0-metrics-default.txt", 41, 2.0),
    ("vllm-0.33.0-metrics-default-multiproc.txt", 41, 2.0),
    ("vllm-0.33.0-metrics-default-http.txt", 41, 2.0),
]


@pytest.mark.parametrize(("name", "count", "waiting"), VLLM_DEFAULTS)
def test_read_exposition_vllm_default_core_values(name: str, count: int, waiting: float) -> None:
    snap = read(name)
    assert len(snap.samples) == count
    assert one(snap, "preemptions_total", **ENGINE0).value == 3.0
    assert one(snap, "kv_cache_usage_ratio", **ENGINE0).value == 0.42
    assert one(snap, "prefix_cache_queries_total", **ENGINE0).value == 1536.0
    assert one(snap, "prefix_cache_hits_total", **ENGINE0).value == 768.0
    assert one(snap, "prompt_tokens_total", **ENGINE0).value == 1536.0
    assert one(snap, "generation_tokens_total", **ENGINE0).value == 120.0
    assert one(snap, "requests_running", **ENGINE0).value == 3.0
    assert one(snap, "requests_waiting", **ENGINE0).value == waiting
    stop = one(snap, "request_success_total", finished_reason="stop", **ENGINE0)
    assert stop.value == 3.0
    ttft = one(snap, "ttft_seconds", **ENGINE0)
    assert (ttft.value, ttft.sum) == (3.0, 0.135)
    assert ttft.buckets[:7] == ((0.001, 0.0), (0.005, 0.0), (0.01, 0.0), (0.02, 0.0),
                                (0.04, 0.0), (0.06, 3.0), (0.08, 3.0))  # fmt: skip
    itl = one(snap, "inter_token_latency_seconds", **ENGINE0)
    assert (itl.value, itl.sum) == (6.0, 0.081)
    assert snap.facts["cache_config"][0]["num_gpu_blocks"] == "1024"
    assert snap.facts["cache_config"][0]["block_size"] == "16"
    assert snap.facts["cache_config"][0]["engine"] == "0"


def test_read_exposition_vllm_0_33_full_two_engines_offload_and_facts() -> None:
    snap = read("vllm-0.33.0-metrics-full.txt")
    assert len(snap.samples) == 108
    for engine in ("0", "1"):
        labels = {"engine": engine, "model_name": "tiny-llama"}
        assert one(snap, "preemptions_total", **labels).value == 3.0
        assert one(snap, "external_prefix_cache_queries_total", **labels).value == 768.0
        assert one(snap, "external_prefix_cache_hits_total", **labels).value == 384.0
        assert one(snap, "offload_cpu_usage_ratio", **labels).value == 0.25
        assert one(snap, "lmcache_mp_lookup_seconds", **labels).sum == 0.0036
    assert len(series(snap, "preemptions_total")) == 2
    facts = snap.facts
    assert sorted(f["engine"] for f in facts["cache_config"]) == ["0", "1"]
    assert all(f["kv_offloading_backend"] == "native" for f in facts["cache_config"])
    assert facts["kv_offload_config"][1] == {
        "cpu_blocks_per_chunk": "example", "cpu_kv_cache_size_bytes": "example",
        "cpu_kv_cache_size_tokens": "example", "cpu_num_chunks": "example", "engine": "1",
        "model_name": "tiny-llama",
    }  # fmt: skip
    assert "vllm:spec_decode_num_drafts_total" in snap.unknown_families
    assert "vllm:lora_requests_info" in snap.unknown_families
    assert "python_gc_objects_collected_total" in snap.unknown_families


def test_read_exposition_offload_deprecated_transfer_type_not_double_counted() -> None:
    snap = read("vllm-0.33.0-metrics-full.txt")
    got = series(snap, "offload_bytes_total")
    assert len(got) == 4  # 2 engines x {load, store}, not 8
    assert {dict(k)["direction"] for k in got} == {"load", "store"}
    assert all("transfer_type" not in dict(k) for k in got)
    assert one(snap, "offload_bytes_total", direction="load", **ENGINE0).value == 12288.0
    assert len(series(snap, "offload_seconds_total")) == 4
    size = one(snap, "offload_transfer_size_bytes", direction="store", **ENGINE0)
    assert (size.value, size.sum) == (3.0, 36000000.0)
    assert [b for b, _ in size.buckets][:3] == [1e6, 5e6, 1e7]  # "1e+06" < "5e+06" numerically


def _without_lines(text: str, prefix: str) -> str:
    return "\n".join(line for line in text.split("\n") if not line.startswith(prefix))


def test_read_exposition_only_deprecated_offload_names_map_transfer_type() -> None:
    text = (METRICS / "vllm-0.33.0-metrics-full.txt").read_text()
    for flat in ("load", "store"):
        text = _without_lines(text, f"vllm:kv_offload_{flat}_bytes_total")
    snap = read_exposition(text, "t", 0.0)
    got = series(snap, "offload_bytes_total")
    assert len(got) == 4
    assert one(snap, "offload_bytes_total", direction="store", **ENGINE0).value == 12288.0


def test_read_exposition_deprecated_offload_value_differs_current_wins() -> None:
    text = (METRICS / "vllm-0.33.0-metrics-full.txt").read_text()
    text = text.replace(
        'vllm:kv_offload_total_bytes_total{engine="0",model_name="tiny-llama",'
        'transfer_type="CPU_to_GPU"} 12288.0',
        'vllm:kv_offload_total_bytes_total{engine="0",model_name="tiny-llama",'
        'transfer_type="CPU_to_GPU"} 99.0',
    )
    assert "} 99.0" in text
    snap = read_exposition(text, "t", 0.0)
    assert one(snap, "offload_bytes_total", direction="load", **ENGINE0).value == 12288.0


def test_read_exposition_vllm_0_11_hidden_old_names_map_when_alone() -> None:
    text = (METRICS / "vllm-0.11.0-metrics-hidden.txt").read_text()
    for new in ("vllm:kv_cache_usage_perc", "vllm:prefix_cache_", "vllm:inter_token_latency"):
        text = _without_lines(text, new)
    snap = read_exposition(text, "hidden", 0.0)
    assert one(snap, "kv_cache_usage_ratio", **ENGINE0).value == 0.42  # gpu_cache_usage_perc
    assert one(snap, "prefix_cache_hits_total", **ENGINE0).value == 768.0
    assert one(snap, "prefix_cache_queries_total", **ENGINE0).value == 1536.0
    itl = one(snap, "inter_token_latency_seconds", **ENGINE0)  # time_per_output_token_seconds
    assert (itl.value, itl.sum) == (6.0, 0.081)


def test_read_exposition_vllm_0_11_hidden_both_names_current_wins() -> None:
    text = (METRICS / "vllm-0.11.0-metrics-hidden.txt").read_text()
    text = text.replace(
        'vllm:gpu_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.42',
        'vllm:gpu_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.99',
    )
    snap = read_exposition(text, "hidden", 0.0)
    assert len(series(snap, "kv_cache_usage_ratio")) == 1
    assert one(snap, "kv_cache_usage_ratio", **ENGINE0).value == 0.42
    assert "vllm:gpu_cache_usage_perc" not in snap.unknown_families


def test_read_exposition_router_feeds_router_signals_only() -> None:
    snap = read("production-stack-router-metrics.txt")
    server = "http://10.0.0.5:8000"
    assert one(snap, "router_requests_running", server=server).value == 4.0
    assert one(snap, "router_requests_waiting", server=server).value == 0.0
    assert one(snap, "router_qps", server=server).value == 1.5
    assert one(snap, "router_healthy_pods", server=server).value == 1.0
    assert one(snap, "router_incoming_requests_total", model="tiny-llama").value == 10.0
    lat = one(snap, "router_request_latency_seconds", model="tiny-llama", server=server,
              status="success")  # fmt: skip
    assert (lat.value, lat.sum) == (1.0, 2.1)
    assert not signals(snap) & {"requests_running", "requests_waiting", "prefix_cache_hits_total",
                                "prefix_cache_queries_total"}  # fmt: skip
    # the router's gauges named like old engine counters are reported, not mis-read
    assert "vllm:gpu_prefix_cache_hits_total" in snap.unknown_families
    assert "router_cpu_usage_percent" in snap.unknown_families


def test_read_exposition_engine_and_router_in_one_text_kept_apart() -> None:
    text = (
        'vllm:num_requests_running{engine="0",model_name="m"} 3\n'
        'vllm:num_requests_running{server="http://a:8000"} 7\n'
    )
    snap = read_exposition(text, "t", 0.0)
    assert [(s.signal, s.value) for s in snap.samples] == [
        ("requests_running", 3.0),
        ("router_requests_running", 7.0),
    ]


def test_read_exposition_multiproc_matches_single_process() -> None:
    single = read("vllm-0.33.0-metrics-default.txt")
    multi = read("vllm-0.33.0-metrics-default-multiproc.txt")
    assert set(single.samples) == set(multi.samples)
    assert single.facts == multi.facts
    extra = set(single.unknown_families) - set(multi.unknown_families)
    assert extra and all(f.startswith(("python_", "process_")) for f in extra)


def test_read_exposition_http_capture_first_line_is_a_comment() -> None:
    http = read("vllm-0.33.0-metrics-default-http.txt")
    plain = read("vllm-0.33.0-metrics-default.txt")
    assert set(http.samples) == set(plain.samples)
    assert "http_requests_total" in http.unknown_families
    assert "http_request_duration_seconds" in http.unknown_families


@pytest.mark.parametrize(
    ("name", "old", "new"),
    [
        ("vllm-0.33.0-metrics-full.txt", "vllm:", "vllm_"),
        ("vllm-0.11.0-metrics-hidden.txt", "vllm:", "vllm_"),
        ("lmcache-0.5.6-legacy-metrics.txt", "lmcache:", "lmcache_"),
    ],
)
def test_read_exposition_colon_rewritten_identical_signals(name: str, old: str, new: str) -> None:
    text = (METRICS / name).read_text()
    rewritten = text.replace(old, new)
    assert old not in rewritten
    a = read_exposition(text, name, 0.0)
    b = read_exposition(rewritten, name, 0.0)
    assert a.samples == b.samples
    assert a.facts == b.facts
    assert len(a.unknown_families) == len(b.unknown_families)


def test_read_exposition_lmcache_legacy_values() -> None:
    snap = read("lmcache-0.5.6-legacy-metrics.txt")
    assert one(snap, "lmcache_requested_tokens_total", **LEGACY).value == 1536.0
    assert one(snap, "lmcache_hit_tokens_total", **LEGACY).value == 768.0
    assert one(snap, "lmcache_lookups_total", **LEGACY).value == 3.0
    assert one(snap, "lmcache_stored_tokens_total", **LEGACY).value == 1536.0
    assert one(snap, "lmcache_l1_usage_bytes", **LEGACY).value == 3.221225472e09
    assert one(snap, "lmcache_disk_usage_bytes", **LEGACY).value == 5.36870912e09
    assert one(snap, "lmcache_remote_usage_bytes", **LEGACY).value == 1.073741824e09
    assert one(snap, "lmcache_l1_evicted_chunks_total", **LEGACY).value == 4.0
    assert one(snap, "lmcache_healthy", **LEGACY).value == 0.0
    retrieve = one(snap, "lmcache_retrieve_seconds", **LEGACY)
    assert (retrieve.value, retrieve.sum) == (3.0, 0.006428598000638885)
    assert retrieve.buckets[:2] == ((0.001, 0.0), (0.005, 3.0))
    assert one(snap, "lmcache_store_seconds", **LEGACY).value == 3.0
    assert len(snap.samples) == 11
    assert "lmcache:retrieve_speed" in snap.unknown_families
    # declared histograms without samples are still reported
    assert "lmcache:retrieve_process_tokens_time" in snap.unknown_families


def test_read_exposition_lmcache_mp_idle_server() -> None:
    snap = read("lmcache-0.5.6-mp-server-idle-metrics.txt")
    tag = {"backend": "dram", "l1_tag": "_default"}
    assert one(snap, "lmcache_l1_usage_bytes", **tag).value == 0.0
    assert one(snap, "lmcache_l1_usage_ratio", **tag).value == 0.0
    assert len(snap.samples) == 2
    target = snap.facts["lmcache_target"][0]
    assert target["service_instance_id"] == "fixture-instance"
    assert target["telemetry_sdk_version"] == "1.40.0"
    assert "lmcache_mp_l1_eviction_loop_ticks_total" in snap.unknown_families


def test_read_exposition_lmcache_mp_events_hit_and_tiers() -> None:
    # MP families as the OTel exporter renders them after traffic (reference §3.2).
    text = """# HELP lmcache_mp_lookup_requested_tokens_total Total tokens submitted for lookup
# TYPE lmcache_mp_lookup_requested_tokens_total counter
lmcache_mp_lookup_requested_tokens_total{model_name="tiny-llama"} 2048.0
# TYPE lmcache_mp_lookup_hit_tokens_total counter
lmcache_mp_lookup_hit_tokens_total{model_name="tiny-llama"} 1024.0
lmcache_mp_lookup_hit_tokens_total{cache_salt="s1",model_name="tiny-llama"} 256.0
# TYPE lmcache_mp_l1_write_chunks_total counter
lmcache_mp_l1_write_chunks_total{l1_tag="_default"} 12.0
# TYPE lmcache_mp_l2_store_throughput_GB_per_second histogram
lmcache_mp_l2_store_throughput_GB_per_second_bucket{l2_name="disk",le="0.0"} 0.0
lmcache_mp_l2_store_throughput_GB_per_second_bucket{l2_name="disk",le="5.0"} 2.0
lmcache_mp_l2_store_throughput_GB_per_second_bucket{l2_name="disk",le="10.0"} 3.0
lmcache_mp_l2_store_throughput_GB_per_second_bucket{l2_name="disk",le="+Inf"} 3.0
lmcache_mp_l2_store_throughput_GB_per_second_count{l2_name="disk"} 3.0
lmcache_mp_l2_store_throughput_GB_per_second_sum{l2_name="disk"} 14.5
"""
    snap = read_exposition(text, "mp", 0.0)
    assert one(snap, "lmcache_requested_tokens_total", model_name="tiny-llama").value == 2048.0
    assert one(snap, "lmcache_hit_tokens_total", model_name="tiny-llama").value == 1024.0
    assert one(snap, "lmcache_hit_tokens_total", cache_salt="s1", model_name="tiny-llama").value
    assert one(snap, "lmcache_l1_write_chunks_total", l1_tag="_default").value == 12.0
    tput = one(snap, "lmcache_l2_store_throughput_gbps", l2_name="disk")
    assert tput.buckets == ((0.0, 0.0), (5.0, 2.0), (10.0, 3.0), (math.inf, 3.0))
    assert (tput.value, tput.sum) == (3.0, 14.5)


# ---- format variants ----------------------------------------------------------------------


def test_read_exposition_openmetrics_eof_unit_timestamps_exemplar() -> None:
    text = """# TYPE vllm:num_preemptions counter
# UNIT vllm:num_preemptions preemptions
# HELP vllm:num_preemptions Cumulative number of preemption from the engine.
vllm:num_preemptions_total{engine="0",model_name="m"} 4.0 1700000000.5
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e+09
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="m"} 1 # {trace_id="ab"} 0.7
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 2
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 3.5
# EOF
"""
    snap = read_exposition(text, "om", 0.0)
    assert one(snap, "preemptions_total", engine="0", model_name="m").value == 4.0
    e2e = one(snap, "e2e_latency_seconds", engine="0", model_name="m")
    assert e2e.buckets == ((1.0, 1.0), (math.inf, 2.0))
    assert snap.unknown_families == ()


def test_read_exposition_counter_without_total_and_unordered_buckets() -> None:
    pairs = (("0.3", 1), ("120.0", 4), ("1e+06", 4), ("5.0", 2), ("+Inf", 4))
    lines = [
        f'vllm:request_queue_time_seconds_bucket{{engine="0",le="{le}"}} {c}' for le, c in pairs
    ]
    random.Random(7).shuffle(lines)
    text = "\n".join(["vllm:num_preemptions 2", *lines]) + "\n"
    snap = read_exposition(text, "t", 0.0)
    assert one(snap, "preemptions_total").value == 2.0
    q = one(snap, "queue_time_seconds", engine="0")
    assert q.buckets == ((0.3, 1.0), (5.0, 2.0), (120.0, 4.0), (1e6, 4.0), (math.inf, 4.0))
    assert (q.value, q.sum) == (4.0, None)  # no _count: the +Inf bucket; no _sum: None


def test_read_exposition_escaped_label_values_kept_exactly() -> None:
    text = (
        'vllm:num_preemptions_total{model_name="a,b}c=d \\"q\\" \\\\ \\n end",engine="0"} 1\n'
        'vllm:num_requests_running { engine = "0" , model_name = "x" , } 2\n'
    )
    snap = read_exposition(text, "t", 0.0)
    assert one(snap, "preemptions_total", engine="0", model_name='a,b}c=d "q" \\ \n end')
    assert one(snap, "requests_running", engine="0", model_name="x").value == 2.0


def test_read_exposition_non_finite_gauges_kept() -> None:
    text = "vllm:kv_cache_usage_perc NaN\nvllm:num_requests_running +Inf\n"
    text += "vllm:num_requests_waiting -Inf\n"
    snap = read_exposition(text, "t", 0.0)
    assert math.isnan(one(snap, "kv_cache_usage_ratio").value)
    assert one(snap, "requests_running").value == math.inf
    assert one(snap, "requests_waiting").value == -math.inf


def test_reader_label_cache_bounded_results_unchanged() -> None:
    text = (METRICS / "vllm-0.33.0-metrics-full.txt").read_text()
    small = ExpositionReader(cache_limit=16)
    first = small.read(text, "t", 0.0)
    second = small.read(text, "t", 0.0)
    assert len(small._labels) <= 16
    assert first.samples == second.samples == read_exposition(text, "t", 0.0).samples


# ---- malformed input ---------------------------------------------------------------------

OK = 'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
TTFT = "vllm:time_to_first_token_seconds"
MALFORMED = [
    ("bad value", OK + 'vllm:num_preemptions_total{engine="0"} 1,5\n', 2, "bad value"),
    ("underscore value", "vllm:num_preemptions_total 1_000\n", 1, "bad value"),
    ("unterminated value", OK + 'vllm:num_preemptions_total{engine="0} 1\n', 2, "unterminated"),
    ("unterminated unknown", OK + 'foo{a="b} 1\n', 2, "unterminated"),
    ("bad escape", OK + OK.replace('"m"', '"a\\tb"'), 2, "bad escape"),
    ("duplicate label", '# c\nvllm:num_preemptions_total{engine="0",engine="1"} 1\n', 2,
     "duplicate label name 'engine'"),
    ("unquoted value", OK + "foo{a=b} 1\n", 2, "double-quoted"),
    ("missing name", "# c\n" + OK + '{engine="0"} 1\n', 3, "missing metric name"),
    ("missing value", OK + 'vllm:num_preemptions_total{engine="0"}\n', 2, "missing value"),
    ("text after value", OK + "foo 1 2 3\n", 2, "unexpected text"),
    ("bad timestamp", OK + "foo 1 soon\n", 2, "bad timestamp"),
    ("unclosed labels", OK + 'foo{a="b" 1\n', 2, "expected ',' or '}'"),
    ("unclosed no quote", OK + "foo{a 1\n", 2, "not closed by '}'"),
    ("bad name char", OK + "foo-bar 1\n", 2, "invalid character '-'"),
    ("bad type", "# TYPE foo frequency\nfoo 1\n", 1, "unknown metric type"),
    ("after EOF", OK + "# EOF\n" + OK, 3, "after '# EOF'"),
    ("__name__ in braces", OK + 'vllm:num_preemptions_total{__name__="x",engine="0"} 1\n', 2,
     "'__name__' inside the braces"),
    ("__name__ in braces, unknown family", OK + 'foo{a="1", __name__ = "foo"} 1\n', 2,
     "'__name__' inside the braces"),
    ("__name__ only", OK + '{__name__="foo"} 1\n', 2, "missing metric name"),
    ("comment-like text after blanks", "  #TYPE\n" + OK + "  foo#bar 1\n", 3,
     "invalid character '#'"),
]  # fmt: skip
# Value anomalies keep the scrape (collector/DESIGN.md#parse): they are ANOMALIES below.


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [pytest.param(t, n, r, id=i) for i, t, n, r in MALFORMED],
)
def test_read_exposition_malformed_raises_parse_error_with_line(
    text: str, line: int, reason: str
) -> None:
    with pytest.raises(ParseError) as info:
        read_exposition(text, "http://e:8000/metrics", 0.0)
    assert info.value.line == line, str(info.value)
    assert info.value.target == "http://e:8000/metrics"
    assert reason in info.value.reason
    assert str(info.value).startswith(f"http://e:8000/metrics:{line}: ")


def test_read_exposition_malformed_in_real_fixture_names_its_line() -> None:
    lines = (METRICS / "vllm-0.33.0-metrics-full.txt").read_text().split("\n")
    assert lines[488].startswith('vllm:num_preemptions_total{engine="0"')  # line 489
    lines[488] = lines[488].replace("} 3.0", "} three")
    with pytest.raises(ParseError) as info:
        read_exposition("\n".join(lines), "full", 0.0)
    assert (info.value.line, info.value.reason) == (489, "bad value 'three'")


def test_reader_warm_cache_reads_new_values_and_rejects_bad_ones() -> None:
    reader = ExpositionReader()
    text = (METRICS / "vllm-0.33.0-metrics-full.txt").read_text()
    reader.read(text, "t", 0.0)  # every prefix is cached now
    changed = text.replace(
        'vllm:num_preemptions_total{engine="1",model_name="tiny-llama"} 3.0',
        'vllm:num_preemptions_total{engine="1",model_name="tiny-llama"} 7.0',
    )
    snap = reader.read(changed, "t", 0.0)
    assert one(snap, "preemptions_total", engine="1", model_name="tiny-llama").value == 7.0
    assert one(snap, "preemptions_total", **ENGINE0).value == 3.0
    with pytest.raises(ParseError) as info:
        reader.read(changed.replace("} 7.0", "} 7.0.1"), "t", 0.0)
    assert info.value.line == 490 and "bad value '7.0.1'" in info.value.reason


def test_read_exposition_repeated_identical_type_line_accepted() -> None:
    text = "# TYPE foo gauge\nfoo 1\n# TYPE foo gauge\nvllm:num_preemptions_total 1\n"
    snap = read_exposition(text, "t", 0.0)
    assert snap.unknown_families == ("foo",)
    assert one(snap, "preemptions_total").value == 1.0


# ---- one reader per thread --------------------------------------------------------------------


def test_thread_reader_same_thread_reuses_other_thread_gets_its_own() -> None:
    mine = thread_reader()
    assert thread_reader() is mine
    seen: list[ExpositionReader] = []
    worker = threading.Thread(target=lambda: seen.append(thread_reader()), daemon=True)
    worker.start()
    worker.join()
    assert len(seen) == 1 and seen[0] is not mine


def test_read_exposition_concurrent_threads_same_snapshots_as_serial() -> None:
    """64 reads at once from 16 worker threads (as the collector's asyncio.to_thread does)
    give exactly the snapshots one reader gives serially."""
    names = sorted(p.name for p in METRICS.glob("*.txt"))
    texts = {n: (METRICS / n).read_text() for n in names}
    serial = {n: ExpositionReader().read(texts[n], n, 1.0) for n in names}
    jobs = [names[i % len(names)] for i in range(64)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        got = list(pool.map(lambda n: (n, read_exposition(texts[n], n, 1.0)), jobs))
    for name, snap in got:
        assert snap == serial[name], name


# ---- value anomalies: kept or dropped per series, never a ParseError ------------------------

RUN = exposed_names("requests_running")[0]  # a gauge
PRE = exposed_names("preemptions_total")[0]  # a counter, with _total
BKT, CNT, SUM = (exposed_names("ttft_seconds", p)[0] for p in ("bucket", "count", "sum"))
GOOD = f'{RUN}{{engine="0"}} 1\n'


def _hist(*buckets: tuple[str, str], count: str | None = "2", total: str | None = "1.5") -> str:
    lines = [f'{BKT}{{engine="0",le="{le}"}} {c}' for le, c in buckets]
    lines += [f'{CNT}{{engine="0"}} {count}'] if count is not None else []
    lines += [f'{SUM}{{engine="0"}} {total}'] if total is not None else []
    return "\n".join(lines) + "\n"


H = _hist(("1.0", "1"), ("+Inf", "2"))  # lines 1-4: two buckets, count, sum
NO_SUM = object()  # the histogram has no sum
# (id, text, [(kind, line, dropped)], {signal: value (histogram: (count, sum, buckets)) or None
#  for absent}) -- every row also keeps GOOD's requests_running == 1 on the last line.
ANOMALIES = [
    ("NaN counter", f"{PRE} NaN\n", [("nan", 1, True)], {"preemptions_total": None}),
    ("+Inf counter", f"{PRE} +Inf\n", [("inf", 1, True)], {"preemptions_total": None}),
    ("-Inf counter", f"{PRE} -Inf\n", [("inf", 1, True)], {"preemptions_total": None}),
    ("negative counter", f"{PRE} -1\n", [("negative_counter", 1, True)],
     {"preemptions_total": None}),
    ("NaN counter, lower case", f"{PRE} nan\n", [("nan", 1, True)], {"preemptions_total": None}),
    ("NaN gauge kept", f"{exposed_names('requests_waiting')[0]} NaN\n", [("nan", 1, False)],
     {"requests_waiting": math.nan}),
    ("+Inf gauge kept", f'{exposed_names("kv_cache_usage_ratio")[0]}{{engine="0"}} +Inf\n',
     [("inf", 1, False)], {"kv_cache_usage_ratio": math.inf}),
    ("duplicate series, first stands", f"{PRE} 3\n{PRE} 7\n{PRE} 8\n",
     [("duplicate_series", 2, True), ("duplicate_series", 3, True)], {"preemptions_total": 3.0}),
    ("duplicate without _total", f"{PRE} 3\n{PRE.removesuffix('_total')} 4\n",
     [("duplicate_series", 2, True)], {"preemptions_total": 3.0}),
    ("duplicate in the underscore spelling", f"{PRE} 3\n{PRE.replace(':', '_')} 4\n",
     [("duplicate_series", 2, True)], {"preemptions_total": 3.0}),
    ("duplicate across two current spellings (LMCache MP and legacy)",
     "".join(f"{n} {v}\n" for n, v in zip(
         [n for n in exposed_names("lmcache_hit_tokens_total") if ":" in n or "_mp_" in n][:2],
         (5, 6), strict=True)),
     [("duplicate_series", 2, True)], {"lmcache_hit_tokens_total": 5.0}),
    ("NaN then a valid duplicate: the valid one", f"{PRE} NaN\n{PRE} 4\n", [("nan", 1, True)],
     {"preemptions_total": 4.0}),
    ("conflicting TYPE kept", f"# TYPE foo gauge\nfoo 1\n# TYPE foo counter\n{PRE} 2\n",
     [("type_conflict", 3, False)], {"preemptions_total": 2.0}),
    ("conflicting TYPE of a signal's family", f"# TYPE {PRE} counter\n# TYPE {PRE} gauge\n"
     f"{PRE} 2\n", [("type_conflict", 2, False)], {"preemptions_total": 2.0}),
    ("NaN bucket drops the histogram", _hist(("1.0", "NaN"), ("+Inf", "2")), [("nan", 1, True)],
     {"ttft_seconds": None}),
    ("negative bucket drops the histogram", _hist(("1.0", "1"), ("+Inf", "-2")),
     [("negative_counter", 2, True)], {"ttft_seconds": None}),
    ("NaN count: the +Inf bucket counts", _hist(("1.0", "1"), ("+Inf", "2"), count="NaN"),
     [("nan", 3, True)], {"ttft_seconds": (2.0, 1.5, ((1.0, 1.0), (math.inf, 2.0)))}),
    ("negative count: the +Inf bucket counts", _hist(("+Inf", "2"), count="-2"),
     [("negative_counter", 2, True)], {"ttft_seconds": (2.0, 1.5, ((math.inf, 2.0),))}),
    ("NaN sum dropped, buckets kept", _hist(("1.0", "1"), ("+Inf", "2"), total="NaN"),
     [("nan", 4, True)], {"ttft_seconds": (2.0, NO_SUM, ((1.0, 1.0), (math.inf, 2.0)))}),
    ("+Inf sum dropped", _hist(("+Inf", "2"), total="+Inf"), [("inf", 3, True)],
     {"ttft_seconds": (2.0, NO_SUM, ((math.inf, 2.0),))}),
    ("negative sum is a value", _hist(("+Inf", "2"), total="-3"), [],
     {"ttft_seconds": (2.0, -3.0, ((math.inf, 2.0),))}),
    ("no +Inf bucket", _hist(("1.0", "1")), [("histogram_no_inf_bucket", 1, True)],
     {"ttft_seconds": None}),
    ("sum/count only", _hist(), [("histogram_no_inf_bucket", 1, True)], {"ttft_seconds": None}),
    ("non-numeric le: that bucket dropped", _hist(("fast", "1"), ("+Inf", "2")),
     [("bad_bucket", 1, True)], {"ttft_seconds": (2.0, 1.5, ((math.inf, 2.0),))}),
    ("le=NaN: that bucket dropped", _hist(("NaN", "1"), ("+Inf", "2")),
     [("bad_bucket", 1, True)], {"ttft_seconds": (2.0, 1.5, ((math.inf, 2.0),))}),
    ("bucket without le", f'{BKT}{{engine="0"}} 1\n' + H, [("bad_bucket", 1, True)],
     {"ttft_seconds": (2.0, 1.5, ((1.0, 1.0), (math.inf, 2.0)))}),
    ("not cumulative: kept as exposed", _hist(("1.0", "5"), ("+Inf", "4"), count="4"),
     [("histogram_not_cumulative", 2, False)],
     {"ttft_seconds": (4.0, 1.5, ((1.0, 5.0), (math.inf, 4.0)))}),
    ("duplicate bucket bound 1 and 1.0", _hist(("1", "1"), ("1.0", "9"), ("+Inf", "2")),
     [("duplicate_series", 2, True)],
     {"ttft_seconds": (2.0, 1.5, ((1.0, 1.0), (math.inf, 2.0)))}),
    ("histogram repeated whole, the first stands", H + H.replace(" 2\n", " 9\n"),
     [("duplicate_series", n, True) for n in (5, 6, 7, 8)],
     {"ttft_seconds": (2.0, 1.5, ((1.0, 1.0), (math.inf, 2.0)))}),
]  # fmt: skip


def _same(got: float | None, want: float | None) -> bool:
    if isinstance(got, float) and isinstance(want, float) and math.isnan(want):
        return math.isnan(got)
    return got == want


@pytest.mark.parametrize(
    ("text", "anomalies", "expected"),
    [pytest.param(t, a, e, id=i) for i, t, a, e in ANOMALIES],
)
def test_read_exposition_value_anomaly_kept_or_dropped_scrape_read(
    text: str, anomalies: list[tuple[str, int, bool]], expected: dict[str, object]
) -> None:
    snap = read_exposition(text + GOOD, "http://e:8000/metrics", 0.0)
    got = [(a.kind, a.line, a.dropped) for a in snap.anomalies]
    assert got == anomalies, [(a.kind, a.line, a.detail) for a in snap.anomalies]
    assert all(a.detail and a.name for a in snap.anomalies)
    assert one(snap, "requests_running", engine="0").value == 1.0  # the good line survives
    for signal, want in expected.items():
        found = [s for s in snap.samples if s.signal == signal]
        if want is None:
            assert found == [], found
            continue
        assert len(found) == 1, found
        sample = found[0]
        if isinstance(want, tuple):
            count, total, buckets = want
            assert (sample.value, sample.buckets) == (count, buckets)
            assert sample.sum == (None if total is NO_SUM else total)
        else:
            assert isinstance(want, float) and _same(sample.value, want), sample


def test_read_exposition_anomaly_records_name_labels_as_written() -> None:
    text = f'{PRE.replace(":", "_")}{{model_name="m",engine="0"}} NaN\n' + GOOD
    (a,) = read_exposition(text, "t", 0.0).anomalies
    assert (a.kind, a.name, a.labels, a.line, a.dropped) == (
        "nan", PRE.replace(":", "_"), (("engine", "0"), ("model_name", "m")), 1, True,
    )  # fmt: skip
    assert "nan" in a.detail and "dropped" in a.detail


FULL = "vllm-0.33.0-metrics-full.txt"
LINE_489 = 'vllm:num_preemptions_total{engine="0",model_name="tiny-llama"} 3.0'


@pytest.mark.parametrize(
    ("value", "kind"),
    [("NaN", "nan"), ("+Inf", "inf"), ("-Inf", "inf"), ("-3", "negative_counter")],
)
def test_read_exposition_real_fixture_bad_counter_loses_only_that_series(
    value: str, kind: str
) -> None:
    clean = read(FULL)
    lines = (METRICS / FULL).read_text().split("\n")
    assert lines[488] == LINE_489
    lines[488] = LINE_489.replace(" 3.0", f" {value}")
    snap = read_exposition("\n".join(lines), FULL, 1_800_000_000.0)
    assert [(a.kind, a.line, a.dropped) for a in snap.anomalies] == [(kind, 489, True)]
    lost = {s for s in clean.samples if s.signal == "preemptions_total" and
            dict(s.labels)["engine"] == "0"}  # fmt: skip
    assert len(lost) == 1
    assert set(snap.samples) == set(clean.samples) - lost  # every other series, exact values
    assert snap.facts == clean.facts and snap.unknown_families == clean.unknown_families


def test_read_exposition_real_fixture_duplicate_line_first_stands() -> None:
    text = (METRICS / FULL).read_text()
    dup = LINE_489.replace(" 3.0", " 99.0")
    snap = read_exposition(text + dup + "\n", FULL, 1_800_000_000.0)
    (a,) = snap.anomalies
    assert (a.kind, a.line, a.name) == ("duplicate_series", text.count("\n") + 1, PRE)
    assert set(snap.samples) == set(read(FULL).samples)


def test_reader_warm_cache_same_anomalies_as_cold() -> None:
    text = (METRICS / FULL).read_text().replace(LINE_489, LINE_489.replace(" 3.0", " NaN"))
    reader = ExpositionReader()
    cold = reader.read(text, "t", 0.0)
    warm = reader.read(text, "t", 0.0)  # every prefix cached: the value-only path
    assert cold == warm and len(warm.anomalies) == 1


def test_read_exposition_clean_fixtures_have_no_anomalies() -> None:
    for name in ALL_FIXTURES:
        assert read(name).anomalies == (), name


# ---- blanks before '#' -------------------------------------------------------------------


@pytest.mark.parametrize("lead", [" ", "\t", " \t  "])
def test_read_exposition_blanks_before_hash_comment_help_type_accepted(lead: str) -> None:
    text = (f"{lead}# a comment\n{lead}# HELP foo help text\n{lead}# TYPE foo gauge\nfoo 1\n"
            f"{lead}# TYPE foo counter\n{GOOD}")  # fmt: skip
    snap = read_exposition(text, "t", 0.0)
    assert snap.unknown_families == ("foo",)
    assert [(a.kind, a.line) for a in snap.anomalies] == [("type_conflict", 5)]  # TYPEs read
    assert one(snap, "requests_running", engine="0").value == 1.0


def test_read_exposition_tab_spaced_type_line_read() -> None:
    snap = read_exposition("#\tTYPE\tfoo\tgauge\n# TYPE  foo counter\nfoo 1\n", "t", 0.0)
    assert snap.unknown_families == ("foo",)
    assert [a.kind for a in snap.anomalies] == ["type_conflict"]


def test_read_exposition_blanks_before_eof_then_content_rejected() -> None:
    with pytest.raises(ParseError) as info:
        read_exposition(f"{GOOD}  # EOF\n{GOOD}", "t", 0.0)
    assert info.value.line == 3 and "after '# EOF'" in info.value.reason
