"""The GPU block pool of an engine run with ``kv_cache_metrics``: BlockPool plus the hooks of
vLLM's KVCacheMetricsCollector (residency.py says what is observed when).

A subclass, so an engine without the metrics runs BlockPool's code unchanged. It reports to
a KVResidency: the blocks each allocation creates (their segment and absolute index), the
unfilled block a request holds, the blocks each eviction takes, and the request's unfilled
block going back to the free queue when it is released. Prefix hits (BlockPool.touch in
vLLM) and decode allocations are reported by the engine, which does them inline.
"""

from __future__ import annotations

from planner.simulate.content import ContentTree
from planner.simulate.kvcache import BlockPool
from planner.simulate.request import Req
from planner.simulate.residency import KVResidency


def _cut(ranges: list[tuple[int, int, int]], b: int) -> bool:
    """Remove block b from the (node, first, end) ranges; True when it was in one."""
    for k, (n, lo, hi) in enumerate(ranges):
        if lo <= b < hi:
            ranges[k : k + 1] = [r for r in ((n, lo, b), (n, b + 1, hi)) if r[2] > r[1]]
            return True
    return False


class TrackedBlockPool(BlockPool):
    """A prefix-caching BlockPool whose block births, fills and evictions a KVResidency sees
    (vLLM observes nothing with prefix caching off, so there is no tracked pool without)."""

    __slots__ = ("res",)

    def __init__(self, total: int, block_size: int, tree: ContentTree, res: KVResidency) -> None:
        super().__init__(total, block_size, tree, True)
        self.res = res

    def _node_of(self, ranges: list[tuple[int, int, int]], b: int) -> int:
        return next(n for n, lo, hi in ranges if lo <= b < hi)

    def reserve(self, req: Req, target_tokens: int) -> bool:
        bs, start, cached, path = self.bs, self.start, self.cached, req.path
        full = target_tokens // bs
        before: list[tuple[int, int]] = []
        for i in range(req.hold_idx, len(path)):
            n = path[i]
            if start[n] // bs >= full:
                break
            before.append((n, cached.get(n, 0)))
        if not super().reserve(req, target_tokens):
            return False
        res = self.res
        t = res.now
        ranges: list[tuple[int, int, int]] = []
        for n, c0 in before:
            c1 = cached.get(n, 0)
            if c1 > c0:
                n0 = start[n] // bs
                ranges.append((n, n0 + c0, n0 + c1))
        p = res.part.get(req.rid)
        if p is not None and p[0] < full:  # its unfilled block is full now: no new block
            del res.part[req.rid]
            b, st = p
            if st is not None and any(lo <= b < hi for _, lo, hi in ranges):
                res.adopt(self._node_of(ranges, b), b, st)
            _cut(ranges, b)
            p = None
        m = 0
        for _, lo, hi in ranges:
            m += hi - lo
        sampler = res.sampler
        if sampler.skip >= m:  # none of them sampled (the common case)
            sampler.skip -= m
        else:
            res.born(ranges, lambda _b: t)
        if target_tokens % bs and p is None:  # a new unfilled block
            res.new_part(req.rid, full, t)
            m += 1
        res.allocated(m)
        return True

    def settle_decode(self, req: Req, computed: int) -> None:
        res, bs = self.res, self.bs
        n = req.path[-1]
        c0 = self.cached.get(n, 0)
        super().settle_decode(req, computed)
        c1 = self.cached.get(n, 0)
        p = res.part.pop(req.rid, None)
        dec_c, dec_d = req.dec_c, req.dec_d

        def birth(b: int) -> float:
            # the decode step whose token opens block b (vllm allocates at scheduling)
            pos = b * bs
            return res.step_time(dec_d + pos - dec_c if pos >= dec_c else dec_d)

        if c1 > c0:
            n0 = self.start[n] // bs
            ranges = [(n, n0 + c0, n0 + c1)]
            if p is not None and _cut(ranges, p[0]):  # the unfilled block decode filled
                res.adopt(n, p[0], p[1])
                p = None
            if ranges:
                res.born(ranges, birth)
        if computed % bs:
            b = computed // bs
            if p is not None and p[0] == b:
                res.part[req.rid] = p
            else:
                res.new_part(req.rid, b, birth(b))

    def release(self, req: Req) -> None:
        self.res.released(req)
        super().release(req)

    def evict(self, count: int) -> None:
        """BlockPool.evict, telling the tracker which blocks go (tail first)."""
        cached, pin, lru, res = self.cached, self.pin, self.lru, self.res
        tracked, start, bs = res.blocks, self.start, self.bs
        self.evicted_total += count
        ordinal = 0
        while count > 0:
            n = next(iter(lru))
            c = cached.get(n, 0)
            e = c - pin.get(n, 0)
            if e <= 0:
                del lru[n]
                continue
            take = e if e < count else count
            states = tracked.get(n)
            if states and states[-1].idx >= start[n] // bs + c - take:
                n0 = start[n] // bs
                res.evicted(n, n0 + c - take, n0 + c, ordinal)
            ordinal += take
            count -= take
            self.cached_total -= take
            if c == take:
                del cached[n]
                del lru[n]
            else:
                cached[n] = c - take
                if take == e:
                    del lru[n]
