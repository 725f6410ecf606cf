"""Accuracy of the offload verdict (planner/plan/verdict.py) on realistic simulated clusters,
against the simulator's truth, on cases frozen before the study ran
(benchmarks/accuracy/verdict_cases.py; truth: benchmarks/accuracy/verdict_truth.py).

Per case: the truth (homogeneous runs at constant load; it also fixes the case's SLO and
load scale), then the cluster's telemetry through the real collector path
(benchmarks/accuracy/telemetry_gen.py: a diurnal load peaking at ``peak`` × R_SAT, a scrape
every 15 s, 60 s windows), the analysis frame (engine_frame with each engine's record: its
offload, its LMCache pool as ``facts["pool"]``, a switchback canary's regimes as
``changes``), ``run_verdicts`` at the case's SLO and at the default SLO, and the plan's
decision (``build_plan`` on a temporary SQLite store holding the same windows). A
switchback case is evaluated on its first 2, 4 and 6 hours.

Scored per case and mode (the verdict's capacity, what rule R7 reads):

* ``covers`` — the 90 % interval holds the truth ratio (saturated throughput); a lower
  bound covers when the truth is >= its lo; a truth that is itself a lower bound is covered
  when the interval reaches it. Only where the verdict can tell.
* ``claim`` — a confident measured claim, as R7 votes on it: the 95 % claim interval
  excludes 1 (``helps`` above, ``hurts`` below).
* ``call`` against the truth's label (helps > 1.05, null within ±3 %): ``right`` (a claim
  of the true sign; for null: no claim), ``wrong`` (a claim of the other sign; for null:
  any claim), ``no claim`` (can tell, the interval holds 1), ``cannot tell``.
* the plan's ``decision`` per case: ``right`` when it picks a mode whose truth helps, or
  none when no mode helps; ``wrong`` when it picks a mode that does not help, or none
  after a measured claim that a mode helps; ``none (cannot tell)`` when it keeps none
  without a measured claim while a mode helps.

Run: ``python -m benchmarks.accuracy.verdict_study --jobs 2`` (progress on stderr and
in ``benchmarks/results/verdict_study.log``; finished cases are appended to
``verdict_study.partial.jsonl`` and ``--resume`` skips them). ``--table FILE`` re-prints
the markdown of a JSON result.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.accuracy.runner import git_revision, run_cases
from benchmarks.accuracy.telemetry_gen import generate
from benchmarks.accuracy.verdict_cases import (
    DIURNAL_AMPLITUDE,
    HELPS_ABOVE,
    NULL_WITHIN,
    OVERLOAD,
    PEAK_RANGE,
    SEEDS,
    SLO_LOW_LOAD,
    SLO_MULTIPLE,
    SPLITS,
    SWITCHBACK_EVAL_HOURS,
    WARMUP_S,
    Case,
    cases,
)
from benchmarks.accuracy.verdict_truth import CaseTruth, mean_rate, measure
from planner.domain.slo import Slo
from planner.frames.frames import engine_frame
from planner.plan.build import build_plan
from planner.plan.verdict import run_verdicts
from planner.simulate.scenario import parse_scenario
from planner.simulate.switchback import Schedule
from store.store import Store
from store.tables import EngineChange, EngineRecord

if TYPE_CHECKING:
    import pandas as pd

    from benchmarks.accuracy.telemetry_gen import Telemetry
    from planner.plan.verdict import ModeVerdict
    from store.tables import EngineRecord

RESULTS = Path(__file__).resolve().parents[1] / "results"
CLUSTER = "sim"
FORECAST_S = 2.0  # the plan's forecast budget (the study reads its decision only)


# ----------------------------------------------------------------------------- telemetry


def scenario_raw(case: Case, truth: CaseTruth) -> dict[str, Any]:
    """The case's telemetry scenario: a diurnal load with mean ``mean_rate``."""
    raw = copy.deepcopy(case.raw)
    raw["workload"].update(
        qps=mean_rate(case, truth.r_sat),
        arrival="diurnal",
        diurnal_period_s=case.period_h * 3600.0,
        diurnal_amplitude=DIURNAL_AMPLITUDE,
    )
    raw.update(duration_s=case.hours * 3600.0, warmup_s=WARMUP_S)
    return raw


def engine_records(
    raw: Mapping[str, Any], tel: Telemetry
) -> tuple[dict[str, EngineRecord], dict[str, list[tuple[float, str]]]]:
    """Each engine source's record (offload, pool, KV facts, a canary's regimes) and the
    regimes of the switched engines (epoch seconds, mode)."""
    sc = parse_scenario(raw)
    c = sc.cluster
    regimes: dict[str, list[tuple[float, str]]] = {}
    if c.switchback is not None:
        sched = Schedule(c.switchback).regimes(sc.duration_s)
        for i in c.switchback.engines:
            regimes[f"engine-{i}"] = [(tel.epoch0 + t, m) for t, m in sched]
    out = {}
    for source, meta in tel.engines.items():
        facts: dict[str, Any] = {"num_gpu_blocks": c.num_gpu_blocks, "block_size": c.block_size}
        if meta.pool is not None:
            facts["pool"] = f"lmcache-{meta.pool}"
        changes = tuple(EngineChange(at, m) for at, m in regimes.get(source, []))
        offload = changes[-1].offload if changes else meta.offload
        out[source] = EngineRecord(CLUSTER, source, c.model.name, c.gpu.name, None,
                                   c.tensor_parallel, offload, facts, changes)  # fmt: skip
    return out, regimes


# ----------------------------------------------------------------------------- scoring


def _f(x: float) -> float | None:
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else None


def covers(lo: float | None, hi: float | None, truth: float, truth_bound: str) -> bool | None:
    """The interval [lo, hi] (hi None: unbounded) holds ``truth``; a truth that is a lower
    bound is held when hi reaches it."""
    if lo is None or not math.isfinite(truth):
        return None
    top = math.inf if hi is None else hi
    if truth_bound == "lower":
        return top >= truth
    return lo <= truth <= top


def claim_of(v: ModeVerdict) -> str:
    """``helps`` / ``hurts`` when the evidence's 95 % claim interval excludes 1, else ""."""
    ev = v.evidence
    if not ev.can_tell or ev.claim is None:
        return ""
    if ev.claim.lo > 1.0:
        return "helps"
    if not ev.lower_bound and ev.claim.hi < 1.0:
        return "hurts"
    return ""


def call_of(label: str, can_tell: bool, claim: str) -> str:
    """right / wrong / no claim / cannot tell (module docstring)."""
    if claim:
        if label == "null":
            return "wrong"
        if label in ("helps", "small"):
            return "right" if claim == "helps" else "wrong"
        if label == "hurts":
            return "right" if claim == "hurts" else "wrong"
        return "unscored"
    if not can_tell:
        return "right" if label == "null" else "cannot tell"
    return "right" if label == "null" else "no claim"


def score_mode(v: ModeVerdict, truth: Any, v_default: ModeVerdict | None) -> dict[str, Any]:
    """One mode's verdict against its truth (a ModeTruth)."""
    cap = v.capacity
    ev = v.evidence
    can = bool(ev.can_tell)
    lo = hi = clo = chi = ratio = None
    bound = ""
    if cap is not None and can:
        ratio, lo, clo = _f(cap.ratio), _f(cap.interval.lo), _f(cap.claim_interval.lo)
        hi, chi = _f(cap.interval.hi), _f(cap.claim_interval.hi)
        bound = cap.bound
    claim = claim_of(v)
    out: dict[str, Any] = {
        "mode": v.mode,
        "truth": {
            "sat_ratio": truth.sat_ratio,
            "sat_bound": truth.sat_bound,
            "label": truth.label,
            "slo_ratio": truth.slo_ratio,
            "slo_bound": truth.slo_bound,
            "ttft_p90_ratio_at_mean_load": truth.ttft_p90_ratio,
            "ttft_mean_ratio_at_mean_load": truth.ttft_mean_ratio,
        },
        "can_tell": can,
        "why": "" if can else (ev.why or v.why),
        "units": list(ev.units),
        "design": ev.design,
        "ratio": ratio,
        "interval": [lo, hi],
        "claim_interval": [clo, chi],
        "bound": bound,
        "unit_status": [
            {
                "unit": u.unit,
                "mode": u.mode,
                "status": u.status,
                "value": _f(u.value),
                "missed": u.missed,
                "windows": u.windows,
            }
            for u in (cap.units if cap is not None else ())
        ],
        "covers": covers(lo, hi, truth.sat_ratio, truth.sat_bound) if can else None,
        "covers_slo_truth": covers(lo, hi, truth.slo_ratio, truth.slo_bound) if can else None,
        "claim": claim,
        "call": call_of(truth.label, can, claim),
        "experiment": (v.experiment or {}).get("design") if v.experiment else None,
        "today_ttft_p90": _today(v, "ttft_p90_s", truth.ttft_p90_ratio),
    }
    if v_default is not None:
        d = v_default
        dc = d.capacity
        dcan = bool(d.evidence.can_tell)
        dlo = _f(dc.interval.lo) if dc is not None and dcan else None
        dhi = _f(dc.interval.hi) if dc is not None and dcan else None
        out["default_slo"] = {
            "can_tell": dcan,
            "why": "" if dcan else (d.evidence.why or d.why),
            "ratio": _f(dc.ratio) if dc is not None and dcan else None,
            "interval": [dlo, dhi],
            "bound": dc.bound if dc is not None and dcan else "",
            "claim": claim_of(d),
            "covers": covers(dlo, dhi, truth.sat_ratio, truth.sat_bound) if dcan else None,
        }
    return out


def crashed(mode: str, truth: Any, exc: Exception) -> dict[str, Any]:
    """The record of a mode whose verdict raised: it counts as "error", never as coverage."""
    return {
        "mode": mode,
        "truth": {"sat_ratio": truth.sat_ratio, "sat_bound": truth.sat_bound,
                  "label": truth.label, "slo_ratio": truth.slo_ratio,
                  "slo_bound": truth.slo_bound,
                  "ttft_p90_ratio_at_mean_load": truth.ttft_p90_ratio,
                  "ttft_mean_ratio_at_mean_load": truth.ttft_mean_ratio},
        "can_tell": False, "why": f"run_verdicts raised {type(exc).__name__}: {exc}",
        "units": [], "design": "", "ratio": None, "interval": [None, None],
        "claim_interval": [None, None], "bound": "", "unit_status": [], "covers": None,
        "covers_slo_truth": None, "claim": "", "call": "error", "experiment": None,
        "today_ttft_p90": None,
    }  # fmt: skip


def _today(v: ModeVerdict, outcome: str, truth: float) -> dict[str, Any] | None:
    if v.today is None:
        return None
    for e in v.today.effects:
        if e.outcome == outcome:
            lo, hi = _f(e.interval.lo), _f(e.interval.hi)
            return {
                "can_tell": e.can_tell,
                "scale": e.scale,
                "estimate": _f(e.estimate),
                "interval": [lo, hi],
                "truth_at_mean_load": truth,
                "covers": covers(lo, hi, truth, "") if e.can_tell else None,
                "excludes_1": e.excludes_null,
            }
    return None


def decision_call(decision: str | None, modes: Mapping[str, Mapping[str, Any]]) -> str:
    """The plan's decision against the truths (module docstring)."""
    if decision is None:
        return "no plan"
    helps = {m for m, r in modes.items() if r["truth"]["label"] == "helps"}
    claimed = {m for m, r in modes.items() if r["claim"] == "helps"}
    if decision == "none":
        if not helps:
            return "right"
        return "wrong (none on a measured claim)" if claimed & helps else "none (cannot tell)"
    if decision not in modes:  # "both", or a mode no engine of the case ran: no truth for it
        return f"unscored ({decision}: no engine ran it)"
    return "right" if decision in helps else "wrong"


# ----------------------------------------------------------------------------- one case


def _restrict(frame: pd.DataFrame, until: float) -> pd.DataFrame:
    return frame[frame["start"].to_numpy(dtype=float) < until].reset_index(drop=True)


def _plans(
    tel: Telemetry,
    records: Mapping[str, EngineRecord],
    regimes: Mapping[str, list[tuple[float, str]]],
    *,
    untils: Sequence[float | None],
    slo: Any,
    seed: int,
) -> list[dict[str, Any]]:
    """The plan's decision on a temporary store of the case's windows, per ``until``."""
    out: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="kvscope-verdict-") as d,
        Store(f"sqlite:///{d}/study.db") as store,
    ):
        store.migrate()
        store.write_windows(tel.windows)
        for source, r in records.items():
            facts = dict(r.facts)
            for at, mode in regimes.get(source, [(math.nan, r.offload)]):
                store.upsert_engine(
                    CLUSTER, source, model=r.model, gpu=r.gpu, tensor_parallel=r.tensor_parallel,
                    offload=mode, facts=facts, observed_at=None if math.isnan(at) else at,
                )  # fmt: skip
        for until in untils:
            t0 = time.perf_counter()
            try:
                plan = build_plan(store, cluster=CLUSTER, until=until, slo=slo, seed=seed,
                                  forecast_seconds=FORECAST_S)  # fmt: skip
            except Exception as exc:  # the study records a failing plan, it does not stop
                out.append({"decision": None, "error": f"{type(exc).__name__}: {exc}"})
                continue
            dec = plan.decision
            r7 = [r.text for r in dec.reasons if r.rule_id.startswith("R7")] if dec else []
            out.append(
                {
                    "decision": dec.mode if dec else None,
                    "score": _f(dec.score) if dec else None,
                    "rules": [r.rule_id for r in dec.reasons] if dec else [],
                    "r7": r7[0] if r7 else "",
                    "seconds": round(time.perf_counter() - t0, 2),
                }
            )
    return out


def run_case(case: Case, say: Callable[[str], None], *, plan: bool = True) -> dict[str, Any]:
    """Truth, telemetry, verdicts and scores of one case (module docstring)."""
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    truth = measure(case, say)
    seconds["truth"] = time.perf_counter() - t0
    raw = scenario_raw(case, truth)
    t0 = time.perf_counter()
    tel = generate(parse_scenario(raw, where=f"verdict study {case.name}"))
    seconds["telemetry"] = time.perf_counter() - t0
    say(f"{case.name}: telemetry {len(tel.windows)} windows in {seconds['telemetry']:.0f} s")
    records, regimes = engine_records(raw, tel)
    full = engine_frame(list(tel.windows), records)
    slo = Slo(truth.slo_ttft_s, "p90")
    horizons: list[float | None] = [float(h) for h in SWITCHBACK_EVAL_HOURS] if regimes else [None]
    evals: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for h in horizons:
        until = None if h is None else tel.epoch0 + h * 3600.0
        frame = full if until is None else _restrict(full, until)
        engines = list(records.values())
        try:
            vs = run_verdicts(frame, engines, slo=slo, seed=case.seed)
        except Exception as exc:  # a planner crash is an outcome the study records
            say(f"{case.name} @{h} h: run_verdicts raised {type(exc).__name__}: {exc}")
            modes = {m: crashed(m, truth.modes[m], exc) for m in case.modes}
        else:
            try:
                vd: Mapping[str, ModeVerdict] | None = run_verdicts(
                    frame, engines, slo=Slo(), seed=case.seed
                )
            except Exception:  # the default SLO is secondary: recorded as not evaluated
                vd = None
            modes = {
                m: score_mode(vs[m], truth.modes[m], vd[m] if vd else None) for m in case.modes
            }
        for m in case.expect_cannot_tell:
            modes[m]["expected_cannot_tell"] = True
            modes[m]["cannot_tell_with_experiment"] = (
                not modes[m]["can_tell"] and modes[m]["experiment"] is not None
            )
        evals.append({"hours": h if h is not None else case.hours, "until": until,
                      "windows": len(frame), "modes": modes})  # fmt: skip
    seconds["verdicts"] = time.perf_counter() - t0
    if plan:
        t0 = time.perf_counter()
        untils = [e["until"] for e in evals]
        plans = _plans(tel, records, regimes, untils=untils, slo=slo, seed=case.seed)
        for e, p in zip(evals, plans, strict=True):
            e["plan"] = p
            e["decision_call"] = decision_call(p.get("decision"), e["modes"])
        seconds["plans"] = time.perf_counter() - t0
    for e in evals:
        brief = ", ".join(
            f"{m}: {r['call']}{' covers' if r['covers'] else ''}" for m, r in e["modes"].items()
        )
        say(f"{case.name} @{e['hours']:g} h: {brief}; decision "
            f"{e.get('plan', {}).get('decision')} ({e.get('decision_call', '-')})")  # fmt: skip
    return {
        "case": case.name,
        "class": case.cls,
        "design": case.design,
        "workload": case.workload_kind,
        "engines": case.engines,
        "model": case.raw["cluster"]["model"],
        "tp": case.raw["cluster"]["tensor_parallel"],
        "gpu": case.raw["cluster"]["gpu"],
        "gpu_memory_utilization": case.raw["cluster"]["gpu_memory_utilization"],
        "router": case.raw["cluster"]["router"],
        "hours": case.hours,
        "peak": case.peak,
        "seed": case.seed,
        "truth": _truth_dict(truth),
        "telemetry": {
            "windows": len(tel.windows),
            "rows": len(full),
            "skipped": dict(tel.skipped),
        },
        "evaluations": evals,
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
    }


def _truth_dict(t: CaseTruth) -> dict[str, Any]:
    d = asdict(t)
    d["wall_s"] = round(t.wall_s, 1)
    out: dict[str, Any] = json.loads(json.dumps(d, default=str).replace("NaN", "null"))
    return out


# ----------------------------------------------------------------------------- summary


def _rate(k: int, n: int) -> str:
    return f"{k}/{n} ({k / n:.0%})" if n else "–"


def summarize(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per class: the scores of the module docstring; switchback per horizon."""
    out: dict[str, Any] = {}
    for cls in ("null", "helps", "canary", "switchback"):
        rs = [r for r in results if r["class"] == cls]
        if not rs:
            continue
        if cls == "switchback":
            out[cls] = {"by_hours": {}}
            for h in SWITCHBACK_EVAL_HOURS:
                rows = [(r, e) for r in rs for e in r["evaluations"] if e["hours"] == h]
                out[cls]["by_hours"][str(h)] = _class_scores(rows)
            continue
        out[cls] = _class_scores([(r, r["evaluations"][0]) for r in rs])
    every = [(r, r["evaluations"][-1]) for r in results]
    out["by_truth_label"] = {
        lab: _class_scores(every, label=lab) for lab in ("helps", "null", "small", "hurts")
    }
    return out


def _class_scores(
    rows: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]], label: str | None = None
) -> dict[str, Any]:
    ms = [m for _, e in rows for m in e["modes"].values()
          if label is None or m["truth"]["label"] == label]  # fmt: skip
    told = [m for m in ms if m["can_tell"]]
    calls: dict[str, int] = {}
    for m in ms:
        calls[m["call"]] = calls.get(m["call"], 0) + 1
    null = [m for m in ms if m["truth"]["label"] == "null"]
    decisions: dict[str, int] = {}
    dec_modes: dict[str, int] = {}
    for _, e in rows:
        if label is not None and not any(m["truth"]["label"] == label for m in e["modes"].values()):
            continue
        c = e.get("decision_call", "no plan")
        decisions[c] = decisions.get(c, 0) + 1
        d = str(e.get("plan", {}).get("decision"))
        dec_modes[d] = dec_modes.get(d, 0) + 1
    dflt = [m["default_slo"] for m in ms if "default_slo" in m]
    today = [m["today_ttft_p90"] for m in ms if m.get("today_ttft_p90")]
    today_told = [t for t in today if t["excludes_1"] and t["estimate"] is not None]
    agrees = [
        t for t in today_told
        if t["truth_at_mean_load"] is not None
        and (t["estimate"] < 1.0) == (t["truth_at_mean_load"] < 1.0)
    ]  # fmt: skip
    expected = [m for m in ms if m.get("expected_cannot_tell")]
    return {
        "comparisons": len(ms),
        "labels": {
            lab: sum(m["truth"]["label"] == lab for m in ms)
            for lab in ("helps", "null", "small", "hurts")
        },
        "can_tell": len(told),
        "lower_bounds": sum(m["bound"] == "lower" for m in told),
        "covers": sum(bool(m["covers"]) for m in told),
        "covers_slo_truth": sum(bool(m["covers_slo_truth"]) for m in told),
        "claims": sum(bool(m["claim"]) for m in ms),
        "claims_helps": sum(m["claim"] == "helps" for m in ms),
        "claims_hurts": sum(m["claim"] == "hurts" for m in ms),
        "null_comparisons": len(null),
        "null_claims": sum(bool(m["claim"]) for m in null),
        "calls": calls,
        "decisions": decisions,
        "decision_modes": dec_modes,
        "expected_cannot_tell": len(expected),
        "expected_cannot_tell_held": sum(bool(m["cannot_tell_with_experiment"]) for m in expected),
        "default_slo_can_tell": sum(d["can_tell"] for d in dflt),
        "default_slo_covers": sum(bool(d["covers"]) for d in dflt if d["can_tell"]),
        "default_slo_claims": sum(bool(d["claim"]) for d in dflt),
        "today_ttft_p90_excludes_1": len(today_told),
        "today_ttft_p90_sign_agrees": len(agrees),
    }


def _iv(lo: float | None, hi: float | None) -> str:
    if lo is None:
        return "–"
    return f"[{lo:.2f}, {'∞' if hi is None else f'{hi:.2f}'}]"


def markdown(doc: Mapping[str, Any]) -> str:
    """The study's tables (per class, then per case)."""
    s = doc["summary"]
    lines = [
        f"# Verdict accuracy study ({doc['split']} split, seed {doc['master_seed']})",
        "",
        f"{doc['cases']} cases, {doc['wall_s'] / 60:.1f} min wall with {doc['jobs']} "
        f"worker(s); truth = saturated throughput ratio at {OVERLOAD} × R_sat; helps > "
        f"{HELPS_ABOVE}, null within ±{NULL_WITHIN:.0%}; SLO = {SLO_MULTIPLE:g} × none's "
        f"TTFT p90 at {SLO_LOW_LOAD} × R_sat. Git: {doc.get('git', '?')}.",
        "",
        "| class | mode comparisons | truth helps / null / other | can tell (lower bounds) "
        "| 90 % covers truth | covers SLO-capacity truth | confident claims (helps/hurts) "
        "| calls | plan decision |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def row(name: str, c: Mapping[str, Any]) -> str:
        lab = c["labels"]
        calls = ", ".join(f"{k} {v}" for k, v in sorted(c["calls"].items()))
        dec = ", ".join(f"{k} {v}" for k, v in sorted(c["decisions"].items()))
        return (
            f"| {name} | {c['comparisons']} | {lab['helps']} / {lab['null']} / "
            f"{lab['small'] + lab['hurts']} | {_rate(c['can_tell'], c['comparisons'])} "
            f"({c['lower_bounds']}) | {_rate(c['covers'], c['can_tell'])} | "
            f"{_rate(c['covers_slo_truth'], c['can_tell'])} | {c['claims']} "
            f"({c['claims_helps']}/{c['claims_hurts']}) | {calls} | {dec} |"
        )

    for cls in ("null", "helps", "canary"):
        if cls in s:
            lines.append(row(cls, s[cls]))
    for h, c in s.get("switchback", {}).get("by_hours", {}).items():
        lines.append(row(f"switchback @{float(h):g} h", c))
    lines += ["", "By the truth's label (every case, switchbacks at their last horizon):", ""]
    lines += [lines[4], lines[5]]
    for lab, c in s["by_truth_label"].items():
        if c["comparisons"]:
            lines.append(row(f"truth {lab}", c))
    lines += [
        "",
        "## Cases",
        "",
        "| case | design | engines | model | truth sat. ratio (label) | SLO-cap. truth | SLO s "
        "| h | verdict ratio [90 %] | claim [95 %] | covers | call | default SLO (2 s) "
        "| decision |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        for e in r["evaluations"]:
            for m, v in e["modes"].items():
                t = v["truth"]
                ds = v.get("default_slo", {})
                dtxt = (
                    f"{ds['ratio']:.2f} {_iv(*ds['interval'])}" if ds.get("can_tell")
                    else "cannot tell"
                )  # fmt: skip
                vr = f"{v['ratio']:.2f} {_iv(*v['interval'])}" if v["can_tell"] else (
                    "cannot tell: " + _short(v["why"]))  # fmt: skip
                sat = f"{t['sat_ratio']:.3f}{'+' if t['sat_bound'] else ''} ({t['label']})"
                slo_t = f"{t['slo_ratio']:.2f}{'+' if t['slo_bound'] else ''}"
                lines.append(
                    f"| {r['case']} {m} | {r['design']} | {r['engines']} | {r['model']} "
                    f"TP{r['tp']} | {sat} | {slo_t} | {r['truth']['slo_ttft_s']:g} | "
                    f"{e['hours']:g} | {vr} | {_iv(*v['claim_interval'])} | "
                    f"{'–' if v['covers'] is None else ('yes' if v['covers'] else 'NO')} | "
                    f"{v['call']} | {dtxt} | {e.get('plan', {}).get('decision', '–')} "
                    f"({e.get('decision_call', '–')}) |"
                )
    return "\n".join(lines) + "\n"


def _short(text: str, n: int = 60) -> str:
    text = text.replace("|", "/")
    return text if len(text) <= n else text[: n - 1] + "…"


# ----------------------------------------------------------------------------- CLI


def merged(base: Mapping[str, Any], rerun: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with the cases ``rerun`` holds replaced by its results, re-summarized."""
    if base["split"] != rerun["split"]:
        raise ValueError(f"cannot merge split {rerun['split']!r} into {base['split']!r}")
    new = {r["case"]: {**r, "git": rerun["git"]} for r in rerun["results"]}
    missing = sorted(set(new) - {r["case"] for r in base["results"]})
    if missing:
        raise ValueError(f"re-run cases not in the base result: {', '.join(missing)}")
    results = [new.get(r["case"], {**r, "git": r.get("git", base["git"])})
               for r in base["results"]]  # fmt: skip
    doc = dict(base)
    doc["git"] = f"{base['git']}; re-run at {rerun['git']}: {', '.join(sorted(new))}"
    doc["wall_s"] = base["wall_s"] + rerun["wall_s"]
    doc["summary"] = summarize(results)
    doc["results"] = results
    return doc


def _worker(args: tuple[Case, bool]) -> dict[str, Any]:
    case, plan = args
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)

    try:
        out = run_case(case, say, plan=plan)
    except Exception as exc:  # a failing case is recorded, the study goes on
        say(f"{case.name}: FAILED {type(exc).__name__}: {exc}")
        return {"case": case.name, "class": case.cls, "error": traceback.format_exc()}
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    say(f"{case.name}: done in {out['wall_s']:.0f} s")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="study", choices=SPLITS)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=None, help="case names or classes")
    ap.add_argument("--no-plan", action="store_true", help="skip build_plan's decision")
    ap.add_argument("--out", type=Path, default=RESULTS / "verdict_study")
    ap.add_argument("--resume", action="store_true", help="skip cases in the partial file")
    ap.add_argument("--table", type=Path, help="re-print the markdown of a JSON result")
    ap.add_argument("--rescore", type=Path, help="re-score a JSON result in place")
    ap.add_argument("--merge", type=Path, nargs=2, metavar=("BASE", "RERUN"),
                    help="BASE's cases with those RERUN re-ran (a later revision) put in their "
                    "place, written to --out; each case keeps the revision it ran at")  # fmt: skip
    a = ap.parse_args(argv)
    if a.table:
        print(markdown(json.loads(a.table.read_text())), end="")
        return 0
    if a.rescore:
        doc = json.loads(a.rescore.read_text())
        for r in doc["results"]:
            for e in r["evaluations"]:
                if "plan" in e:
                    e["decision_call"] = decision_call(e["plan"].get("decision"), e["modes"])
        doc["summary"] = summarize(doc["results"])
        a.rescore.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        a.rescore.with_suffix(".md").write_text(markdown(doc))
        print(markdown(doc), end="")
        return 0
    if a.merge:
        doc = merged(*(json.loads(p.read_text()) for p in a.merge))
        a.out.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
        a.out.with_suffix(".md").write_text(markdown(doc))
        print(markdown(doc), end="")
        return 0
    todo = [c for c in cases(a.split) if not a.only or c.name in a.only or c.cls in a.only]
    revision = git_revision()  # the code this run runs
    results, wall_s = run_cases(
        [c.name for c in todo],
        [(c, not a.no_plan) for c in todo],
        _worker,
        out=a.out,
        jobs=a.jobs,
        resume=a.resume,
        label="verdict study",
    )
    good = [r for r in results if "error" not in r]
    doc = {
        "split": a.split,
        "master_seed": SEEDS[a.split],
        "git": revision,
        "jobs": a.jobs,
        "cases": len(good),
        "failed": [r["case"] for r in results if "error" in r],
        "wall_s": wall_s,
        "rules": {
            "overload": OVERLOAD,
            "slo_low_load": SLO_LOW_LOAD,
            "slo_multiple": SLO_MULTIPLE,
            "helps_above": HELPS_ABOVE,
            "null_within": NULL_WITHIN,
            "diurnal_amplitude": DIURNAL_AMPLITUDE,
            "peak_range": list(PEAK_RANGE),
        },
        "summary": summarize(good),
        "results": good,
    }
    a.out.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    a.out.with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
