"""The plan's "What a CPU tier would buy" (planner/plan/tier.py) against a brute-force LRU:
an engine whose blocks follow an IRM trace, recorded the vLLM way (tests/planner/reusesynth.py),
read as the plan reads it (frame rows + summed bucket counts + engine facts)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from core.catalog import KV_RESIDENCY_BUCKETS
from planner.decide.decision import decide
from planner.decide.evidence import Evidence
from planner.deploy.sizing import size
from planner.domain.hardware import get_gpu, get_model
from planner.domain.slo import Slo
from planner.frames.residency import BucketCounts
from planner.plan.fits import Hardware
from planner.plan.tier import ENABLE, MULTIPLES, recommended_gib, tier_section
from planner.report.tier_text import tier_lines
from store.tables import EngineRecord
from tests.planner.reusesynth import (
    Recorded,
    irm_trace,
    lru_record,
    tiered_hit_ratio,
)

CAP = 2000  # HBM blocks
BLOCK = 16
ROWS = 60
HW = Hardware(get_model("llama-3.1-8b"), get_gpu("h100-80gb"), 1)


def _counts(values: list[float]) -> BucketCounts:
    edges = np.concatenate([[0.0], KV_RESIDENCY_BUCKETS, [np.inf]])
    counts, _ = np.histogram(np.asarray(values, dtype=float), edges)
    return BucketCounts(tuple(KV_RESIDENCY_BUCKETS), tuple(float(c) for c in counts), ROWS)


def _engine(rec: Recorded, source: str) -> tuple[pd.DataFrame, dict[str, BucketCounts]]:
    """The frame rows and summed bucket counts the plan would read for one engine."""
    secs = rec.window / ROWS
    rows = pd.DataFrame({
        "source": source, "engine": "0", "start": 1.8e9 + secs * np.arange(ROWS),
        "window_s": secs, "prefix_queries": rec.accesses * BLOCK / ROWS,
        "prefix_hit_ratio": rec.hits / rec.accesses, "output_tokens_per_s": 0.0,
        "requests": 0.0, "tokens_per_s": rec.accesses * BLOCK / rec.window,
        "ttft_p90_s": 0.1, "waiting": 0.0, "offload_mode": "none",
    })  # fmt: skip
    hists = {
        "kv_block_reuse_gap_seconds": _counts(rec.gaps),
        "kv_block_idle_before_evict_seconds": _counts(rec.idle),
        "kv_block_lifetime_seconds": _counts(rec.life),
    }
    return rows, hists


def _record(source: str) -> EngineRecord:
    return EngineRecord("c", source, "llama-3.1-8b", "h100-80gb", 80.0, 1, "none",
                        facts={"num_gpu_blocks": CAP, "block_size": BLOCK})  # fmt: skip


@pytest.fixture(scope="module")
def irm() -> tuple[object, Recorded]:
    trace = irm_trace(100_000, 0.9, 200.0, 250_000, seed=11)
    return trace, lru_record(trace, CAP)


def _section(rec: Recorded) -> dict[str, Any]:
    rows, hists = _engine(rec, "a")
    return tier_section(rows, [_record("a")], {"a/0": hists}, HW, slo=Slo(), mfu=None,
                        engines_per_node=None, seed=0)  # fmt: skip


def test_native_rows_match_a_brute_force_two_tier_lru(irm: tuple[object, Recorded]) -> None:
    trace, rec = irm
    sec = _section(rec)
    assert sec["can_tell"] and sec["engines"] == 1
    native = sec["native"]
    assert isinstance(native, dict)
    rows = native["rows"]
    assert [r["multiple"] for r in rows] == pytest.approx(list(MULTIPLES))
    hbm = sec["hbm"]
    assert isinstance(hbm, dict)
    assert hbm["blocks_per_engine"] == CAP and hbm["hit_ratio_measured"] == pytest.approx(
        rec.hits / rec.accesses
    )
    # inclusive: a tier no larger than HBM adds nothing
    for r in rows[:2]:
        assert r["extra_hit_ratio"]["estimate"] == 0.0
        assert r["avoided_prefill_tokens_per_s"]["estimate"] == 0.0
    # 2x HBM of CPU: HBM + CPU hit as an HBM of 2x
    two = rows[2]
    base, both = tiered_hit_ratio(trace, CAP, 2 * CAP)  # type: ignore[arg-type]
    assert abs(two["extra_hit_ratio"]["estimate"] - (both - base)) < 0.03
    assert two["extra_hit_ratio"]["lo"] <= both - base + 1e-9
    assert two["extra_hit_ratio"]["hi"] >= both - base - 1e-9
    assert two["hit_ratio"]["estimate"] == pytest.approx(
        hbm["hit_ratio_measured"] + two["extra_hit_ratio"]["estimate"]
    )
    # avoided re-prefill tokens/s: extra block hits/s x block size
    lookups_tok = rec.accesses * BLOCK / rec.window
    assert two["avoided_prefill_tokens_per_s"]["estimate"] == pytest.approx(
        two["extra_hit_ratio"]["estimate"] * lookups_tok, rel=0.05
    )
    assert two["prefill_gpu_seconds_saved_per_hour"]["estimate"] > 0
    # no window near the SLO: capacity cannot be told, and says why
    assert two["capacity_ratio"] is None and "capacity" in two["capacity_why"]
    # every hit ratio is a ratio
    for r in rows:
        assert r["hit_ratio"]["hi"] is None or r["hit_ratio"]["hi"] <= 1.0
    curve = native["curve"]
    assert curve[0]["gib"] == 0.0 and curve[0]["hit_ratio"] == pytest.approx(
        hbm["hit_ratio_measured"]
    )


def test_recommended_size_feeds_sizing_only_where_the_model_can_tell(
    irm: tuple[object, Recorded],
) -> None:
    _, rec = irm
    sec = _section(rec)
    native = sec["native"]
    assert isinstance(native, dict)
    r = native["recommended"]
    told = [row["gib"] for row in native["rows"] if row["can_tell"]]
    # the knee is reported with its range either way; sizing reads it only inside the sizes
    # the model can tell
    assert r["gib"] is not None and r["interval_gib"]["lo"] <= r["interval_gib"]["hi"]
    assert r["can_tell"] == (r["gib"] <= max(told))
    assert (recommended_gib(sec, "native") is not None) == r["can_tell"]
    doctored = {"native": {"recommended": {**r, "can_tell": True}}}
    gib = recommended_gib(doctored, "native")
    assert gib is not None and gib == r["gib"]

    ev = Evidence(model="llama-3.1-8b", gpu="h100-80gb", tp=1, engines=2, kv_util_p95=0.97,
                  preemptions_per_1k=80.0, prompt_tokens_p90=9000, prefix_hit_ratio=0.3,
                  cpu_tier_native_gib=gib)  # fmt: skip
    decision = replace(decide(ev), mode="native")
    sizing = size(ev, decision)
    assert sizing.native_cpu_gib == pytest.approx(float(int(gib)))
    assert any("reuse curve" in n for n in sizing.notes)
    fallback = size(replace(ev, cpu_tier_native_gib=None), decision)
    assert fallback.native_cpu_gib != sizing.native_cpu_gib


def test_two_engines_add_their_avoided_tokens(irm: tuple[object, Recorded]) -> None:
    _, rec = irm
    r1, h1 = _engine(rec, "a")
    r2, h2 = _engine(rec, "b")
    both = tier_section(pd.concat([r1, r2], ignore_index=True), [_record("a"), _record("b")],
                        {"a/0": h1, "b/0": h2}, HW, slo=Slo(), mfu=None, engines_per_node=2,
                        seed=0)  # fmt: skip
    one = _section(rec)
    row2, row1 = both["native"]["rows"][2], one["native"]["rows"][2]
    assert row2["avoided_prefill_tokens_per_s"]["estimate"] == pytest.approx(
        2 * row1["avoided_prefill_tokens_per_s"]["estimate"]
    )
    assert row2["extra_hit_ratio"]["estimate"] == pytest.approx(row1["extra_hit_ratio"]["estimate"])
    assert both["lmcache"]["scope"] == "per node pool of 2 engine(s)"
    assert both["lmcache"]["lower_bound"] is True


def test_without_histograms_it_says_how_to_turn_them_on(irm: tuple[object, Recorded]) -> None:
    _, rec = irm
    rows, _ = _engine(rec, "a")
    sec = tier_section(rows, [_record("a")], {}, HW, slo=Slo(), mfu=None, engines_per_node=None,
                       seed=0)  # fmt: skip
    assert sec["can_tell"] is False and "--kv-cache-metrics" in str(sec["why"])
    assert sec["enable"] == ENABLE and sec["engines_without"] == ["a/0"]
    lines = tier_lines({"cpu_tier": sec})
    assert "cannot tell" in lines[0] and "--kv-cache-metrics" in lines[1]


def test_engine_without_facts_is_left_out_with_the_reason(irm: tuple[object, Recorded]) -> None:
    _, rec = irm
    r1, h1 = _engine(rec, "a")
    r2, h2 = _engine(rec, "b")
    bare = EngineRecord("c", "b", "llama-3.1-8b", "h100-80gb", 80.0, 1, "none")
    sec = tier_section(pd.concat([r1, r2], ignore_index=True), [_record("a"), bare],
                       {"a/0": h1, "b/0": h2}, HW, slo=Slo(), mfu=None, engines_per_node=None,
                       seed=0)  # fmt: skip
    assert sec["engines"] == 1 and sec["engines_without"] == ["b/0"]
    assert "num_gpu_blocks" in sec["engines_without_why"]["b/0"]
    text = "\n".join(tier_lines({"cpu_tier": sec}))
    assert "What a CPU tier would buy" in text and "2× HBM" in text


def test_unknown_hardware_cannot_turn_gib_into_blocks(irm: tuple[object, Recorded]) -> None:
    _, rec = irm
    rows, hists = _engine(rec, "a")
    sec = tier_section(rows, [_record("a")], {"a/0": hists}, None, slo=Slo(), mfu=None,
                       engines_per_node=None, seed=0)  # fmt: skip
    assert sec["can_tell"] is False and "model/GPU/TP" in str(sec["why"])
