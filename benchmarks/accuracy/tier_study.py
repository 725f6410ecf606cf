"""Accuracy of the plan's "What a CPU tier would buy" (planner/plan/tier.py) on simulated
clusters with no offload deployed, against the simulator's native CPU offload of each size,
on cases frozen before the study ran (benchmarks/accuracy/tier_cases.py; truth:
benchmarks/accuracy/tier_truth.py).

Per case: the truth (its saturation probe fixes the offered rate; then the case's scenario
without offload and with native offload at 0.5×, 1×, 2× and 4× HBM), then the cluster's
telemetry through the real collector path (benchmarks/accuracy/telemetry_gen.py: the same
scenario without offload, a scrape every 15 s, 60 s windows from WARMUP_S), the analysis
frame (``engine_frame``), the engines' residency histograms summed from the windows' bucket
counts as the store sums them (telemetry_gen ``bucket_sums`` → planner/frames/residency.py
``combine``) and the section itself (``tier_section``). Its native rows are scored against
the truth (tier_cases.py: within ±5 pp on the hit ratio, ±10 % on avoided re-prefill
tokens/s, the model-based range covering the truth; a cannot-tell is not a hit).

Per engine, diagnostics beside the scores: each engine's AET fit (``fit_reuse`` on the
section's own inputs: T_hbm, the under-count weight, rho, kappa, the reproduction error,
the estimated sample rate) and its native gain per size and tail family.

Run: ``python -m benchmarks.accuracy.tier_study --jobs 2`` (progress on stderr; finished
cases are appended to ``tier_study.partial.jsonl`` and ``--resume`` skips them).
``--table FILE`` re-prints the markdown of a JSON result.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.accuracy.runner import git_revision, run_cases
from benchmarks.accuracy.telemetry_gen import bucket_sums, generate
from benchmarks.accuracy.tier_cases import (
    AVOIDED_REL,
    DEV_SEED,
    FLOOR_PP,
    HIT_PP,
    MASTER_SEED,
    MULTIPLES,
    SAMPLE_RATE,
    WARMUP_S,
    Case,
    cases,
)
from benchmarks.accuracy.tier_truth import CaseTruth, Size, engines_truth, measure
from benchmarks.accuracy.verdict_study import engine_records
from planner.domain.slo import Slo
from planner.fit.reuse import GIB, bytes_per_block, fit_reuse, native_offload_gain
from planner.fit.units import engine_keys
from planner.frames.frames import engine_frame
from planner.frames.residency import combine
from planner.plan import tier
from planner.plan.fits import Hardware
from planner.plan.tier import tier_section
from planner.simulate.scenario import parse_scenario

if TYPE_CHECKING:
    from benchmarks.accuracy.telemetry_gen import Telemetry

RESULTS = Path(__file__).resolve().parents[1] / "results"


# ----------------------------------------------------------------------------- the section


def telemetry_of(raw: Mapping[str, Any]) -> Telemetry:
    """The telemetry of ``raw`` (the case's scenario, no offload) through the collector path."""
    return generate(parse_scenario(raw, where=f"tier study {raw.get('name', '')}"))


def section_of(
    raw: Mapping[str, Any], tel: Telemetry, seed: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The plan's cpu_tier section over ``tel`` (the telemetry of ``raw``) and the per-engine
    diagnostics; returns (section, extras)."""
    sc = parse_scenario(raw, where=f"tier study {raw.get('name', '')}")
    records, _ = engine_records(raw, tel)
    frame = engine_frame(list(tel.windows), records)
    hists = combine(bucket_sums(tel.windows))
    c = sc.cluster
    hw = Hardware(c.model, c.gpu, c.tensor_parallel)
    t0 = time.perf_counter()
    section = tier_section(frame, list(records.values()), hists, hw, slo=Slo(), mfu=None,
                           engines_per_node=c.engines_per_node, seed=seed)  # fmt: skip
    sec_s = time.perf_counter() - t0
    queries = frame["prefix_queries"].to_numpy(dtype=float)
    ratio = frame["prefix_hit_ratio"].to_numpy(dtype=float)
    ok = [math.isfinite(q) and math.isfinite(r) for q, r in zip(queries, ratio, strict=True)]
    q_sum = sum(q for q, g in zip(queries, ok, strict=True) if g)
    h_sum = sum(q * r for q, r, g in zip(queries, ratio, ok, strict=True) if g)
    extras = {
        "windows": len(tel.windows),
        "rows": len(frame),
        "skipped": dict(tel.skipped),
        "today_hit_ratio": h_sum / q_sum if q_sum > 0 else None,
        "histogram_counts": {
            key: {sig.removeprefix("kv_block_"): b.total() for sig, b in by.items()}
            for key, by in hists.items()
        },
        "engines": diagnostics(frame, records, hists, hw, seed),
        "seconds": {"telemetry": round(tel.sim_wall_s + tel.collect_wall_s, 1),
                    "section": round(sec_s, 1)},
    }  # fmt: skip
    return section, extras


def diagnostics(
    frame: Any, records: Mapping[str, Any], hists: Mapping[str, Any], hw: Any, seed: int
) -> dict[str, Any]:
    """Per engine: its AET fit on the section's inputs and its native gain per size and tail
    family (what the section merged)."""
    keys = engine_keys(frame)
    out: dict[str, Any] = {}
    for key in sorted(set(keys.tolist())):
        source = key.split("/", 1)[0]
        try:
            inputs, tok_s = tier._inputs(  # the section's own inputs
                key, hists.get(key, {}), frame[keys == key], dict(records[source].facts or {})
            )
            fit = fit_reuse(inputs, level=tier.LEVEL, n_boot=tier.N_BOOT, seed=seed)
        except Exception as exc:  # a diagnostic never stops the study
            out[key] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        per_block = bytes_per_block(hw.model, inputs.block_size)
        hbm_gib = inputs.hbm_blocks * per_block / GIB
        gain = native_offload_gain(fit, [m * hbm_gib for m in MULTIPLES], bytes_per_block=per_block)
        out[key] = {
            "can_tell": fit.can_tell,
            "why": fit.why,
            "hit_ratio": fit.hit_ratio,
            "lookups_per_s": inputs.lookups_per_s,
            "sample_rate": inputs.sample_rate,
            "t_hbm_s": fit.t_hbm,
            "rho": fit.rho,
            "weight": fit.weight,
            "kappa": fit.kappa,
            "excess_share": fit.excess_share,
            "reproduction_error": fit.reproduction.error,
            "families": list(fit.families),
            "warnings": list(fit.warnings),
            "sizes": [
                {
                    "multiple": m,
                    "extra_hit_ratio": p.extra_hit_ratio.value,
                    "interval": [p.extra_hit_ratio.interval.lo, p.extra_hit_ratio.interval.hi],
                    "families": dict(p.families),
                    "eviction_time_s": p.eviction_time_s,
                    "extrapolated": p.extrapolated,
                    "beyond_histogram": p.beyond_histogram,
                    "can_tell": p.can_tell,
                }
                for m, p in zip(MULTIPLES, gain.points, strict=True)
            ],
            "tokens_per_s": tok_s,
            "requests_per_s": inputs.unhittable_per_s,  # the section's floor: one a request
        }
    return out


# ----------------------------------------------------------------------------- scoring


def _f(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else None


def covers(lo: float | None, hi: float | None, truth: float, tol: float = 0.0) -> bool | None:
    """[lo − tol, hi + tol] holds ``truth`` (None: no range)."""
    if lo is None or hi is None or not math.isfinite(truth):
        return None
    return lo - tol <= truth <= hi + tol


def score_row(row: Mapping[str, Any] | None, truth: Size, section_can_tell: bool) -> dict[str, Any]:
    """One section row (None: the section could not tell at all) against the truth at its
    size (tier_cases.py's scoring rules)."""
    floor_tok = FLOOR_PP / 100.0 * truth.lookup_tokens_per_s
    out: dict[str, Any] = {
        "multiple": truth.multiple,
        "gib": truth.gib,
        "truth": asdict(truth),
        "can_tell": False,
        "why": "",
        "extrapolated": None,
        "hit_ratio": [None, None, None],
        "avoided_tokens_per_s": [None, None, None],
        "hit_error_pp": None,
        "avoided_error_pct": None,
        "within_hit": False,
        "within_avoided": False,
        "covers_hit": None,
        "covers_hit_strict": None,
        "covers_avoided": None,
        "covers_avoided_strict": None,
        "would_be_within_hit": None,
        "would_be_within_avoided": None,
    }
    if row is None:
        out["why"] = "the section cannot tell"
        return out
    hr, tok = row["hit_ratio"], row["avoided_prefill_tokens_per_s"]
    est, lo, hi = (_f(hr[k]) for k in ("estimate", "lo", "hi"))
    t_est, t_lo, t_hi = (_f(tok[k]) for k in ("estimate", "lo", "hi"))
    can = bool(section_can_tell and row["can_tell"])
    out.update(
        can_tell=can,
        why=str(row.get("why", "")),
        extrapolated=bool(row.get("extrapolated")),
        hit_ratio=[est, lo, hi],
        avoided_tokens_per_s=[t_est, t_lo, t_hi],
    )
    within_hit = within_tok = None
    if est is not None:
        err = (est - truth.hit_ratio) * 100.0
        out["hit_error_pp"] = err
        within_hit = abs(err) <= HIT_PP
    if t_est is not None:
        a = truth.avoided_tokens_per_s
        if a > floor_tok:
            out["avoided_error_pct"] = (t_est - a) / a * 100.0
        within_tok = abs(t_est - a) <= max(AVOIDED_REL * abs(a), floor_tok)
    tol = FLOOR_PP / 100.0
    out["covers_hit"] = covers(lo, hi, truth.hit_ratio, tol)
    out["covers_hit_strict"] = covers(lo, hi, truth.hit_ratio)
    out["covers_avoided"] = covers(t_lo, t_hi, truth.avoided_tokens_per_s, floor_tok)
    out["covers_avoided_strict"] = covers(t_lo, t_hi, truth.avoided_tokens_per_s)
    out["within_hit"] = bool(can and within_hit)
    out["within_avoided"] = bool(can and within_tok)
    if not can:
        out["would_be_within_hit"] = within_hit
        out["would_be_within_avoided"] = within_tok
    return out


def score(
    section: Mapping[str, Any], truth: CaseTruth, engines: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """Every size of the case: the section's native row against the truth. ``engines``: every
    engine key of the frame; when the section left some out, each row also carries
    ``section_engines``: its score against the truth of the engines it covers."""
    rows: list[Mapping[str, Any] | None] = [None] * len(truth.sizes)
    if section.get("can_tell") and section.get("native"):
        got = section["native"]["rows"]
        if len(got) != len(truth.sizes):
            raise ValueError(f"section has {len(got)} native rows, the truth {len(truth.sizes)}")
        for r, s in zip(got, truth.sizes, strict=True):
            if not math.isclose(float(r["gib"]), s.gib, rel_tol=1e-6):
                raise ValueError(f"section row {r['label']} is {r['gib']} GiB, the truth's {s.gib}")
        rows = list(got)
    told = bool(section.get("can_tell"))
    out = [score_row(r, s, told) for r, s in zip(rows, truth.sizes, strict=True)]
    left_out = section.get("engines_without") or []
    if told and left_out:
        # the section covers only its fitted engines: beside the frozen (whole-cluster)
        # score, the score against those engines' own truth
        keys = sorted({_engine_index(k) for k in engines if k not in left_out})
        if keys:
            part = engines_truth(truth, keys)
            for o, r, s in zip(out, rows, part, strict=True):
                o["section_engines"] = score_row(r, s, told)
    return out


def _engine_index(key: str) -> int:
    """``engine-3/0`` -> 3 (telemetry_gen's source names)."""
    return int(key.split("/", 1)[0].rsplit("-", 1)[1])


# ----------------------------------------------------------------------------- one case


def run_case(case: Case, say: Callable[[str], None]) -> dict[str, Any]:
    """Truth, telemetry, section and scores of one case (module docstring)."""
    t0 = time.perf_counter()
    truth, raw = measure(case, say)
    section, extras = section_of(raw, telemetry_of(raw), case.seed)
    sizes = score(section, truth, list(extras["engines"]))
    for s in sizes:
        t = s["truth"]
        got = s["hit_ratio"][0]
        say(f"{case.name} {s['multiple']:g}x: truth {t['hit_ratio']:.3f} "
            f"(+{t['avoided_tokens_per_s']:.0f} tok/s); section "
            f"{'-' if got is None else f'{got:.3f}'}"
            f"{'' if s['can_tell'] else ' (cannot tell)'}")  # fmt: skip
    c = raw["cluster"]
    return {
        "case": case.name,
        "kind": case.kind,
        "design": case.design,
        "engines": case.engines,
        "model": c["model"],
        "tp": c["tensor_parallel"],
        "gpu": c["gpu"],
        "gpu_memory_utilization": c["gpu_memory_utilization"],
        "router": c["router"],
        "workload": raw["workload"],
        "hours": case.hours,
        "level": case.level,
        "arrival": case.arrival,
        "working_set": case.working_set,
        "sample_rate": raw["engine"]["kv_cache_metrics_sample"],
        "seed": case.seed,
        "truth": _jsonable(asdict(truth)),
        "section": _jsonable(_section_brief(section)),
        "telemetry": _jsonable(extras),
        "sizes": _jsonable(sizes),
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def _section_brief(section: Mapping[str, Any]) -> dict[str, Any]:
    """The section without its curve and LMCache rows (the study scores native)."""
    keep = ("can_tell", "why", "engines", "engines_without", "engines_without_why", "hbm")
    out = {k: section.get(k) for k in keep}
    native = section.get("native") or {}
    out["native_rows"] = native.get("rows")
    out["recommended"] = native.get("recommended")
    return out


def _jsonable(x: Any) -> Any:
    out: Any = json.loads(json.dumps(x, default=str).replace("NaN", "null"))
    return out


# ----------------------------------------------------------------------------- summary


def _share(k: int, n: int) -> str:
    return f"{k}/{n} ({k / n:.0%})" if n else "–"


def summarize(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per size and over all sizes: the scores of tier_cases.py (module docstring)."""

    def block(rows: list[Mapping[str, Any]]) -> dict[str, Any]:
        told = [r for r in rows if r["can_tell"]]
        errs = [abs(r["hit_error_pp"]) for r in told if r["hit_error_pp"] is not None]
        tok_errs = [abs(r["avoided_error_pct"]) for r in told if r["avoided_error_pct"] is not None]
        untold = [r for r in rows if not r["can_tell"]]
        return {
            "rows": len(rows),
            "can_tell": len(told),
            "cannot_tell": len(untold),
            "within_hit": sum(r["within_hit"] for r in rows),
            "within_avoided": sum(r["within_avoided"] for r in rows),
            "covers_hit": sum(bool(r["covers_hit"]) for r in told),
            "covers_hit_strict": sum(bool(r["covers_hit_strict"]) for r in told),
            "covers_avoided": sum(bool(r["covers_avoided"]) for r in told),
            "covers_hit_cannot_tell": sum(bool(r["covers_hit"]) for r in untold),
            "would_be_within_hit": sum(bool(r["would_be_within_hit"]) for r in untold),
            "median_abs_hit_error_pp": _median(errs),
            "max_abs_hit_error_pp": max(errs) if errs else None,
            "median_abs_avoided_error_pct": _median(tok_errs),
        }

    every = [s for r in results for s in r["sizes"]]
    out: dict[str, Any] = {"all": block(every)}
    for m in MULTIPLES:
        out[f"{m:g}x"] = block([s for s in every if s["multiple"] == m])
    out["tier_adds"] = block(
        [s for s in every
         if s["truth"]["hit_ratio"] - s["truth"]["none_hit_ratio"] > FLOOR_PP / 100.0]
    )  # fmt: skip
    return out


def _median(xs: Sequence[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2.0


def _pct(x: float | None, nd: int = 1) -> str:
    return "–" if x is None else f"{100.0 * x:.{nd}f}"


def _tok(x: float | None) -> str:
    return "–" if x is None else f"{x:,.0f}"


def markdown(doc: Mapping[str, Any]) -> str:
    """The study's tables (per size, then per case and size)."""
    s = doc["summary"]
    lines = [
        f"# CPU-tier accuracy study ({doc['split']} split, seed {doc['master_seed']})",
        "",
        f"{doc['cases']} cases, {doc['wall_s'] / 60:.1f} min wall with {doc['jobs']} "
        f"worker(s); sample rate {doc['rules']['sample_rate']:g}; scored: hit ratio within "
        f"±{HIT_PP:g} pp, avoided re-prefill tokens/s within ±{AVOIDED_REL:.0%} (or "
        f"±{FLOOR_PP:g} pp of the lookup rate), the model-based range covering the truth "
        f"(±{FLOOR_PP:g} pp; strict in brackets). A cannot-tell is never a hit. Git: "
        f"{doc.get('git', '?')}.",
        "",
        "| CPU size | rows | cannot tell | hit ratio ±5 pp (all rows) | of those told | "
        "avoided ±10 % (all rows) | range covers hit ratio (told) | range covers avoided "
        "(told) | median / max abs. error pp (told) | cannot-tell rows the estimate would "
        "have had within ±5 pp |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in ("0.5x", "1x", "2x", "4x", "all", "tier_adds"):
        c = s[name]
        label = {"all": "every size", "tier_adds": "rows where the tier adds > 0.5 pp"}.get(
            name, f"{name} HBM"
        )
        med, mx = c["median_abs_hit_error_pp"], c["max_abs_hit_error_pp"]
        lines.append(
            f"| {label} | {c['rows']} | {_share(c['cannot_tell'], c['rows'])} | "
            f"{_share(c['within_hit'], c['rows'])} | {_share(c['within_hit'], c['can_tell'])} | "
            f"{_share(c['within_avoided'], c['rows'])} | "
            f"{_share(c['covers_hit'], c['can_tell'])} [{c['covers_hit_strict']}] | "
            f"{_share(c['covers_avoided'], c['can_tell'])} | "
            f"{'–' if med is None else f'{med:.1f}'} / {'–' if mx is None else f'{mx:.1f}'} | "
            f"{c['would_be_within_hit']}/{c['cannot_tell']} |"
        )
    lines += [
        "",
        "## Cases",
        "",
        "| case | design | model | h | load × R_sat | today (tel. / none run) | size | truth hit "
        "ratio % | section % [range] | error pp | truth avoided tok/s | section tok/s [range] "
        "| error % | covers (hit / tok) | can tell |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        today = r["telemetry"].get("today_hit_ratio")
        none = r["truth"]["none"]["hit_ratio"]
        for k, z in enumerate(r["sizes"]):
            t = z["truth"]
            est, lo, hi = z["hit_ratio"]
            te, tl, th = z["avoided_tokens_per_s"]
            first = k == 0
            cov = "/".join(
                "–" if v is None else ("yes" if v else "NO")
                for v in (z["covers_hit"], z["covers_avoided"])
            )
            ct = "yes" if z["can_tell"] else "no: " + _short(z["why"])
            err = z["hit_error_pp"]
            terr = z["avoided_error_pct"]
            lines.append(
                f"| {r['case'] if first else ''} | {r['design'] if first else ''} | "
                f"{(r['model'] + ' TP' + str(r['tp'])) if first else ''} | "
                f"{_first(first, format(r['hours'], 'g'))} | "
                f"{_first(first, format(r['level'], 'g'))} | "
                f"{(_pct(today) + ' / ' + _pct(none)) if first else ''} | {z['multiple']:g}× "
                f"({z['gib']:.1f} GiB) | {_pct(t['hit_ratio'])} | {_pct(est)} "
                f"[{_pct(lo)}, {_pct(hi)}] | {'–' if err is None else f'{err:+.1f}'} | "
                f"{_tok(t['avoided_tokens_per_s'])} | {_tok(te)} [{_tok(tl)}, {_tok(th)}] | "
                f"{'–' if terr is None else f'{terr:+.0f}'} | {cov} | {ct} |"
            )
    part = [(r, z) for r in doc["results"] for z in r["sizes"] if "section_engines" in z]
    if part:
        lines += [
            "",
            "Sections that left engines out (their reproduction failed) cover only the others: "
            "the same rows against the truth of the engines they cover.",
            "",
            "| case | engines left out | size | truth hit ratio % (those engines) | section % | "
            "error pp | truth avoided tok/s | section tok/s | error % |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r, z in part:
            e = z["section_engines"]
            t = e["truth"]
            err, terr = e["hit_error_pp"], e["avoided_error_pct"]
            terr_s = "–" if terr is None else f"{terr:+.0f}"
            lines.append(
                f"| {r['case']} | {', '.join(r['section']['engines_without'])} | "
                f"{z['multiple']:g}× | {_pct(t['hit_ratio'])} | {_pct(e['hit_ratio'][0])} | "
                f"{'–' if err is None else f'{err:+.1f}'} | {_tok(t['avoided_tokens_per_s'])} | "
                f"{_tok(e['avoided_tokens_per_s'][0])} | {terr_s} |"
            )
    return "\n".join(lines) + "\n"


def _first(first: bool, text: str) -> str:
    return text if first else ""


def _short(text: str, n: int = 70) -> str:
    text = text.replace("|", "/")
    return text if len(text) <= n else text[: n - 1] + "…"


# ----------------------------------------------------------------------------- CLI


def _worker(case: Case) -> dict[str, Any]:
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)

    try:
        out = run_case(case, say)
    except Exception as exc:  # a failing case is recorded, the study goes on
        say(f"{case.name}: FAILED {type(exc).__name__}: {exc}")
        return {"case": case.name, "error": traceback.format_exc()}
    say(f"{case.name}: done in {time.perf_counter() - t0:.0f} s")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--split", default="study", choices=("study", "dev"))
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=None, help="case names")
    ap.add_argument("--out", type=Path, default=RESULTS / "tier_study")
    ap.add_argument("--resume", action="store_true", help="skip cases in the partial file")
    ap.add_argument("--table", type=Path, help="re-print the markdown of a JSON result")
    a = ap.parse_args(argv)
    if a.table:
        print(markdown(json.loads(a.table.read_text())), end="")
        return 0
    todo = [c for c in cases(a.split) if not a.only or c.name in a.only]
    revision = git_revision()  # the code this run runs
    results, wall_s = run_cases(
        [c.name for c in todo],
        todo,
        _worker,
        out=a.out,
        jobs=a.jobs,
        resume=a.resume,
        label="tier study",
    )
    good = [r for r in results if "error" not in r]
    doc = {
        "split": a.split,
        "master_seed": MASTER_SEED if a.split == "study" else DEV_SEED,
        "git": revision,
        "jobs": a.jobs,
        "cases": len(good),
        "failed": [r["case"] for r in results if "error" in r],
        "errors": {r["case"]: r["error"] for r in results if "error" in r},
        "wall_s": wall_s,
        "rules": {
            "multiples": list(MULTIPLES),
            "sample_rate": SAMPLE_RATE,
            "warmup_s": WARMUP_S,
            "hit_pp": HIT_PP,
            "avoided_rel": AVOIDED_REL,
            "floor_pp": FLOOR_PP,
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
