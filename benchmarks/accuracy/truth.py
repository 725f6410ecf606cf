"""The simulator's own A/B truth of the offload gain, on the fit's definitions.

Definitions (the same in the fit and in the truth; benchmarks/accuracy/study.py explains why)
-----------------------------------------------------------------------------------
* utilization ``u`` of an engine = the time average of ``kv_cache_usage_ratio`` (vLLM's
  ``kv_cache_usage_perc``: blocks held by running requests / all GPU blocks) — the fit's
  default ``kv_util`` column. Here it is the exact time integral the simulator keeps
  (``Engine.kv_integral``); the telemetry's ``kv_util`` is the mean of the gauge scraped
  every 15 s, a sample of the same average.
* throughput ``tp`` = prompt + generation tokens per second (the engine's
  ``prompt_tokens_total`` + ``generation_tokens_total`` counters, the fit's ``tokens_per_s``).
* the gain at utilization u = ``tp_off(u) / tp_none(u) - 1``, each arm's throughput taken
  where ITS OWN utilization is u ("utilization-matched"); the break-even u* is where it
  changes sign. A regression of tokens/s on kv_util by mode (planner.fit.gain) estimates
  exactly this: it compares windows of equal utilization, not of equal offered load.

Measurement
-----------
One engine per run, open loop at a FIXED Poisson rate (sessions for multi-turn workloads),
the same seed in both arms. Each arm runs at a ladder of rates; its (u, tp) points trace
``tp_m(u)``, interpolated linearly between neighbouring rates. Where the gain changes sign
between two rates whose utilizations are more than ``refine_gap`` apart, the midpoint rate
is added to both arms (bisection, at most ``max_refine`` rounds).

Noise. An unsaturated open loop serves what is offered: its throughput IS ``rate × τ``
(τ = tokens per arrival, a property of the workload, the same in both arms), so the truth
uses that expectation instead of the measured rate, whose Poisson noise (~1 % over a
20-minute run) would otherwise swamp gains of a fraction of a percent; a level counts as
saturated (then its measured throughput is used) when it serves < 97 % of ``rate × τ``.
``u`` is still a measurement: the measured period is cut into equal batches and the truth
crossing's uncertainty is a bootstrap over batches (batch means, resampled with the same
batch indices in both arms at a rate, since both see the same arrivals).
"""

from __future__ import annotations

import copy
import itertools
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from core.errors import ConfigError
from planner.fit.gain import located_crossings
from planner.simulate.cluster import Simulation
from planner.simulate.scenario import parse_scenario

if TYPE_CHECKING:
    import numpy.typing as npt

    Array = npt.NDArray[np.float64]

SATURATED = 0.97  # served / offered tokens below this: the level is saturated
N_BOOT = 200
GRID = 401
LEVEL = 0.90
MAX_NEW = 2  # rates added per refinement round and mode


@dataclass(frozen=True, slots=True)
class LevelResult:
    """One arm at one fixed offered rate."""

    mode: str
    rate: float  # offered arrivals per second (requests, or sessions for multi-turn)
    seed: int
    u: float  # time-averaged kv_cache_usage_ratio over the measured period
    tp: float  # measured prompt + generation tokens per second
    preemptions: int
    ttft_mean_s: float
    wall_s: float
    batch_u: tuple[float, ...] = ()  # u of consecutive equal batches of the period
    batch_tp: tuple[float, ...] = ()  # measured tp of the same batches
    served_tp: float = math.nan  # the throughput the truth uses (module doc)
    saturated: bool = False


@dataclass(frozen=True, slots=True)
class Crossing:
    """A located sign change of the gain: ``u`` and the stretch [lo, hi] around it where
    the gain's 90 % bootstrap band contains 0 (planner.fit.gain.located_crossings)."""

    u: float
    lo: float
    hi: float
    rising: bool  # gain goes from negative to positive as u grows


Points = Sequence[tuple[float, float, float]]  # (rate, u, tp) of one arm's levels


def _curve(points: Points) -> tuple[list[float], list[float]]:
    """(rate, u, tp) -> (u, tp) ordered by rate; by u where u does not rise with the rate;
    equal u keep their mean throughput."""
    xy = [(u, tp) for _, u, tp in sorted(points)]
    if any(b[0] <= a[0] for a, b in itertools.pairwise(xy)):
        xy = sorted(xy)
    us: list[float] = []
    ts: list[float] = []
    for x, y in xy:
        if us and x == us[-1]:
            ts[-1] = 0.5 * (ts[-1] + y)
        else:
            us.append(x)
            ts.append(y)
    return us, ts


def _gain(
    grid: Array,
    none: Sequence[tuple[float, float, float]],
    off: Sequence[tuple[float, float, float]],
) -> Array:
    """tp_off(u)/tp_none(u) - 1 on ``grid`` (piecewise-linear interpolants of each arm)."""
    un, tn = _curve(none)
    uo, to = _curve(off)
    out: Array = np.interp(grid, uo, to) / np.interp(grid, un, tn) - 1.0
    return out


@dataclass(frozen=True, slots=True)
class TruthCurve:
    """The utilization-matched gain of one offload mode against none on a grid over the
    utilizations both arms reach, with its pointwise 90 % batch-bootstrap band."""

    mode: str
    none: tuple[LevelResult, ...]
    off: tuple[LevelResult, ...]
    support: tuple[float, float]
    grid: tuple[float, ...]
    mean: tuple[float, ...]  # gain of the measured curves
    band: tuple[tuple[float, float], ...]  # (5th, 95th) percentile of the replicates
    crossings: tuple[Crossing, ...]  # located sign changes (module doc)

    def gain(self, u: float) -> float:
        """Relative gain at utilization ``u`` (NaN outside the support)."""
        lo, hi = self.support
        if not lo <= u <= hi:
            return math.nan
        return float(np.interp(u, self.grid, self.mean))

    def first_in(self, lo: float, hi: float) -> Crossing | None:
        """The first located crossing with ``lo <= u <= hi``."""
        return next((c for c in self.crossings if lo <= c.u <= hi), None)

    def sign_on(self, lo: float, hi: float) -> str:
        """On [lo, hi] ∩ support: ``crosses`` (a located crossing), else ``positive`` /
        ``negative`` (the sign where the band excludes 0), ``flat`` (it never does) or
        ``unknown`` (no overlap)."""
        a, b = max(lo, self.support[0]), min(hi, self.support[1])
        if not a < b:
            return "unknown"
        if self.first_in(a, b) is not None:
            return "crosses"
        sig = [
            m for u, m, (q0, q1) in zip(self.grid, self.mean, self.band, strict=True)
            if a <= u <= b and (q0 > 0 or q1 < 0)
        ]  # fmt: skip
        if not sig:
            return "flat"
        return "positive" if sig[0] > 0 else "negative"


def truth_curve(
    mode: str, none: Sequence[LevelResult], off: Sequence[LevelResult], *, seed: int = 0
) -> TruthCurve:
    """The gain curve from both arms' levels (``served_tp`` set), its batch bootstrap band
    and its located crossings."""
    if len(none) < 2 or len(off) < 2:
        raise ConfigError("truth curve needs at least two rates per arm")
    pn = [(p.rate, p.u, p.served_tp) for p in none]
    po = [(p.rate, p.u, p.served_tp) for p in off]
    lo = max(min(p.u for p in none), min(p.u for p in off))
    hi = min(max(p.u for p in none), max(p.u for p in off))
    if not lo < hi:
        raise ConfigError(f"truth {mode}: the arms' utilizations do not overlap")
    grid = np.linspace(lo, hi, GRID)
    mean = _gain(grid, pn, po)
    rng = random.Random(seed)
    reps = np.empty((N_BOOT, GRID))
    for k in range(N_BOOT):
        picks: dict[float, list[int]] = {}
        arms = []
        for arm in (none, off):
            pts = []
            for p in arm:
                nb = len(p.batch_u)
                idx = picks.setdefault(p.rate, [rng.randrange(nb) for _ in range(nb)])
                pts.append(
                    (p.rate, sum(p.batch_u[i] for i in idx) / nb,
                     sum(p.batch_tp[i] for i in idx) / nb)
                )  # fmt: skip
            arms.append(pts)
        reps[k] = _gain(grid, arms[0], arms[1])
    tail = (1.0 - LEVEL) / 2.0
    q0, q1 = np.quantile(reps, [tail, 1.0 - tail], axis=0)
    ok = (q0 <= 0.0) & (q1 >= 0.0)
    crossings = tuple(Crossing(*c) for c in located_crossings(grid, mean, ok))
    return TruthCurve(
        mode, tuple(none), tuple(off), (float(lo), float(hi)), tuple(grid.tolist()),
        tuple(mean.tolist()), tuple(zip(q0.tolist(), q1.tolist(), strict=True)), crossings,
    )  # fmt: skip


def run_level(
    raw: Mapping[str, Any], mode: str, rate: float, seed: int, *,
    duration_s: float, warmup_s: float, batches: int,
) -> LevelResult:  # fmt: skip
    """Run one engine of ``raw`` (a one-engine scenario without arrivals) in ``mode`` at a
    fixed Poisson ``rate``; measure ``batches`` equal batches of [warmup_s, duration_s]."""
    run = copy.deepcopy(dict(raw))
    run["cluster"] = {**run["cluster"], "offload": mode}
    run["workload"] = {**run["workload"], "qps": rate, "arrival": "poisson"}
    run["workload"].pop("concurrency", None)
    run.update(duration_s=duration_s, warmup_s=warmup_s, seed=seed)
    scenario = parse_scenario(run, where=f"truth {run.get('name', '')} {mode}@{rate:.4g}")
    if scenario.cluster.num_engines != 1:
        raise ConfigError("truth runs simulate one engine")
    t0 = time.perf_counter()
    sim = Simulation(scenario)
    eng = sim.engines[0]
    keys = ("prompt_tokens_total", "generation_tokens_total")
    sim.advance_to(warmup_s, settle=True)
    pre0 = eng.preemptions
    marks = [(sim.now, eng.kv_integral, sum(eng.tel.counters[k] for k in keys))]
    step = (duration_s - warmup_s) / batches
    for b in range(1, batches + 1):
        sim.advance_to(warmup_s + b * step, settle=True)
        marks.append((sim.now, eng.kv_integral, sum(eng.tel.counters[k] for k in keys)))
    pairs = list(itertools.pairwise(marks))
    bu = tuple((b[1] - a[1]) / (b[0] - a[0]) for a, b in pairs)
    btp = tuple((b[2] - a[2]) / (b[0] - a[0]) for a, b in pairs)
    span = marks[-1][0] - marks[0][0]
    ttft = [c[1] - c[0] for c in sim.completed if c[2] >= warmup_s]
    return LevelResult(
        mode=mode,
        rate=rate,
        seed=seed,
        u=(marks[-1][1] - marks[0][1]) / span,
        tp=(marks[-1][2] - marks[0][2]) / span,
        preemptions=eng.preemptions - pre0,
        ttft_mean_s=sum(ttft) / len(ttft) if ttft else math.nan,
        wall_s=time.perf_counter() - t0,
        batch_u=bu,
        batch_tp=btp,
    )


def served_levels(levels: Sequence[LevelResult]) -> list[LevelResult]:
    """Set ``served_tp`` and ``saturated`` (module doc): at each rate the arms that serve
    at least ``SATURATED`` of the most any arm served there are unsaturated and share the
    mean of their measured throughputs (their batch series too); the others keep their own."""
    by_rate: dict[float, list[LevelResult]] = {}
    for p in levels:
        by_rate.setdefault(p.rate, []).append(p)
    out = []
    for group in by_rate.values():
        top = max(p.tp for p in group)
        ok = [p for p in group if p.tp >= SATURATED * top]
        shared = sum(p.tp for p in ok) / len(ok)
        n = min(len(p.batch_tp) for p in ok)
        batches = tuple(sum(p.batch_tp[i] for p in ok) / len(ok) for i in range(n))
        for p in group:
            if p in ok:
                out.append(replace(p, served_tp=shared, batch_tp=batches, saturated=False))
            else:
                out.append(replace(p, served_tp=p.tp, saturated=True))
    return out


def measure_truth(
    raw: Mapping[str, Any],
    modes: Sequence[str],
    rates: Sequence[float],
    seed: int,
    *,
    duration_s: float,
    warmup_s: float,
    batches: int = 8,
    min_arrivals: float = 0.0,
    refine_below: float = math.inf,
    refine_gap: float = 0.03,
    max_refine: int = 2,
    say: Callable[[str], None] | None = None,
) -> dict[str, TruthCurve]:
    """Truth curves of every offload mode in ``modes`` against ``none`` (see module doc)."""

    def level(mode: str, rate: float) -> LevelResult:
        # low rates run longer: at least ``min_arrivals`` arrivals measured
        duration = max(duration_s, warmup_s + min_arrivals / rate)
        return run_level(
            raw, mode, rate, seed, duration_s=duration, warmup_s=warmup_s, batches=batches
        )

    arms = ["none", *(m for m in modes if m != "none")]
    runs: dict[str, dict[float, LevelResult]] = {
        m: {r: level(m, r) for r in sorted(set(rates))} for m in arms
    }

    def curve(mode: str) -> TruthCurve:
        both = served_levels([*runs["none"].values(), *runs[mode].values()])
        return truth_curve(
            mode, [p for p in both if p.mode == "none"], [p for p in both if p.mode == mode],
            seed=seed,
        )  # fmt: skip

    curves: dict[str, TruthCurve] = {}
    for mode in arms[1:]:
        for _ in range(max_refine):
            new = _refinements(runs["none"], runs[mode], curve(mode), refine_gap, refine_below)
            if not new:
                break
            if say:
                say(f"truth {mode}: refining at rates {', '.join(f'{r:.4g}' for r in new)}")
            for r in new:
                for m in ("none", mode):
                    if r not in runs[m]:
                        runs[m][r] = level(m, r)
    for mode in arms[1:]:
        curves[mode] = curve(mode)
    return curves


def _refinements(
    none: dict[float, LevelResult], off: dict[float, LevelResult], curve: TruthCurve,
    gap: float, below: float,
) -> list[float]:  # fmt: skip
    """Midpoint rates of the rate intervals where either arm's u moves by more than ``gap``
    (crossing intervals first; only intervals starting below u = ``below``), so the curves
    are resolved to about ``gap`` in u where they are compared."""
    rates = sorted(set(none) & set(off))
    wide: list[tuple[int, float, float]] = []
    for r0, r1 in itertools.pairwise(rates):
        us = [none[r0].u, none[r1].u, off[r0].u, off[r1].u]
        span = max(abs(none[r1].u - none[r0].u), abs(off[r1].u - off[r0].u))
        if span > gap and r1 - r0 > 1e-3 * r1 and min(us) < below:
            holds = any(min(us) <= c.u <= max(us) for c in curve.crossings)
            wide.append((0 if holds else 1, -span, 0.5 * (r0 + r1)))
    return sorted(r for *_, r in sorted(wide)[:MAX_NEW])
