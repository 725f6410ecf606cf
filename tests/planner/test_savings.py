"""Savings of a shared prefix per tenant, checked against the cost model."""

from __future__ import annotations

import pytest

from core.errors import ConfigError
from planner.domain.costmodel import prefill_seconds, tier_read_seconds
from planner.domain.hardware import get_gpu, get_model, get_tier
from planner.domain.savings import prefix_savings

# A tenant's 6 K-token system prompt shared by 200 queries per hour.
PREFIX, QPH, PRICE = 6000, 200, 3.0


@pytest.mark.parametrize(("model_name", "tp"), [("llama-3.1-8b", 1), ("llama-3.1-70b", 4)])
def test_prefix_savings_6k_prefix_200_qph_matches_cost_model(model_name: str, tp: int) -> None:
    model, gpu, tier = get_model(model_name), get_gpu("h100"), get_tier("cpu-dram-pcie")
    s = prefix_savings(model_name, "h100", tp, PREFIX, QPH, PRICE, "cpu-dram-pcie")
    prefill = prefill_seconds(model, gpu, tp, PREFIX, mfu=0.5)
    reload = tier_read_seconds(model, tier, PREFIX, tp=tp)
    # One lifetime of an hour: the first query computes, the other 199 reload.
    expected_gpu_s = 199 * (prefill - reload) * tp
    assert s.prefill_seconds == pytest.approx(prefill)
    assert s.reload_seconds == pytest.approx(reload)
    assert s.reuses_per_hour == pytest.approx(199)
    assert s.saved_gpu_seconds_per_hour == pytest.approx(expected_gpu_s)
    assert s.saved_cost_per_hour == pytest.approx(expected_gpu_s / 3600 * PRICE)
    assert s.verdict.startswith("caching saves")
    assert len(s.assumptions) >= 4


def test_prefix_savings_6k_prefix_8b_ballpark() -> None:
    s = prefix_savings("llama-3.1-8b", "h100", 1, PREFIX, QPH, PRICE, "cpu-dram-pcie")
    # 2·8.03e9·6000 + 4·32·32·128·6000·6001/2 ≈ 1.06e14 FLOP at 50 % of 989 TFLOP/s ≈ 0.21 s;
    # 6000 · 131,072 B = 0.79 GB over 50 GB/s ≈ 16 ms.
    assert 0.18 < s.prefill_seconds < 0.25
    assert 0.012 < s.reload_seconds < 0.02
    assert 35 < s.saved_gpu_seconds_per_hour < 50


def test_prefix_savings_hit_probability_and_lifetime_scale_reuses() -> None:
    s = prefix_savings(
        "llama-3.1-8b", "h100", 1, PREFIX, QPH, PRICE, "cpu-dram-pcie",
        hit_probability=0.5, cache_lifetime_s=600,
    )  # fmt: skip
    # 200/h over 10-minute lifetimes: 33.3 queries each, 32.3 reusable, half hit, 6 per hour.
    assert s.reuses_per_hour == pytest.approx((200 / 6 - 1) * 0.5 * 6)


def test_prefix_savings_slow_tier_does_not_pay() -> None:
    s = prefix_savings("llama-3.1-8b", "h100", 1, PREFIX, QPH, PRICE, "ceph-hdd-single-stream")
    assert s.reload_seconds > s.prefill_seconds
    assert s.saved_gpu_seconds_per_hour < 0 and "does not pay" in s.verdict


def test_prefix_savings_single_query_saves_nothing() -> None:
    s = prefix_savings("llama-3.1-8b", "h100", 1, PREFIX, 1, PRICE, "cpu-dram-pcie")
    assert s.saved_gpu_seconds_per_hour == 0 and "nothing to save" in s.verdict


def test_prefix_savings_no_price_gpu_seconds_only() -> None:
    priced = prefix_savings("llama-3.1-8b", "h100", 1, PREFIX, QPH, PRICE, "cpu-dram-pcie")
    s = prefix_savings("llama-3.1-8b", "h100", 1, PREFIX, QPH, None, "cpu-dram-pcie")
    assert s.saved_cost_per_hour is None
    assert s.saved_gpu_seconds_per_hour == priced.saved_gpu_seconds_per_hour
    assert s.verdict == f"caching saves {s.saved_gpu_seconds_per_hour:,.0f} GPU-s/h"
    assert any("no GPU price given" in a for a in s.assumptions)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prefix_tokens": 0}, "prefix_tokens"),
        ({"queries_per_hour": -1}, "queries_per_hour"),
        ({"gpu_price_per_hour": float("nan")}, "gpu_price_per_hour"),
        ({"hit_probability": 1.5}, "hit_probability"),
        ({"cache_lifetime_s": 0}, "cache_lifetime_s"),
        ({"tier": "floppy"}, "unknown tier"),
        ({"tp": 3}, "tp=3"),
    ],
)
def test_prefix_savings_bad_input_raises(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {
        "model": "llama-3.1-8b",
        "gpu": "h100",
        "tp": 1,
        "prefix_tokens": PREFIX,
        "queries_per_hour": QPH,
        "gpu_price_per_hour": PRICE,
        "tier": "cpu-dram-pcie",
    }
    with pytest.raises(ConfigError, match=match):
        prefix_savings(**{**args, **kwargs})  # type: ignore[arg-type]
