"""benchmarks.accuracy.verdict_study: the frozen cases, the scoring rules, and (slow) one case
end to end and a switchback canary's regimes reaching the frame."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks.accuracy.telemetry_gen import generate
from benchmarks.accuracy.verdict_cases import HELPS_ABOVE, NULL_WITHIN, cases
from benchmarks.accuracy.verdict_study import (
    call_of,
    covers,
    decision_call,
    engine_records,
    merged,
    run_case,
)
from benchmarks.accuracy.verdict_truth import label_of, slo_ttft
from core.errors import ConfigError
from planner.frames.frames import engine_frame
from planner.simulate.scenario import parse_scenario

# sha256 of the study split as committed before its first run (ba50cd3): changing a case,
# a seed or a rule of verdict_cases.py makes a new study, not a re-run of this one
STUDY_DIGEST = "d6edb4e3e56179d9b0870e885ad76a65d851e421d9267314cc6689ee24fdd734"
# the replica split, as committed before its first run
REPLICA_DIGEST = "9eea994edba627e3567834d46cd21a9ed6f9aa806f8fee72bf308dba63a3e18d"


@pytest.mark.parametrize(("split", "digest"), [("study", STUDY_DIGEST),
                                                ("replica", REPLICA_DIGEST)])  # fmt: skip
def test_verdict_cases_split_unchanged_since_frozen(split: str, digest: str) -> None:
    blob = json.dumps([asdict(c) for c in cases(split)], sort_keys=True).encode()
    assert hashlib.sha256(blob).hexdigest() == digest


def test_verdict_cases_replica_draws_the_same_specs_with_other_seeds() -> None:
    study, replica = cases("study"), cases("replica")
    assert [(c.name, c.cls, c.design) for c in study] == [
        (c.name, c.cls, c.design) for c in replica
    ]
    assert not {c.seed for c in study} & {c.seed for c in replica}


def test_verdict_cases_single_unit_arms_expect_cannot_tell() -> None:
    by_name = {c.name: c for c in cases("study")}
    assert len(by_name) == 25
    for c in by_name.values():
        if c.cls == "canary":
            assert c.expect_cannot_tell == ("native",), c.name
        if c.cls == "switchback":
            assert c.modes == ("native",) and not c.expect_cannot_tell, c.name
            assert c.raw["cluster"]["switchback"]["engines"] == [0]
    assert by_name["helps-15-prefix"].expect_cannot_tell == ("lmcache",)  # one pool
    assert by_name["helps-14-prefix"].expect_cannot_tell == ()  # two pools


def test_verdict_cases_unknown_split_raises() -> None:
    with pytest.raises(ConfigError, match="split"):
        cases("heldout")


@pytest.mark.parametrize(
    ("ratio", "label"),
    [
        (HELPS_ABOVE + 0.001, "helps"),
        (HELPS_ABOVE, "small"),
        (1.0 + NULL_WITHIN, "null"),
        (1.0 - NULL_WITHIN, "null"),
        (0.95, "hurts"),
        (math.nan, "unknown"),
    ],
)
def test_label_of_thresholds_give_label(ratio: float, label: str) -> None:
    assert label_of(ratio) == label


def test_slo_ttft_four_times_low_load_to_two_digits() -> None:
    assert slo_ttft(0.0679) == pytest.approx(0.27)
    assert slo_ttft(0.323) == pytest.approx(1.3)
    with pytest.raises(ConfigError):
        slo_ttft(math.nan)


@pytest.mark.parametrize(
    ("lo", "hi", "truth", "bound", "held"),
    [
        (0.9, 1.1, 1.0, "", True),
        (0.9, 1.1, 1.2, "", False),
        (1.2, None, 1.5, "", True),  # a lower bound holds a larger truth
        (1.2, None, 1.1, "", False),
        (0.9, 1.3, 1.4, "lower", False),  # the truth is at least 1.4: the interval stops short
        (0.9, 1.6, 1.4, "lower", True),
        (None, None, 1.0, "", None),
    ],
)
def test_covers_bounds_on_either_side(
    lo: float | None, hi: float | None, truth: float, bound: str, held: bool | None
) -> None:
    assert covers(lo, hi, truth, bound) is held


def test_call_of_null_any_claim_is_wrong_and_no_claim_right() -> None:
    assert call_of("null", True, "helps") == "wrong"
    assert call_of("null", True, "hurts") == "wrong"
    assert call_of("null", True, "") == "right"
    assert call_of("null", False, "") == "right"
    assert call_of("helps", True, "helps") == "right"
    assert call_of("helps", True, "hurts") == "wrong"
    assert call_of("helps", True, "") == "no claim"
    assert call_of("helps", False, "") == "cannot tell"


def test_decision_call_none_after_measured_claim_is_wrong() -> None:
    helps = {"truth": {"label": "helps"}, "claim": "helps"}
    unclaimed = {"truth": {"label": "helps"}, "claim": ""}
    null = {"truth": {"label": "null"}, "claim": ""}
    assert decision_call("none", {"native": helps}).startswith("wrong")
    assert decision_call("none", {"native": unclaimed}) == "none (cannot tell)"
    assert decision_call("native", {"native": helps}) == "right"
    assert decision_call("native", {"native": null}) == "wrong"
    assert decision_call("native", {"lmcache": helps}).startswith("unscored")
    assert decision_call("none", {"native": null}) == "right"
    assert decision_call(None, {"native": null}) == "no plan"


@pytest.mark.slow
def test_verdict_study_switchback_regimes_reach_the_frame_rows() -> None:
    """A switchback canary's schedule (engine records' ``changes``) sets each window's mode."""
    case = next(c for c in cases("dev") if c.cls == "switchback")
    raw = {**case.raw, "duration_s": 7200.0, "warmup_s": 0.0}
    raw["workload"] = {**raw["workload"], "qps": 0.5}
    tel = generate(parse_scenario(raw), drop_before_s=0.0)
    records, regimes = engine_records(raw, tel)
    assert set(regimes) == {"engine-0"} and len(regimes["engine-0"]) >= 2
    frame = engine_frame(list(tel.windows), records)
    rows = frame[frame["source"] == "engine-0"]
    at = np.array([t for t, _ in regimes["engine-0"]])
    want = [regimes["engine-0"][i][1] for i in np.searchsorted(at, rows["start"], "right") - 1]
    assert rows["offload_mode"].astype(str).tolist() == want
    assert set(frame.loc[frame["source"] != "engine-0", "offload_mode"].astype(str)) == {"none"}


@pytest.mark.slow
def test_verdict_study_helps_case_measured_claim_right_sign() -> None:
    """A dev 2+2 native case with long shared prefixes, 2 h: the truth helps, the verdict can
    tell, and it makes no wrong-sign claim (with 2 + 2
    engines over 2 h the 95 % claim interval may still hold 1: the study's helps-12 too)."""
    case = next(c for c in cases("dev") if c.name == "helps-12-prefix")
    case = replace(case, hours=2.0, period_h=2.0)
    out = run_case(case, lambda _msg: None, plan=False)
    json.dumps(out)  # JSON-ready
    (native,) = [e["modes"]["native"] for e in out["evaluations"]]
    assert native["truth"]["label"] == "helps"
    assert native["can_tell"] and native["claim"] in ("helps", "")
    assert native["call"] in ("right", "no claim")


def test_merged_puts_rerun_cases_in_place_and_keeps_each_revision() -> None:
    base = json.loads(Path("benchmarks/results/verdict_study.json").read_text())
    one = json.loads(json.dumps(base["results"][-1]))
    one["evaluations"][-1]["modes"]["native"]["covers"] = not one["evaluations"][-1]["modes"][
        "native"
    ]["covers"]
    rerun = {**base, "git": "abc1234", "results": [one], "wall_s": 60.0}
    doc = merged(base, rerun)
    assert [r["case"] for r in doc["results"]] == [r["case"] for r in base["results"]]
    assert doc["results"][-1]["git"] == "abc1234"
    assert doc["results"][0]["git"] == base["results"][0].get("git", base["git"])
    assert (
        doc["results"][-1]["evaluations"][-1]["modes"]["native"]["covers"]
        == one["evaluations"][-1]["modes"]["native"]["covers"]
    )
    assert doc["wall_s"] == base["wall_s"] + 60.0
    with pytest.raises(ValueError, match="split"):
        merged(base, {**rerun, "split": "dev"})
    with pytest.raises(ValueError, match="not in the base"):
        merged(base, {**rerun, "results": [{**one, "case": "nope-99"}]})
