"""Planner accuracy study: the fitted offload break-even against the simulator's A/B truth.

For each case (planner/accuracy_scenarios.py: one engine type and one prompt mix, drawn
from fixed seeds) the study

1. calibrates: the engine's capacity ``cap`` without offload (arrivals/s a closed loop of
   enough clients to fill its KV cache completes);
2. generates telemetry (planner/telemetry_gen.py: simulator -> real exposition text ->
   collector.parse -> collector.rollup): ``engines_per_mode`` engines per arm (none and each
   offload mode), each an independent simulation with its own seed, under an open-loop
   sinusoidal ("diurnal") arrival rate from ~5 % to ~``peak`` of ``cap`` over the run, each
   engine with its own load scale — so utilization varies over time and across engines —
   then fits planner.fit_gain on the frame of those windows (level 90 %);
3. measures the truth (planner/accuracy_truth.py): the same engine, arms none and offload,
   same seed, each at a ladder of FIXED rates, refined around the crossing;
4. compares break-even, its interval and the gain at a few utilizations.

Definitions (shared by fit and truth)
-------------------------------------
*Utilization* is kv_util = mean kv_cache_usage_ratio, the fit's default column. Is it
measurable identically in both arms? As a quantity yes — the same gauge, the same blocks
(a request's KV counts whether it was computed or loaded) — but offload changes its VALUE at
a given load: a request whose history is reloaded instead of recomputed leaves the engine
sooner, so fewer requests hold KV. We therefore never compare arms at the same load on the
utilization axis; both the fit and the truth compare them at the same utilization.

*Throughput* is tokens_per_s = (prompt + generation tokens)/s. In an open loop below
saturation both arms serve the offered load, so the throughput gain AT EQUAL LOAD is 0 by
construction and offload shows only in latency. At EQUAL UTILIZATION it is not: by Little's
law the requests in flight (hence KV in use) = arrival rate × time in the engine, so at the
same KV occupancy an arm that serves each request faster carries proportionally more
tokens/s. The gain ``tp_off(u)/tp_none(u) − 1`` is therefore the capacity gained per unit
of KV occupancy — the latency effect of offload expressed as load an engine can carry at a
given KV utilization — and its break-even u* is the utilization above which an engine with
offload does more work than one without at the same KV pressure. This is exactly what the
regression of tokens/s on kv_util by mode estimates from open-loop windows, so no change of
definition in planner/frames.py or planner/fit_gain.py was needed. (Goodput under a TTFT
SLO was rejected: it needs per-request data that the exposition only gives as bucketed
histograms, and its value depends on an arbitrary SLO.)

Scoring of a case (per offload mode, on the fit's common support [lo, hi])
--------------------------------------------------------------------------
``ok`` fitted u* within ±5 pp of the true u*; ``off`` further (``confidently_wrong`` when
the interval also misses the truth by > 5 pp); ``cannot_tell`` the fit declined (reason
kept); ``agrees_none`` no true crossing in [lo, hi] and the fit reports the same sign
throughout; ``false_crossing`` / ``wrong_sign`` / ``missed`` the other mismatches.
Interval coverage counts every case where the fit reported a break-even interval
(open ends of an interval that reaches the support edge extend to ±∞).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from planner.accuracy_scenarios import Draw
from planner.accuracy_truth import Crossing, TruthCurve, measure_truth

if TYPE_CHECKING:
    from planner.fit_gain import GainFit
    from planner.simulate.workload_spec import WorkloadSpec
    from planner.telemetry_gen import Telemetry

TOLERANCE = 0.05  # ±5 percentage points of utilization
LEVEL = 0.90
COLLAPSE = 0.9  # time-averaged kv_util at which the engine without offload has given out
CAPACITY_STEPS = 4  # bisection steps (the rate is known to within (1/4)^(1/16) ≈ 9 %)


@dataclass(frozen=True, slots=True)
class Budget:
    """Simulated durations (seconds) and sizes; ``FULL`` for the study, ``FAST`` for tests."""

    telemetry_s: float = 5400.0  # one diurnal period
    telemetry_warmup_s: float = 300.0
    engines_per_mode: int = 3
    peak: float = 1.0  # peak offered rate / capacity, times the engine load scale
    truth_s: float = 2100.0
    truth_warmup_s: float = 300.0
    truth_batches: int = 6
    truth_min_requests: float = 2500.0  # low rates run longer to measure this many
    truth_fractions: tuple[float, ...] = (0.08, 0.25, 0.45, 0.62, 0.76, 0.88, 1.0)
    calibrate_s: float = 900.0
    scrape_s: float = 15.0
    window_s: float = 60.0


FULL = Budget()
FAST = Budget(  # the test suite's: one simulated hour of telemetry, shorter truth runs
    telemetry_s=3600.0,
    telemetry_warmup_s=240.0,
    truth_s=1000.0,
    truth_warmup_s=200.0,
    truth_batches=5,
    truth_min_requests=1000.0,
    truth_fractions=(0.1, 0.35, 0.6, 0.8, 1.0),
    calibrate_s=600.0,
)
LOAD_SCALES = (0.6, 0.8, 1.0)  # per-engine load multipliers, the same set in every arm


def _raw(draw: Draw, mode: str, seed: int, duration_s: float, warmup_s: float) -> dict[str, Any]:
    raw = copy.deepcopy(draw.raw)
    raw["cluster"]["offload"] = mode
    raw.update(duration_s=duration_s, warmup_s=warmup_s, seed=seed)
    return raw


def capacity(draw: Draw, budget: Budget, say: Callable[[str], None] | None = None) -> float:
    """The load scale of a case: the offered rate (arrivals/s) at which the engine WITHOUT
    offload fills its KV cache (time-averaged kv_util >= ``COLLAPSE``: preemptions, a
    growing queue), found by bisection between 25 % and 100 % of a closed-loop upper bound
    (clients enough to fill the KV cache, zero think time), or that bound when even it does
    not fill the cache. Telemetry peaks and truth ladders are fractions of it, so both cover
    the utilizations up to where the engine without offload gives out."""
    from planner.accuracy_truth import run_level
    from planner.simulate.cluster import Simulation
    from planner.simulate.scenario import parse_scenario

    raw = _raw(draw, "none", draw.seed, budget.calibrate_s, budget.calibrate_s / 3)
    probe = parse_scenario({**raw, "workload": {**raw["workload"], "concurrency": 1}})
    spec: WorkloadSpec = probe.workload
    per_request = _mean_request_tokens(spec)
    kv_tokens = probe.cluster.num_gpu_blocks * probe.cluster.block_size
    clients = max(4, min(probe.cluster.max_num_seqs, math.ceil(1.5 * kv_tokens / per_request)))
    wl = {**raw["workload"], "concurrency": clients}
    if spec.kind == "multi_turn":
        wl["think_time_s"] = 0.0
    result = Simulation(parse_scenario({**raw, "workload": wl})).run()
    bound = float(result["requests_per_s"]) / draw.turns  # type: ignore[index]

    def full(rate: float) -> bool:
        level = run_level(
            draw.raw, "none", rate, draw.seed,
            duration_s=budget.calibrate_s, warmup_s=budget.calibrate_s / 3, batches=1,
        )  # fmt: skip
        if say:
            say(f"{draw.name}: probe {rate:.4g} {draw.rate_unit}: kv_util {level.u:.2f}")
        return level.u >= COLLAPSE

    if not full(bound):
        return bound
    lo, hi = 0.25 * bound, bound
    if full(lo):
        return lo
    for _ in range(CAPACITY_STEPS):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if full(mid) else (mid, hi)
    return hi


def _mean_request_tokens(spec: WorkloadSpec) -> float:
    out = spec.output_tokens.mean
    if spec.kind == "synthetic":
        return spec.prompt_tokens.mean + out
    if spec.kind == "multi_turn":
        turn = spec.question_tokens.mean + out
        return spec.system_prompt_tokens + (spec.turns + 1) / 2.0 * turn
    if spec.kind == "rag":
        docs = spec.docs_per_request * spec.doc_tokens
        return spec.system_prompt_tokens + docs + spec.question_tokens.mean + out
    return spec.system_prompt_tokens + spec.question_tokens.mean + out


def telemetry(
    draw: Draw, cap: float, budget: Budget, say: Callable[[str], None] | None = None
) -> Telemetry:
    """Open-loop diurnal telemetry of ``engines_per_mode`` engines per arm (module doc)."""
    from planner.simulate.scenario import parse_scenario
    from planner.telemetry_gen import generate, merge

    amp = 0.9  # rate from 0.1/1.9 ≈ 5 % to 100 % of the peak
    parts = []
    arms = ("none", *draw.modes)
    for a, mode in enumerate(arms):
        for k in range(budget.engines_per_mode):
            scale = LOAD_SCALES[k % len(LOAD_SCALES)]
            seed = draw.seed + 1000 * (k + 1)  # the same seeds in every arm
            raw = _raw(draw, mode, seed, budget.telemetry_s, budget.telemetry_warmup_s)
            mean_rate = scale * budget.peak * cap / (1.0 + amp)
            raw["workload"].update(
                qps=mean_rate,
                arrival="diurnal",
                diurnal_period_s=budget.telemetry_s,
                diurnal_amplitude=amp,
            )
            scenario = parse_scenario(raw, where=f"telemetry {draw.name} {mode} #{k}")
            parts.append(
                generate(
                    scenario,
                    scrape_s=budget.scrape_s,
                    window_s=budget.window_s,
                    prefix=f"{mode}{k}-",
                )
            )
            if say:
                say(f"{draw.name}: telemetry {a * budget.engines_per_mode + k + 1}/"
                    f"{len(arms) * budget.engines_per_mode} engines")  # fmt: skip
    return merge(parts, draw.name)


@dataclass(frozen=True, slots=True)
class GainCheck:
    """True and fitted relative gain at one utilization."""

    u: float
    true: float
    fitted: float
    lo: float
    hi: float

    @property
    def covered(self) -> bool:
        return self.lo <= self.true <= self.hi


@dataclass(frozen=True, slots=True)
class ModeResult:
    """One offload mode of one case: truth, fit and the verdict of the comparison."""

    mode: str
    outcome: str
    true_u: float | None  # first true crossing inside the fit's support (None: none)
    true_lo: float | None  # 90 % bootstrap interval of that crossing
    true_hi: float | None
    true_sign: str  # crosses | positive | negative | unknown (on the fit's support)
    truth_determinate: bool
    true_crossings: tuple[float, ...]  # every true crossing on the truth's support
    fitted_u: float | None
    lo: float | None
    hi: float | None
    open_lo: bool
    open_hi: bool
    error_pp: float | None
    covered: bool | None
    can_tell: bool
    verdict: str
    why: str
    support: tuple[float, float]
    truth_support: tuple[float, float]
    gains: tuple[GainCheck, ...]
    cov_type: str
    windows: int


@dataclass(frozen=True, slots=True)
class CaseResult:
    name: str
    family: str
    split: str
    model: str
    capacity: float
    rate_unit: str
    modes: tuple[ModeResult, ...]
    truth_levels: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def judge(truth: TruthCurve, fit: GainFit) -> ModeResult:
    """Compare one fit with its truth (scoring rules in the module docstring)."""
    lo, hi = fit.support
    has_support = math.isfinite(lo) and math.isfinite(hi)
    sign = truth.sign_on(lo, hi) if has_support else "unknown"
    first = truth.first_in(lo, hi) if has_support else None
    true_u = first.u if first else None
    if first is not None:
        determinate = first.hi - first.lo <= TOLERANCE
    else:
        determinate = sign in ("positive", "negative")
    reported = fit.verdict == "crosses"
    f_u = fit.estimate if reported else None
    i_lo, i_hi = (fit.interval.lo, fit.interval.hi) if reported else (None, None)
    open_lo = bool(reported and i_lo is not None and i_lo <= lo + 1e-12)
    open_hi = bool(reported and i_hi is not None and i_hi >= hi - 1e-12)
    error = covered = None
    if reported and true_u is not None and f_u is not None:
        error = 100.0 * (f_u - true_u)
    if reported and i_lo is not None and i_hi is not None and true_u is not None:
        covered = (open_lo or i_lo <= true_u) and (open_hi or true_u <= i_hi)
    outcome = _outcome(
        fit, sign, first, error, i_lo=i_lo, i_hi=i_hi, open_lo=open_lo, open_hi=open_hi
    )
    if not determinate:
        outcome = "truth_flat"
    return ModeResult(
        mode=truth.mode, outcome=outcome, true_u=true_u,
        true_lo=first.lo if first else None, true_hi=first.hi if first else None,
        true_sign=sign, truth_determinate=determinate,
        true_crossings=tuple(c.u for c in truth.crossings), fitted_u=f_u, lo=i_lo, hi=i_hi,
        open_lo=open_lo, open_hi=open_hi, error_pp=error, covered=covered,
        can_tell=fit.can_tell, verdict=fit.verdict, why=fit.why, support=(lo, hi),
        truth_support=truth.support, gains=_gain_checks(truth, fit), cov_type=fit.cov_type,
        windows=fit.n,
    )  # fmt: skip


def _outcome(
    fit: GainFit, sign: str, first: Crossing | None, error: float | None, *,
    i_lo: float | None, i_hi: float | None, open_lo: bool, open_hi: bool,
) -> str:  # fmt: skip
    if fit.verdict == "crosses":
        if first is None:
            return "false_crossing" if fit.can_tell else "cannot_tell"
        if not fit.can_tell:
            return "cannot_tell"
        assert error is not None and i_lo is not None and i_hi is not None
        if abs(error) <= 100 * TOLERANCE:
            return "ok"
        miss = max(i_lo - first.u if not open_lo else 0.0, first.u - i_hi if not open_hi else 0.0)
        return "confidently_wrong" if miss > TOLERANCE else "off"
    if fit.verdict in ("positive_throughout", "negative_throughout"):
        claimed = fit.verdict.split("_")[0]
        if sign == claimed:
            return "agrees_none"
        if first is None:
            return "wrong_sign"
        # "no break-even in [lo, hi]" puts u* beyond the edge where the claimed sign starts:
        # right to within the tolerance when the true crossing is that close to the edge
        lo, hi = fit.support
        edge = lo if (claimed == "positive") == first.rising else hi
        return "agrees_edge" if abs(first.u - edge) <= TOLERANCE else "missed"
    return "cannot_tell"


def _gain_checks(truth: TruthCurve, fit: GainFit) -> tuple[GainCheck, ...]:
    """Relative gain, true vs fitted (with its pointwise 90 % interval), at 20/50/80 % of the
    utilizations both cover."""
    if not fit.grid:
        return ()
    a = max(fit.support[0], truth.support[0])
    b = min(fit.support[1], truth.support[1])
    if not a < b:
        return ()
    us = [p.u for p in fit.grid]
    out = []
    for q in (0.2, 0.5, 0.8):
        u = a + q * (b - a)
        out.append(
            GainCheck(
                u=u,
                true=truth.gain(u),
                fitted=_lin(u, us, [p.relative for p in fit.grid]),
                lo=_lin(u, us, [p.relative_interval.lo for p in fit.grid]),
                hi=_lin(u, us, [p.relative_interval.hi for p in fit.grid]),
            )
        )
    return tuple(out)


def _lin(u: float, xs: list[float], ys: list[float]) -> float:
    import numpy as np

    return float(np.interp(u, xs, ys))


@dataclass(frozen=True, slots=True)
class Simulated:
    """What the simulator produced for one case: the fit's frame and the truth curves."""

    draw: Draw
    capacity: float
    frame: Any  # pandas DataFrame (planner.frames.engine_frame)
    curves: dict[str, TruthCurve]
    seconds: dict[str, float]


def simulate_case(
    draw: Draw, budget: Budget = FULL, say: Callable[[str], None] | None = None
) -> Simulated:
    """Calibrate, simulate the telemetry (-> frame) and measure the truth (module doc)."""
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    cap = capacity(draw, budget, say)
    seconds["calibrate"] = time.perf_counter() - t0
    if say:
        say(f"{draw.name}: capacity {cap:.4g} {draw.rate_unit}")
    t0 = time.perf_counter()
    tel = telemetry(draw, cap, budget, say)
    frame = tel.frame()
    seconds["telemetry"] = time.perf_counter() - t0
    seconds["telemetry_render_parse_rollup"] = tel.collect_wall_s
    t0 = time.perf_counter()
    rates = [f * cap for f in budget.truth_fractions]
    top = [_support(frame, m)[1] for m in draw.modes]
    curves = measure_truth(
        draw.raw, draw.modes, rates, draw.seed,
        duration_s=budget.truth_s, warmup_s=budget.truth_warmup_s,
        batches=budget.truth_batches, min_arrivals=budget.truth_min_requests / draw.turns,
        refine_below=max(top), say=say,
    )  # fmt: skip
    seconds["truth"] = time.perf_counter() - t0
    return Simulated(draw, cap, frame, curves, seconds)


def _support(frame: Any, mode: str) -> tuple[float, float]:
    """The fit's common support of ``mode`` and none (2nd-98th percentiles intersected)."""
    import numpy as np

    u = frame["kv_util"].to_numpy(dtype=float)
    m = frame["offload_mode"].astype(str).to_numpy()
    qs = [np.nanquantile(u[m == x], [0.02, 0.98]) for x in ("none", mode)]
    return float(max(q[0] for q in qs)), float(min(q[1] for q in qs))


def judge_case(sim: Simulated) -> CaseResult:
    """Fit the gain of every mode on the simulated frame and judge it against the truth."""
    from planner.fit_gain import fit_gain

    draw = sim.draw
    t0 = time.perf_counter()
    fits = {m: fit_gain(sim.frame, offload=m, level=LEVEL) for m in draw.modes}
    seconds = {**sim.seconds, "fit": time.perf_counter() - t0}
    curves = sim.curves
    levels = {
        "none": _levels(max((c.none for c in curves.values()), key=len)),
        **{m: _levels(c.off) for m, c in curves.items()},
    }
    return CaseResult(
        name=draw.name,
        family=draw.family,
        split=draw.split,
        model=str(draw.raw["cluster"]["model"]),
        capacity=sim.capacity,
        rate_unit=draw.rate_unit,
        modes=tuple(judge(curves[m], fits[m]) for m in draw.modes),
        truth_levels=levels,
        seconds=seconds,
    )


def run_case(
    draw: Draw, budget: Budget = FULL, say: Callable[[str], None] | None = None
) -> CaseResult:
    """Simulate one case and judge the fit (module doc)."""
    return judge_case(simulate_case(draw, budget, say))


def _levels(points: Any) -> list[dict[str, float]]:
    return [
        {"rate": p.rate, "u": p.u, "tp": p.tp, "preemptions": p.preemptions}
        for p in sorted(points, key=lambda p: p.rate)
    ]
