"""Brute force for planner.fit.reuse: random access traces, exact LRU caches, and vLLM's
``--kv-cache-metrics`` recording done the vLLM way (sample at allocation, the last 4 hit
times in a deque, gaps/idle/lifetime observed at eviction; the allocation is not an access).
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from core.catalog import KV_RESIDENCY_BUCKETS
from planner.fit.reuse import Histogram, ReuseInputs

Trace = tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]


def irm_trace(n_items: int, alpha: float, rate: float, n: int, seed: int) -> Trace:
    """Independent reference model: Poisson accesses at ``rate``/s, Zipf(α) popularity."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, n_items + 1) ** alpha
    items = rng.choice(n_items, size=n, p=p / p.sum()).astype(np.int64)
    times = np.cumsum(rng.exponential(1.0 / rate, size=n))
    return times, items


def renewal_trace(
    rate_new: float, q: float, gap: Callable[[np.random.Generator], float], n: int, seed: int
) -> Trace:
    """Chains of reuse: new blocks arrive at ``rate_new``/s; after each access a block is
    reused once more with probability ``q``, after a gap drawn from ``gap`` (so the reuse
    time distribution is q·P(gap <= t), the same for every block)."""
    rng = np.random.default_rng(seed)
    heap: list[tuple[float, int]] = []
    out_t: list[float] = []
    out_i: list[int] = []
    nxt, new_id = rng.exponential(1.0 / rate_new), 0
    while len(out_t) < n:
        if heap and heap[0][0] < nxt:
            t, i = heapq.heappop(heap)
        else:
            t, i, new_id = nxt, new_id, new_id + 1
            nxt = t + rng.exponential(1.0 / rate_new)
        out_t.append(t)
        out_i.append(i)
        if rng.random() < q:
            heapq.heappush(heap, (t + gap(rng), i))
    return np.asarray(out_t), np.asarray(out_i, dtype=np.int64)


def lognormal_mix(m1: float, m2: float, sigma: float) -> Callable[[np.random.Generator], float]:
    def draw(rng: np.random.Generator) -> float:
        m = m1 if rng.random() < 0.5 else m2
        return float(rng.lognormal(np.log(m), sigma))

    return draw


@dataclass
class Recorded:
    """What vLLM's collector would have observed after the warm-up, plus the exact counts."""

    hits: int = 0
    accesses: int = 0
    gaps: list[float] = field(default_factory=list)
    idle: list[float] = field(default_factory=list)
    life: list[float] = field(default_factory=list)
    window: float = 0.0


def lru_record(
    trace: Trace, capacity: int, *, sample_rate: float = 1.0, seed: int = 0, warm: float = 0.2
) -> Recorded:
    """An exact LRU of ``capacity`` blocks with vLLM's sampled residency recording."""
    times, items = trace
    rng = np.random.default_rng(seed)
    lru: OrderedDict[int, None] = OrderedDict()
    state: dict[int, list[object] | None] = {}
    t0 = float(times[int(len(times) * warm)])
    rec = Recorded(window=float(times[-1]) - t0)
    for t, x in zip(times.tolist(), items.tolist(), strict=True):
        on = t >= t0
        if x in lru:
            lru.move_to_end(x)
            if on:
                rec.hits += 1
                rec.accesses += 1
            st = state[x]
            if st is not None:  # BlockMetricsState.record_access
                st[1] = t
                hist = st[2]
                assert isinstance(hist, deque)
                hist.append(t)
            continue
        if on:
            rec.accesses += 1
        lru[x] = None
        sampled = sample_rate >= 1.0 or rng.random() < sample_rate
        state[x] = [t, t, deque(maxlen=4)] if sampled else None
        if len(lru) > capacity:
            y, _ = lru.popitem(last=False)
            st = state.pop(y)
            if st is not None and on:
                birth, last, hist = st
                assert isinstance(birth, float) and isinstance(last, float)
                assert isinstance(hist, deque)
                rec.life.append(t - birth)
                rec.idle.append(t - last)
                h = list(hist)
                rec.gaps.extend(b - a for a, b in itertools.pairwise(h))
    return rec


def histogram(values: Sequence[float]) -> Histogram:
    edges = np.concatenate([[0.0], KV_RESIDENCY_BUCKETS, [np.inf]])
    counts, _ = np.histogram(np.asarray(values, dtype=np.float64), edges)
    return Histogram(tuple(KV_RESIDENCY_BUCKETS), tuple(float(c) for c in counts))


def to_inputs(
    rec: Recorded, capacity: int, *, sample_rate: float = 1.0, name: str = ""
) -> ReuseInputs:
    """The fit's inputs as kvscope would read them (block_size 1: lookups = accesses)."""
    return ReuseInputs(
        reuse_gap=histogram(rec.gaps),
        idle_before_evict=histogram(rec.idle),
        lifetime=histogram(rec.life),
        window_s=rec.window,
        lookups_per_s=rec.accesses / rec.window,
        hits_per_s=rec.hits / rec.window,
        hbm_blocks=capacity,
        block_size=1,
        sample_rate=sample_rate,
        name=name,
    )


def _touch(lru: OrderedDict[int, None], x: int, capacity: int) -> None:
    if x in lru:
        lru.move_to_end(x)
        return
    lru[x] = None
    if len(lru) > capacity:
        lru.popitem(last=False)


def lru_hit_ratio(trace: Trace, capacity: int, warm: float = 0.2) -> float:
    times, items = trace
    lru: OrderedDict[int, None] = OrderedDict()
    t0 = float(times[int(len(times) * warm)])
    hits = n = 0
    for t, x in zip(times.tolist(), items.tolist(), strict=True):
        if t >= t0:
            n += 1
            hits += x in lru
        _touch(lru, x, capacity)
    return hits / n


def tiered_hit_ratio(trace: Trace, hbm: int, cpu: int, warm: float = 0.2) -> tuple[float, float]:
    """(HBM hit ratio, HBM-or-CPU hit ratio) with a write-through CPU LRU that sees every
    access, as kvscope's simulator and vLLM's OffloadingConnector do."""
    times, items = trace
    a: OrderedDict[int, None] = OrderedDict()
    b: OrderedDict[int, None] = OrderedDict()
    t0 = float(times[int(len(times) * warm)])
    h_a = h_ab = n = 0
    for t, x in zip(times.tolist(), items.tolist(), strict=True):
        if t >= t0:
            n += 1
            h_a += x in a
            h_ab += x in a or x in b
        _touch(a, x, hbm)
        _touch(b, x, cpu)
    return h_a / n, h_ab / n


def pool_hit_ratio(
    traces: Sequence[Trace], hbm: Sequence[int], pool: int, warm: float = 0.2
) -> tuple[float, float]:
    """(HBM hit ratio, HBM-or-pool hit ratio) over all engines' accesses: one HBM LRU per
    engine, one shared LRU over the merged streams that every access touches."""
    ev = sorted(
        (float(t), e, int(x))
        for e, (times, items) in enumerate(traces)
        for t, x in zip(times.tolist(), items.tolist(), strict=True)
    )
    t0 = max(float(times[int(len(times) * warm)]) for times, _ in traces)
    t1 = min(float(times[-1]) for times, _ in traces)
    own: list[OrderedDict[int, None]] = [OrderedDict() for _ in traces]
    shared: OrderedDict[int, None] = OrderedDict()
    h = h2 = n = 0
    for t, e, x in ev:
        if t0 <= t <= t1:
            n += 1
            h += x in own[e]
            h2 += x in own[e] or x in shared
        _touch(own[e], x, hbm[e])
        _touch(shared, x, pool)
    return h / n, h2 / n


def clip(trace: Trace, t0: float, t1: float) -> Trace:
    """The part of a trace in [t0, t1] (to give pooled engines the same window)."""
    times, items = trace
    keep = (times >= t0) & (times <= t1)
    return times[keep], items[keep]
