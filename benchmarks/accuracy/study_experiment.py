"""Would the planned experiment have settled it? Held-out set 5 (benchmarks/accuracy/heldout5.py).

For each frozen case: the pilot history of a synthetic cluster (fitsynth) is fitted with the
plan's gain fit (planner.fit.gain.fit_gain, native vs none) at the pilot's median KV use; when
it cannot tell (planner.plan.experiment.needs_experiment, the test `kvscope plan` applies), the
experiment is planned (plan_experiment) and run on the same cluster — the planned engines
switched to native offload (benchmarks/accuracy/abtest.py) for the planned hours, the engines'
effects, load and noise continuing — and the fit is repeated on pilot + A/B. Settled: the
refit no longer needs an experiment; right: its gain interval at current use has the true
sign and, when it reports a break-even, its interval covers the true one.

    PYTHONPATH=. .venv/bin/python -m benchmarks.accuracy.study_experiment \
        --json benchmarks/results/accuracy_heldout5.json \
        --md benchmarks/results/accuracy_heldout5.md

The planner reads windows through the store in `kvscope plan`; this study calls the same fit
and planner functions on the frames directly (tests/planner/test_experiment_plan.py checks the
store path once), and uses the fitsynth generator, not the discrete-event simulator, so the
whole set runs in minutes on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from benchmarks.accuracy.abtest import switch_engines
from benchmarks.accuracy.fitsynth import Truth, synthetic_frame
from benchmarks.accuracy.heldout5 import Case, cases
from planner.fit.gain import GainFit, fit_gain
from planner.plan.experiment import HOURS, needs_experiment, plan_experiment

WINDOW_S = 60.0


def _modes(c: Case) -> tuple[str, ...]:
    on = {round((j + 1) * c.engines / c.treated) - 1 for j in range(c.treated)}
    return tuple("native" if i in on else "none" for i in range(c.engines))


def true_log_gain(c: Case, u: float) -> float:
    """The generator's gain as a log ratio at u (its mean engine: 1500 + 9000·u tokens/s)."""
    return math.log1p(c.gain_slope * (u - c.break_even) / (1500.0 + 9000.0 * u))


def _judge(c: Case, fit: GainFit, u_now: float) -> dict[str, Any]:
    p = min(fit.grid, key=lambda q: abs(q.u - u_now)) if fit.grid else None
    out: dict[str, Any] = {"verdict": fit.verdict, "why": fit.why, "u": u_now}
    if p is None:
        return out | {"right": None}
    lo, hi = p.relative_interval.lo, p.relative_interval.hi
    truth = true_log_gain(c, p.u)
    sign_ok = (lo > 0 and truth > 0) or (hi < 0 and truth < 0) or (lo <= 0 <= hi)
    be_ok = True
    if fit.verdict == "crosses":
        be_ok = fit.interval.lo <= c.break_even <= fit.interval.hi
    out |= {
        "gain": p.relative,
        "gain_interval": [lo, hi],
        "true_gain": math.expm1(truth),
        "break_even": fit.estimate if math.isfinite(fit.estimate) else None,
        "break_even_interval": [fit.interval.lo, fit.interval.hi],
        "right": bool(sign_ok and be_ok),
    }
    return out


def run_case(c: Case) -> dict[str, Any]:
    t = time.perf_counter()
    truth = Truth(break_even={"native": c.break_even}, gain_slope=c.gain_slope)
    full = synthetic_frame(
        c.engines, c.pilot_windows + int(HOURS[-1] * 3600 / WINDOW_S), seed=c.seed,
        truth=truth, modes=_modes(c), noise_tokens_per_s=c.noise_tokens_per_s,
        engine_sd_tokens_per_s=c.engine_sd_tokens_per_s,
    )  # fmt: skip
    t0 = float(full["start"].min()) + c.pilot_windows * WINDOW_S
    pilot = full[full["start"] < t0]
    fit = fit_gain(pilot, offload="native")
    u_now = float(pilot["kv_util"].median())
    out: dict[str, Any] = {"case": c.name, "definition": _def(c)}
    out["pilot"] = _judge(c, fit, u_now) | {"needs": needs_experiment(fit, u_now)}
    design = plan_experiment(pilot, fit, u_now) if out["pilot"]["needs"] else None
    if design is None:
        out["outcome"] = "settled by the pilot" if not out["pilot"]["needs"] else "no design"
    else:
        out["design"] = {
            "text": design.text, "treated": design.treated, "engines": design.engines,
            "switch": list(design.switch), "hours": design.hours,
            "reachable": design.reachable, "power": list(design.power),
            "targets": [x.what for x in design.targets],
        }  # fmt: skip
        ab = switch_engines(full, design.switch, t0, "native", truth)
        ab = ab[ab["start"] < t0 + design.hours * 3600.0]
        refit = fit_gain(ab, offload="native")
        u_after = float(ab["kv_util"].median())
        after = _judge(c, refit, u_after) | {"needs": needs_experiment(refit, u_after)}
        out["after"] = after
        out["outcome"] = "settled" if not after["needs"] else "still cannot tell"
    out["seconds"] = round(time.perf_counter() - t, 2)
    return out


def _def(c: Case) -> dict[str, Any]:
    return {
        "seed": c.seed, "engines": c.engines, "treated": c.treated,
        "pilot_hours": c.pilot_windows * WINDOW_S / 3600.0, "break_even": c.break_even,
        "gain_slope": c.gain_slope, "noise_tokens_per_s": c.noise_tokens_per_s,
        "engine_sd_tokens_per_s": c.engine_sd_tokens_per_s,
    }  # fmt: skip


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    planned = [r for r in rows if "design" in r]
    reach = [r for r in planned if r["design"]["reachable"]]

    def settled(rs: list[dict[str, Any]]) -> dict[str, int]:
        s = [r for r in rs if r["outcome"] == "settled"]
        return {
            "cases": len(rs),
            "settled": len(s),
            "settled_and_right": sum(bool(r["after"]["right"]) for r in s),
            "wrong_after": sum(r["after"]["right"] is False for r in rs),
        }

    return {
        "cases": len(rows),
        "settled_by_the_pilot": sum(r["outcome"] == "settled by the pilot" for r in rows),
        "pilot_right_when_settled": sum(
            bool(r["pilot"]["right"]) for r in rows if r["outcome"] == "settled by the pilot"
        ),
        "cannot_tell_without_design": sum(r["outcome"] == "no design" for r in rows),
        "planned": settled(planned),
        "planned_reachable": settled(reach),
        "planned_unreachable": settled([r for r in planned if not r["design"]["reachable"]]),
        "mean_planned_power_reachable": (
            sum(min(r["design"]["power"]) for r in reach) / len(reach) if reach else None
        ),
    }


def markdown(rows: list[dict[str, Any]], s: dict[str, Any], seconds: float) -> str:
    lines = [
        f"## The planned experiment on held-out set 5 ({s['cases']} cases, {seconds / 60:.1f} min)",
        "",
        "Synthetic clusters (benchmarks/accuracy/fitsynth.py, not the simulator); definition "
        "frozen in benchmarks/accuracy/heldout5.py before this run.",
        "",
        "| case | engines (native) | pilot h | true u* / slope | pilot | planned | after the A/B |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d, p = r["definition"], r["pilot"]
        plan = r.get("design")
        after = r.get("after")
        lines.append(
            f"| {r['case']} | {d['engines']} ({d['treated']}) | {d['pilot_hours']:g} | "
            f"{d['break_even']:.2f} / {d['gain_slope']:+g} | {p['verdict']}"
            f"{' (cannot tell)' if p['needs'] else ''} | "
            + (
                f"{plan['treated']} of {plan['engines']} for {plan['hours']:g} h"
                f"{'' if plan['reachable'] else ' (unreachable: best)'}, "
                f"power {min(plan['power']):.0%}"
                if plan
                else "–"
            )
            + " | "
            + (
                f"{r['outcome']}, {after['verdict']}, "
                f"{'right' if after['right'] else 'WRONG' if after['right'] is False else '?'}"
                if after
                else r["outcome"]
            )
            + " |"
        )
    pr, ru = s["planned_reachable"], s["planned_unreachable"]
    lines += [
        "",
        f"- settled by the pilot alone: {s['settled_by_the_pilot']} "
        f"(right {s['pilot_right_when_settled']}); cannot tell and no design: "
        f"{s['cannot_tell_without_design']}",
        f"- planned and reachable: {pr['cases']}; settled after the planned A/B: "
        f"{pr['settled']}/{pr['cases']} (right {pr['settled_and_right']}); mean planned "
        "power "
        + (
            f"{s['mean_planned_power_reachable']:.0%}"
            if s["mean_planned_power_reachable"] is not None
            else "n/a"
        ),
        f"- unreachable within a week (the best design run anyway): {ru['cases']}; settled "
        f"{ru['settled']}/{ru['cases']} (right {ru['settled_and_right']})",
        f"- wrong after the A/B (gain interval of the wrong sign, or a break-even interval "
        f"missing the truth): {s['planned']['wrong_after']}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--md", type=Path, required=True)
    ap.add_argument("--cases", type=int, default=None, help="only the first N cases")
    a = ap.parse_args(argv)
    t = time.perf_counter()
    rows = []
    for c in cases()[: a.cases]:
        r = run_case(c)
        print(r["case"], r["outcome"], r.get("design", {}).get("text", ""), f"{r['seconds']}s")
        rows.append(r)
    s = summary(rows)
    took = time.perf_counter() - t
    a.json.write_text(json.dumps({"summary": s, "cases": rows, "seconds": took}, indent=1) + "\n")
    a.md.write_text(markdown(rows, s, took))
    print(json.dumps(s, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
