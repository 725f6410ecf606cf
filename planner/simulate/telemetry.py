"""Cumulative telemetry of simulated engines and LMCache pools, keyed by canonical signal names.

Counters and histograms only ever grow (like a real exporter), so a server can render them
between `Simulation.advance_to()` calls; `snapshot()` returns frozen records. Histogram
bucket bounds come from core.catalog (the vLLM / LMCache exporters' own bounds) unless
injected. No vendor metric name is spelled here: core/catalog.py maps these signals to
what vLLM and LMCache expose.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from core import catalog

# Histogram signals an engine observes (canonical names from core/catalog.py).
ENGINE_HISTOGRAMS = (
    "ttft_seconds",
    "e2e_latency_seconds",
    "queue_time_seconds",
    "inference_time_seconds",
    "prefill_time_seconds",
    "decode_time_seconds",
    "inter_token_latency_seconds",
    "request_tpot_seconds",
    "request_prompt_tokens",
    "request_generation_tokens",
    "request_prefill_kv_computed_tokens",
    "request_num_preemptions",
    "iteration_tokens",
)
# vLLM --kv-cache-metrics: registered only when it is on (planner/simulate/residency.py)
KV_RESIDENCY_HISTOGRAMS = (
    "kv_block_lifetime_seconds",
    "kv_block_idle_before_evict_seconds",
    "kv_block_reuse_gap_seconds",
)
ENGINE_COUNTERS = (
    "preemptions_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "external_prefix_cache_queries_total",
    "external_prefix_cache_hits_total",
    "prompt_tokens_cached_total",
)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")  # vLLM pre-creates all five
LMCACHE_COUNTERS = (
    "lmcache_requested_tokens_total",
    "lmcache_hit_tokens_total",
    "lmcache_hit_l1_tokens_total",
    "lmcache_hit_l2_tokens_total",
    "lmcache_lookups_total",
    "lmcache_l1_read_chunks_total",
    "lmcache_l1_write_chunks_total",
    "lmcache_l1_evicted_chunks_total",
    "lmcache_l2_store_completed_chunks_total",
    "lmcache_l2_load_completed_chunks_total",
    "lmcache_l2_evicted_chunks_total",
)

# Per-task L2 -> L1 load throughput, GB/s (the MP server's histogram; L2 stores are modelled
# as free write-through, so they have no throughput to report), and the gap between touches
# of a sampled L1 chunk (L1LifecycleSubscriber, planner/simulate/residency.py).
LMCACHE_HISTOGRAMS = ("lmcache_l2_load_throughput_gbps", "lmcache_l1_chunk_reuse_gap_seconds")


# Request-token histograms: vLLM renders them with build_1_2_5_buckets(max_model_len).
TOKEN_HISTOGRAMS = (
    "request_prompt_tokens",
    "request_generation_tokens",
    "request_prefill_kv_computed_tokens",
)


def default_buckets(max_model_len: int | None = None) -> dict[str, tuple[float, ...]]:
    """Bucket bounds per histogram signal, as the real exporters use them: the catalogue's,
    with the request-token histograms rendered for `max_model_len` when given (the
    catalogue's are vLLM's for max_model_len 4096, top finite bound 2000)."""
    out = {name: tuple(catalog.SIGNALS[name].buckets) for name in ENGINE_HISTOGRAMS}
    if max_model_len is not None:
        out.update(dict.fromkeys(TOKEN_HISTOGRAMS, catalog.token_buckets(max_model_len)))
    return out


# Observations buffered per histogram (and per-request records per engine) before they are
# bucketed in bulk: a batch run's default; a served run uses SERVED_BUFFER (cluster.py), so
# what it holds between two scrapes, or with nobody scraping, stays small.
BUFFER = 65536
SERVED_BUFFER = 4096


class Histogram:
    """Prometheus-style histogram: non-cumulative bucket counts (+Inf last), sum, count.

    Single observations are buffered and bucketed in bulk when read (the simulator makes
    millions; bisecting each one would dominate its run time), or when `limit` are waiting.
    """

    __slots__ = ("bounds", "count", "counts", "limit", "pending", "total")

    def __init__(self, bounds: tuple[float, ...], limit: int = BUFFER) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.count = 0
        self.limit = limit
        self.pending: list[float] = []

    def observe(self, value: float, weight: int = 1) -> None:
        if weight == 1:
            self.pending.append(value)
            if len(self.pending) >= self.limit:
                self.flush()
            return
        self.counts[bisect.bisect_left(self.bounds, value)] += weight
        self.total += value * weight
        self.count += weight

    def flush(self) -> None:
        if not self.pending:
            return

        values = np.asarray(self.pending, dtype=float)
        idx = np.searchsorted(np.asarray(self.bounds, dtype=float), values, side="left")
        for i, c in enumerate(np.bincount(idx, minlength=len(self.counts)).tolist()):
            self.counts[i] += c
        self.total += float(values.sum())
        self.count += len(self.pending)
        self.pending = []

    def observe_linear(self, first: float, step: float, k: int, weight: int = 1) -> None:
        """Observe first + step·j for j = 0..k-1, each `weight` times, in O(buckets touched)."""
        if k <= 0 or weight <= 0:
            return
        if step == 0.0 or k == 1:
            self.observe(first, weight * k)
            return
        if step < 0.0:  # the same values, walked from the smallest
            first, step = first + step * (k - 1), -step
        bounds, counts = self.bounds, self.counts
        lo = bisect.bisect_left(bounds, first)
        hi = bisect.bisect_left(bounds, first + step * (k - 1))
        below = 0
        for i in range(lo, hi):
            # values <= bounds[i]: j <= (bound - first) / step
            n = min(k, max(0, int((bounds[i] - first) // step) + 1))
            counts[i] += (n - below) * weight
            below = n
        counts[hi] += (k - below) * weight
        self.total += weight * (k * first + step * k * (k - 1) / 2.0)
        self.count += k * weight

    def cumulative(self) -> tuple[int, ...]:
        self.flush()
        out, run = [], 0
        for c in self.counts:
            run += c
            out.append(run)
        return tuple(out)


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]  # per bound, then +Inf (== count)
    sum: float
    count: int


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """One engine at simulated time `t`: counters, gauges and histograms by signal name."""

    engine: int
    node: int
    offload: str
    t: float
    counters: Mapping[str, float]
    finished: Mapping[str, int]  # request_success_total by finished_reason
    offload_bytes: Mapping[str, float]  # direction load|store
    offload_seconds: Mapping[str, float]
    gauges: Mapping[str, float]
    histograms: Mapping[str, HistogramSnapshot]
    facts: Mapping[str, int] = field(default_factory=dict)  # num_gpu_blocks, block_size, …


@dataclass(frozen=True, slots=True)
class LMCacheSnapshot:
    pool: int
    scope: str
    engines: tuple[int, ...]
    t: float
    counters: Mapping[str, float]
    gauges: Mapping[str, float]
    histograms: Mapping[str, HistogramSnapshot] = field(default_factory=dict)


class EngineTelemetry:
    """Mutable cumulative counters of one engine (the engine writes, snapshots read).

    `buffer`: per-request records held before they are moved into the histograms; with
    `bounded`, a histogram is also bucketed as soon as `buffer` observations wait in it
    (otherwise only when read, which a batch run never does before its end).
    `kv_residency`: the engine runs with vLLM's --kv-cache-metrics, so it has the three KV
    residency histograms too (catalogue buckets unless `buckets` names them)."""

    __slots__ = (
        "bounded",
        "buffer",
        "counters",
        "finished",
        "firsts",
        "hist",
        "offload_bytes",
        "offload_seconds",
        "requests",
    )

    def __init__(
        self,
        buckets: Mapping[str, tuple[float, ...]] | None = None,
        *,
        buffer: int = BUFFER,
        bounded: bool = False,
        kv_residency: bool = False,
    ) -> None:
        bounds = dict(buckets) if buckets is not None else default_buckets()
        self.buffer, self.bounded = buffer, bounded
        self.counters: dict[str, float] = dict.fromkeys(ENGINE_COUNTERS, 0.0)
        self.finished: dict[str, int] = dict.fromkeys(FINISHED_REASONS, 0)
        self.offload_bytes = {"load": 0.0, "store": 0.0}
        self.offload_seconds = {"load": 0.0, "store": 0.0}
        self.hist = {
            name: Histogram(tuple(bounds.get(name, ())), buffer) for name in ENGINE_HISTOGRAMS
        }
        if kv_residency:
            for name in KV_RESIDENCY_HISTOGRAMS:
                bound = bounds.get(name) or catalog.SIGNALS[name].buckets
                self.hist[name] = Histogram(tuple(bound), buffer)
        # per-request observations, bucketed in bulk when read (see flush)
        self.requests: list[tuple[float, float, float, float, int, int, int]] = []
        self.firsts: list[tuple[float, int]] = []

    def first_token(self, ttft: float, computed_prompt_tokens: int) -> None:
        self.firsts.append((ttft, computed_prompt_tokens))
        if len(self.firsts) >= self.buffer:
            self.flush()

    def request_done(self, record: tuple[float, float, float, float, int, int, int]) -> None:
        """A finished request: (arrival, first scheduled, first token, finish) in simulated
        seconds, then prompt tokens, generated tokens and preemptions."""
        self.requests.append(record)
        if len(self.requests) >= self.buffer:
            self.flush()

    def flush(self) -> None:
        """Bucket the buffered per-request observations (vLLM observes them at first token
        and at finish; the values and buckets are the same, only the work is batched)."""
        h = self.hist
        if self.firsts:
            for ttft, computed in self.firsts:
                h["ttft_seconds"].pending.append(ttft)
                h["request_prefill_kv_computed_tokens"].pending.append(computed)
            self.firsts = []
        if self.requests:
            for arr, sched, first, done, prompt, gen, pre in self.requests:
                h["e2e_latency_seconds"].pending.append(done - arr)
                h["queue_time_seconds"].pending.append(sched - arr)
                h["inference_time_seconds"].pending.append(done - sched)
                h["prefill_time_seconds"].pending.append(first - sched)
                h["decode_time_seconds"].pending.append(done - first)
                if gen > 1:
                    h["request_tpot_seconds"].pending.append((done - first) / (gen - 1))
                h["request_prompt_tokens"].pending.append(prompt)
                h["request_generation_tokens"].pending.append(gen)
                h["request_num_preemptions"].pending.append(pre)
            self.requests = []
        if self.bounded:
            for hist in h.values():
                if len(hist.pending) >= self.buffer:
                    hist.flush()

    def add(self, name: str, value: float) -> None:
        self.counters[name] += value

    def snapshot(
        self,
        *,
        engine: int,
        node: int,
        offload: str,
        t: float,
        gauges: Mapping[str, float],
        facts: Mapping[str, int],
    ) -> EngineSnapshot:
        self.flush()
        return EngineSnapshot(
            engine=engine,
            node=node,
            offload=offload,
            t=t,
            counters=dict(self.counters),
            finished=dict(self.finished),
            offload_bytes=dict(self.offload_bytes),
            offload_seconds=dict(self.offload_seconds),
            gauges=dict(gauges),
            histograms={k: _snap(h) for k, h in self.hist.items()},
            facts=dict(facts),
        )


def _snap(h: Histogram) -> HistogramSnapshot:
    cumulative = h.cumulative()  # flushes first
    return HistogramSnapshot(h.bounds, cumulative, h.total, h.count)


class PoolTelemetry:
    """Counters and histograms of one LMCache server (pool)."""

    __slots__ = ("counters", "hist")

    def __init__(self) -> None:
        self.counters: dict[str, float] = dict.fromkeys(LMCACHE_COUNTERS, 0.0)
        self.hist = {
            name: Histogram(tuple(catalog.SIGNALS[name].buckets)) for name in LMCACHE_HISTOGRAMS
        }

    def add(self, name: str, value: float) -> None:
        self.counters[name] += value

    def observe(self, name: str, value: float) -> None:
        self.hist[name].observe(value)

    def histograms(self) -> dict[str, HistogramSnapshot]:
        return {k: _snap(h) for k, h in self.hist.items()}
