"""planner.advise.whatif: what-if checks, the scenario it builds, and simulated evidence ->
decision."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from core.errors import ConfigError, InputError
from planner.advise.question import parse_scorer_weights
from planner.advise.sim import (
    ALT_MAX_REQUESTS,
    BAND_KIND,
    BANDS,
    MAX_REQUESTS,
    WARMUP_FRACTION,
    band_halfwidth,
    layout,
    scenario_of,
    working_set_regime,
)
from planner.advise.whatif import WhatIf, advise
from planner.domain.costmodel import hbm_kv_capacity_tokens
from planner.domain.hardware import get_gpu, get_model
from planner.report.advise_text import advice_text, band_lines

SMALL = WhatIf("llama-3.1-8b", "h100", 1, 3000, 128, 4.0, 0.5, engines=2, duration_s=60.0)


@pytest.mark.parametrize(
    ("engines", "tp", "expected"),
    [
        (1, 1, (1, 1)),
        (4, 1, (1, 4)),
        (8, 1, (1, 8)),
        (12, 1, (2, 6)),
        (16, 2, (4, 8)),
        (7, 1, (1, 7)),
        (11, 1, (11, 1)),
        (3, 4, (3, 4)),
        (2, 16, (2, 16)),
    ],
)
def test_layout_engines_per_node_divide_engines(
    engines: int, tp: int, expected: tuple[int, int]
) -> None:
    nodes, gpn = layout(engines, tp)
    assert (nodes, gpn) == expected
    assert nodes * (gpn // tp) == engines and gpn % tp == 0


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"tp": 0}, "--tp must be an integer >= 1"),
        ({"prompt_tokens": 0}, "--prompt-tokens"),
        ({"output_tokens": -3}, "--output-tokens"),
        ({"engines": 0}, "--engines"),
        ({"qps": 0.0}, "--qps must be a number > 0"),
        ({"qps": float("nan")}, "--qps"),
        ({"duration_s": -1.0}, "--duration"),
        ({"prefix_share": 1.5}, "--prefix-share must be in \\[0, 1\\]"),
        ({"prefix_tokens": 0}, "--prefix-tokens"),
        ({"cpu_gb": 0.0}, "--cpu-gb"),
        ({"vllm_version": "0.9.0"}, "outside the supported range"),
        ({"model": "gpt-5"}, "unknown model 'gpt-5'; known: "),
        ({"gpu": "tpu-v5"}, "unknown GPU"),
        ({"model": "llama-3.1-70b", "tp": 1}, "does not fit on 1× "),
    ],
)
def test_whatif_check_bad_value_names_the_flag(change: dict[str, Any], match: str) -> None:
    with pytest.raises(InputError, match=match) as caught:
        dataclasses.replace(SMALL, **change).check()
    # the field is the value's attribute (the API body's field); model, gpu, tp and the
    # vLLM version are checked together and reported on "model"
    assert caught.value.field == (
        "model" if {"model", "gpu", "vllm_version"} & set(change) or len(change) > 1 else
        next(iter(change))
    )  # fmt: skip
    assert isinstance(caught.value, ConfigError)  # the CLI's exit 2 path


def test_scenario_of_shared_prefix_groups_cpu_split_and_duration_cap() -> None:
    w = dataclasses.replace(
        SMALL,
        engines=4,
        prompt_tokens=8000,
        prefix_share=0.75,
        prefix_tokens=120_000,
        cpu_gb=400.0,
        qps=50.0,
        duration_s=300.0,
    )
    raw, notes = scenario_of(w)
    wl = raw["workload"]
    assert wl["kind"] == "shared_prefix" and wl["system_prompt_tokens"] == 6000
    assert wl["question_tokens"] == 2000 and wl["groups"] == 20
    assert raw["cluster"]["nodes"] * raw["cluster"]["gpus_per_node"] == 4
    # 20 % reserved; native splits the node's DRAM over its 4 engines, LMCache pools it.
    assert raw["_cpu_gb"] == {"native": 80.0, "lmcache": 320.0}
    assert raw["duration_s"] * w.qps * (1 - WARMUP_FRACTION) == pytest.approx(MAX_REQUESTS)
    assert raw["warmup_s"] == pytest.approx(WARMUP_FRACTION * raw["duration_s"])
    assert any("instead of 300 s" in n for n in notes)
    plain, plain_notes = scenario_of(dataclasses.replace(SMALL, prefix_share=0.0))
    assert plain["workload"]["kind"] == "synthetic"
    assert plain["workload"]["prompt_tokens"] == SMALL.prompt_tokens
    assert any("--cpu-gb not given" in n for n in plain_notes)


def test_advise_small_whatif_wires_simulation_into_evidence_and_is_seeded() -> None:
    a = advise(SMALL)
    b = advise(SMALL)

    def strip(d: dict[str, Any]) -> dict[str, Any]:
        return {m: {k: v for k, v in r.items() if k != "wall_s"} for m, r in d["modes"].items()}

    assert strip(a.simulated) == strip(b.simulated)  # same seed, same answer
    assert set(a.simulated["modes"]) == {"none", "native", "lmcache"}
    ev, sim = a.evidence, a.simulated["modes"]
    for mode, cap in (("native", ev.native_capacity), ("lmcache", ev.lmcache_capacity)):
        assert cap is not None and cap.gain is not None
        assert cap.gain.estimate == pytest.approx(sim[mode]["throughput_gain"])
        g = cap.gain.estimate
        fits = BANDS["fits"]
        assert cap.gain.hi - cap.gain.lo == pytest.approx(
            2 * (fits.absolute + fits.relative * abs(g))
        )
        assert cap.provenance == "simulated" and cap.interval_kind == "largest_in_sample_miss"
    capacity = hbm_kv_capacity_tokens(get_model("llama-3.1-8b"), get_gpu("h100"), 1)
    assert ev.engine_capacity == capacity // 16 * 16  # whole 16-token blocks
    assert ev.kv_util_p95 == pytest.approx(sim["none"]["kv_util_p95"])
    assert (ev.engines, ev.engines_per_node, ev.nodes) == (2, 2, 1)
    assert ev.prompt_tokens_p90 == 3000 and ev.vllm_version == "0.33.0"
    d = a.to_dict()
    json.dumps(d, allow_nan=False)
    assert d["decision"]["mode"] in ("none", "native", "lmcache", "both")
    assert d["cost_model"]["kv_bytes_per_token"] == 131_072  # [source: hf-llama-3.1-8b-config]
    assert len(d["cost_model"]["breakeven_context_by_tier"]) >= 9
    assert "simulated, not measured" in d["simulated"]["note"]
    r7 = [r for r in d["decision"]["reasons"] if r["rule"] == "R7_capacity"]
    assert len(r7) == 2  # native and lmcache: the gains came from the simulator, not a fit
    for r in r7:
        assert r["text"].startswith("simulated:") and r["source"].startswith("simulated:")
        assert "fit_gain" not in r["source"]


def test_advise_shared_prefixes_overflowing_hbm_recommend_lmcache() -> None:
    # 600 k distinct prefix tokens (8 × the HBM KV of one engine's share of the traffic) on 4
    # engines, round robin: prefixes are evicted and reused across engines.
    w = WhatIf(
        "llama-3.1-8b",
        "h100",
        1,
        8000,
        256,
        30.0,
        0.75,
        engines=4,
        prefix_tokens=600_000,
        cpu_gb=400.0,
    )
    a = advise(w)
    sim = a.simulated["modes"]
    assert a.simulated["none_keeps_up"] is False
    assert sim["lmcache"]["throughput_gain"] > BANDS["fits"].absolute
    assert sim["lmcache"]["prefill_compute_saved"] > 0.1
    assert a.decision.mode in ("lmcache", "both")
    assert a.sizing is not None and a.sizing.l1_size_gib is not None
    assert "lmcache_server" in a.sizing.configs and "LMCacheMPConnector" in a.sizing.configs["vllm"]


def test_advise_issue_case_offload_gain_depends_on_the_router() -> None:
    # kvscope issue 14: 8 Qwen3-32B TP2 engines, 45 shared 8,192-token prefixes, KV use
    # ~16 %. Round robin brings every prefix to every engine (45 x 8k tokens do not fit one
    # engine's HBM KV), so a shared LMCache pool saves much of the prefill; the scorer keeps
    # each prefix on the engine that holds it and offload has little left to save.
    w = WhatIf(
        "qwen3-32b",
        "h100",
        2,
        8704,
        256,
        6.0,
        8192 / 8704,
        engines=8,
        prefix_tokens=45 * 8192,
        cpu_gb=1000.0,
        router="round_robin",
    )
    a = advise(w)
    rows = {r["router"]: r for r in a.routers["rows"]}
    assert list(rows) == ["round_robin", "least_loaded", "prefix_affinity", "scorer"]
    assert a.routers["assumed"] == "round_robin" and a.routers["default"] is False
    rr, sc = rows["round_robin"], rows["scorer"]
    assert rr["kv_util_p95"] < 0.3  # light load: the issue's ~16 %
    assert rr["recommended"] == a.decision.mode
    assert rr["lmcache_prefill_compute_saved"] > 0.4
    assert sc["lmcache_prefill_compute_saved"] < 0.25 * rr["lmcache_prefill_compute_saved"]
    assert sc["gpu_prefix_hit_rate"] > rr["gpu_prefix_hit_rate"] + 0.15
    assert rows["prefix_affinity"]["lmcache_prefill_compute_saved"] < 0.1
    # the alternatives ran shorter, at most ALT_MAX_REQUESTS per mode
    assert sc["duration_s"] < rr["duration_s"]
    assert sc["duration_s"] * 6.0 * (1 - WARMUP_FRACTION) <= ALT_MAX_REQUESTS + 1
    d = a.to_dict()
    assert d["router"]["rows"][3]["lmcache_prefill_compute_saved"] == pytest.approx(
        sc["lmcache_prefill_compute_saved"]
    )


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"router": "random"}, r"--router must be one of .*scorer"),
        ({"scorer_weights": {"prefix": -1.0}}, r"--scorer-weights: prefix must be .*>= 0"),
        ({"scorer_weights": {"latency": 1.0}}, r"--scorer-weights: latency: unknown key"),
        ({"scorer_weights": {"prefix": 0, "kv": 0, "queue": 0, "no_hit_lru": 0}}, r"all 0"),
    ],
)
def test_whatif_bad_router_or_weights_name_the_flag(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        dataclasses.replace(SMALL, **change).check()


def test_parse_scorer_weights() -> None:
    assert parse_scorer_weights("prefix=2, kv=1,queue=0.5") == {
        "prefix": 2.0,
        "kv": 1.0,
        "queue": 0.5,
    }
    with pytest.raises(ConfigError, match=r"--scorer-weights: kv: 'x' is not a number"):
        parse_scorer_weights("prefix=2,kv=x")
    with pytest.raises(ConfigError, match=r"--scorer-weights: 'prefix' is not KEY=NUMBER"):
        parse_scorer_weights("prefix")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({}, "fits"),  # one 1,500-token prefix
        ({"prefix_share": 0.0}, "fits"),  # nothing shared: no working set to spill
        # 2 engines x 451 k HBM tokens + 100 GB at 128 KiB/token (763 k tokens) < 3 M
        ({"prefix_tokens": 3_000_000}, "spills"),
        ({"prefix_tokens": 3_000_000, "cpu_gb": 2_000.0}, "fits"),
    ],
)
def test_working_set_regime_picks_the_calibration_band(
    change: dict[str, Any], expected: str
) -> None:
    raw, _ = scenario_of(dataclasses.replace(SMALL, **change))
    assert working_set_regime(raw) == expected
    band = BANDS[expected]
    assert band_halfwidth(0.5, expected) == pytest.approx(band.absolute + 0.5 * band.relative)


def _keys(x: object) -> set[str]:
    if isinstance(x, dict):
        return set(x) | {k for v in x.values() for k in _keys(v)}
    if isinstance(x, list):
        return {k for v in x for k in _keys(v)}
    return set()


# What would make a band read as a confidence interval: a level, "95", CI/interval wording.
_COVERAGE_WORDS = re.compile(r"\b95 ?%|confiden|\bCI\b|interval", re.IGNORECASE)


@pytest.mark.parametrize("regime", sorted(BANDS))
def test_band_lines_name_the_rows_and_carry_no_confidence_level(regime: str) -> None:
    band = BANDS[regime].to_dict()
    text = "\n".join(band_lines(band))
    assert not _COVERAGE_WORDS.search(text), text
    assert f"largest in-sample miss over {band['rows']} published" in text
    assert band["row_set"] in text and "benchmarks/calibrate_sim.py" in text
    if band["loso_excess_pp"] is None:  # spills: every row from GKE Test 3
        assert "out-of-source: not checked" in text
    else:
        assert f"by up to {band['loso_excess_pp']:.1f} pp" in text


def test_advise_json_and_text_give_the_band_as_largest_in_sample_miss() -> None:
    d = dataclasses.replace(SMALL, compare_routers=False)
    out = advise(d).to_dict()
    sim, ev = out["simulated"], out["evidence"]
    assert "level" not in _keys(sim) and "level" not in _keys(ev)
    assert sim["gain_band"]["kind"] == BAND_KIND and "gain_tolerance" not in sim
    for mode in ("native", "lmcache"):
        g = sim["modes"][mode]["throughput_gain"]
        band = sim["modes"][mode]["throughput_gain_band"]
        half = band_halfwidth(g, sim["gain_band"]["regime"])
        assert (band["lo"], band["hi"]) == pytest.approx((g - half, g + half))
        assert band["kind"] == BAND_KIND and band["rows"] == sim["gain_band"]["rows"]
        cap = ev[f"{mode}_capacity"]
        assert cap["provenance"] == "simulated" and set(cap["ratio"]) == {"estimate", "band"}
        assert cap["interval_kind"] == "largest_in_sample_miss" and "claim" not in cap
        ratio_band = cap["ratio"]["band"]
        assert (ratio_band["lo"], ratio_band["hi"]) == pytest.approx(
            (1 + band["lo"], 1 + band["hi"])
        )
        assert ratio_band["kind"] == BAND_KIND and cap["ratio"]["estimate"] == pytest.approx(1 + g)
    assert sim["modes"]["none"]["throughput_gain_band"] is None  # none against itself
    text = advice_text(out)
    block = text[text.index("Simulated (") : text.index("Cost model")]
    assert not _COVERAGE_WORDS.search(block), block
    assert "gain band" in block and "largest in-sample miss" in block
