"""planner.plan.build model groups: a real SQLite store of two models' engines -> a plan per group.

The store (tests/planner/groupstore.py) holds 6 engines of an 8B model on one GPU and 4 of
a 70B model on four, each model's windows labelled with its served name. The plan must fit
each group on its own windows (equal to direct fits on that group's generating frame, not
on the pooled one), decide and size each group, and fit nothing across them; ``--group``
plans one group; an unknown group is a ConfigError naming the groups; a store of one model
gives the plan it gave before groups existed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from core.errors import ConfigError
from planner.domain.values import json_ready
from planner.fit.preempt import fit_preemption
from planner.fit.registry import FIT_NAMES
from planner.plan import Plan, build_plan
from planner.report.plan_text import summary_text
from store.store import Store
from tests.planner.groupstore import BIG, SMALL, fill_two_models
from tests.planner.synthstore import (
    BLOCK_SIZE,
    BLOCKS,
    fill_store,
    shifted_frame,
    sqlite_url,
    without_timings,
)

CAP = BLOCKS * BLOCK_SIZE
# Plans compared with each other get an ample forecast budget: a budget that cuts candidate
# models depends on the machine's load, and two runs would then differ.
BUDGET = 60.0


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Plan, dict[str, pd.DataFrame]]:
    url = sqlite_url(tmp_path_factory.mktemp("groups") / "two.db")
    frames = fill_two_models(url)
    with Store(url) as store:
        plan = build_plan(store, cluster="synth", gpu_price_per_hour=2.0, forecast_seconds=BUDGET)
    return url, plan, frames


def test_plan_two_models_gives_one_group_each_with_its_engines(two: Any) -> None:
    _, plan, frames = two
    assert [g.name for g in plan.groups] == sorted([SMALL.group, BIG.group])
    for g in plan.groups:
        sources = sorted(frames[g.name]["source"].unique())
        assert [e.split("/")[0] for e in g.engines] == sources
        assert list(g.sources) == sources
        assert g.plan.group == g.name and g.plan.groups == ()
        assert g.plan.window["engines"] == len(sources)
        ev = g.plan.evidence
        spec = SMALL if g.name == SMALL.group else BIG
        assert (ev.model, ev.gpu, ev.tp) == (spec.model, spec.gpu, spec.tp)
    assert plan.window["engines"] == 10


def test_plan_two_models_fits_each_group_on_its_own_windows(two: Any) -> None:
    _, plan, frames = two
    pooled = fit_preemption(pd.concat(list(frames.values()), ignore_index=True))
    knees = {}
    for g in plan.groups:
        direct = fit_preemption(frames[g.name])
        knees[g.name] = g.plan.fits["preemption_knee"]["estimate"]
        assert knees[g.name] == pytest.approx(direct.estimate, rel=1e-6)
        assert g.plan.fits["preemption_knee"]["n"] == len(frames[g.name])
        assert g.plan.details.frame["group"].unique().tolist() == [g.name]
        # each group's forecast is against its own engines' HBM KV capacity
        assert (
            g.plan.forecast["kv_demand"]["capacity_total"]
            == CAP * frames[g.name]["source"].nunique()
        )
    assert knees[SMALL.group] != knees[BIG.group]
    assert all(k != pytest.approx(pooled.estimate, rel=1e-6) for k in knees.values())
    # the top level pools observations only: no fit across the two models
    for name in FIT_NAMES:
        entry = plan.fits[name]
        assert entry["can_tell"] is False and "per model group" in entry["why"]
    assert "2 model groups" in plan.basis[1]


def test_plan_two_models_json_lists_groups_each_with_its_plan(two: Any) -> None:
    _, plan, _ = two
    d = json.loads(json.dumps(plan.to_dict(), allow_nan=False))
    assert "group" not in d
    assert [g["name"] for g in d["groups"]] == [g.name for g in plan.groups]
    for g in d["groups"]:
        assert set(g) == {"name", "engines", "sources", "plan"}
        sub = g["plan"]
        assert sub["group"] == g["name"] and "groups" not in sub
        assert set(sub) >= {"decision", "fits", "forecast", "sizing", "evidence", "cost"}
        assert sub["decision"]["mode"] in ("none", "native", "lmcache", "both")
        assert sub["fits"]["preemption_knee"]["estimate"] is not None
        tp = sub["evidence"]["tp"]
        assert sub["cost"]["current_per_month"] == pytest.approx(2.0 * tp * 730 * len(g["engines"]))
    text = summary_text(d)
    assert "Model groups: 2" in text
    for g in plan.groups:
        assert f"━━ group {g.name} ━━" in text
    assert text.count("Decision: ") == 2 and text.count("Fits (95 % intervals)") == 2
    assert "all groups pooled" in text


TOP_KEYS = {"cluster", "window", "happening", "decision", "offload", "cpu_tier", "fits",
            "forecast", "sizing", "configs", "cost", "evidence", "basis"}  # fmt: skip
MODES = ("none", "native", "lmcache", "both")


def test_plan_two_models_top_level_has_no_decision_sizing_or_configs(two: Any) -> None:
    _, plan, _ = two
    assert plan.decision is None and plan.sizing is None and plan.sizing_error is None
    d = json.loads(json.dumps(plan.to_dict(), allow_nan=False))
    assert set(d) == TOP_KEYS | {"see_groups", "groups"}
    assert d["decision"] is None and d["sizing"] is None and d["configs"] is None
    assert "groups[].plan" in d["see_groups"]
    assert not any(b.startswith("decision: rules") for b in d["basis"])
    # the pooled cost is the current fleet's only: no sized fleet to price
    assert d["cost"]["current_per_month"] is not None and "needed_per_month" not in d["cost"]
    for g in d["groups"]:
        sub = g["plan"]
        assert sub["decision"]["mode"] in MODES and "see_groups" not in sub
        assert sub["sizing"] is not None and isinstance(sub["configs"], dict)
        assert any(b.startswith("decision: rules") for b in sub["basis"])
    text = summary_text(d)
    head, _, rest = text.partition("━━ group ")
    assert "Decisions per model group below" in head and "Decision: " not in head
    assert rest.count("Decision: ") == len(plan.groups)


def test_plan_group_option_plans_that_group_alone(two: Any) -> None:
    url, plan, _ = two
    with Store(url) as store:
        one = build_plan(store, cluster="synth", gpu_price_per_hour=2.0, forecast_seconds=BUDGET,
                         group=BIG.group)  # fmt: skip
    assert one.group == BIG.group and one.groups == ()
    inner = next(g.plan for g in plan.groups if g.name == BIG.group)
    a, b = (json.dumps(without_timings(p.to_dict()), sort_keys=True) for p in (one, inner))
    assert a == b
    assert f"model group {BIG.group!r}" in one.basis[1]
    assert summary_text(one.to_dict()).startswith(
        f"kvscope plan — cluster synth — model group {BIG.group}: 4 engines"
    )


@pytest.mark.parametrize("name", ["nope", "llama-8b-instruct", SMALL.group + " "])
def test_plan_unknown_group_raises_configerror_naming_the_groups(two: Any, name: str) -> None:
    url, _, _ = two
    with Store(url) as store, pytest.raises(ConfigError) as err:
        build_plan(store, cluster="synth", forecast_seconds=1, group=name)
    msg = str(err.value)
    assert repr(name) in msg and "no such model group" in msg
    assert repr(SMALL.group) in msg and repr(BIG.group) in msg


def test_plan_one_model_store_output_has_no_groups(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "one.db")
    fill_store(url, shifted_frame(3, 150, seed=11))
    with Store(url) as store:
        plain = build_plan(store, cluster="synth", forecast_seconds=BUDGET)
        (group,) = plain.details.frame["group"].unique().tolist()
        picked = build_plan(store, cluster="synth", forecast_seconds=BUDGET, group=group)
    assert group == "m@h100:tp1"  # the windows' model_name label, the record's GPU and TP
    d = plain.to_dict()
    assert plain.group is None and plain.groups == ()
    assert "group" not in d and "groups" not in d
    assert not any("model group" in b for b in plain.basis)
    assert "Model groups" not in summary_text(d) and "model group" not in summary_text(d)
    # one group: the decision, sizing and configs stay at the top level, as without groups
    assert set(d) == TOP_KEYS and plain.decision is not None
    assert d["decision"]["mode"] in MODES and d["decision"] == json_ready(plain.decision.to_dict())
    assert isinstance(d["sizing"], dict) and isinstance(d["configs"], dict)
    assert any(b.startswith("decision: rules") for b in d["basis"])
    assert f"Decision: {plain.decision.mode.upper()}" in summary_text(d)
    assert "Decisions per model group" not in summary_text(d)
    # selecting the only group changes nothing but the label and its basis line
    p = picked.to_dict()
    assert p.pop("group") == group
    p["basis"] = [b for b in p["basis"] if not b.startswith("model group")]
    a, b = (json.dumps(without_timings(x), sort_keys=True) for x in (d, p))
    assert a == b


def test_plan_one_model_store_unknown_group_lists_the_one_group(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "one.db")
    fill_store(url, shifted_frame(2, 20, seed=1), model=None)
    with Store(url) as store, pytest.raises(ConfigError, match=r"groups are 'm@h100:tp1'"):
        build_plan(store, cluster="synth", forecast_seconds=1, group="other")
