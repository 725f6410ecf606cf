"""The verdict per mode (planner/plan/verdict.py): designs, units, proposals and its JSON."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from planner.decide.evidence import Evidence
from planner.domain.slo import Slo
from planner.fit.common import exp_or_inf
from planner.plan.verdict import run_verdicts, verdict_section
from planner.report.verdict_text import offload_lines
from tests.planner.switchsynth import switchback_frame
from tests.planner.verdictsynth import cluster_frame


def engines(frame: pd.DataFrame, pools: dict[str, str] | None = None) -> list[Any]:
    """Engine records as the store gives them: a source and its facts."""
    return [
        SimpleNamespace(source=s, facts={"pool": (pools or {})[s]} if s in (pools or {}) else {})
        for s in sorted(frame["source"].unique())
    ]


def test_run_verdicts_measured_mode_can_tell_and_feeds_evidence() -> None:
    frame = cluster_frame(["none"] * 3 + ["native"] * 3, ratio={"native": 1.3}, seed=1, peak=2.0)
    v = run_verdicts(frame, engines(frame))
    native = v["native"]
    assert native.evidence.can_tell and native.evidence.units == (3, 3)
    assert native.evidence.ratio is not None and native.evidence.ratio.level == 0.9
    assert native.evidence.claim is not None and native.evidence.claim.level == 0.95
    assert native.experiment is None
    assert native.today is not None and native.today.can_tell
    # no engine ran lmcache: cannot tell; 3 engines without offload cannot give 2 to lmcache
    # and keep 2 controls, so the proposal says so instead of drawing
    lm = v["lmcache"]
    assert not lm.evidence.can_tell and lm.experiment is not None
    assert lm.experiment["design"] == "random assignment" and lm.experiment["engines"] == []
    assert "too few engines without offload (3)" in lm.experiment["text"]


def _drawn(frame: pd.DataFrame, seed: int) -> list[str]:
    x = run_verdicts(frame, engines(frame), seed=seed)["native"].experiment
    assert x is not None
    return list(x["engines"])


def test_run_verdicts_random_assignment_is_seeded_and_blind_to_load() -> None:
    frame = cluster_frame(["none"] * 6, ratio={}, seed=2)
    picked = run_verdicts(frame, engines(frame), seed=7)["native"].experiment
    assert picked is not None
    again = run_verdicts(frame, engines(frame), seed=7)["native"].experiment
    assert again is not None and again["engines"] == picked["engines"] and picked["seed"] == 7
    # the busiest engines are not preferred: load does not enter the draw
    busy = frame.copy()
    busy.loc[busy["source"] == picked["engines"][0], "tokens_per_s"] *= 10
    assert _drawn(busy, 7) == picked["engines"]
    others = {tuple(_drawn(frame, s)) for s in range(8)}
    assert len(others) > 1  # the seed, not a rule, picks


def test_run_verdicts_single_canary_proposes_a_seeded_switchback() -> None:
    frame = cluster_frame(["none"] * 3 + ["native"], ratio={"native": 1.3}, seed=3, peak=2.0,
                          windows=1440)  # fmt: skip
    v = run_verdicts(frame, engines(frame), seed=11)["native"]
    assert not v.evidence.can_tell and v.experiment is not None
    x = v.experiment
    assert x["design"] == "switchback" and x["engines"] == ["e3/0"] and x["seed"] == 11
    assert x is not None and x["block_s"] >= 900 and "τ_int" in x["block_basis"]
    if x.get("blocks"):  # enough history to size the blocks
        assert len(x["schedule"]) == x["blocks"]
        assert x["schedule"].count("on") == x["schedule"].count("off")


def test_run_verdicts_shared_pool_counts_once() -> None:
    modes = ["none"] * 4 + ["lmcache"] * 2
    frame = cluster_frame(modes, ratio={"lmcache": 1.3}, seed=4, peak=2.0, pools={4: "p", 5: "p"})
    v = run_verdicts(frame, engines(frame, {"e4": "p", "e5": "p"}))["lmcache"]
    assert v.evidence.units[0] == 1 and not v.evidence.can_tell
    assert v.today is not None and (v.today.units_treated, v.today.engines_treated) == (1, 2)
    # a pool is no canary: the proposal is a second pool, not a switchback of one engine
    assert v.experiment is not None and v.experiment["design"] == "random assignment"
    assert v.experiment["engines"] and "its own LMCache server" in v.experiment["text"]


def _switching_frame(effect: float, seed: int) -> pd.DataFrame:
    """A switchback history with the columns the verdict reads: TTFT falls by ``effect``
    (log) when the canary's offload is on."""
    f = switchback_frame(seed, effect=-effect, n_periods=12, period_windows=30)
    ttft = 0.5 * np.exp(np.log(3000.0) - np.log(f["tokens_per_s"]))
    n = len(f)
    return f.assign(
        group="g", ttft_p50_s=ttft / 2, ttft_p90_s=ttft, ttft_p99_s=ttft * 1.5,
        ttft_mean_s=ttft / 1.6, e2e_mean_s=ttft + 5, preemptions=0.0, waiting=0.0,
        output_tokens_per_s=f["requests"] * 300.0 / 60.0, kv_util=0.5, running=10.0,
        prompt_tokens_per_s=f["tokens_per_s"] * 0.9,
    ).iloc[:n]  # fmt: skip


def test_run_verdicts_switchback_history_is_estimated_on_the_canary_itself() -> None:
    frame = _switching_frame(math.log(0.7), seed=5)
    v = run_verdicts(frame, engines(frame))["native"]
    assert v.evidence.design == "switchback"
    assert v.today is not None and v.today.can_tell
    p90 = next(e for e in v.today.effects if e.outcome == "ttft_p90_s")
    assert p90.can_tell and p90.interval.lo < 0.7 < p90.interval.hi
    assert v.today.units_treated >= 2 and v.today.units_control >= 2  # blocks, not windows
    # no window came near the SLO: capacity cannot tell, and the switchback continues
    assert not v.evidence.can_tell and v.experiment is not None
    assert v.experiment["design"] == "switchback"


def test_verdict_section_is_json_and_reads_as_text() -> None:
    frame = cluster_frame(["none"] * 3 + ["native"] * 3, ratio={"native": 1.3}, seed=6, peak=2.0)
    v = run_verdicts(frame, engines(frame))
    ev = Evidence(demand_peak=None, engine_capacity=None)
    section = verdict_section(v, ev, Slo())
    json.dumps(section, allow_nan=False)
    native = section["modes"]["native"]
    assert native["capacity"]["can_tell"] and native["capacity"]["interval"]["level"] == 0.9
    assert native["bill"] == {"can_tell": False, "why": "no demand forecast or engine capacity"}
    text = "\n".join(offload_lines({"offload": section}))
    assert "capacity at the SLO:" in text and "TTFT p90" in text
    assert "raises throughput" not in text
    assert "the experiment that would settle it (random assignment)" in text  # lmcache


@pytest.mark.parametrize("mode", ["native", "lmcache"])
def test_run_verdicts_without_engines_off_offload_cannot_compare(mode: str) -> None:
    frame = cluster_frame(["native"] * 2 + ["lmcache"] * 2, ratio={}, seed=7)
    v = run_verdicts(frame, engines(frame))[mode]
    assert not v.evidence.can_tell and "without offload" in v.why


@pytest.mark.parametrize("n_periods", [4, 6])
def test_run_verdicts_short_switchback_never_raises(n_periods: int) -> None:
    # a few blocks give a tiny Bell–McCaffrey ν: a t quantile whose exp overflows a double
    # (the verdict study's 2 h switchbacks raised OverflowError before exp_or_inf)
    f = switchback_frame(9, effect=-math.log(0.7), n_periods=n_periods, period_windows=12)
    ttft = 0.5 * np.exp(np.log(3000.0) - np.log(f["tokens_per_s"]))
    frame = f.assign(group="g", ttft_p50_s=ttft, ttft_p90_s=ttft, ttft_p99_s=ttft,
                     e2e_mean_s=ttft, preemptions=0.0, waiting=0.0, running=1.0,
                     output_tokens_per_s=f["requests"] * 5.0)  # fmt: skip
    v = run_verdicts(frame, engines(frame))["native"]
    json.dumps(verdict_section({"native": v}, None, Slo()), allow_nan=False)


def test_exp_or_inf_saturates() -> None:
    assert exp_or_inf(800.0) == math.inf and exp_or_inf(0.0) == 1.0
