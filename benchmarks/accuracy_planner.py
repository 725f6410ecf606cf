"""Planner accuracy study: fitted offload break-even vs the simulator's own A/B truth.

    .venv/bin/python benchmarks/accuracy_planner.py                 # held-out cases, ~15 min
    .venv/bin/python benchmarks/accuracy_planner.py --split dev     # the development cases
    .venv/bin/python benchmarks/accuracy_planner.py --heldout-set 3 # re-run an earlier set
    .venv/bin/python benchmarks/accuracy_planner.py --table out/accuracy.json   # re-print

Every case (benchmarks/accuracy/scenarios.py, fixed seeds) simulates open-loop telemetry of
engines with and without offload through the real collector path, fits planner.fit.gain
(90 % intervals) and compares with the simulator's A/B truth (benchmarks/accuracy/truth.py);
definitions and scoring are in benchmarks/accuracy/study.py. Prints a markdown table and a summary
on
stdout, progress on stderr, and writes everything to ``--out`` (out/accuracy.json).
Each held-out set was fixed (accuracy_scenarios.HELDOUT_SETS) before any of its results
were seen; the default is the current one (HELDOUT_SET).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scipy import stats

from benchmarks.accuracy.judge import TOLERANCE
from benchmarks.accuracy.scenarios import HELDOUT_SET, HELDOUT_SETS, MASTER_SEED, draw
from benchmarks.accuracy.study import FAST, FULL, run_case
from benchmarks.accuracy.truth import LEVEL

HELDOUT_CASES = 12  # fixed with each held-out set's seed before its run


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _one(split: str, index: int, fast: bool, heldout_set: int) -> dict[str, Any]:
    result = run_case(draw(split, index, heldout_set), FAST if fast else FULL, say=_say)
    return asdict(result)


def run(
    split: str, indices: list[int], jobs: int, fast: bool, heldout_set: int = HELDOUT_SET
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if jobs <= 1:
        for i in indices:
            out.append(_one(split, i, fast, heldout_set))
            _say(f"case {len(out)}/{len(indices)} done: {out[-1]['name']}")
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(_one, split, i, fast, heldout_set): i for i in indices}
            for fut in as_completed(futures):
                out.append(fut.result())
                _say(f"case {len(out)}/{len(indices)} done: {out[-1]['name']}")
    return sorted(out, key=lambda c: c["name"])


def _pct(x: float | None, digits: int = 0) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{100 * x:.{digits}f}"


def _interval(lo: float | None, hi: float | None, open_lo: bool, open_hi: bool) -> str:
    if lo is None or hi is None:
        return ""
    return f"[{'≤' if open_lo else ''}{_pct(lo)}, {_pct(hi)}{'+' if open_hi else ''}]"


def table(cases: list[dict[str, Any]]) -> str:
    """One row per case and offload mode; utilizations in % (kv_util × 100)."""
    head = (
        "| case | model | mode | true u* [90 %] | fitted u* [90 % CI] | error pp | covered | "
        "outcome | gain at u: true / fitted [90 % CI] (%) |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    rows = [head]
    for c in cases:
        for m in c["modes"]:
            if m["true_u"] is not None:
                true = f"{_pct(m['true_u'])} [{_pct(m['true_lo'])}, {_pct(m['true_hi'])}]"
            else:
                true = f"none ({m['true_sign']})"
            if m["fitted_u"] is not None:
                fitted = f"{_pct(m['fitted_u'])} " + _interval(
                    m["lo"], m["hi"], m["open_lo"], m["open_hi"]
                )
            elif m["lo"] is not None:  # a one-sided bound (planner.fit.gain's *_above/_below)
                fitted = f"{m['verdict'].replace('_', ' ')}: u* " + (
                    f"≤ {_pct(m['hi'])}" if m["open_lo"] else f"≥ {_pct(m['lo'])}"
                )
            else:
                fitted = m["verdict"].replace("_", " ")
            err = "–" if m["error_pp"] is None else f"{m['error_pp']:+.1f}"
            cov = {None: "–", True: "yes", False: "no"}[m["covered"]]
            gains = "; ".join(
                f"{_pct(g['u'])}: {_pct(g['true'], 1)} / {_pct(g['fitted'], 1)} "
                f"[{_pct(g['lo'], 1)}, {_pct(g['hi'], 1)}]"
                for g in m["gains"]
            )
            rows.append(
                f"| {c['name']} | {c['model']} | {m['mode']} | {true} | {fitted} | {err} | "
                f"{cov} | {m['outcome'].replace('_', ' ')} | {gains} |"
            )
    return "\n".join(rows)


def _binom(k: int, n: int, nominal: float) -> str:
    """k/n with its Clopper-Pearson 95 % interval and the two-sided binomial p-value."""
    if n == 0:
        return "0/0"

    lo = float(stats.beta.ppf(0.025, k, n - k + 1)) if k > 0 else 0.0
    hi = float(stats.beta.ppf(0.975, k + 1, n - k)) if k < n else 1.0
    p = float(stats.binomtest(k, n, nominal).pvalue)
    return f"{k}/{n} = {k / n:.0%} (95 % CI {lo:.0%}–{hi:.0%}; p = {p:.2f} vs {nominal:.0%})"


def summary(cases: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [m | {"case": c["name"]} for c in cases for m in c["modes"]]
    scored = [r for r in rows if r["truth_determinate"] and r["true_u"] is not None]
    numbers = [r for r in scored if r["outcome"] in ("ok", "off", "confidently_wrong")]
    # every point estimate of a determinate true break-even, bounded interval or not
    estimates = [r for r in scored if r["error_pp"] is not None]
    near = [r for r in estimates if abs(r["error_pp"]) <= 100 * TOLERANCE]
    within = [r for r in numbers if r["outcome"] == "ok"]
    cover = [r for r in rows if r["truth_determinate"] and r["covered"] is not None]
    gains = [g for r in rows for g in r["gains"] if math.isfinite(g["true"])]
    outcomes: dict[str, int] = {}
    for r in rows:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    cannot = [
        {"case": r["case"], "mode": r["mode"], "truth": r["true_u"], "why": r["why"]}
        for r in rows
        if r["outcome"] == "cannot_tell"
    ]
    return {
        "comparisons": len(rows),
        "outcomes": outcomes,
        "determinate_true_break_evens": len(scored),
        "fitted_numbers": len(numbers),
        "within_5pp": len(within),
        "within_5pp_share_of_numbers": _binom(len(within), len(numbers), 0.9),
        "within_5pp_share_of_true_break_evens": f"{len(within)}/{len(scored)}",
        "estimates_within_5pp": f"{len(near)}/{len(estimates)} point estimates "
        f"(bounded or not) of {len(scored)} determinate true break-evens",
        "interval_coverage": _binom(sum(r["covered"] for r in cover), len(cover), LEVEL),
        "gain_interval_coverage": _binom(
            sum(g["lo"] <= g["true"] <= g["hi"] for g in gains), len(gains), LEVEL
        ),
        "gain_abs_error_pp_median": (
            sorted(100 * abs(g["fitted"] - g["true"]) for g in gains)[len(gains) // 2]
            if gains
            else None
        ),
        "cannot_tell": cannot,
        "confidently_wrong": [
            r["case"] + "/" + r["mode"] for r in rows if r["outcome"] == "confidently_wrong"
        ],
        "false_or_wrong_claims": [
            r["case"] + "/" + r["mode"]
            for r in rows
            if r["outcome"] in ("false_crossing", "wrong_sign", "missed", "bound_wrong")
        ],
    }


def render(report: dict[str, Any]) -> str:
    s = report["summary"]
    lines = [
        f"## Planner accuracy ({report['split']}, {len(report['cases'])} cases, "
        f"{report['wall_s'] / 60:.1f} min)",
        "",
        table(report["cases"]),
        "",
        f"- comparisons (case × offload mode): {s['comparisons']}; outcomes: "
        + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(s["outcomes"].items())),
        f"- determinate true break-evens in the fit's support: "
        f"{s['determinate_true_break_evens']}; the fit gave a number for {s['fitted_numbers']}",
        f"- within ±{100 * TOLERANCE:.0f} pp: {s['within_5pp_share_of_numbers']} of the numbers "
        f"given; {s['within_5pp_share_of_true_break_evens']} of all determinate true break-evens",
        f"- every point estimate, bounded or not: {s['estimates_within_5pp']} within "
        f"±{100 * TOLERANCE:.0f} pp",
        f"- break-even interval coverage ({LEVEL:.0%} nominal): {s['interval_coverage']}",
        f"- pointwise gain interval coverage: {s['gain_interval_coverage']}; median |error| "
        f"{s['gain_abs_error_pp_median']:.1f} pp"
        if s["gain_abs_error_pp_median"] is not None
        else "- no gain comparisons",
        f"- confidently wrong: {', '.join(s['confidently_wrong']) or 'none'}; wrong claims "
        f"about the existence or sign of a break-even: "
        f"{', '.join(s['false_or_wrong_claims']) or 'none'}",
        "- can't tell: "
        + ("; ".join(f"{c['case']}/{c['mode']}: {c['why']}" for c in s["cannot_tell"]) or "none"),
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--split", choices=("heldout", "dev"), default="heldout")
    ap.add_argument("--cases", type=int, default=HELDOUT_CASES, help="cases 0..N-1 of the split")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--fast", action="store_true", help="the test suite's shorter budget")
    ap.add_argument(
        "--heldout-set", type=int, choices=sorted(HELDOUT_SETS), default=HELDOUT_SET,
        help=f"which held-out set (default {HELDOUT_SET}, the current one)",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("out/accuracy.json"))
    ap.add_argument("--table", type=Path, help="re-print the table of a saved JSON; no run")
    args = ap.parse_args()
    if args.table:
        print(render(json.loads(args.table.read_text(encoding="utf-8"))))
        return
    t0 = time.perf_counter()
    heldout = args.split == "heldout"
    seed = HELDOUT_SETS[args.heldout_set] if heldout else MASTER_SEED
    _say(f"{args.split}: {args.cases} cases, {args.jobs} job(s), master seed {seed}")
    cases = run(args.split, list(range(args.cases)), args.jobs, args.fast, args.heldout_set)
    report = {
        "split": args.split + (f" set {args.heldout_set}" if heldout else ""),
        "master_seed": seed,
        "budget": asdict(FAST if args.fast else FULL),
        "level": LEVEL,
        "tolerance": TOLERANCE,
        "wall_s": time.perf_counter() - t0,
        "summary": summary(cases),
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    print(render(report))
    _say(f"wrote {args.out} in {report['wall_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
