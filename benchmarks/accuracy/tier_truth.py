"""The simulator's truth for a CPU-tier case (benchmarks/accuracy/tier_cases.py): the case's
scenario run without offload and with every engine running vLLM's native CPU offload of
each size — the runs ``kvscope simulate --compare none,native --sweep
cluster.cpu_cache_gb=…`` makes (planner/simulate/compare.py: same scenario, same seed, same
arrivals; a run here is float for float the one ``compare`` makes) — measured over
[WARMUP_S, end], the period the telemetry's windows cover.

Per run: the prefix-cache queries, hits and connector (external) hits in tokens, summed over
engines, taken as the counters' increase from WARMUP_S to the end; the hit ratio (hits +
connector hits) / queries; the prefix-hit tokens/s. Each run's compare-table figures
(``prefix_hit_rate``, ``external_hit_rate``, ``avoided_reprefill_tokens``: over the whole
run, cold start included) are recorded beside them.

Each figure is one seeded run: a simulated number, never an interval.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.accuracy.tier_cases import DIURNAL_AMPLITUDE, MULTIPLES, WARMUP_S, Case
from benchmarks.accuracy.verdict_truth import probe_clients, run_arm
from core.errors import ConfigError
from planner.fit.reuse import bytes_per_block
from planner.simulate.cluster import Simulation
from planner.simulate.scenario import parse_scenario

GB = 1e9  # cluster.cpu_cache_gb is in decimal GB (planner/simulate/scenario.py)
GIB = float(2**30)  # the plan's sizes are in GiB
PROBE_S = 1800.0  # the saturation probe: simulated seconds, the first PROBE_WARM_S not measured
PROBE_WARM_S = 600.0
COUNTERS = (
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "external_prefix_cache_hits_total",
)
COMPARE = (
    "prefix_hit_rate",
    "external_hit_rate",
    "avoided_reprefill_tokens",
    "total_tokens_per_s",
    "completed_requests",
    "preemptions",
)


@dataclass(frozen=True, slots=True)
class Run:
    """One run of the case's scenario: without offload (``multiple`` 0) or with native
    offload of ``gib`` GiB per engine."""

    multiple: float
    gib: float
    cpu_cache_gb: float  # what the scenario was given
    cpu_blocks: float  # the simulated CPU pool's capacity in blocks, per engine
    queries: float  # prefix-cache query tokens over the measured period, all engines
    hits: float  # HBM prefix-cache hit tokens
    external_hits: float  # connector hit tokens
    seconds: float  # the measured period
    hit_ratio: float  # (hits + external_hits) / queries
    hit_tokens_per_s: float  # (hits + external_hits) / seconds
    engine_hit_ratios: tuple[float, ...]
    engine_counts: tuple[tuple[float, float, float], ...]  # per engine: queries, hits, external
    compare: dict[str, Any]  # the compare table's figures of this run (whole run)
    wall_s: float


@dataclass(frozen=True, slots=True)
class Size:
    """The truth at one CPU size."""

    multiple: float
    gib: float
    hit_ratio: float
    none_hit_ratio: float  # the run without the tier
    avoided_tokens_per_s: float  # prefix-hit tokens/s with the tier − without
    connector_tokens_per_s: float  # the connector's hit tokens/s alone
    lookup_tokens_per_s: float  # prefix-cache query tokens/s with the tier


@dataclass(frozen=True, slots=True)
class CaseTruth:
    case: str
    r_sat: float  # requests/s, no offload, closed loop
    probe_clients: int
    qps: float  # the offered rate of the telemetry and the truth (arrivals/s)
    requests_per_s: float  # the offered request rate (sessions × turns for multi-turn)
    none: Run
    runs: tuple[Run, ...]
    sizes: tuple[Size, ...]
    hbm_blocks: int
    bytes_per_block: float
    wall_s: float


def scenario(case: Case, qps: float) -> dict[str, Any]:
    """The case's scenario at ``qps`` arrivals/s over its history (telemetry and truth)."""
    raw = copy.deepcopy(case.raw)
    wl = raw["workload"]
    wl["qps"] = qps
    if case.arrival == "diurnal":
        wl.update(
            arrival="diurnal",
            diurnal_period_s=case.hours * 3600.0,
            diurnal_amplitude=DIURNAL_AMPLITUDE,
        )
    else:
        wl["arrival"] = "poisson"
    raw.update(duration_s=case.hours * 3600.0, warmup_s=WARMUP_S)
    return raw


def with_native(raw: Mapping[str, Any], gib: float) -> dict[str, Any]:
    """``raw`` with every engine on native offload of ``gib`` GiB (compare.py's arm)."""
    out = copy.deepcopy(dict(raw))
    out["cluster"]["offload"] = "native"
    out["cluster"].pop("engines_offload", None)
    out["cluster"]["cpu_cache_gb"] = gib * GIB / GB
    return out


def saturation(case: Case) -> tuple[float, int]:
    """R_SAT (completed requests/s, no offload, closed loop) and the clients used."""
    raw = copy.deepcopy(case.raw)
    if raw["workload"].get("kind") == "multi_turn":
        raw["workload"]["think_time_s"] = 0.0  # a closed loop that keeps every engine busy
    clients = probe_clients(raw)
    arm = run_arm(raw, "none", clients=clients, duration_s=PROBE_S, warmup_s=PROBE_WARM_S)
    if not (math.isfinite(arm.requests_per_s) and arm.requests_per_s > 0):
        raise ConfigError(f"tier truth {case.name}: the saturation probe completed nothing")
    return arm.requests_per_s, clients


def offered_qps(case: Case, r_sat: float) -> tuple[float, float]:
    """(arrivals/s, requests/s) at ``case.level`` × R_SAT: a multi-turn arrival starts a
    session of ``turns`` requests."""
    req = case.level * r_sat
    turns = int(case.raw["workload"].get("turns", 1)) if case.kind == "session" else 1
    return req / turns, req


def sizes_gib(raw: Mapping[str, Any]) -> tuple[list[float], int, float]:
    """The CPU sizes (GiB per engine) at MULTIPLES × the engine's HBM KV, as the plan's
    section computes them (planner/fit/reuse.py ``bytes_per_block``), the HBM blocks and the
    bytes per block."""
    c = parse_scenario(raw, where="tier truth").cluster
    per_block = bytes_per_block(c.model, c.block_size)
    sim_per_block = c.block_size * c.kv_bytes_per_token_engine
    if not math.isclose(per_block, sim_per_block, rel_tol=1e-9):
        raise ConfigError(
            f"tier truth: the plan's bytes per block ({per_block}) differ from the "
            f"simulator's ({sim_per_block}): the sizes would not match"
        )
    hbm_gib = c.num_gpu_blocks * per_block / GIB
    return [m * hbm_gib for m in MULTIPLES], int(c.num_gpu_blocks), per_block


def measure_run(raw: Mapping[str, Any], multiple: float, gib: float) -> Run:
    """One run of ``raw`` (module docstring)."""
    t0 = time.perf_counter()
    sc = parse_scenario(raw, where=f"tier truth {raw.get('name', '')}")
    sim = Simulation(sc)
    sim.advance_to(sc.warmup_s, settle=True)
    before = [[e.tel.counters[k] for k in COUNTERS] for e in sim.engines]
    summary = sim.run().summary
    after = [[e.tel.counters[k] for k in COUNTERS] for e in sim.engines]
    delta = [[a - b for a, b in zip(x, y, strict=True)] for x, y in zip(after, before, strict=True)]
    q, h, x = (sum(d[i] for d in delta) for i in range(3))
    seconds = float(summary["simulated_s"]) - sc.warmup_s
    if q <= 0 or seconds <= 0:
        raise ConfigError(f"tier truth {sc.name}: no prefix-cache queries after the warm-up")
    cpu_blocks = 0.0
    if multiple > 0:
        conn = sim.engines[0].conn
        cpu_blocks = float(conn.pool.capacity)  # type: ignore[attr-defined]
    return Run(
        multiple=multiple,
        gib=gib,
        cpu_cache_gb=float(raw["cluster"].get("cpu_cache_gb", 0.0)),
        cpu_blocks=cpu_blocks,
        queries=q,
        hits=h,
        external_hits=x,
        seconds=seconds,
        hit_ratio=(h + x) / q,
        hit_tokens_per_s=(h + x) / seconds,
        engine_hit_ratios=tuple((d[1] + d[2]) / d[0] if d[0] else math.nan for d in delta),
        engine_counts=tuple((d[0], d[1], d[2]) for d in delta),
        compare={k: summary[k] for k in COMPARE},
        wall_s=time.perf_counter() - t0,
    )


def engines_truth(truth: CaseTruth, engines: Sequence[int]) -> tuple[Size, ...]:
    """The truth over some engines only (those a section covers): per size, the same figures
    from those engines' counters."""
    if not engines:
        raise ConfigError("tier truth: no engine to restrict the truth to")

    def part(run: Run) -> tuple[float, float]:
        q = sum(run.engine_counts[i][0] for i in engines)
        h = sum(run.engine_counts[i][1] + run.engine_counts[i][2] for i in engines)
        return q, h

    q0, h0 = part(truth.none)
    out = []
    for r in truth.runs:
        q, h = part(r)
        out.append(
            Size(multiple=r.multiple, gib=r.gib, hit_ratio=h / q, none_hit_ratio=h0 / q0,
                 avoided_tokens_per_s=(h - h0) / r.seconds, connector_tokens_per_s=math.nan,
                 lookup_tokens_per_s=q / r.seconds)
        )  # fmt: skip
    return tuple(out)


def measure(
    case: Case, say: Callable[[str], None] | None = None
) -> tuple[CaseTruth, dict[str, Any]]:
    """The case's truth and the telemetry's scenario (module docstring)."""
    t0 = time.perf_counter()
    r_sat, clients = saturation(case)
    qps, req_s = offered_qps(case, r_sat)
    raw = scenario(case, qps)
    gibs, hbm_blocks, per_block = sizes_gib(raw)
    if say:
        listed = ", ".join(f"{g:.1f}" for g in gibs)
        say(f"{case.name}: R_sat {r_sat:.3g} req/s ({clients} clients); offered {req_s:.3g} "
            f"req/s ({case.level:g} x R_sat); sizes {listed} GiB")  # fmt: skip
    none = measure_run(raw, 0.0, 0.0)
    runs = []
    for m, gib in zip(MULTIPLES, gibs, strict=True):
        run = measure_run(with_native(raw, gib), m, gib)
        want = m * hbm_blocks
        if abs(run.cpu_blocks - want) > 1e-6 * want:
            raise ConfigError(
                f"tier truth {case.name}: the simulated CPU pool holds {run.cpu_blocks} blocks, "
                f"not {m:g} x {hbm_blocks}"
            )
        runs.append(run)
        if say:
            say(f"{case.name}: {m:g}x HBM ({gib:.1f} GiB): hit ratio {run.hit_ratio:.4f} "
                f"(none {none.hit_ratio:.4f}) in {run.wall_s:.0f} s")  # fmt: skip
    sizes = tuple(
        Size(
            multiple=r.multiple,
            gib=r.gib,
            hit_ratio=r.hit_ratio,
            none_hit_ratio=none.hit_ratio,
            avoided_tokens_per_s=r.hit_tokens_per_s - none.hit_tokens_per_s,
            connector_tokens_per_s=r.external_hits / r.seconds,
            lookup_tokens_per_s=r.queries / r.seconds,
        )
        for r in runs
    )
    truth = CaseTruth(
        case=case.name, r_sat=r_sat, probe_clients=clients, qps=qps, requests_per_s=req_s,
        none=none, runs=tuple(runs), sizes=sizes, hbm_blocks=hbm_blocks,
        bytes_per_block=per_block, wall_s=time.perf_counter() - t0,
    )  # fmt: skip
    return truth, raw
