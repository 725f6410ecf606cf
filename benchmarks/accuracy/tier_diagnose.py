"""Why the CPU-tier study's rows miss (benchmarks/accuracy/tier_study.py): a diagnosis, not
part of the frozen study — it reads the study's results and reruns chosen cases.

Per case, beside the study's truth (native offload of m × HBM) and section (sample rate
0.01):

* ``hbm_equiv`` — the same cluster without offload and an HBM of m × its blocks
  (``cluster.num_gpu_blocks``): what the model's inclusive-LRU assumption says a native tier
  of m × HBM equals. truth − hbm_equiv is the simulated native tier's semantics against
  that assumption.
* ``exact`` — the AET model (planner/fit/reuse.py) fed the *exact* reuse times instead of
  vLLM's sampled, censored histograms: every KV block access of the run without offload is
  recorded (each admission's full prompt blocks, hits and misses alike, and each finished
  request's decode blocks), keyed per engine by content (the segment holding the block's
  last token and the block index, planner/simulate/kvcache.py's convention), and
  C(T) = Σ_accesses min(gap, T) / span, hits(T) = #{prompt-block accesses with gap ≤ T} ×
  block_size / span; the hit ratio at m × HBM is hits / query tokens at C(T) = m × blocks.
  exact at 1× against the measured hit ratio says whether AET holds for this system at all;
  exact − hbm_equiv at 2× and 4× is AET's own error (pinned in-flight blocks, the prefix
  constraint); section − exact is the estimation from the histograms (censoring, the
  under-count correction, the tails).
* ``section_s1`` — the section on telemetry with vLLM's sample rate at 1 (every block
  tracked): section − section_s1 is sampling noise. Per engine the fit's eviction time at
  each size against the exact one, and the exact F there: F_exact(T_fit) − F_exact(T_exact)
  is what a wrong occupancy (the body's under-count) costs, section − F_exact(T_fit) what
  a wrong tail shape costs.

Run: ``python -m benchmarks.accuracy.tier_diagnose --only doc-05 null-00`` (reads
``benchmarks/results/tier_study.json``; writes ``tier_diagnose.json`` and ``.md`` there).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.accuracy.tier_cases import MULTIPLES, cases
from benchmarks.accuracy.tier_study import section_of, telemetry_of
from benchmarks.accuracy.tier_truth import measure_run, scenario
from planner.simulate import engine as engine_mod
from planner.simulate.cluster import Simulation
from planner.simulate.scenario import parse_scenario

RESULTS = Path(__file__).resolve().parents[1] / "results"


# ----------------------------------------------------------------------------- exact AET


class AccessLog:
    """Every KV block access of a run, per engine: gaps since the same content's previous
    access (inf: first), split into prompt-block accesses (lookups: can hit) and decode
    blocks (allocations only)."""

    def __init__(self, block_size: int, start: Any, end: Any, warmup_s: float) -> None:
        self.bs = block_size
        self.start = start
        self.end = end
        self.warmup = warmup_s
        self.last: dict[tuple[int, int, int], float] = {}
        self.lookup_gaps: dict[int, list[float]] = {}
        self.other_gaps: dict[int, list[float]] = {}
        self.query_tokens: dict[int, float] = {}
        self.partials: dict[int, int] = {}

    def _blocks(self, path: list[int], lo: int, hi: int) -> list[tuple[int, int]]:
        """(segment, block) of blocks lo … hi-1 of ``path`` (the segment holding the last
        token: blocks [start // bs, end // bs) of a segment)."""
        out = []
        bs, start, end = self.bs, self.start, self.end
        for n in path:
            b0, b1 = start[n] // bs, end[n] // bs
            for b in range(max(b0, lo), min(b1, hi)):
                out.append((n, b))
            if b1 >= hi:
                break
        return out

    def _touch(self, eng: int, blocks: list[tuple[int, int]], t: float, into: list[float]) -> None:
        last = self.last
        keep = t >= self.warmup
        for n, b in blocks:
            key = (eng, n, b)
            prev = last.get(key)
            if keep:
                into.append(math.inf if prev is None else t - prev)
            last[key] = t

    def lookup(self, eng: int, path: list[int], p_eff: int, t: float) -> None:
        gaps = self.lookup_gaps.setdefault(eng, [])
        self._touch(eng, self._blocks(path, 0, p_eff // self.bs), t, gaps)
        if t >= self.warmup:
            self.query_tokens[eng] = self.query_tokens.get(eng, 0.0) + p_eff
            self.partials[eng] = self.partials.get(eng, 0) + 1

    def finished(self, eng: int, path: list[int], prompt: int, output: int, t: float) -> None:
        gaps = self.other_gaps.setdefault(eng, [])
        lo, hi = prompt // self.bs, (prompt + output) // self.bs
        self._touch(eng, self._blocks(path, lo, hi), t, gaps)


def exact_aet(
    log: AccessLog, eng: int, span: float, blocks: Sequence[float]
) -> list[dict[str, float]]:
    """Per capacity (blocks): the AET eviction time T and hit ratio from the exact gaps."""
    look = np.sort(np.asarray(log.lookup_gaps.get(eng, []), dtype=float))
    other = np.asarray(log.other_gaps.get(eng, []), dtype=float)
    every = np.sort(np.concatenate([look, other, np.full(log.partials.get(eng, 0), np.inf)]))
    finite = every[np.isfinite(every)]
    n_inf = every.size - finite.size
    cum = np.concatenate([[0.0], np.cumsum(finite)])

    def occupancy(t: float) -> float:  # Σ min(gap, t) / span
        k = int(np.searchsorted(finite, t, side="right"))
        return float((cum[k] + t * (finite.size - k + n_inf)) / span)

    out = []
    q = log.query_tokens.get(eng, 0.0)
    for c in blocks:
        lo, hi = 0.0, 1.0
        while occupancy(hi) < c and hi < 1e9:
            hi *= 2.0
        for _ in range(80):
            mid = (lo + hi) / 2.0
            lo, hi = (mid, hi) if occupancy(mid) < c else (lo, mid)
        t = (lo + hi) / 2.0
        hits = int(np.searchsorted(look, t, side="right")) * log.bs
        out.append({"blocks": c, "t": t, "hit_ratio": hits / q if q else math.nan})
    return out


def f_exact(log: AccessLog, eng: int, t: float) -> float:
    """Prompt-block hits at eviction time t over query tokens (the exact curve at t)."""
    look = log.lookup_gaps.get(eng, [])
    q = log.query_tokens.get(eng, 0.0)
    return sum(g <= t for g in look) * log.bs / q if q else math.nan


def run_logged(raw: Mapping[str, Any]) -> tuple[AccessLog, Any]:
    """The run without offload with every block access logged."""
    sc = parse_scenario(raw, where="tier diagnose")
    sim = Simulation(sc)
    log = AccessLog(sc.cluster.block_size, sim.tree.start, sim.tree.end, sc.warmup_s)
    now: dict[int, float] = {}
    eng_cls = engine_mod.Engine
    orig_admit, orig_count = eng_cls._admit, eng_cls._count_lookup
    orig_finish = sim._on_finish

    def admit(self: Any, t: float, budget: int, chunks: Any) -> Any:
        now[self.idx] = t
        return orig_admit(self, t, budget, chunks)

    def count(self: Any, req: Any, p_eff: int, hit: int, ext: int) -> None:
        log.lookup(self.idx, req.path, p_eff, now[self.idx])
        orig_count(self, req, p_eff, hit, ext)

    def finish(req: Any, t: float) -> None:
        log.finished(req.engine, req.path, req.prompt_len, req.output_len, t)
        orig_finish(req, t)

    eng_cls._admit = admit  # type: ignore[method-assign,assignment]
    eng_cls._count_lookup = count  # type: ignore[method-assign]
    for e in sim.engines:
        e.on_finish = finish
    try:
        sim.advance_to(sc.duration_s)
    finally:
        eng_cls._admit = orig_admit  # type: ignore[method-assign]
        eng_cls._count_lookup = orig_count  # type: ignore[method-assign]
    return log, sim


# ----------------------------------------------------------------------------- one case


def diagnose(case_name: str, study: Mapping[str, Any], say: Any) -> dict[str, Any]:
    case = next(c for c in cases(study.get("split", "study")) if c.name == case_name)
    res = next(r for r in study["results"] if r["case"] == case_name)
    truth = res["truth"]
    raw = scenario(case, truth["qps"])
    blocks = int(truth["hbm_blocks"])
    out: dict[str, Any] = {"case": case_name, "design": res["design"]}
    t0 = time.perf_counter()
    log, sim = run_logged(raw)
    span = sim.scenario.duration_s - sim.scenario.warmup_s
    engines = sorted(log.query_tokens)
    caps = [m * blocks for m in (1.0, *MULTIPLES)]
    per_eng = {e: exact_aet(log, e, span, caps) for e in engines}
    q_tot = sum(log.query_tokens[e] for e in engines)
    exact = []
    for j, m in enumerate((1.0, *MULTIPLES)):
        hits = sum(per_eng[e][j]["hit_ratio"] * log.query_tokens[e] for e in engines)
        exact.append({"multiple": m, "hit_ratio": hits / q_tot,
                      "t": [per_eng[e][j]["t"] for e in engines]})  # fmt: skip
    out["exact"] = exact
    out["exact_wall_s"] = round(time.perf_counter() - t0, 1)
    say(f"{case_name}: exact AET at 1x {exact[0]['hit_ratio']:.3f} (measured "
        f"{truth['none']['hit_ratio']:.3f})")  # fmt: skip
    equiv = []
    for m in (2.0, 4.0):
        big = copy.deepcopy(raw)
        big["cluster"]["num_gpu_blocks"] = round(m * blocks)
        run = measure_run(big, 0.0, 0.0)
        equiv.append({"multiple": m, "hit_ratio": run.hit_ratio})
    out["hbm_equiv"] = equiv
    s1 = copy.deepcopy(raw)
    s1["engine"]["kv_cache_metrics_sample"] = 1.0
    section, extras = section_of(s1, telemetry_of(s1), case.seed)
    rows = (section.get("native") or {}).get("rows") or []
    out["section_s1"] = [
        {"multiple": m, "hit_ratio": r["hit_ratio"]["estimate"], "can_tell": r["can_tell"]}
        for m, r in zip(MULTIPLES, rows, strict=False)
    ]
    out["section_s1_engines"] = {
        k: {x: e.get(x) for x in ("t_hbm_s", "rho", "weight", "kappa", "excess_share",
                                  "reproduction_error", "can_tell", "why")}
        for k, e in extras["engines"].items()
    }  # fmt: skip
    # per engine: the fit's eviction time at each size (sample 0.01 and 1) against the exact
    fits: dict[str, Any] = {}
    for label, eng_diag in (("s001", res["telemetry"]["engines"]), ("s1", extras["engines"])):
        for key, e in eng_diag.items():
            if "sizes" not in e:
                continue
            idx = int(key.split("/")[0].rsplit("-", 1)[1])
            for z in e["sizes"]:
                j = (1.0, *MULTIPLES).index(z["multiple"])
                t_fit = z["eviction_time_s"]
                fits.setdefault(f"{key} {z['multiple']:g}x", {})[label] = {
                    "t_fit": t_fit,
                    "t_exact": per_eng[idx][j]["t"],
                    "extra_fit": z["extra_hit_ratio"],
                    "families": z["families"],
                    "f_exact_at_t_fit": f_exact(log, idx, t_fit)
                    if t_fit is not None and math.isfinite(t_fit) else None,
                    "f_exact_at_t_exact": per_eng[idx][j]["hit_ratio"],
                    "f_exact_at_t_hbm": f_exact(log, idx, e["t_hbm_s"]),
                    "t_hbm_fit": e["t_hbm_s"],
                }  # fmt: skip
    out["per_engine"] = fits
    out["study"] = [
        {"multiple": z["multiple"], "truth": z["truth"]["hit_ratio"],
         "section": z["hit_ratio"][0], "can_tell": z["can_tell"]}
        for z in res["sizes"]
    ]  # fmt: skip
    out["measured_today"] = truth["none"]["hit_ratio"]
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def _p(x: float | None) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{100 * x:.1f}"


def markdown(doc: Mapping[str, Any]) -> str:
    lines = [
        "# CPU-tier study: where the misses come from (tier_diagnose.py)",
        "",
        "Hit ratio %, pooled over engines. truth: native offload of m × HBM (the study's); "
        "HBM-equiv: no offload, an HBM of m × the blocks; exact AET: the model on the exact "
        "reuse times; section: the plan's (sample rate 0.01, the study's) and at sample rate 1.",
        "",
        "| case | m × HBM | truth | HBM-equiv | exact AET | section (0.01) | section (1.0) |",
        "|---|---|---|---|---|---|---|",
    ]
    for d in doc["cases"]:
        eq = {e["multiple"]: e["hit_ratio"] for e in d["hbm_equiv"]}
        ex = {e["multiple"]: e["hit_ratio"] for e in d["exact"]}
        s1 = {e["multiple"]: e["hit_ratio"] for e in d["section_s1"]}
        lines.append(f"| {d['case']} | 1 (today) | {_p(d['measured_today'])} | "
                     f"{_p(d['measured_today'])} | {_p(ex.get(1.0))} | | |")  # fmt: skip
        for z in d["study"]:
            m = z["multiple"]
            if m < 2:
                continue
            lines.append(
                f"| | {m:g} | {_p(z['truth'])} | {_p(eq.get(m))} | {_p(ex.get(m))} | "
                f"{_p(z['section'])}{'' if z['can_tell'] else ' (cannot tell)'} | "
                f"{_p(s1.get(m))} |"
            )
    lines += [
        "",
        "Per engine (sample 0.01 / 1): the fit's eviction time at the size against the exact "
        "AET's, and the exact curve's hit ratio at each (today's included):",
        "",
        "| engine, size | T_hbm fit s | T fit s (0.01 / 1) | T exact s | exact F at T_fit "
        "(0.01 / 1) | exact F at T exact | exact F at T_hbm |",
        "|---|---|---|---|---|---|---|",
    ]
    for d in doc["cases"]:
        for k, v in d["per_engine"].items():
            if not (k.endswith(" 2x") or k.endswith(" 4x")):
                continue
            a, b = v.get("s001", {}), v.get("s1", {})
            base = a or b

            def t(x: Any) -> str:
                return "–" if x is None else f"{x:.1f}"

            lines.append(
                f"| {d['case']} {k} | {t(base.get('t_hbm_fit'))} | {t(a.get('t_fit'))} / "
                f"{t(b.get('t_fit'))} | {t(base.get('t_exact'))} | "
                f"{_p(a.get('f_exact_at_t_fit'))} / {_p(b.get('f_exact_at_t_fit'))} | "
                f"{_p(base.get('f_exact_at_t_exact'))} | {_p(base.get('f_exact_at_t_hbm'))} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--study", type=Path, default=RESULTS / "tier_study.json")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--out", type=Path, default=RESULTS / "tier_diagnose")
    ap.add_argument("--table", type=Path)
    a = ap.parse_args(argv)
    if a.table:
        print(markdown(json.loads(a.table.read_text())), end="")
        return 0
    study = json.loads(a.study.read_text())
    names = a.only or [r["case"] for r in study["results"]]

    def say(msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)

    out = []
    for name in names:
        out.append(diagnose(name, study, say))
        say(f"{name}: diagnosed in {out[-1]['wall_s']:.0f} s")
    doc = {"study_git": study.get("git"), "cases": out}
    a.out.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    a.out.with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
