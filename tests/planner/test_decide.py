"""The offload decider: decision tables, measured-over-prior, health, decision score, DECIDER.md."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest

from core.errors import ConfigError
from planner.decide.decision import (
    RULE_IDS,
    CapacityEvidence,
    Decision,
    Evidence,
    Thresholds,
    ValueCI,
    decide,
    decider_doc,
)
from planner.decide.rules import apply_rules
from planner.decide.rules_limits import lmcache_over_native
from planner.decide.rulestate import RuleState
from planner.domain.breakeven import breakeven_bandwidth
from planner.domain.hardware import get_gpu, get_model

# A complete, unremarkable 8-engine Llama-3.1-8B group on one H100 node: every rule can run.
BASE: dict[str, Any] = {
    "model": "llama-3.1-8b",
    "gpu": "h100",
    "tp": 1,
    "vllm_version": "0.14.0",
    "engines": 8,
    "engines_per_node": 8,
    "nodes": 1,
    "kv_util_p50": 0.5,
    "kv_util_p95": 0.6,
    "preemptions_per_1k": 0.0,
    "reprefill_share": 0.0,
    "prompt_tokens_mean": 5000,
    "prompt_tokens_p90": 9000,
    "prefix_hit_ratio": 0.3,
    "cross_engine_reuse": 0.02,
    "cross_node_reuse": 0.0,
    "effective_mfu": ValueCI(0.45, 0.4, 0.5),
    "cpu_dram_per_node_gib": 1872,
}
PRESSURE: dict[str, Any] = {"kv_util_p95": 0.97, "preemptions_per_1k": 12.0, "reprefill_share": 0.3}


def ev(**over: Any) -> Evidence:
    return Evidence(**{**BASE, **over})


def rules_of(d: Decision) -> list[str]:
    return [r.rule_id for r in d.reasons]


def reason(d: Decision, rule_id: str) -> Any:
    return next(r for r in d.reasons if r.rule_id == rule_id)


def gain(estimate: float, lo: float, hi: float, **kw: Any) -> CapacityEvidence:
    """A capacity ratio of 1 + estimate [1 + lo, 1 + hi] (claim interval the same); a
    simulated one carries the simulator's band (interval_kind)."""
    iv = ValueCI(1 + estimate, 1 + lo, 1 + hi)
    if kw.get("provenance") == "simulated":
        kw.setdefault("interval_kind", "largest_in_sample_miss")
    return CapacityEvidence(True, iv, iv, units=(2, 2), **kw)


# ---- decision table -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "over", "mode"),
    [
        ("no pressure, no sharing", {}, "none"),
        ("no pressure, short prompts", {"prompt_tokens_p90": 800}, "none"),
        ("pressure but short prompts", {**PRESSURE, "prompt_tokens_p90": 900}, "none"),
        (
            "short prompts even with cross reuse",
            {"prompt_tokens_p90": 900, "cross_engine_reuse": 0.6},
            "none",
        ),
        ("pressure, long prompts, local reuse", {**PRESSURE}, "native"),
        ("pressure but little local reuse", {"kv_util_p95": 0.95, "reprefill_share": 0.01}, "none"),
        ("cross-engine reuse, no pressure", {"cross_engine_reuse": 0.4}, "lmcache"),
        ("cross-engine reuse below threshold", {"cross_engine_reuse": 0.1}, "none"),
        ("local and cross reuse, large DRAM", {**PRESSURE, "cross_engine_reuse": 0.4}, "both"),
        (
            "local and cross reuse, small DRAM, cross larger",
            {
                **PRESSURE,
                "reprefill_share": 0.2,
                "cross_engine_reuse": 0.4,
                "cpu_dram_per_node_gib": 256,
            },
            "lmcache",
        ),
        (
            "local and cross reuse, small DRAM, local larger",
            {
                **PRESSURE,
                "reprefill_share": 0.5,
                "cross_engine_reuse": 0.2,
                "cpu_dram_per_node_gib": 256,
            },
            "native",
        ),
        ("one engine cannot share", {"engines": 1, "cross_engine_reuse": 0.9}, "none"),
    ],
)
def test_decide_table_priors_pick_mode(name: str, over: dict[str, Any], mode: str) -> None:
    assert decide(ev(**over)).mode == mode, name


def test_decide_reasons_follow_rule_order() -> None:
    d = decide(ev(**PRESSURE, cross_engine_reuse=0.4, l2_tier="local-nvme"))
    applied = rules_of(d)
    assert applied == sorted(applied, key=RULE_IDS.index)
    assert applied[:5] == list(RULE_IDS[:5])


def test_decide_no_pressure_reason_carries_numbers_and_gke_source() -> None:
    d = decide(ev())
    r = reason(d, "R1_hbm_pressure")
    assert r.numbers["kv_util_p95"] == 0.6
    assert "GKE" in r.source
    assert d.pressure is False


def test_decide_short_prompts_reason_has_cost_model_prefill_seconds() -> None:
    d = decide(ev(**PRESSURE, prompt_tokens_p90=1000))
    r = reason(d, "R2_short_prompts")
    assert r.numbers["prompt_tokens"] == 1000
    assert 0 < float(r.numbers["prefill_seconds"]) < 0.2  # 1 k tokens of an 8B model on H100


@pytest.mark.parametrize(
    ("p90", "mean", "expect"),
    [
        # the demo's case: 6.8 k-token prompts, vLLM buckets ending at 2000
        (2000, 6800, "long"),
        (2000, 1500, "undetermined"),  # p90 >= 2000 and mean 1500: could be either
        (2000, None, "undetermined"),
        (5000, 1500, "long"),  # a lower bound above the mark is enough
    ],
)
def test_decide_censored_prompt_p90_is_a_lower_bound_never_short(
    p90: float, mean: float | None, expect: str
) -> None:
    d = decide(
        ev(
            **PRESSURE,
            prompt_tokens_p90=p90,
            prompt_tokens_mean=mean,
            prompt_tokens_p90_censored=True,
        )
    )
    r = reason(d, "R2_short_prompts")
    assert "short" not in r.text.split("(")[0]  # never "prompts are short"
    assert r.numbers["prompt_tokens_p90_at_least"] == p90
    censored_unknown = [u for u in d.unknowns if u.startswith("prompt_tokens_p90 (censored")]
    if expect == "long":
        assert r.text.startswith("prompts are long enough")
        assert not censored_unknown
        assert d.mode != "none"  # R5 (local reuse under pressure) is no longer overridden
    else:
        assert r.text.startswith("prompt length undetermined")
        assert f">= {p90:.0f} tokens" in r.text
        assert censored_unknown


def test_decide_same_p90_uncensored_is_short() -> None:
    """The control: the same numbers without the censoring flag vote both modes off."""
    d = decide(ev(**PRESSURE, prompt_tokens_p90=2000, prompt_tokens_mean=1500))
    assert reason(d, "R2_short_prompts").text.startswith("prompts are short (p90 2000")
    assert d.mode == "none"


def test_decide_forecast_saturation_counts_as_pressure() -> None:
    soon = ValueCI(5 * 86400, 3 * 86400, 9 * 86400)
    d = decide(
        ev(kv_util_p95=0.85, reprefill_share=None, prefix_hit_ratio=0.4, time_to_saturation_s=soon)
    )
    assert d.pressure is True
    assert d.mode == "native"  # local reuse (prefix-hit proxy) under expected pressure
    assert "reprefill_share (used prefix_hit_ratio as a proxy)" in d.unknowns


def test_decide_far_forecast_keeps_no_pressure() -> None:
    later = ValueCI(60 * 86400, 30 * 86400, 90 * 86400)
    assert decide(ev(time_to_saturation_s=later)).pressure is False


# ---- L2 tier (R3) ---------------------------------------------------------------------------


def test_decide_slow_tier_disables_l2_with_breakeven_numbers() -> None:
    d = decide(ev(cross_engine_reuse=0.4, l2_tier="ceph-hdd", prompt_tokens_p90=4096))
    assert d.l2_ok is False
    r = reason(d, "R3_slow_tier")
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h100")
    expected = breakeven_bandwidth(model, gpu, 1, mfu=0.45, prompt_tokens=4096) / 1e9
    assert math.isclose(float(r.numbers["breakeven_GBps"]), expected)
    assert float(r.numbers["tier_read_GBps"]) == pytest.approx(0.83)
    assert float(r.numbers["tier_read_GBps"]) < expected


def test_decide_fast_tier_keeps_l2() -> None:
    d = decide(ev(cross_engine_reuse=0.4, l2_tier="local-nvme"))
    assert d.l2_ok is True


def test_decide_slow_tier_discounts_cross_node_reuse() -> None:
    # 40 % cross-engine reuse, 75 % of it on other nodes: only 10 % is reachable without L2.
    over = {"cross_engine_reuse": 0.4, "cross_node_reuse": 0.75, "nodes": 4, "l2_tier": "ceph-hdd"}
    d = decide(ev(**over))
    assert d.mode == "none"
    assert reason(d, "R4_cross_engine_reuse").numbers["within_node_share"] == pytest.approx(0.1)
    assert decide(ev(**{**over, "l2_tier": "local-nvme"})).mode == "lmcache"


def test_decide_unknown_tier_is_named() -> None:
    d = decide(ev(cross_engine_reuse=0.4, l2_tier="tape-robot"))
    assert any("tape-robot" in u for u in d.unknowns)


# ---- measured evidence overrides priors (R6, R7) --------------------------------------------


def test_decide_measured_negative_gain_overrides_prior_vote() -> None:
    prior = decide(ev(**PRESSURE))
    assert prior.mode == "native"
    d = decide(ev(**PRESSURE, native_capacity=gain(-0.06, -0.09, -0.03)))
    assert d.mode == "none"
    assert "overrides the priors" in reason(d, "R7_capacity").text
    assert d.score > prior.score  # measured beats priors


def test_decide_measured_positive_gain_overrides_short_prompt_prior() -> None:
    d = decide(ev(prompt_tokens_p90=900, lmcache_capacity=gain(0.2, 0.12, 0.28)))
    assert d.mode == "lmcache"
    assert any(s.startswith("measured: capacity at the SLO (lmcache)") for s in d.rests_on)


@pytest.mark.parametrize("provenance", ["measured", "simulated"])
def test_decide_gain_reason_says_where_the_gain_came_from(provenance: str) -> None:
    d = decide(ev(**PRESSURE, native_capacity=gain(-0.06, -0.09, -0.03, provenance=provenance)))
    r = reason(d, "R7_capacity")
    other = "simulated" if provenance == "measured" else "measured"
    assert r.text.startswith(f"{provenance}: an engine with native offload carries less load")
    assert r.source.startswith(f"{provenance}:") and other not in r.source
    assert r.numbers["provenance"] == provenance
    assert any(s.startswith(f"{provenance}: ") and "(native)" in s for s in d.rests_on)
    assert d.mode == "none"
    # the same vote; a simulated ratio weighs less than a measured one (DECIDER.md)
    measured = decide(ev(**PRESSURE, native_capacity=gain(-0.06, -0.09, -0.03))).score
    assert d.score == measured if provenance == "measured" else d.score < measured


def test_gain_evidence_unknown_provenance_raises() -> None:
    with pytest.raises(ConfigError, match="provenance"):
        CapacityEvidence(can_tell=False, provenance="guessed")


def test_decide_gain_straddling_zero_keeps_prior_and_lowers_score() -> None:
    sure = decide(ev(**PRESSURE))
    unsure = decide(ev(**PRESSURE, native_capacity=gain(0.01, -0.02, 0.04)))
    assert unsure.mode == sure.mode == "native"
    assert unsure.score < sure.score
    assert "indistinguishable" in reason(unsure, "R7_capacity").text


def test_decide_fit_that_cannot_tell_is_named_unknown() -> None:
    fit = CapacityEvidence(can_tell=False, why="only 3 windows with offload on")
    d = decide(ev(**PRESSURE, native_capacity=fit))
    assert d.mode == "native"
    assert any("only 3 windows" in u for u in d.unknowns)


def test_decide_lower_bound_ratio_votes_on_never_off() -> None:
    up = ValueCI(1.2, 1.1, 1.2)  # at least +10 %: the offload engines never missed the SLO
    on = CapacityEvidence(True, up, up, lower_bound=True, units=(2, 4))
    d = decide(ev(prompt_tokens_p90=900, native_capacity=on))
    assert d.mode == "native" and "at least +10.0 %" in reason(d, "R7_capacity").text
    low = ValueCI(0.9, 0.8, 0.9)  # a bound below 1 says nothing against the mode
    off = CapacityEvidence(True, low, low, lower_bound=True, units=(2, 4))
    d = decide(ev(**PRESSURE, native_capacity=off))
    assert d.mode == "native" and "indistinguishable" in reason(d, "R7_capacity").text


def test_decide_simulated_ratio_never_overrides_a_measured_one() -> None:
    s = RuleState(ev(**PRESSURE, native_capacity=gain(0.2, 0.1, 0.3)), Thresholds(), None,
                  None, None, 0.5)  # fmt: skip
    apply_rules(s)
    assert s.votes["native"].on is True and s.votes["native"].basis == "measured"


def test_decide_idle_deployed_connector_voted_off() -> None:
    d = decide(
        ev(
            cross_engine_reuse=0.4,
            current_mode="lmcache",
            external_hit_ratio=0.01,
            lmcache_up_fraction=1.0,
        )
    )
    assert d.mode == "none"
    assert reason(d, "R6_idle_connector").numbers["external_hit_ratio"] == 0.01


def test_decide_busy_deployed_connector_voted_on() -> None:
    d = decide(
        ev(
            cross_engine_reuse=None,
            current_mode="lmcache",
            external_hit_ratio=0.35,
            lmcache_up_fraction=1.0,
        )
    )
    assert d.mode == "lmcache"


def test_decide_measured_overhead_raises_cross_engine_threshold() -> None:
    over = {"cross_engine_reuse": 0.2, "current_mode": "lmcache", "lmcache_up_fraction": 1.0}
    assert decide(ev(**over)).mode == "lmcache"  # prior threshold 15 %
    d = decide(ev(**over, overhead_zero_hit=ValueCI(0.2, 0.18, 0.25)))
    assert d.mode == "none"
    assert reason(d, "R4_cross_engine_reuse").numbers["threshold"] == 0.25


# ---- DRAM for both (R8) and LMCache health (R9) ---------------------------------------------


def test_decide_both_reason_has_dram_arithmetic() -> None:
    d = decide(ev(**PRESSURE, cross_engine_reuse=0.4))
    r = reason(d, "R8_dram_for_both")
    assert float(r.numbers["usable_dram_gib"]) == pytest.approx(1872 * 0.8)
    assert float(r.numbers["needed_gib"]) == pytest.approx(
        2 * 8 * float(r.numbers["engine_hbm_kv_gib"])
    )


def test_decide_both_with_unknown_dram_keeps_one_and_names_it() -> None:
    d = decide(ev(**PRESSURE, cross_engine_reuse=0.4, cpu_dram_per_node_gib=None))
    assert d.mode in ("native", "lmcache")
    assert any("cpu_dram_per_node_gib" in u for u in d.unknowns)


@pytest.mark.parametrize(
    ("native", "lmcache", "keep", "says"),
    [
        # the two plans of one cluster in tests/e2e/test_modes_agree.py: a tie either way
        ((0.201, 0.115, 0.293), (0.230, 0.131, 0.338), "native", "the data cannot tell"),
        ((0.248, 0.187, 0.312), (0.234, 0.127, 0.352), "native", "the data cannot tell"),
        ((0.10, 0.07, 0.13), (0.40, 0.35, 0.45), "lmcache", "the larger measured capacity"),
        ((0.40, 0.35, 0.45), (0.10, 0.07, 0.13), "native", "the larger measured capacity"),
    ],
)
def test_decide_unknown_dram_keeps_lmcache_only_when_it_measurably_beats_native(
    native: tuple[float, float, float], lmcache: tuple[float, float, float], keep: str, says: str
) -> None:
    d = decide(
        ev(
            **PRESSURE,
            cross_engine_reuse=0.4,
            cpu_dram_per_node_gib=None,
            native_capacity=gain(*native),
            lmcache_capacity=gain(*lmcache),
        )
    )
    assert d.mode == keep
    r = reason(d, "R8_dram_for_both")
    assert f"keeping {keep}: {says}" in r.text
    lo, hi = float(r.numbers["lo"]), float(r.numbers["hi"])
    assert lo <= float(r.numbers["lmcache_over_native"]) <= hi
    assert (lo <= 0 <= hi) == (says == "the data cannot tell")


def test_decide_simulated_gains_keep_the_larger_even_inside_the_tolerance() -> None:
    # advise's case: one deterministic model for both modes, its tolerance band shared
    sim = {"provenance": "simulated"}
    d = decide(
        ev(
            **PRESSURE,
            cross_engine_reuse=0.4,
            cpu_dram_per_node_gib=None,
            native_capacity=gain(0.153, 0.022, 0.283, **sim),
            lmcache_capacity=gain(0.270, 0.116, 0.424, **sim),
        )
    )
    assert d.mode == "lmcache"
    assert "keeping lmcache: the larger simulated capacity" in reason(d, "R8_dram_for_both").text


def test_lmcache_over_native_interval_adds_log_half_widths() -> None:
    n, lm = ValueCI(0.2, 0.1, 0.3), ValueCI(0.2, 0.1, 0.3)
    diff = lmcache_over_native(n, lm)
    assert diff.estimate == pytest.approx(0.0)
    half = math.hypot(*[(math.log1p(0.3) - math.log1p(0.1)) / 2] * 2)
    assert math.log1p(diff.hi) == pytest.approx(half)
    assert math.log1p(diff.lo) == pytest.approx(-half)
    with pytest.raises(ValueError, match="different levels"):
        lmcache_over_native(n, ValueCI(0.2, 0.1, 0.3, level=0.9))


def test_decide_lmcache_down_falls_back_to_native_with_ha_advice() -> None:
    d = decide(
        ev(
            **PRESSURE,
            cross_engine_reuse=0.4,
            current_mode="lmcache",
            external_hit_ratio=0.3,
            lmcache_up_fraction=0.0,
        )
    )
    assert d.mode == "native"
    assert "fall back to native" in reason(d, "R9_lmcache_unhealthy").text
    spof = next(r for r in d.risks if r.risk_id == "lmcache_spof")
    assert "DaemonSet" in spof.advice and "mq_timeout" in spof.text


def test_decide_lmcache_down_without_pressure_falls_back_to_none() -> None:
    d = decide(ev(cross_engine_reuse=0.4, lmcache_healthy=False))
    assert d.mode == "none"
    assert "fall back to none" in reason(d, "R9_lmcache_unhealthy").text


def test_decide_partial_lmcache_outage_keeps_mode_with_risk() -> None:
    d = decide(ev(cross_engine_reuse=0.4, lmcache_up_fraction=0.75))
    assert d.mode == "lmcache"
    assert "affected nodes" in reason(d, "R9_lmcache_unhealthy").text


def test_decide_healthy_lmcache_still_reports_spof_risk() -> None:
    d = decide(ev(cross_engine_reuse=0.4, lmcache_up_fraction=1.0, lmcache_healthy=True))
    assert d.mode == "lmcache"
    assert "R9_lmcache_unhealthy" not in rules_of(d)
    assert {r.risk_id for r in d.risks} == {"lmcache_spof", "decode_latency"}


def test_decide_none_reports_no_risks() -> None:
    assert decide(ev()).risks == ()


# ---- missing evidence, decision score -----------------------------------------------------------


def test_decide_missing_evidence_lowers_score_and_names_fields() -> None:
    full = decide(
        ev(
            **PRESSURE,
            native_capacity=gain(0.1, 0.05, 0.15),
            lmcache_capacity=gain(-0.02, -0.05, -0.01),
        )
    )
    sparse = decide(Evidence(kv_util_p95=0.97))
    assert full.score > sparse.score
    assert sparse.score_label == "low"
    for name in (
        "prompt_tokens_p90",
        "cross_engine_reuse",
        "model",
        "capacity at the SLO (native)",
    ):
        assert any(u.startswith(name) for u in sparse.unknowns), name
    assert full.score_label == "high"


def test_decide_each_missing_field_costs_score() -> None:
    d_all = decide(ev(**PRESSURE))
    d_less = decide(ev(**PRESSURE, cross_engine_reuse=None))
    assert d_less.score < d_all.score
    assert "cross_engine_reuse (prefix reuse across engines)" in d_less.unknowns


def test_decide_empty_evidence_is_none_low_score() -> None:
    d = decide(Evidence())
    assert d.mode == "none" and d.score_label == "low"
    assert "kv_util_p95 (HBM pressure)" in d.unknowns


def test_decide_custom_thresholds_change_outcome() -> None:
    e = ev(prompt_tokens_p90=3000, **PRESSURE)
    assert decide(e).mode == "native"
    assert decide(e, thresholds=Thresholds(short_prompt_tokens=4096)).mode == "none"


def test_decide_to_dict_is_json() -> None:
    d = decide(ev(**PRESSURE, cross_engine_reuse=0.4, l2_tier="ceph-hdd"))
    doc = json.loads(json.dumps(d.to_dict()))
    assert doc["mode"] == d.mode and doc["reasons"][0]["rule"] == "R1_hbm_pressure"
    assert isinstance(doc["unknown"], list)


def test_decide_bad_tp_for_model_raises() -> None:
    with pytest.raises(ConfigError, match="tp=3"):
        decide(ev(**PRESSURE, tp=3, cross_engine_reuse=0.4))


# ---- evidence validation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"kv_util_p95": 1.2}, "kv_util_p95"),
        ({"kv_util_p95": float("nan")}, "use None"),
        ({"prefix_hit_ratio": -0.1}, "prefix_hit_ratio"),
        ({"engines": 0}, "engines"),
        ({"tp": 2.5}, "tp"),
        ({"prompt_tokens_p90": -1}, "prompt_tokens_p90"),
        ({"current_mode": "turbo"}, "current_mode"),
        ({"engines": True}, "engines"),
        ({"l1_hit_curve": ((0.0, 0.5),)}, "l1_hit_curve"),
        ({"engine_capacity": 0}, "engine_capacity"),
    ],
)
def test_evidence_bad_field_raises(over: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ev(**over)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0.5, 0.6, 0.7), "lo <= estimate"),
        ((0.5, 0.4, 0.6, 1.0), "level"),
        ((math.inf, 0, 1), "finite"),
    ],
)
def test_interval_bad_values_raise(args: tuple[float, ...], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ValueCI(*args)


def test_capacity_that_can_tell_needs_its_interval() -> None:
    with pytest.raises(ConfigError, match="needs its interval"):
        CapacityEvidence(can_tell=True)


# ---- DECIDER.md ------------------------------------------------------------------------------


def test_decider_doc_and_rule_table_name_the_same_rules() -> None:
    documented = re.findall(r"\bR\d+_[a-z0-9_]+", decider_doc())
    assert set(documented) == set(RULE_IDS)
    headings = re.findall(r"^## (R\d+_[a-z0-9_]+)", decider_doc(), flags=re.M)
    assert headings == list(RULE_IDS)  # one section per rule, in the order applied


def test_decider_doc_states_the_default_thresholds() -> None:
    doc = decider_doc().replace(",", "")
    t = Thresholds()
    for pct in (
        t.pressure_util,
        t.no_pressure_util,
        t.cross_engine_min,
        t.local_reuse_min,
        t.idle_hit_ratio,
        t.dram_reserve_fraction,
        t.lmcache_down_fraction,
    ):
        assert f"**{pct:.0%}".replace("%", " %") in doc, pct
    assert f"**{t.short_prompt_tokens:.0f} tokens**" in doc
    assert f"**{t.saturation_horizon_s / 86400:.0f} days**" in doc
