"""KV residency metrics of simulated engines and LMCache pools: vLLM's ``--kv-cache-metrics``
block histograms [source: vllm-kv-cache-metrics] and LMCache's L1 chunk reuse gaps
[source: lmcache-mp-l1-lifecycle], observed when and as the real exporters observe them.

A sampled block is tracked as (segment, block index): born at the step that allocates it,
accessed at each prefix hit covering it, observed (lifetime, idle, ≤ 3 reuse gaps) at the
step whose allocation evicts it; sampling draws from a stream of its own.

Design, and the vLLM / LMCache code read (with commits): planner/simulate/METHODS.md#residency
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections.abc import Callable
from typing import Protocol

from planner.simulate.content import NodeTable
from planner.simulate.request import Req
from planner.simulate.telemetry import Histogram

HISTORY = 4  # BlockMetricsState.access_history maxlen [source: vllm-kv-cache-metrics]
DEFAULT_SAMPLE = 0.01  # --kv-cache-metrics-sample default [source: vllm-kv-cache-metrics]
# LMCache MP server: --metrics-sample-rate default and the sampling prime of
# L1LifecycleSubscriber [source: lmcache-mp-l1-lifecycle]
LMCACHE_METRICS_SAMPLE_RATE = 0.01
LMCACHE_SAMPLE_PRIME = 1_000_003
# decode steps kept in an engine's step log before the ones no decoding request needs go
STEP_LOG_TRIM = 4096

LIFETIME = "kv_block_lifetime_seconds"
IDLE = "kv_block_idle_before_evict_seconds"
REUSE_GAP = "kv_block_reuse_gap_seconds"
RESIDENCY_HISTOGRAMS = (LIFETIME, IDLE, REUSE_GAP)
L1_REUSE_GAP = "lmcache_l1_chunk_reuse_gap_seconds"


class Sampler:
    """Bernoulli(rate) per allocation, drawn as geometric skips (one draw per sampled block,
    not one per block): ``take(m)`` says which of the next m allocations are sampled."""

    __slots__ = ("log_q", "rate", "rng", "skip")

    def __init__(self, rate: float, rng: random.Random) -> None:
        if not 0.0 <= rate <= 1.0 or math.isnan(rate):
            raise ValueError(f"sample rate must be in [0, 1], got {rate!r}")
        self.rate = rate
        self.rng = rng
        self.log_q = math.log1p(-rate) if 0.0 < rate < 1.0 else 0.0
        self.skip = self._draw()

    def _draw(self) -> int:
        """Allocations not sampled before the next sampled one (geometric, P(k) = q^k p)."""
        if self.rate >= 1.0:
            return 0
        if self.rate <= 0.0:
            return 1 << 62
        return int(math.log1p(-self.rng.random()) / self.log_q)

    def take(self, m: int) -> list[int]:
        """Offsets in [0, m) of the sampled allocations among the next m."""
        if self.skip >= m:  # the common case at small rates: none of them
            self.skip -= m if m > 0 else 0
            return []
        out: list[int] = []
        pos, skip = 0, self.skip
        while pos + skip < m:
            pos += skip
            out.append(pos)
            pos += 1
            skip = self._draw()
        self.skip = skip - (m - pos)
        return out


class BlockState:
    """vLLM's BlockMetricsState of one sampled block (times in simulated seconds); `idx` is
    the block's absolute index in its segment's sequence once it is full."""

    __slots__ = ("birth", "hist", "idx", "last")

    def __init__(self, t: float, idx: int = -1) -> None:
        self.idx = idx
        self.birth = t
        self.last = t
        self.hist: list[float] = []

    def access(self, t: float) -> None:
        self.last = t
        hist = self.hist
        hist.append(t)
        if len(hist) > HISTORY:
            del hist[0]


class _Decode(Protocol):
    d: int

    def blocks(self, k: int, offset: int = 0) -> tuple[int, int]: ...


class KVResidency:
    """The KVCacheMetricsCollector of one simulated engine (METHODS.md#residency).

    The engine sets ``now`` to the time of the step it plans or commits; ``jump`` is set
    while a decode jump's aggregated allocations are applied, so an allocation's ordinal maps
    to the step that made it.
    """

    __slots__ = (
        "blocks",
        "bs",
        "dec",
        "fresh",
        "h_gap",
        "h_idle",
        "h_life",
        "jump",
        "log_d",
        "log_s",
        "memo",
        "now",
        "oldest",
        "part",
        "sampler",
        "start",
        "trim_at",
    )

    def __init__(
        self,
        sampler: Sampler,
        hists: dict[str, Histogram],
        block_size: int,
        start: NodeTable,
    ) -> None:
        self.sampler = sampler
        self.h_life, self.h_idle, self.h_gap = (hists[n] for n in RESIDENCY_HISTOGRAMS)
        self.bs = block_size
        self.start = start
        self.now = 0.0
        self.dec: _Decode | None = None
        self.oldest: Callable[[], int] | None = None  # lowest decode start of running requests
        self.jump: tuple[float, float, float, int, int] | None = None
        self.memo: dict[int, int] = {}  # steps -> blocks they allocate, in the current jump
        # node -> its tracked blocks by absolute index, ascending (a segment grows and is
        # evicted at its tail, so births append and evictions pop)
        self.blocks: dict[int, list[BlockState]] = {}
        self.part: dict[int, tuple[int, BlockState | None]] = {}  # rid -> its unfilled block
        self.fresh: list[BlockState | None] = []  # freed unfilled blocks, last freed on top
        self.log_d: list[int] = []  # decode step log: first step index of each segment
        self.log_s: list[tuple[float, float, float]] = []  # its (start, a, b): step j at a+b·j
        self.trim_at = STEP_LOG_TRIM

    def reset(self) -> None:
        """A new BlockPool (the engine restarted): every tracked block is gone unobserved."""
        self.blocks = {}
        self.part = {}
        self.fresh = []
        self.log_d = []
        self.log_s = []
        self.jump = None

    # --- time ---------------------------------------------------------------------------------
    def log_steps(self, d0: int, t0: float, a: float, b: float) -> None:
        """Decode steps d0, d0+1, … committed, step d0+j starting at t0 + j·a + b·j(j-1)/2."""
        self.log_d.append(d0)
        self.log_s.append((t0, a, b))
        if len(self.log_d) > self.trim_at and self.oldest is not None:
            drop = bisect_right(self.log_d, self.oldest()) - 1
            if drop > 0:
                del self.log_d[:drop]
                del self.log_s[:drop]
            self.trim_at = max(STEP_LOG_TRIM, 2 * len(self.log_d))  # amortised O(1) a step

    def step_time(self, d: int) -> float:
        """Start of decode step d (the one being planned now if not committed yet)."""
        dec = self.dec
        if dec is not None and d >= dec.d:
            return self.now
        i = bisect_right(self.log_d, d) - 1
        if i < 0:
            return self.now
        t0, a, b = self.log_s[i]
        j = d - self.log_d[i]
        return t0 + j * a + b * j * (j - 1) / 2.0

    def at(self, ordinal: int, evicting: bool) -> float:
        """Time of the allocation that takes the ordinal-th block (0-based): of the free
        blocks (fresh first) when not `evicting`, of the cached ones after every free block
        when `evicting`. Without a jump in progress, now."""
        jump = self.jump
        if jump is None or self.dec is None:
            return self.now
        t0, a, b, k, free = jump
        need = ordinal + 1 + (free if evicting else 0)
        blocks, memo = self.dec.blocks, self.memo
        lo, hi = 1, max(1, k - 1)
        while lo < hi:  # the first of steps 1 … k-1 by which `need` blocks were allocated
            mid = (lo + hi) // 2
            got = memo.get(mid)
            if got is None:
                got = memo[mid] = blocks(mid, 1)[0]
            if got >= need:
                hi = mid
            else:
                lo = mid + 1
        return t0 + lo * a + b * lo * (lo - 1) / 2.0

    # --- events -------------------------------------------------------------------------------
    def _observe(self, st: BlockState, t: float) -> None:
        # Histogram.observe(x) for each, written out: one of these per evicted sampled block
        for h, x in ((self.h_life, t - st.birth), (self.h_idle, t - st.last)):
            pending = h.pending
            pending.append(x)
            if len(pending) >= h.limit:
                h.flush()
        hist = st.hist
        if len(hist) > 1:
            h = self.h_gap
            pending = h.pending
            pending.extend([hist[i] - hist[i - 1] for i in range(1, len(hist))])
            if len(pending) >= h.limit:
                h.flush()

    def allocated(self, m: int) -> None:
        """m blocks allocated: the freed unfilled blocks are reused first (evicted now)."""
        fresh = self.fresh
        if not fresh or m <= 0:
            return
        for j in range(min(m, len(fresh))):
            st = fresh.pop()
            if st is not None:
                self._observe(st, self.at(j, False))

    def born(self, ranges: list[tuple[int, int, int]], times: Callable[[int], float]) -> None:
        """Sample the new full blocks (node, first, end) (absolute block indices); `times`
        gives a block's birth from its index."""
        picks = self.sampler.take(sum(hi - lo for _, lo, hi in ranges))
        if not picks:
            return
        it = iter(picks)
        nxt = next(it, -1)
        base = 0
        blocks = self.blocks
        for n, lo, hi in ranges:
            while 0 <= nxt < base + hi - lo:
                b = lo + nxt - base
                st = BlockState(times(b), b)
                lst = blocks.get(n)
                if lst is not None and lst[-1].idx < b:
                    lst.append(st)
                else:
                    self._track(n, st)
                nxt = next(it, -1)
            base += hi - lo
            if nxt < 0:
                break

    def _track(self, n: int, st: BlockState) -> None:
        lst = self.blocks.get(n)
        if lst is None:
            self.blocks[n] = [st]
        elif lst[-1].idx < st.idx:
            lst.append(st)
        else:  # not at the tail (no path of the pool does this; kept sorted regardless)
            lst.append(st)
            lst.sort(key=lambda x: x.idx)

    def adopt(self, n: int, b: int, st: BlockState | None) -> None:
        """Block b of node n, req's unfilled block until now, is full: tracked if sampled."""
        if st is not None:
            st.idx = b
            self._track(n, st)

    def new_part(self, rid: int, b: int, t: float) -> None:
        """Req rid allocated unfilled block b at t."""
        self.part[rid] = (b, BlockState(t) if self.sampler.take(1) else None)

    def accessed(self, path: list[int], nblocks: int) -> None:
        """A prefix-cache hit on the first `nblocks` blocks of `path` (BlockPool.touch)."""
        blocks = self.blocks
        if not blocks or nblocks <= 0:
            return
        t, start, bs = self.now, self.start, self.bs
        for n in path:
            if start[n] // bs >= nblocks:
                break
            states = blocks.get(n)
            if states:
                for st in states:
                    if st.idx >= nblocks:
                        break
                    st.access(t)

    def evicted(self, n: int, lo: int, hi: int, ordinal: int) -> None:
        """Blocks [lo, hi) of node n evicted, the tail first, the first of them the
        ordinal-th block this eviction takes."""
        states = self.blocks.get(n)
        if not states:
            return
        while states and states[-1].idx >= lo:
            st = states.pop()
            self._observe(st, self.at(ordinal + hi - 1 - st.idx, True))
        if not states:
            del self.blocks[n]

    def released(self, req: Req) -> None:
        """req's references dropped: its unfilled block goes to the front of the free queue."""
        p = self.part.pop(req.rid, None)
        if p is not None:
            self.fresh.append(p[1])


class L1Lifecycle:
    """LMCache's L1LifecycleSubscriber as far as the reuse-gap histogram goes
    (METHODS.md#residency): tracked chunks (node, chunk index) -> last access."""

    __slots__ = ("end", "hist", "last", "now", "start", "threshold", "unit")

    def __init__(
        self, rate: float, hist: Histogram, start: NodeTable, end: NodeTable, unit: int
    ) -> None:
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"LMCache metrics sample rate must be in (0, 1], got {rate!r}")
        self.threshold = int(rate * LMCACHE_SAMPLE_PRIME)
        self.hist = hist
        self.start = start
        self.end = end
        self.unit = unit
        self.now = 0.0
        self.last: dict[tuple[int, int], float] = {}

    def written(self, n: int, lo: int, hi: int) -> None:
        """Chunks [lo, hi) of node n written to L1."""
        t, last, threshold = self.now, self.last, self.threshold
        for c in range(lo, hi):
            key = (n, c)
            prev = last.get(key)
            if prev is not None:
                self.hist.observe(t - prev)
                last[key] = t
            elif hash(key) % LMCACHE_SAMPLE_PRIME < threshold:
                last[key] = t

    def read(self, path: list[int], lo: int, hi: int) -> None:
        """Chunks lo … hi-1 of `path` read from L1."""
        last = self.last
        if not last or hi <= lo:
            return
        t, start, end, u = self.now, self.start, self.end, self.unit
        for n in path:
            n0 = start[n] // u
            if n0 >= hi:
                break
            for c in range(max(lo, n0), min(hi, end[n] // u)):
                key = (n, c)
                prev = last.get(key)
                if prev is not None:
                    self.hist.observe(t - prev)
                    last[key] = t

    def evicted(self, n: int, lo: int, hi: int) -> None:
        last = self.last
        if last:
            for c in range(lo, hi):
                last.pop((n, c), None)
