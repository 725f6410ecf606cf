"""benchmarks.accuracy.tier_study: the frozen cases, the truth's CPU sizes, the scoring rules,
and (slow) one small case end to end with its harness checked against ``simulate
--compare`` and the plan's own section."""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from dataclasses import asdict, replace
from typing import Any

import pytest

from benchmarks.accuracy import tier_cases
from benchmarks.accuracy.tier_cases import MULTIPLES, cases
from benchmarks.accuracy.tier_study import (
    covers,
    run_case,
    score,
    score_row,
    section_of,
    telemetry_of,
)
from benchmarks.accuracy.tier_truth import (
    GB,
    GIB,
    CaseTruth,
    Run,
    Size,
    offered_qps,
    scenario,
    sizes_gib,
    with_native,
)
from benchmarks.accuracy.verdict_study import engine_records
from core.errors import ConfigError
from planner.plan.build import build_plan
from planner.plan.tier import MULTIPLES as SECTION_MULTIPLES
from planner.simulate.cluster import Simulation
from planner.simulate.compare import Sweep, compare
from planner.simulate.scenario import parse_scenario
from store.store import Store

# sha256 of the study split and its rules as committed before the first run (af304fa):
# changing a case, a seed or a rule of tier_cases.py makes a new study, not a re-run
STUDY_DIGEST = "2f7a4efbf30ec6eccd280332034dcfb0a903bb65da7d3e0d5d5ca76d60af22c4"
RULES = ("MULTIPLES", "SAMPLE_RATE", "HOURS", "WARMUP_S", "DIURNAL_AMPLITUDE", "LOAD_MID",
         "LOAD_LOW", "LOAD_HIGH", "HIT_PP", "AVOIDED_REL", "FLOOR_PP")  # fmt: skip


def _digest() -> str:
    doc = {
        "cases": [asdict(c) for c in cases("study")],
        "rules": {k: getattr(tier_cases, k) for k in RULES},
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def test_tier_cases_study_split_unchanged_since_frozen() -> None:
    assert _digest() == STUDY_DIGEST


def test_tier_cases_no_offload_metrics_on_sizes_are_the_sections_rows() -> None:
    assert MULTIPLES == SECTION_MULTIPLES
    got = cases("study")
    assert len(got) == 13 and len({c.name for c in got}) == 13
    for c in got:
        assert c.raw["cluster"]["offload"] == "none", c.name
        assert c.raw["engine"] == {"kv_cache_metrics": True, "kv_cache_metrics_sample": 0.01}
        assert c.hours in (1.0, 2.0, 4.0)
    kinds = {c.kind for c in got}
    assert kinds == {"null", "doc", "session", "rag"}
    assert cases("dev") != got


def test_tier_cases_unknown_split_raises() -> None:
    with pytest.raises(ConfigError, match="split"):
        cases("heldout")


def test_sizes_are_the_sections_gib_and_the_simulators_cpu_blocks() -> None:
    """The truth's sizes: MULTIPLES x the HBM KV in GiB (the section's rows), given to the
    simulator in decimal GB, hold exactly MULTIPLES x num_gpu_blocks blocks per engine."""
    case = cases("study")[1]
    raw = {**case.raw, "workload": {**case.raw["workload"], "qps": 1.0}, "duration_s": 60}
    gibs, blocks, per_block = sizes_gib(raw)
    assert gibs == pytest.approx([m * blocks * per_block / GIB for m in MULTIPLES])
    for m, gib in zip(MULTIPLES, gibs, strict=True):
        native = with_native(raw, gib)
        assert native["cluster"]["cpu_cache_gb"] == pytest.approx(gib * 2**30 / GB)
        assert raw["cluster"]["offload"] == "none"  # a copy
        sim = Simulation(parse_scenario(native))
        pool = sim.engines[1].conn.pool  # type: ignore[attr-defined]
        assert pool.capacity == pytest.approx(m * blocks, rel=1e-9)


def _size(hit: float = 0.5, none: float = 0.3, lookups: float = 10_000.0) -> Size:
    return Size(multiple=2.0, gib=10.0, hit_ratio=hit, none_hit_ratio=none,
                avoided_tokens_per_s=(hit - none) * lookups, connector_tokens_per_s=0.0,
                lookup_tokens_per_s=lookups)  # fmt: skip


def _row(est: float, lo: float, hi: float, tok: tuple[float, float, float], *,
         can_tell: bool = True) -> dict[str, Any]:  # fmt: skip
    return {
        "label": "2× HBM", "gib": 10.0, "can_tell": can_tell, "why": "", "extrapolated": True,
        "hit_ratio": {"estimate": est, "lo": lo, "hi": hi},
        "avoided_prefill_tokens_per_s": dict(zip(("estimate", "lo", "hi"), tok, strict=True)),
    }  # fmt: skip


def test_score_row_within_and_covers_by_the_frozen_rules() -> None:
    truth = _size()  # 50 %, avoids 2000 tokens/s
    r = score_row(_row(0.54, 0.45, 0.60, (2150.0, 1500.0, 3000.0)), truth, True)
    assert r["hit_error_pp"] == pytest.approx(4.0)
    assert r["within_hit"] and r["within_avoided"]  # +7.5 %
    assert r["avoided_error_pct"] == pytest.approx(7.5)
    assert r["covers_hit"] and r["covers_hit_strict"] and r["covers_avoided"]
    r = score_row(_row(0.56, 0.52, 0.60, (2300.0, 2100.0, 3000.0)), truth, True)
    assert not r["within_hit"] and not r["within_avoided"]  # +6 pp, +15 %
    assert r["covers_hit"] is False and r["covers_avoided"] is False
    # within the coverage tolerance (0.5 pp) but not strictly
    r = score_row(_row(0.50, 0.504, 0.51, (2000.0, 2040.0, 2100.0)), truth, True)
    assert r["covers_hit"] and not r["covers_hit_strict"]


def test_score_row_cannot_tell_is_never_a_hit() -> None:
    truth = _size()
    r = score_row(_row(0.5, 0.4, 0.6, (2000.0, 1000.0, 3000.0), can_tell=False), truth, True)
    assert not r["can_tell"] and not r["within_hit"] and not r["within_avoided"]
    assert r["would_be_within_hit"] is True
    r = score_row(_row(0.5, 0.4, 0.6, (2000.0, 1000.0, 3000.0)), truth, False)
    assert not r["can_tell"] and not r["within_hit"]  # the section as a whole cannot tell
    r = score_row(None, truth, False)
    assert not r["can_tell"] and r["hit_ratio"] == [None, None, None]


def test_score_row_near_zero_truth_judged_against_the_floor() -> None:
    """A truth below 0.5 pp of the lookups (a tier no larger than HBM) has no relative error;
    a prediction within that floor is within."""
    truth = _size(hit=0.302, none=0.3)  # avoids 20 tokens/s of 10 000 looked up
    r = score_row(_row(0.3, 0.3, 0.3, (0.0, 0.0, 0.0)), truth, True)
    assert r["avoided_error_pct"] is None and r["within_avoided"] and r["within_hit"]
    assert r["covers_hit"] and not r["covers_hit_strict"] and r["covers_avoided"]
    r = score_row(_row(0.31, 0.3, 0.32, (100.0, 0.0, 200.0)), truth, True)
    assert not r["within_avoided"]  # 80 tokens/s off > the 50 tokens/s floor


def test_covers_without_a_range_is_none() -> None:
    assert covers(None, 1.0, 0.5) is None
    assert covers(0.0, 1.0, math.nan) is None
    assert covers(0.4, 0.6, 0.5) is True
    assert covers(0.4, 0.6, 0.61, 0.02) is True


def _truth(sizes: list[Size]) -> CaseTruth:
    run = Run(0.0, 0.0, 0.0, 0.0, 1.0, 0.3, 0.0, 1.0, 0.3, 0.3, (0.3,), ((1.0, 0.3, 0.0),), {}, 0.0)
    return CaseTruth("x", 1.0, 1, 1.0, 1.0, run, (), tuple(sizes), 100, 1.0, 0.0)


def test_score_refuses_rows_at_other_sizes() -> None:
    truth = _truth([replace(_size(), multiple=m, gib=10.0 * m) for m in MULTIPLES])
    rows = [dict(_row(0.5, 0.4, 0.6, (1.0, 0.0, 2.0)), gib=10.0 * m) for m in MULTIPLES]
    assert len(score({"can_tell": True, "native": {"rows": rows}}, truth)) == 4
    rows[2]["gib"] = 21.0
    with pytest.raises(ValueError, match="GiB"):
        score({"can_tell": True, "native": {"rows": rows}}, truth)
    untold = score({"can_tell": False, "native": None}, truth)
    assert [r["can_tell"] for r in untold] == [False] * 4


def test_score_restricted_to_the_sections_engines_when_some_were_left_out() -> None:
    """Engine 0 hits 20 % without the tier and 60 % with it, engine 1 (left out) 40 % and
    40 %: the whole cluster's truth is 50 %, the section's engine's 60 %."""
    none = Run(0.0, 0.0, 0.0, 0.0, 200.0, 60.0, 0.0, 10.0, 0.3, 6.0, (0.2, 0.4),
               ((100.0, 20.0, 0.0), (100.0, 40.0, 0.0)), {}, 0.0)  # fmt: skip
    runs = tuple(
        replace(none, multiple=m, gib=10.0 * m, external_hits=40.0, hit_ratio=0.5,
                engine_counts=((100.0, 20.0, 40.0), (100.0, 40.0, 0.0)))
        for m in MULTIPLES
    )  # fmt: skip
    sizes = tuple(Size(m, 10.0 * m, 0.5, 0.3, 4.0, 4.0, 20.0) for m in MULTIPLES)
    truth = CaseTruth("x", 1.0, 1, 1.0, 1.0, none, runs, sizes, 100, 1.0, 0.0)
    rows = [dict(_row(0.6, 0.55, 0.65, (4.0, 3.0, 5.0)), gib=10.0 * m) for m in MULTIPLES]
    section = {"can_tell": True, "native": {"rows": rows}, "engines_without": ["engine-1/0"]}
    got = score(section, truth, ["engine-0/0", "engine-1/0"])
    assert got[0]["hit_error_pp"] == pytest.approx(10.0)  # against the whole cluster
    part = got[0]["section_engines"]
    assert part["truth"]["hit_ratio"] == pytest.approx(0.6)
    assert part["truth"]["none_hit_ratio"] == pytest.approx(0.2)
    assert part["truth"]["avoided_tokens_per_s"] == pytest.approx(4.0)
    assert part["hit_error_pp"] == pytest.approx(0.0) and part["within_avoided"]
    assert "section_engines" not in score({**section, "engines_without": []}, truth)[0]


@pytest.mark.slow
def test_tier_study_one_small_case_end_to_end() -> None:
    """A dev doc case shortened to 1 h: the harness's numbers are the ones ``simulate
    --compare`` and the plan give (not the accuracy: that is the study's)."""
    case = replace(next(c for c in cases("dev") if c.name == "doc-10"), hours=1.0,
                   arrival="poisson")  # fmt: skip
    out = run_case(case, lambda _msg: None)
    json.dumps(out)  # JSON-ready
    assert [s["multiple"] for s in out["sizes"]] == list(MULTIPLES)
    truth = out["truth"]
    # the telemetry's today and the run without offload: one scenario, one seed
    assert out["telemetry"]["today_hit_ratio"] == pytest.approx(truth["none"]["hit_ratio"],
                                                                abs=0.005)  # fmt: skip
    assert out["section"]["can_tell"] and out["section"]["engines"] == 2
    for s, run in zip(out["sizes"], truth["runs"], strict=True):
        assert s["gib"] == pytest.approx(run["gib"])
        assert run["cpu_blocks"] == pytest.approx(s["multiple"] * truth["hbm_blocks"])
        assert s["truth"]["avoided_tokens_per_s"] == pytest.approx(
            run["hit_tokens_per_s"] - truth["none"]["hit_tokens_per_s"]
        )
    # the truth's 2x run is the run `simulate --compare none,native --sweep` makes
    _, req_s = offered_qps(case, truth["r_sat"])
    raw = scenario(case, truth["qps"])
    assert truth["requests_per_s"] == pytest.approx(req_s)
    run2 = truth["runs"][2]
    got = compare(raw, ("none", "native"), Sweep("cluster.cpu_cache_gb", (run2["cpu_cache_gb"],)),
                  progress=lambda _m: None)  # fmt: skip
    native = got["points"][0]["modes"]["native"]
    for k in ("prefix_hit_rate", "external_hit_rate", "avoided_reprefill_tokens"):
        assert native[k] == run2["compare"][k], k
    assert (
        got["points"][0]["modes"]["none"]["prefix_hit_rate"]
        == truth["none"]["compare"]["prefix_hit_rate"]
    )
    # the section the study scores is the plan's, read back from a store
    tel = telemetry_of(raw)
    section, _ = section_of(raw, tel, case.seed)
    records, _ = engine_records(raw, tel)
    with tempfile.TemporaryDirectory() as d, Store(f"sqlite:///{d}/t.db") as store:
        store.migrate()
        store.write_windows(tel.windows)
        for source, r in records.items():
            store.upsert_engine("sim", source, model=r.model, gpu=r.gpu,
                                tensor_parallel=r.tensor_parallel, offload=r.offload,
                                facts=dict(r.facts), observed_at=None)  # fmt: skip
        plan = build_plan(store, cluster="sim", seed=case.seed, forecast_seconds=1.0)
    assert plan.cpu_tier is not None
    want = [r["hit_ratio"] for r in section["native"]["rows"]]
    assert [r["hit_ratio"] for r in plan.cpu_tier["native"]["rows"]] == want
    assert [r["hit_ratio"] for r in out["section"]["native_rows"]] == want
