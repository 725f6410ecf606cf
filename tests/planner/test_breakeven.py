"""Break-even bandwidth / context and the seed exercise (numbers.md figures)."""

from __future__ import annotations

import re

import pytest

from collector.errors import ConfigError
from planner.model.breakeven import (
    SEED_EXERCISE_NOTE,
    breakeven_bandwidth,
    breakeven_context,
    reread_vs_reprefill,
    seed_exercise,
)
from planner.model.costmodel import prefill_seconds, tier_read_seconds
from planner.model.hardware import Tier, get_gpu, get_model, get_tier, with_kv_dtype

H100 = get_gpu("h100")
LLAMA_8B = get_model("llama-3.1-8b")


def test_breakeven_bandwidth_llama_8b_numbers_md() -> None:
    # numbers.md: ~31 k tok/s × 131,072 B ≈ 4.0 GB/s bf16 KV, 2.0 GB/s fp8 KV
    assert breakeven_bandwidth(LLAMA_8B, H100, 1, mfu=0.5, prompt_tokens=512) == pytest.approx(
        4.0e9, rel=0.05
    )
    fp8_kv = with_kv_dtype(LLAMA_8B, "fp8")
    assert breakeven_bandwidth(fp8_kv, H100, 1, mfu=0.5, prompt_tokens=512) == pytest.approx(
        2.0e9, rel=0.05
    )


def test_breakeven_bandwidth_falls_with_prompt_length() -> None:
    # the quadratic attention term makes long prompts relatively dearer to recompute
    short = breakeven_bandwidth(LLAMA_8B, H100, 1, prompt_tokens=1024)
    long = breakeven_bandwidth(LLAMA_8B, H100, 1, prompt_tokens=65_536)
    assert long < short


@pytest.mark.parametrize("tier", ["cpu-dram-pcie", "lmcache-cpu-loopback"])
def test_breakeven_context_fast_tiers_always_read(tier: str) -> None:
    result = breakeven_context(LLAMA_8B, H100, 1, get_tier(tier))
    assert (result.regime, result.tokens) == ("always", None)


@pytest.mark.parametrize("tier", ["ceph-hdd", "ceph-hdd-single-stream", "remote-lmcache-10gbe"])
def test_breakeven_context_slow_tiers_never_read(tier: str) -> None:
    result = breakeven_context(LLAMA_8B, H100, 1, get_tier(tier))
    assert (result.regime, result.tokens) == ("never", None)
    assert "GB/s" in result.explanation


def test_breakeven_context_latency_tier_has_a_threshold() -> None:
    # Fast but with per-object latency: recompute wins short prompts, reading long ones.
    tier = Tier("slow-rpc", 20e9, 20e9, 0.005, "test tier: 20 GB/s, 5 ms per object")
    result = breakeven_context(LLAMA_8B, H100, 1, tier)
    assert result.regime == "above"
    assert result.tokens is not None
    t = result.tokens

    def margin(n: int) -> float:
        return prefill_seconds(LLAMA_8B, H100, 1, n) - tier_read_seconds(LLAMA_8B, tier, n)

    assert margin(t) > 0
    assert margin(t - 1) <= 0
    assert margin(4 * t) > 0


def test_breakeven_context_compression_lowers_threshold() -> None:
    tier = get_tier("remote-lmcache-25gbe")
    model = get_model("llama-3.1-70b")
    plain = breakeven_context(model, H100, 4, tier)
    packed = breakeven_context(model, H100, 4, tier, compression=4.0)
    assert plain.regime in {"never", "above"}
    assert packed.regime in {"always", "above"}
    if plain.tokens is not None and packed.tokens is not None:
        assert packed.tokens < plain.tokens


def test_seed_exercise_kv_sizes_and_ranges() -> None:
    result = seed_exercise()
    fp8, bf16 = result["fp8"], result["bf16"]
    assert fp8.kv_bytes == 163_840 * 4096  # 0.67 GB
    assert bf16.kv_bytes == 327_680 * 4096  # 1.34 GB
    # numbers.md: reading ~0.8–13 s, re-prefill ~0.15–0.6 s -> re-prefill wins
    assert 0.8 <= fp8.read_seconds_low <= 1.0
    assert 12.0 <= bf16.read_seconds_high <= 15.0
    for c in (fp8, bf16):
        assert 0.1 <= c.prefill_seconds_low < c.prefill_seconds_high <= 0.6
        assert c.verdict == "re-prefill"
        assert c.objects == 16
        assert any("Ceph" in a for a in c.assumptions)


def test_seed_exercise_note_states_the_inconsistency_with_computed_sizes() -> None:
    result = seed_exercise()
    assert "500 MB" in SEED_EXERCISE_NOTE
    for kv in ("fp8", "bf16"):
        gb = f"{result[kv].kv_bytes / 1e9:.2f} GB ({kv} KV)"
        assert gb in SEED_EXERCISE_NOTE
    numbers = re.search(r"takes ~([\d.]+)–([\d.]+) s; re-prefill .* takes ~([\d.]+)–([\d.]+) s",
                        SEED_EXERCISE_NOTE)  # fmt: skip
    assert numbers is not None
    read_lo, read_hi, pre_lo, pre_hi = map(float, numbers.groups())
    assert read_lo == pytest.approx(result["fp8"].read_seconds_low, abs=0.05)
    assert read_hi == pytest.approx(result["bf16"].read_seconds_high, abs=0.5)
    assert pre_lo == pytest.approx(result["fp8"].prefill_seconds_low, abs=0.01)
    assert pre_hi == pytest.approx(result["fp8"].prefill_seconds_high, abs=0.01)


def test_reread_vs_reprefill_fast_tier_rereads_and_compression_helps() -> None:
    model = get_model("llama-3.1-70b")
    dram = reread_vs_reprefill(model, H100, 4, get_tier("cpu-dram-pcie"), 8192)
    assert dram.verdict == "re-read"
    plain = reread_vs_reprefill(model, H100, 4, get_tier("ceph-hdd"), 4096)
    packed = reread_vs_reprefill(model, H100, 4, get_tier("ceph-hdd"), 4096, compression=4.3)
    assert packed.read_seconds_high < plain.read_seconds_high
    assert packed.to_dict()["read_seconds"]["low"] == packed.read_seconds_low


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [({"mfu_range": (0.6, 0.2)}, "mfu_range"), ({"mfu_range": (0.0, 0.5)}, "mfu_range"),
     ({"compression": 0.5}, "compression"), ({"tokens": 0}, "tokens")],
)  # fmt: skip
def test_reread_vs_reprefill_bad_input_raises(kwargs: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {"tokens": 4096, **kwargs}
    with pytest.raises(ConfigError, match=needle):
        reread_vs_reprefill(LLAMA_8B, H100, 1, get_tier("ceph-hdd"), **args)  # type: ignore[arg-type]


USUAL_H100_SETUPS = [
    ("llama-3.1-8b", 1), ("llama-3.1-8b-fp8", 1), ("qwen3-8b", 1), ("qwen3-32b", 2),
    ("qwen3-32b-fp8", 2), ("llama-3.1-70b", 4), ("llama-3.1-70b-fp8", 4), ("llama-3.1-70b", 8),
]  # fmt: skip


@pytest.mark.parametrize(("name", "tp"), USUAL_H100_SETUPS)
def test_breakeven_bandwidth_usual_h100_setups_match_numbers_md(name: str, tp: int) -> None:
    # numbers.md: B* ≈ 2–16 GB/s for usual H100 set-ups; DRAM over PCIe wins by ~10×,
    # HDD Ceph loses by 3–90× (0.83 GB/s aggregate … 0.1 GB/s single stream).
    model = get_model(name)
    for mfu in (0.4, 0.6):
        b_star = breakeven_bandwidth(model, H100, tp, mfu=mfu, prompt_tokens=4096)
        assert 2e9 <= b_star <= 16e9
        assert b_star / get_tier("ceph-hdd").read_bounds[1] >= 3
        assert b_star / get_tier("ceph-hdd").read_bounds[0] <= 90
        assert get_tier("cpu-dram-pcie").read_Bps * tp / b_star >= 5
