"""The summary of a simulation run: throughput, latency, preemption and cache figures, per
engine and in total, with every parameter used and where it came from."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from planner.simulate.engine import Engine
from planner.simulate.scenario import Scenario
from planner.simulate.switchback import Switch
from planner.simulate.telemetry import LMCacheSnapshot
from planner.simulate.workload import Workload


class FinishedRun(Protocol):
    """What a summary reads of a run (planner.simulate.cluster.Simulation provides it)."""

    scenario: Scenario
    workload: Workload
    heap: list[tuple[float, int, int, object, int]]
    end_time: float
    last_event: float
    completed: list[tuple[float, float, float, int, int, int, int]]
    engines: list[Engine]
    too_long: int
    events: int
    switches: deque[Switch]
    wall_s: float

    def lmcache_snapshots(self) -> list[LMCacheSnapshot]: ...


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default method) of an ascending list."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def _clean(value: float) -> float | None:
    return None if isinstance(value, float) and not math.isfinite(value) else round(value, 6)


@dataclass(frozen=True, slots=True)
class SimResult:
    """`summary` keys are the figures the CLI prints; `engines` one dict per engine."""

    summary: dict[str, Any]
    engines: tuple[dict[str, Any], ...]
    lmcache_pools: tuple[dict[str, Any], ...]
    params: tuple[dict[str, Any], ...]

    def __getitem__(self, key: str) -> Any:
        return self.summary[key]

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.summary,
            "engines": list(self.engines),
            "lmcache_pools": list(self.lmcache_pools),
            "parameters": list(self.params),
        }


def summarize(sim: FinishedRun) -> SimResult:
    sc = sim.scenario
    t0 = sc.warmup_s
    finished_early = not sim.heap and sim.last_event < sim.end_time
    t1 = sim.last_event if finished_early else sim.end_time
    window = max(t1 - t0, 1e-9)
    done = [c for c in sim.completed if t0 <= c[2] <= t1]
    ttft = sorted(c[1] - c[0] for c in done)
    e2e = sorted(c[2] - c[0] for c in done)
    prompt = sum(c[3] for c in done)
    output = sum(c[4] for c in done)
    tpot = [(c[2] - c[1]) / (c[4] - 1) for c in done if c[4] > 1]
    engines = sim.engines
    counters = [e.tel.counters for e in engines]

    def total(name: str) -> float:
        return sum(c[name] for c in counters)

    n = len(engines)
    summary: dict[str, Any] = {
        "scenario": sc.name,
        "offload": _offload_label(sc.cluster.engines_offload),
        "num_engines": n,
        "simulated_s": round(t1, 6),
        "measured_window_s": round(window, 6),
        "finished_early": finished_early,
        "completed_requests": len(done),
        "rejected_requests": sum(e.rejected for e in engines) + sim.too_long,
        "total_tokens_per_s": _clean((prompt + output) / window),
        "input_tokens_per_s": _clean(prompt / window),
        "output_tokens_per_s": _clean(output / window),
        "requests_per_s": _clean(len(done) / window),
        "ttft_mean_s": _clean(_mean(ttft)),
        "ttft_p50_s": _clean(_quantile(ttft, 0.5)),
        "ttft_p90_s": _clean(_quantile(ttft, 0.9)),
        "ttft_p99_s": _clean(_quantile(ttft, 0.99)),
        "e2e_mean_s": _clean(_mean(e2e)),
        "e2e_p50_s": _clean(_quantile(e2e, 0.5)),
        "e2e_p90_s": _clean(_quantile(e2e, 0.9)),
        "tpot_mean_s": _clean(_mean(tpot)),
        "preemptions": sum(e.preemptions for e in engines),
        "prefill_tokens_computed": sum(e.computed_tokens for e in engines),
        "reprefill_tokens": sum(e.reprefill_tokens for e in engines),
        "avoided_reprefill_tokens": sum(e.avoided_tokens for e in engines),
        "prefix_hit_rate": _clean(
            _ratio(total("prefix_cache_hits_total"), total("prefix_cache_queries_total"))
        ),
        "external_hit_rate": _clean(
            _ratio(
                total("external_prefix_cache_hits_total"),
                total("external_prefix_cache_queries_total"),
            )
        ),
        "kv_usage_mean": _clean(sum(e.kv_integral for e in engines) / (n * max(t1, 1e-9))),
        # why an async connector helps or hurts: loads, their wait for admission (step
        # boundary, budget, blocks), resumed requests preempted again, starvation, PCIe load
        "async_loads": sum(e.loads for e in engines),
        "load_wait_mean_s": _clean(
            _ratio(sum(e.load_wait_s for e in engines), sum(e.loads for e in engines))
        ),
        "preempted_after_load": sum(e.preempted_after_load for e in engines),
        "max_preemptions_per_request": max((e.max_req_preemptions for e in engines), default=0),
        "pcie_load_busy_max": _clean(
            max((e.tel.offload_seconds["load"] for e in engines), default=0.0) / max(t1, 1e-9)
        ),
        "offload_load_bytes": sum(e.tel.offload_bytes["load"] for e in engines),
        "offload_store_bytes": sum(e.tel.offload_bytes["store"] for e in engines),
        "events": sim.events,
        "wall_s": round(sim.wall_s, 3),
    }
    if sc.workload.stages:
        summary["stages"] = _stage_rows(sim)
    if sc.cluster.switchback is not None:
        summary["switchback"] = _switchback(sim, t1)
    per_engine = tuple(_engine_row(e, done, window, t1) for e in engines)
    pools = tuple(
        {
            "pool": s.pool,
            "scope": s.scope,
            "engines": list(s.engines),
            **{k: _clean(v) for k, v in s.counters.items()},
            **{k: _clean(v) for k, v in s.gauges.items()},
        }
        for s in sim.lmcache_snapshots()
    )
    spec = sc.cluster
    derived: list[dict[str, Any]] = [
        {"key": "derived.num_engines", "value": n, "source": "nodes x gpus_per_node / TP"},
        {
            "key": "derived.num_gpu_blocks",
            "value": spec.num_gpu_blocks,
            "source": "scenario"
            if spec.num_gpu_blocks and _given(sc.raw, "num_gpu_blocks")
            else "costmodel.hbm_kv_capacity_tokens / block_size",
        },
        {
            "key": "derived.kv_bytes_per_token_gpu",
            "value": spec.kv_bytes_per_token_gpu,
            "source": "costmodel.kv_bytes_per_token (2 x layers x KV heads x head_dim x bytes)",
        },
        {"key": "derived.model", "value": spec.model.name, "source": spec.model.source},
        {"key": "derived.gpu", "value": spec.gpu.name, "source": spec.gpu.source},
    ]
    params: tuple[dict[str, Any], ...] = tuple(
        [{"key": p.key, "value": p.value, "source": p.source} for p in sc.params] + derived
    )
    return SimResult(summary, per_engine, pools, params)


def _stage_rows(sim: FinishedRun) -> list[dict[str, Any]]:
    """One row per stage of a rate ramp, as inference-perf's per-stage report: the stage's own
    requests (by request id), throughput over their span (first arrival to last finish)."""
    wl, stages = sim.workload, sim.scenario.workload.stages
    bounds = [*wl.stage_first_rid, wl.issued]
    rows: list[dict[str, Any]] = []
    for k, start in enumerate(wl.stage_starts):
        lo, hi = bounds[k], bounds[k + 1]
        mine = [c for c in sim.completed if lo <= c[6] < hi]
        span = max(c[2] for c in mine) - min(c[0] for c in mine) if mine else math.nan
        ttft = sorted(c[1] - c[0] for c in mine)
        e2e = sorted(c[2] - c[0] for c in mine)
        prompt, output = sum(c[3] for c in mine), sum(c[4] for c in mine)
        rows.append(
            {
                "stage": k,
                "qps": stages[k].qps,
                "duration_s": stages[k].duration_s,
                "started_s": _clean(start),
                "requests": hi - lo,
                "completed_requests": len(mine),
                "span_s": _clean(span),
                "total_tokens_per_s": _clean(_ratio(prompt + output, span) if mine else math.nan),
                "input_tokens_per_s": _clean(_ratio(prompt, span) if mine else math.nan),
                "ttft_mean_s": _clean(_mean(ttft)),
                "ttft_p90_s": _clean(_quantile(ttft, 0.9)),
                "e2e_mean_s": _clean(_mean(e2e)),
                "e2e_p90_s": _clean(_quantile(e2e, 0.9)),
                "tpot_mean_s": _clean(
                    _mean([(c[2] - c[1]) / (c[4] - 1) for c in mine if c[4] > 1])
                ),
            }
        )
    return rows


def _switchback(sim: FinishedRun, t1: float) -> dict[str, Any]:
    """The canaries' schedule as run: every regime (t = 0 included) with the requests its
    restart aborted and sent again, and the seconds each state held up to t1."""
    sb = sim.scenario.cluster.switchback
    assert sb is not None
    changes = [s for s in sim.switches if s.engine == sb.engines[0] and s.t <= t1]
    seconds = {"on": 0.0, "off": 0.0}
    for k, s in enumerate(changes):
        end = changes[k + 1].t if k + 1 < len(changes) else t1
        seconds["off" if s.offload == "none" else "on"] += end - s.t
    return {
        "engines": list(sb.engines),
        "mode": sb.mode,
        "block_s": sb.period_s,
        "seed": sb.seed,
        "on_s": _clean(seconds["on"]),
        "off_s": _clean(seconds["off"]),
        "changes": [
            {"t": s.t, "engine": s.engine, "offload": s.offload, "aborted_requests": s.aborted}
            for s in sim.switches
        ],
    }


def _offload_label(modes: tuple[str, ...]) -> str:
    if len(set(modes)) == 1:
        return modes[0]
    return "mixed: " + ", ".join(f"{m}x{modes.count(m)}" for m in sorted(set(modes)))


def _given(raw: Any, key: str) -> bool:
    cluster = raw.get("cluster") if isinstance(raw, dict) else None
    return isinstance(cluster, dict) and cluster.get(key) is not None


def _engine_row(
    eng: Any, done: list[tuple[float, float, float, int, int, int, int]], window: float, t1: float
) -> dict[str, Any]:
    mine = [c for c in done if c[5] == eng.idx]
    c = eng.tel.counters
    return {
        "engine": eng.idx,
        "node": eng.node,
        "offload": eng.conn.mode,
        "completed_requests": len(mine),
        "total_tokens_per_s": _clean(sum(x[3] + x[4] for x in mine) / window),
        "ttft_mean_s": _clean(_mean([x[1] - x[0] for x in mine])),
        "preemptions": eng.preemptions,
        "reprefill_tokens": eng.reprefill_tokens,
        "avoided_reprefill_tokens": eng.avoided_tokens,
        "prefix_hit_rate": _clean(
            _ratio(c["prefix_cache_hits_total"], c["prefix_cache_queries_total"])
        ),
        "external_hit_rate": _clean(
            _ratio(c["external_prefix_cache_hits_total"], c["external_prefix_cache_queries_total"])
        ),
        "kv_usage_mean": _clean(eng.kv_integral / max(t1, 1e-9)),
        "busy_fraction": _clean(eng.busy_time / max(t1, 1e-9)),
        "connector_stall_fraction": _clean(eng.stall_s / max(t1, 1e-9)),
        "async_loads": eng.loads,
        "load_wait_mean_s": _clean(_ratio(eng.load_wait_s, eng.loads)),
        "preempted_after_load": eng.preempted_after_load,
        "max_preemptions_per_request": eng.max_req_preemptions,
        "pcie_load_busy": _clean(eng.tel.offload_seconds["load"] / max(t1, 1e-9)),
        "steps": eng.steps,
        "offload_cache_usage": _clean(eng.conn.usage_ratio()),
    }
