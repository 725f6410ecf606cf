"""planner/simulate/exposition: telemetry rendered as vLLM 0.33 / LMCache MP text, read back
by kvscope's own parser, prometheus_client's parser and promtool, and compared with the real
vLLM 0.33 / LMCache 0.5.6 expositions in tests/fixtures/metrics."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector.parse import read_exposition
from core import catalog
from core.errors import ConfigError
from core.records import SignalSample, Snapshot
from planner.simulate.exposition import (
    CONTENT_TYPE,
    EndpointView,
    EngineConfig,
    Series,
    engine_view,
    expected_values,
    pool_view,
    render,
)
from planner.simulate.telemetry import (
    EngineSnapshot,
    EngineTelemetry,
    HistogramSnapshot,
    LMCacheSnapshot,
    PoolTelemetry,
)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CFG = EngineConfig(
    model_name=MODEL,
    block_size=16,
    num_gpu_blocks=27_000,
    gpu_memory_utilization=0.9,
    cpu_cache_bytes=100e9,
    kv_bytes_per_token=131_072.0,  # Llama-3.1-8B bf16: 32 layers x 8 KV heads x 128 x 2 x 2 B
)
ENGINE_GAUGES = {
    "kv_cache_usage_ratio": 0.8125,
    "requests_running": 37.0,
    "requests_waiting": 4.0,
    "offload_cpu_usage_ratio": 0.125,
}


def _engine_snapshot(offload: str, seed: int = 1) -> EngineSnapshot:
    """An engine with distinct, non-trivial numbers everywhere."""
    tel = EngineTelemetry()
    for i, name in enumerate(tel.counters):
        tel.add(name, 1000.0 * (i + seed) + 0.5)
    for i, reason in enumerate(tel.finished):
        tel.finished[reason] = 10 * i + seed
    tel.offload_bytes.update(load=3.5e9 * seed, store=7.25e9)
    tel.offload_seconds.update(load=0.75, store=1.5 * seed)
    for i, h in enumerate(tel.hist.values()):
        # spread observations over the bucket range, +Inf included
        top = h.bounds[-1] if h.bounds else 1.0
        h.observe_linear(top / 1000.0 * (i + 1), top / 97.0, 211, weight=seed)
        h.observe(top * 4.0)
    facts = {"num_gpu_blocks": CFG.num_gpu_blocks, "block_size": CFG.block_size}
    return tel.snapshot(
        engine=3, node=1, offload=offload, t=321.5, gauges=ENGINE_GAUGES, facts=facts
    )


def _pool_snapshot(zero: tuple[str, ...] = ()) -> LMCacheSnapshot:
    tel = PoolTelemetry()
    for i, name in enumerate(tel.counters):
        if name not in zero:
            tel.add(name, 256.0 * (i + 3))
    gauges = {
        "lmcache_l1_usage_bytes": 42.0e9,
        "lmcache_l1_usage_ratio": 0.42,
        "lmcache_l2_usage_bytes": 0.0,
    }
    return LMCacheSnapshot(0, "node", (0, 1), 99.0, dict(tel.counters), gauges)


def _read(body: bytes) -> Snapshot:
    return read_exposition(body.decode("utf-8"), "sim", 0.0)


def _by_key(snap: Snapshot) -> dict[tuple[str, tuple[tuple[str, str], ...]], SignalSample]:
    return {(s.signal, s.labels): s for s in snap.samples}


def _eng(extra: Mapping[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"engine": "0", "model_name": MODEL, **(extra or {})}.items()))


def _check_hist(sample: SignalSample, h: HistogramSnapshot) -> None:
    assert sample.value == h.count
    assert sample.sum == pytest.approx(h.sum, rel=1e-15)
    assert sample.buckets == tuple(
        zip((*h.bounds, float("inf")), map(float, h.cumulative), strict=True)
    )


# ------------------------------------------------------------------ read back = simulator


@pytest.mark.parametrize("offload", ["none", "native", "lmcache"])
def test_engine_render_read_back_equals_simulator_numbers(offload: str) -> None:
    snap = _engine_snapshot(offload)
    got = _by_key(_read(render(engine_view(snap, CFG))))
    for name, value in snap.counters.items():
        assert got.pop((name, _eng())).value == value, name
    for reason, n in snap.finished.items():
        assert got.pop(("request_success_total", _eng({"finished_reason": reason}))).value == n
    for name, value in snap.gauges.items():
        key = (name, _eng())
        if name.startswith("offload_") and offload != "native":
            assert key not in got
        else:
            assert got.pop(key).value == value, name
    for name, h in snap.histograms.items():
        _check_hist(got.pop((name, _eng())), h)
    for direction in ("load", "store"):
        for sig, src in (("offload_bytes_total", snap.offload_bytes),
                         ("offload_seconds_total", snap.offload_seconds)):  # fmt: skip
            key = (sig, _eng({"direction": direction}))
            if offload == "native":
                assert got.pop(key).value == src[direction]
            else:
                assert key not in got
    assert got == {}  # nothing rendered that the simulator does not hold


def test_engine_render_facts_carry_cache_config() -> None:
    for offload in ("none", "native", "lmcache"):
        snap = _read(render(engine_view(_engine_snapshot(offload), CFG)))
        (cache,) = snap.facts["cache_config"]
        assert cache["engine"] == "0"
        assert cache["block_size"] == "16"
        assert cache["num_gpu_blocks"] == "27000"
        assert cache["gpu_memory_utilization"] == "0.9"
        # native: 100 GB / (16 tokens x 128 KiB) = 47683 blocks of CPU KV
        assert cache["num_cpu_blocks"] == ("47683" if offload == "native" else "0")
        assert ("kv_offload_config" in snap.facts) == (offload == "native")
        assert snap.unknown_families == ()


def test_pool_render_read_back_equals_simulator_numbers() -> None:
    snap = _pool_snapshot()
    got = _by_key(_read(render(pool_view(snap, MODEL, "fs"))))
    l1 = {"backend": "dram", "l1_tag": "_default"}
    for name, value in [*snap.counters.items(), *snap.gauges.items()]:
        labels = catalog.export_spelling(name).labels
        want = {
            k: v for k, v in {**l1, "model_name": MODEL, "l2_name": "fs"}.items() if k in labels
        }
        assert got.pop((name, tuple(sorted(want.items())))).value == value, name
    assert got == {}


def test_pool_render_zero_counters_absent_gauges_present() -> None:
    """OpenTelemetry: an instrument appears on its first measurement; gauges always."""
    zero = ("lmcache_l2_store_completed_chunks_total", "lmcache_l2_evicted_chunks_total")
    snap = _read(render(pool_view(_pool_snapshot(zero), MODEL)))
    signals = {s.signal for s in snap.samples}
    assert signals.isdisjoint(zero)
    assert {
        "lmcache_l1_usage_bytes",
        "lmcache_l2_usage_bytes",
        "lmcache_hit_tokens_total",
    } <= signals
    assert snap.facts["lmcache_target"][0]["service_instance_id"] == "kvscope-sim-lmcache-0"


@pytest.mark.parametrize("offload", ["none", "native", "lmcache"])
def test_expected_values_match_parsed_snapshot(offload: str) -> None:
    view = engine_view(_engine_snapshot(offload, seed=2), CFG)
    got = _by_key(_read(render(view)))
    want = expected_values(view)
    assert set(got) == set(want)
    for key, value in want.items():
        if isinstance(value, HistogramSnapshot):
            _check_hist(got[key], value)
        else:
            assert got[key].value == value


# ------------------------------------------------------------------ the real exporters' shape


def _shapes(text: str) -> dict[str, set[frozenset[str]]]:
    """sample name -> label-name sets, from an exposition (comment lines skipped)."""
    out: dict[str, set[frozenset[str]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, set()).add(frozenset(s.labels))
    return out


def _les(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r'([^{ #]+)_bucket\{(?:[^}]*,)?le="([^"]+)"', line)
        if m and 'engine="0"' in line and "transfer_type" not in line:
            out.setdefault(m.group(1), [])
            if m.group(2) not in out[m.group(1)]:
                out[m.group(1)].append(m.group(2))
    return out


def test_engine_render_names_labels_buckets_as_real_vllm_033(fixtures_dir: Path) -> None:
    real = ""
    for name in ("vllm-0.33.0-metrics-default-multiproc.txt", "vllm-0.33.0-metrics-full.txt"):
        real += (fixtures_dir / "metrics" / name).read_text()
    real_shapes, real_les = _shapes(real), _les(real)
    ours = render(engine_view(_engine_snapshot("native"), CFG)).decode()
    assert "_created" not in ours  # multiprocess rendering
    shapes = _shapes(ours)
    fact_families = set(catalog.FACTS.values())
    for sample, label_sets in shapes.items():
        assert sample in real_shapes, f"vLLM 0.33 has no sample {sample}"
        if sample not in fact_families:
            assert label_sets <= real_shapes[sample], sample
    for family, les in _les(ours).items():
        assert les == real_les[family], family
    # the TYPE lines agree too
    real_types = set(re.findall(r"^# TYPE (\S+ \S+)$", real, re.M))
    assert set(re.findall(r"^# TYPE (\S+ \S+)$", ours, re.M)) <= real_types


def test_pool_render_gauges_as_real_lmcache_server(fixtures_dir: Path) -> None:
    real = (fixtures_dir / "metrics" / "lmcache-0.5.6-mp-server-idle-metrics.txt").read_text()
    real_shapes = _shapes(real)
    ours = _shapes(render(pool_view(_pool_snapshot(), MODEL)).decode())
    for name in ("lmcache_mp_l1_memory_usage_bytes", "lmcache_mp_l1_usage_ratio", "target_info"):
        assert ours[name] == real_shapes[name], name


def test_render_prometheus_client_parser_reads_colon_names() -> None:
    body = render(engine_view(_engine_snapshot("native"), CFG)).decode()
    fams = {f.name: f for f in text_string_to_metric_families(body)}
    preempt = catalog.SIGNALS["preemptions_total"].exported
    assert ":" in preempt and fams[preempt].type == "counter"
    ttft = fams[catalog.SIGNALS["ttft_seconds"].exported]
    assert ttft.type == "histogram"
    assert ttft.samples[-1].name.endswith("_sum")


_LINT_OK = re.compile(
    r'metric names should not contain|non-counter metrics should not have "_total"'
)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_render_promtool_lints_only_what_real_vllm_also_gets(fixtures_dir: Path) -> None:
    """promtool 2.42 `check metrics`: no parse error (exit 1); the only lint findings (exit 3)
    are the ones vLLM's own exposition gets (colons; the histogram named *_total)."""
    real = (fixtures_dir / "metrics" / "vllm-0.33.0-metrics-full.txt").read_text()
    real_run = subprocess.run(["promtool", "check", "metrics"], input=real,
                              capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    real_findings = set(real_run.stderr.splitlines() + real_run.stdout.splitlines())
    for body in (render(engine_view(_engine_snapshot(o), CFG)) for o in ("native", "lmcache")):
        run = subprocess.run(["promtool", "check", "metrics"], input=body.decode(),
                             capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        findings = [x for x in run.stderr.splitlines() + run.stdout.splitlines() if x.strip()]
        assert run.returncode in (0, 3), findings
        for finding in findings:
            assert _LINT_OK.search(finding), finding
            assert finding in real_findings or "kv_offload_config_info" in finding, finding
    pool = subprocess.run(["promtool", "check", "metrics"],
                          input=render(pool_view(_pool_snapshot(), MODEL, "fs")).decode(),
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    assert pool.returncode == 0, pool.stdout + pool.stderr


def test_render_content_type_is_text_004() -> None:
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


# ------------------------------------------------------------------ bad input


_H = HistogramSnapshot((1.0, 2.0), (1, 2, 3), 4.0, 3)
BAD_VIEWS = [
    ("unknown signal", Series("no_such_signal", (), 1.0), "unknown signal"),
    ("histogram value for a counter", Series("preemptions_total", (), _H), "is a counter"),
    ("float for a histogram", Series("ttft_seconds", (), 1.0), "is a histogram"),
    ("label the family lacks", Series("preemptions_total", (("pod", "x"),), 1.0), "'pod'"),
    ("bad cumulative length", Series("ttft_seconds", (), HistogramSnapshot((1.0,), (1,), 1.0, 1)),
     "cumulative counts"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "series", "message"), BAD_VIEWS, ids=[b[0] for b in BAD_VIEWS])
def test_render_bad_series_raises_config_error(what: str, series: Series, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        render(EndpointView((series,), common=(("engine", "0"),)))
