"""The three regimes the simulator must get right (small, fast scenarios):

1. KV fits in HBM and nothing is reused: offload buys nothing and costs ~0.5-3 %.
2. Gains grow with the prompt (prefix) length and with how far KV demand exceeds HBM.
3. LMCache beats native offload only when prefixes recur across engines.
"""

from __future__ import annotations

from typing import Any

from planner.simulate.compare import Sweep, compare
from planner.simulate.spec import set_dotted

FITS: dict[str, Any] = {
    "cluster": {"nodes": 1, "gpus_per_node": 1, "model": "llama-3.1-8b", "cpu_cache_gb": 50},
    "workload": {"kind": "synthetic", "prompt_tokens": {"dist": "uniform", "min": 500, "max": 1500},
                 "output_tokens": {"dist": "uniform", "min": 50, "max": 350}, "concurrency": 48},
    "duration_s": 300,
    "seed": 1,
}  # fmt: skip
BEYOND_HBM: dict[str, Any] = {
    "cluster": {"nodes": 1, "gpus_per_node": 1, "model": "llama-3.1-8b", "cpu_cache_gb": 200,
                "gpu_memory_utilization": 0.5},
    "workload": {"kind": "shared_prefix", "groups": 60, "prompts_per_group": 6,
                 "system_prompt_tokens": 8000, "question_tokens": 200, "output_tokens": 200,
                 "concurrency": 32},
    "duration_s": 10_000,
    "seed": 1,
}  # fmt: skip
CROSS_ENGINE: dict[str, Any] = {
    "cluster": {"nodes": 1, "gpus_per_node": 4, "model": "llama-3.1-8b", "cpu_cache_gb": 400,
                "gpu_memory_utilization": 0.5, "lmcache_scope": "node"},
    "workload": {"kind": "shared_prefix", "groups": 200, "prompts_per_group": 4,
                 "system_prompt_tokens": 8000, "question_tokens": 200, "output_tokens": 200,
                 "concurrency": 64},
    "duration_s": 10_000,
    "seed": 1,
}  # fmt: skip

MODES = ("none", "native", "lmcache")


def _quiet(_: str) -> None:
    pass


def _gains(raw: dict[str, Any]) -> dict[str, float]:
    point = compare(raw, MODES, progress=_quiet)["points"][0]["modes"]
    return {m: point[m]["throughput_gain"] for m in MODES}


def test_regime_kv_fits_in_hbm_offload_costs_a_little() -> None:
    result = compare(FITS, MODES, progress=_quiet)["points"][0]["modes"]
    assert result["none"]["preemptions"] == 0
    assert result["none"]["kv_usage_mean"] < 0.5
    for mode in ("native", "lmcache"):
        gain = result[mode]["throughput_gain"]
        assert -0.03 <= gain < 0.0, (mode, gain)  # costs, never pays, at most ~3 %
        assert result[mode]["avoided_reprefill_tokens"] == 0


def test_regime_gains_grow_with_prefix_length() -> None:
    short = set_dotted(BEYOND_HBM, "workload.system_prompt_tokens", 1000)
    short = set_dotted(short, "workload.groups", 480)  # same prefix tokens in total
    g_short, g_long = _gains(short), _gains(BEYOND_HBM)
    for mode in ("native", "lmcache"):
        assert g_long[mode] > g_short[mode] + 0.2, (mode, g_short[mode], g_long[mode])
        assert g_long[mode] > 0.3


def test_regime_gains_grow_with_kv_beyond_hbm_and_break_even_is_found() -> None:
    sweep = Sweep("cluster.gpu_memory_utilization", (0.45, 0.65, 0.9))
    result = compare(BEYOND_HBM, ("none", "native"), sweep, progress=_quiet)
    gains = [p["modes"]["native"]["throughput_gain"] for p in result["points"]]
    assert gains[0] > gains[1] > gains[2], gains  # less HBM -> more to gain from CPU
    assert gains[0] > 0.3
    point = result["break_even"]["native"]
    if gains[2] < 0:
        assert point is not None and 0.65 < point < 0.9
    else:
        assert point is None


def test_regime_lmcache_beats_native_only_across_engines() -> None:
    spread = _gains(CROSS_ENGINE)  # round robin: each engine sees a prefix ~once
    assert spread["lmcache"] > spread["native"] + 0.05, spread
    pinned = _gains(set_dotted(CROSS_ENGINE, "cluster.router", "prefix_affinity"))
    assert pinned["native"] >= pinned["lmcache"], pinned  # reuse stays on one engine
