"""planner.domain.payloads: the compare-tiers and savings answers and the input they blame."""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import InputError
from planner.domain.breakeven import compare_tiers
from planner.domain.payloads import compare_tiers_payload, savings_payload
from planner.domain.savings import prefix_savings

COMPARE: dict[str, Any] = {"model": "llama-3.1-70b-fp8", "gpu": "h100", "tp": 4,
                           "tokens": 4096, "tiers": ["ceph-hdd"], "kv_dtype": "both"}  # fmt: skip
SAVINGS: dict[str, Any] = {"model": "llama-3.1-70b", "gpu": "h100", "tp": 4,
                           "tier": "cpu-dram-pcie", "kv_dtype": "auto", "prefix_tokens": 6000,
                           "queries_per_hour": 200.0,
                           "gpu_hour_usd": 3.0, "mfu": 0.5, "hit_probability": 1.0,
                           "cache_lifetime_s": 3600.0}  # fmt: skip


def test_compare_tiers_payload_rows_are_the_comparisons_fp8_then_bf16() -> None:
    out = compare_tiers_payload(**COMPARE)
    rows = compare_tiers("llama-3.1-70b-fp8", "h100", 4, 4096, tiers=["ceph-hdd"],
                         kv_dtypes=("fp8", "bf16"))  # fmt: skip
    assert out["kv_dtypes"] == ["fp8", "bf16"] and out["tiers"] == ["ceph-hdd"]
    assert out["comparisons"] == [
        {"kv_dtype": kv, **rows[kv]["ceph-hdd"].to_dict()} for kv in ("fp8", "bf16")
    ]
    assert out["note"] is not None and out["mfu_range"] == {"low": 0.2, "high": 0.6}


def test_savings_payload_carries_prefix_savings_and_its_price() -> None:
    out = savings_payload(**SAVINGS)
    s = prefix_savings("llama-3.1-70b", "h100", 4, 6000, 200.0, 3.0, "cpu-dram-pcie")
    assert out["saved_gpu_seconds_per_hour"] == s.saved_gpu_seconds_per_hour
    assert out["saved_usd_per_hour"] == s.saved_cost_per_hour
    assert out["gpu_hour_usd"] == 3.0 and out["assumptions"] == list(s.assumptions)


@pytest.mark.parametrize(
    ("over", "field", "message"),
    [({"model": "nope"}, "model", "model: unknown model 'nope'"),
     ({"tiers": ["ceph-hdd", "tape"]}, "tiers", "tiers: unknown tier 'tape'"),
     ({"tiers": []}, "tiers", "tiers: no tier named; known: ceph-hdd"),
     ({"tp": 3}, "tp", "tp: tp=3 does not divide"),
     ({"tokens": 0}, "tokens", "tokens must be an integer >= 1, got 0"),
     ({"kv_dtype": "int4"}, "kv_dtype", "kv_dtype: unknown KV dtype 'int4'; known: auto, bf16, "
      "fp8, both")],
)  # fmt: skip
def test_compare_tiers_payload_bad_input_names_the_field(
    over: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(InputError) as caught:
        compare_tiers_payload(**{**COMPARE, **over})
    assert caught.value.field == field and str(caught.value).startswith(message)


@pytest.mark.parametrize(
    ("over", "field", "message"),
    [({"tier": "tape"}, "tier", "--tier: unknown tier 'tape'"),
     ({"kv_dtype": "int4"}, "kv_dtype", "--kv-dtype: unknown KV dtype 'int4'"),
     ({"prefix_tokens": 0}, "prefix_tokens", "--prefix-tokens must be an integer >= 1, got 0"),
     ({"gpu_hour_usd": float("nan")}, "gpu_hour_usd", "--gpu-hour-usd must be a number >= 0"),
     ({"mfu": 0.0}, "mfu", "--mfu must be in (0, 1], got 0.0"),
     ({"cache_lifetime_s": float("inf")}, "cache_lifetime_s",
      "--cache-lifetime-s must be a number of seconds > 0, got inf")],
)  # fmt: skip
def test_savings_payload_bad_input_labelled_by_the_caller(
    over: dict[str, Any], field: str, message: str
) -> None:
    def label(key: str) -> str:
        return "--" + key.replace("_", "-")

    with pytest.raises(InputError) as caught:
        savings_payload(**{**SAVINGS, **over}, label=label)
    assert caught.value.field == field and str(caught.value).startswith(message)
