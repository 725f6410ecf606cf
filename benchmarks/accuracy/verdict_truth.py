"""The simulator's truth for a verdict case: every engine in one mode against every engine
in none (planner/simulate/compare.py's homogeneous runs), same cluster, router and seed, at
CONSTANT load (Poisson arrivals at a fixed rate).

* ``R_SAT`` — the none cluster's saturated request rate: its completed requests per second
  in a closed loop with clients enough to fill every engine (``clients`` per engine: three
  KV caches' worth of mean requests, at least 16, at most ``max_num_seqs``). Loads below
  are multiples of it.
* capacity truth (the one the study scores) — the ratio of saturated throughput, total
  (prompt + generated) tokens/s of completed requests, mode over none, both at the
  constant offered rate ``OVERLOAD`` × R_SAT (benchmarks/accuracy/verdict_cases.py). When
  the mode's arm serves (nearly) all it is offered there, its throughput is not saturated
  and the ratio is only a lower bound (``sat_bound`` "lower").
* capacity truth at the SLO (reported beside it: the estimand planner/fit/capacity.py
  states) — per arm, the highest constant rate whose TTFT p90 is within the case's SLO and
  whose queue does not grow (requests completed >= ``SERVED`` of those that arrived in
  the measured period), by bisection in log rate;
  the ratio of the two rates (throughput is proportional below saturation).
* the SLO — ``SLO_MULTIPLE`` × the none cluster's TTFT p90 at ``SLO_LOW_LOAD`` × R_SAT.
* today truth — TTFT mean and p90, mode over none, at the telemetry's mean offered rate.

Each figure is one seeded run (no interval: a simulated number is not an estimate).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from benchmarks.accuracy.verdict_cases import (
    DIURNAL_AMPLITUDE,
    HELPS_ABOVE,
    NULL_WITHIN,
    OVERLOAD,
    SLO_LOW_LOAD,
    SLO_MULTIPLE,
    Case,
)
from core.errors import ConfigError
from planner.simulate.cluster import Simulation
from planner.simulate.scenario import parse_scenario

SERVED = 0.97  # completed / offered requests at or above: the queue is not growing
RUN_S = 2400.0  # constant-load runs: simulated seconds, the first WARM_S not measured
WARM_S = 600.0
BISECT_S = 1800.0  # the SLO bisection's runs
BISECT_STEPS = 7  # log-rate bisection of [BISECT_LO, BISECT_HI] × R_SAT: ~1.8 % resolution
BISECT_LO, BISECT_HI = 0.2, 2.0
PROBE_KV_MULTIPLE = 3.0
PROBE_MIN_CLIENTS = 16


@dataclass(frozen=True, slots=True)
class ArmRun:
    """One homogeneous run: every engine in ``mode``, a fixed Poisson ``rate`` (requests/s)
    or ``clients`` in a closed loop."""

    mode: str
    rate: float  # offered requests/s (NaN: closed loop)
    clients: int
    tokens_per_s: float  # completed requests' prompt + output tokens per second
    requests_per_s: float
    ttft_mean_s: float
    ttft_p90_s: float
    kv_usage_mean: float
    preemptions: int
    wall_s: float
    served: float  # requests completed / arrived in the measured period (< 1: a queue grows)


@dataclass(frozen=True, slots=True)
class ModeTruth:
    """One mode against none (module docstring)."""

    mode: str
    sat_none: ArmRun
    sat_mode: ArmRun
    sat_ratio: float
    sat_bound: str  # "" | "lower": the mode's arm was not saturated at OVERLOAD × R_SAT
    label: str  # helps | null | small (between) | hurts (below 1 − NULL_WITHIN)
    slo_rate_none: float  # requests/s within the SLO
    slo_rate_mode: float
    slo_ratio: float
    slo_bound: str  # "" | "lower" (the mode met the SLO at BISECT_HI × R_SAT)
    mean_none: ArmRun
    mean_mode: ArmRun
    ttft_mean_ratio: float
    ttft_p90_ratio: float


@dataclass(frozen=True, slots=True)
class CaseTruth:
    case: str
    r_sat: float  # requests/s
    probe: ArmRun
    low: ArmRun  # none at SLO_LOW_LOAD × R_SAT
    slo_ttft_s: float
    mean_rate: float  # the telemetry's mean offered rate (requests/s)
    modes: dict[str, ModeTruth]
    wall_s: float
    runs: int
    notes: tuple[str, ...] = field(default=())


def label_of(ratio: float) -> str:
    """helps / null / small / hurts by the frozen thresholds (verdict_cases.py)."""
    if not math.isfinite(ratio):
        return "unknown"
    if ratio > HELPS_ABOVE:
        return "helps"
    if abs(ratio - 1.0) <= NULL_WITHIN + 1e-12:  # the edge itself is null
        return "null"
    return "small" if ratio > 1.0 else "hurts"


def homogeneous(raw: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """``raw`` with every engine in ``mode`` and no switchback (compare.py's runs)."""
    out = copy.deepcopy(dict(raw))
    cluster = out["cluster"]
    cluster["offload"] = mode
    cluster.pop("engines_offload", None)
    cluster.pop("switchback", None)
    return out


def run_arm(
    raw: Mapping[str, Any], mode: str, *, rate: float | None = None, clients: int | None = None,
    duration_s: float = RUN_S, warmup_s: float = WARM_S,
) -> ArmRun:  # fmt: skip
    """One homogeneous run of ``raw`` (a case's scenario without arrivals)."""
    if (rate is None) == (clients is None):
        raise ConfigError("verdict truth: give a rate or clients")
    run = homogeneous(raw, mode)
    wl = run["workload"]
    for k in ("qps", "concurrency", "arrival", "diurnal_period_s", "diurnal_amplitude"):
        wl.pop(k, None)
    if rate is not None:
        wl.update(qps=rate, arrival="poisson")
    else:
        wl["concurrency"] = clients
    run.update(duration_s=duration_s, warmup_s=warmup_s)
    t0 = time.perf_counter()
    sim = Simulation(parse_scenario(run, where=f"truth {run.get('name', '')} {mode}"))
    sim.advance_to(warmup_s, settle=True)
    before = sim.outstanding
    s = sim.run().summary
    done = int(s["completed_requests"])
    arrived = done + sim.outstanding - before  # arrivals in the measured period
    return ArmRun(
        mode=mode,
        rate=math.nan if rate is None else rate,
        clients=clients or 0,
        tokens_per_s=float(s["total_tokens_per_s"] or 0.0),
        requests_per_s=float(s["requests_per_s"] or 0.0),
        ttft_mean_s=_num(s["ttft_mean_s"]),
        ttft_p90_s=_num(s["ttft_p90_s"]),
        kv_usage_mean=_num(s["kv_usage_mean"]),
        preemptions=int(s["preemptions"]),
        wall_s=time.perf_counter() - t0,
        served=done / arrived if arrived > 0 else math.nan,
    )


def _num(x: object) -> float:
    return float(x) if isinstance(x, int | float) else math.nan


def probe_clients(raw: Mapping[str, Any]) -> int:
    """Closed-loop clients that fill every engine of the case (module docstring)."""
    probe = homogeneous(raw, "none")
    probe["workload"] = {**probe["workload"], "concurrency": 1}
    sc = parse_scenario(probe)
    spec = sc.workload
    per_request = spec.system_prompt_tokens + spec.question_tokens.mean + spec.output_tokens.mean
    kv = sc.cluster.num_gpu_blocks * sc.cluster.block_size
    per_engine = min(sc.cluster.max_num_seqs, math.ceil(PROBE_KV_MULTIPLE * kv / per_request))
    return sc.cluster.num_engines * max(PROBE_MIN_CLIENTS, per_engine)


def slo_ttft(p90: float) -> float:
    """The case's SLO: SLO_MULTIPLE × the low-load p90, to 2 significant digits."""
    x = SLO_MULTIPLE * p90
    if not (math.isfinite(x) and x > 0):
        raise ConfigError(f"verdict truth: no TTFT p90 at low load ({p90!r})")
    digits = 1 - math.floor(math.log10(x))
    return round(x, digits)


def mean_rate(case: Case, r_sat: float) -> float:
    """The telemetry's mean offered rate: the diurnal peak over (1 + amplitude)."""
    return case.peak * r_sat / (1.0 + DIURNAL_AMPLITUDE)


def slo_rate(
    raw: Mapping[str, Any], mode: str, r_sat: float, slo_s: float, count: Callable[[], None]
) -> tuple[float, str]:
    """(highest rate within the SLO, "" or "lower") by log-rate bisection (module doc)."""

    def meets(rate: float) -> bool:
        count()
        a = run_arm(raw, mode, rate=rate, duration_s=BISECT_S)
        return a.ttft_p90_s <= slo_s and a.served >= SERVED

    lo, hi = BISECT_LO * r_sat, BISECT_HI * r_sat
    if meets(hi):
        return hi, "lower"
    if not meets(lo):
        return lo, "upper"
    for _ in range(BISECT_STEPS):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return math.sqrt(lo * hi), ""


def measure(case: Case, say: Callable[[str], None] | None = None) -> CaseTruth:
    """The truth of every mode of ``case`` (module docstring)."""
    t0 = time.perf_counter()
    raw = case.raw
    n = [0]

    def count() -> None:
        n[0] += 1

    notes: list[str] = []
    clients = probe_clients(raw)
    probe = run_arm(raw, "none", clients=clients, duration_s=1800.0, warmup_s=600.0)
    count()
    r_sat = probe.requests_per_s
    low = run_arm(raw, "none", rate=SLO_LOW_LOAD * r_sat)
    count()
    slo_s = slo_ttft(low.ttft_p90_s)
    if say:
        say(f"{case.name}: R_sat {r_sat:.3g} req/s ({clients} clients), SLO TTFT p90 <= "
            f"{slo_s:g} s (low-load p90 {low.ttft_p90_s:.3g} s)")  # fmt: skip
    over = OVERLOAD * r_sat
    m_rate = mean_rate(case, r_sat)
    sat_none = run_arm(raw, "none", rate=over)
    mean_none = run_arm(raw, "none", rate=m_rate)
    n[0] += 2
    if sat_none.served >= SERVED:
        notes.append(f"none arm not saturated at {OVERLOAD} x R_sat (served {sat_none.served:.1%})")
    rate_none, bound_none = slo_rate(raw, "none", r_sat, slo_s, count)
    if bound_none:
        notes.append(f"none arm's SLO rate is a bound ({bound_none})")
    modes: dict[str, ModeTruth] = {}
    for mode in case.modes:
        sat_mode = run_arm(raw, mode, rate=over)
        mean_mode = run_arm(raw, mode, rate=m_rate)
        n[0] += 2
        rate_mode, bound_mode = slo_rate(raw, mode, r_sat, slo_s, count)
        ratio = sat_mode.tokens_per_s / sat_none.tokens_per_s
        slo_ratio = rate_mode / rate_none
        modes[mode] = ModeTruth(
            mode=mode, sat_none=sat_none, sat_mode=sat_mode, sat_ratio=ratio,
            sat_bound="lower" if sat_mode.served >= SERVED else "",
            label=label_of(ratio), slo_rate_none=rate_none, slo_rate_mode=rate_mode,
            slo_ratio=slo_ratio,
            slo_bound="lower" if bound_mode == "lower" and not bound_none else "",
            mean_none=mean_none, mean_mode=mean_mode,
            ttft_mean_ratio=mean_mode.ttft_mean_s / mean_none.ttft_mean_s,
            ttft_p90_ratio=mean_mode.ttft_p90_s / mean_none.ttft_p90_s,
        )  # fmt: skip
        if say:
            more = " (lower bound)" if bound_mode == "lower" else ""
            say(f"{case.name}: truth {mode}: saturated x{ratio:.3f} ({modes[mode].label}), "
                f"at the SLO x{slo_ratio:.3f}{more}")  # fmt: skip
    return CaseTruth(
        case=case.name, r_sat=r_sat, probe=probe, low=low, slo_ttft_s=slo_s, mean_rate=m_rate,
        modes=modes, wall_s=time.perf_counter() - t0, runs=n[0], notes=tuple(notes),
    )  # fmt: skip
