"""Break-even bandwidth / context and re-read vs re-prefill per tier (figures derived from
the catalogue's sources, planner/domain/data/sources.yaml)."""

from __future__ import annotations

import re

import pytest

from core.errors import ConfigError
from planner.domain.breakeven import (
    LLAMA_70B_4K_CEPH_HDD_NOTE,
    Comparison,
    breakeven_bandwidth,
    breakeven_context,
    case_note,
    compare_tiers,
    reread_vs_reprefill,
)
from planner.domain.costmodel import prefill_seconds, tier_read_seconds
from planner.domain.hardware import (
    Tier,
    builtin_catalog,
    get_gpu,
    get_model,
    get_tier,
    with_kv_dtype,
)

H100 = get_gpu("h100")
LLAMA_8B = get_model("llama-3.1-8b")


def test_breakeven_bandwidth_llama_8b_tp1_is_4_gbps_bf16_2_gbps_fp8() -> None:
    # Derived (Kaplan FLOPs [source: kaplan-scaling-laws-2020], H100 datasheet):
    # ~31 k tok/s × 131,072 B ≈ 4.0 GB/s bf16 KV, 2.0 GB/s fp8 KV
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


def _llama_70b_4k_ceph_hdd() -> dict[str, Comparison]:
    """Llama-3.1-70B FP8 on 4× H100, 4,096 tokens, ceph-hdd, both KV dtypes: {kv: row}."""
    result = compare_tiers(
        "llama-3.1-70b-fp8", "h100", 4, 4096, tiers=["ceph-hdd"], kv_dtypes=("fp8", "bf16")
    )
    assert list(result) == ["fp8", "bf16"]
    return {kv: rows["ceph-hdd"] for kv, rows in result.items()}


def test_compare_tiers_70b_fp8_4k_ceph_hdd_kv_sizes_and_ranges() -> None:
    result = _llama_70b_4k_ceph_hdd()
    fp8, bf16 = result["fp8"], result["bf16"]
    assert fp8.kv_bytes == 163_840 * 4096  # 0.67 GB
    assert bf16.kv_bytes == 327_680 * 4096  # 1.34 GB
    # Derived from the ceph-hdd tier and the H100 datasheet: reading ~0.8–13 s, re-prefill
    # ~0.15–0.6 s -> re-prefill wins
    assert 0.8 <= fp8.read_seconds_low <= 1.0
    assert 12.0 <= bf16.read_seconds_high <= 15.0
    for c in (fp8, bf16):
        assert 0.1 <= c.prefill_seconds_low < c.prefill_seconds_high <= 0.6
        assert c.verdict == "re-prefill"
        assert c.objects == 16
        assert any("Ceph" in a for a in c.assumptions)


def test_llama_70b_4k_ceph_hdd_note_states_the_inconsistency_with_computed_sizes() -> None:
    result = _llama_70b_4k_ceph_hdd()
    note = LLAMA_70B_4K_CEPH_HDD_NOTE
    assert "500 MB" in note and "seed" not in note.lower()
    for kv in ("fp8", "bf16"):
        gb = f"{result[kv].kv_bytes / 1e9:.2f} GB ({kv} KV)"
        assert gb in note
    numbers = re.search(r"takes ~([\d.]+)–([\d.]+) s; re-prefill .* takes ~([\d.]+)–([\d.]+) s",
                        note)  # fmt: skip
    assert numbers is not None
    read_lo, read_hi, pre_lo, pre_hi = map(float, numbers.groups())
    assert read_lo == pytest.approx(result["fp8"].read_seconds_low, abs=0.05)
    assert read_hi == pytest.approx(result["bf16"].read_seconds_high, abs=0.5)
    assert pre_lo == pytest.approx(result["fp8"].prefill_seconds_low, abs=0.01)
    assert pre_hi == pytest.approx(result["fp8"].prefill_seconds_high, abs=0.01)


def test_compare_tiers_no_tiers_compares_every_catalogue_tier() -> None:
    result = compare_tiers("llama-3.1-8b", "h100", 1, 4096)
    assert list(result) == ["bf16"]  # "auto": the model's own KV dtype, named
    assert list(result["bf16"]) == list(builtin_catalog().tiers)


def test_compare_tiers_aliases_and_duplicates_one_row_each_equal_to_reread() -> None:
    result = compare_tiers(
        "llama-3.1-70b-fp8", "h100", 4, 4096,
        tiers=["ceph", "ceph-hdd", "cpu"], kv_dtypes=("auto", "bf16", "fp8", "fp8"),
    )  # fmt: skip
    assert list(result) == ["bf16", "fp8"]  # auto = bf16 KV for FP8 weights
    model = get_model("llama-3.1-70b-fp8")
    for kv, rows in result.items():
        assert list(rows) == ["ceph-hdd", "cpu-dram-pcie"]
        for tier, row in rows.items():
            direct = reread_vs_reprefill(with_kv_dtype(model, kv), H100, 4, get_tier(tier), 4096)
            assert row == direct


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [({"tokens": 0}, "tokens"), ({"tokens": -1}, "tokens"),
     ({"kv_dtypes": ("int4",)}, "unknown KV dtype 'int4'"), ({"kv_dtypes": ()}, "kv_dtypes"),
     ({"tiers": []}, "tiers"), ({"tiers": ["tape"]}, "unknown tier 'tape'"),
     ({"model": "nope"}, "unknown model 'nope'"), ({"gpu": "tpu"}, "unknown GPU 'tpu'"),
     ({"tp": 3}, "tp=3")],
)  # fmt: skip
def test_compare_tiers_bad_input_raises(kwargs: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {"model": "llama-3.1-8b", "gpu": "h100", "tp": 1, "tokens": 4096}
    with pytest.raises(ConfigError, match=re.escape(needle)):
        compare_tiers(**{**args, **kwargs})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("model", "gpu", "tp", "tier", "tokens", "noted"),
    [("llama-3.1-70b-fp8", "h100", 4, "ceph-hdd", 4096, True),
     ("llama-3.1-70b-fp8", "h100", 4, "ceph", 4096, True),
     ("llama-3.1-70b-fp8", "h100", 4, "ceph-hdd", 8192, False),
     ("llama-3.1-70b-fp8", "h100", 4, "ceph-hdd-single-stream", 4096, False),
     ("llama-3.1-70b-fp8", "h100", 8, "ceph-hdd", 4096, False),
     ("llama-3.1-70b-fp8", "h200", 4, "ceph-hdd", 4096, False),
     ("llama-3.1-70b", "h100", 4, "ceph-hdd", 4096, False)],
)  # fmt: skip
def test_case_note_only_the_case_it_describes_gets_it(  # noqa: PLR0917 - one table row
    model: str, gpu: str, tp: int, tier: str, tokens: int, noted: bool
) -> None:
    for kv in ("fp8", "bf16"):
        m = with_kv_dtype(get_model(model), kv)
        note = case_note(m, get_gpu(gpu), tp, get_tier(tier), tokens)
        assert note == (LLAMA_70B_4K_CEPH_HDD_NOTE if noted else None)


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
def test_breakeven_bandwidth_usual_h100_setups_within_2_to_16_gbps(name: str, tp: int) -> None:
    # Derived: B* ≈ 2–16 GB/s for usual H100 set-ups; DRAM over PCIe wins by ~10×,
    # HDD Ceph loses by 3–90× (0.83 GB/s aggregate … 0.1 GB/s single stream).
    model = get_model(name)
    for mfu in (0.4, 0.6):
        b_star = breakeven_bandwidth(model, H100, tp, mfu=mfu, prompt_tokens=4096)
        assert 2e9 <= b_star <= 16e9
        assert b_star / get_tier("ceph-hdd").read_bounds[1] >= 3
        assert b_star / get_tier("ceph-hdd").read_bounds[0] <= 90
        assert get_tier("cpu-dram-pcie").read_Bps * tp / b_star >= 5
