"""Paged KV memory: the GPU block pool with prefix caching, and the prefix LRU of CPU tiers.

Both count blocks per segment of the ContentTree (a run of leading blocks per segment, as
vLLM frees tail-first), not block objects. GPU accounting follows vLLM v1's BlockPool:
usage = (pinned + private) / total, the rest free or evictable cached.

Design: planner/simulate/METHODS.md#kvcache
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator
from typing import Protocol

from planner.simulate.content import ContentTree, NodeTable
from planner.simulate.request import Req


class ChunkWatch(Protocol):
    """Sees the units a PrefixLRU writes and evicts (LMCache's L1 lifecycle metrics)."""

    def written(self, n: int, lo: int, hi: int) -> None: ...

    def evicted(self, n: int, lo: int, hi: int) -> None: ...


def leading_cached(
    path: list[int],
    start: NodeTable,
    end: NodeTable,
    cached: dict[int, int],
    *,
    unit: int,
    limit: int,
) -> int:
    """Units (blocks or chunks) of the leading segments of ``path`` that are cached, up to
    ``limit``: whole segments count until the first one cached only partly (its cached units
    are its head, as eviction eats segments tail-first)."""
    total = 0
    for n in path:
        nb = end[n] // unit - start[n] // unit
        c = cached.get(n, 0)
        if c < nb:
            total += c
            break
        total += nb
        if total >= limit:
            break
    return total if total < limit else limit


class BlockPool:
    """One engine's GPU KV blocks with hash-based prefix caching and LRU eviction."""

    __slots__ = (
        "bs",
        "cached",
        "cached_total",
        "end",
        "evicted_total",
        "holders",
        "lru",
        "pin",
        "pinned_total",
        "prefix_caching",
        "private_total",
        "start",
        "total",
    )

    def __init__(
        self, total: int, block_size: int, tree: ContentTree, prefix_caching: bool
    ) -> None:
        self.total = total
        self.bs = block_size
        self.start = tree.start  # shared lists: nodes appended later are visible
        self.end = tree.end
        self.prefix_caching = prefix_caching
        self.cached: dict[int, int] = {}  # node -> leading blocks of the node in HBM
        self.pin: dict[int, int] = {}  # node -> leading blocks referenced (max over holders)
        self.holders: dict[int, int] = {}  # node -> running requests holding some of it
        self.lru: OrderedDict[int, None] = OrderedDict()  # nodes with evictable blocks, LRU first
        self.cached_total = 0
        self.pinned_total = 0
        self.private_total = 0
        self.evicted_total = 0

    # --- queries ------------------------------------------------------------------------------
    @property
    def available(self) -> int:
        return self.total - self.pinned_total - self.private_total

    @property
    def used(self) -> int:
        return self.pinned_total + self.private_total

    def nodes(self) -> Iterator[int]:
        """Every node the pool has an entry for (ContentTree.prune keeps them)."""
        yield from self.cached
        yield from self.holders
        yield from self.lru

    def lookup(self, path: list[int], max_blocks: int) -> int:
        """Leading blocks of `path` cached in HBM (vLLM find_longest_cache_hit), capped."""
        if not self.prefix_caching or max_blocks <= 0:
            return 0
        return leading_cached(
            path, self.start, self.end, self.cached, unit=self.bs, limit=max_blocks
        )

    # --- allocation -------------------------------------------------------------------------
    def reserve(self, req: Req, target_tokens: int) -> bool:  # noqa: PLR0912, PLR0915 - one allocation decision, as vLLM's allocate_slots
        """Hold blocks for `target_tokens` of req's sequence (hits are shared, the rest is
        allocated, evicting LRU cached blocks as needed). False, and nothing changed, when
        the pool cannot supply them."""
        bs, start, end, cached, pin = self.bs, self.start, self.end, self.cached, self.pin
        path = req.path
        full = target_tokens // bs
        priv = 1 if target_tokens % bs else 0
        idx, h = req.hold_idx, req.hold_blocks
        if idx < len(path):
            # fast path: the new full blocks stay inside the segment being extended (a chunked
            # prefill continuing, a one-segment prompt)
            n = path[idx]
            n0 = start[n] // bs
            e = full - n0
            if h <= e <= end[n] // bs - n0 and (h > 0 or e > 0 or idx == len(path) - 1):
                p = pin.get(n, 0)
                grow = e - p if e > p else 0
                if self.pinned_total + grow + self.private_total + priv - req.private > self.total:
                    return False
                if e > h:
                    if h == 0:
                        self.holders[n] = self.holders.get(n, 0) + 1
                    c = cached.get(n, 0)
                    if e > c:
                        cached[n] = e
                        self.cached_total += e - c
                    if grow:
                        pin[n] = e
                        self.pinned_total += grow
                    req.hold_blocks = e
                # self._settle_private(req, priv), inlined: this is the common case
                self.private_total = private = self.private_total + priv - req.private
                req.private = priv
                over = self.cached_total + private - self.total
                if over > 0:
                    self.evict(over)
                return True
        # plan: walk from the current holding to `full` blocks, summing the pin increase
        done = start[path[idx]] // bs + h if idx < len(path) else full
        delta_pin = 0
        i = idx
        while done < full and i < len(path):
            n = path[i]
            n0 = start[n] // bs
            nb = end[n] // bs - n0
            e = min(nb, full - n0)
            p = pin.get(n, 0)
            if e > p:
                delta_pin += e - p
            done = n0 + e
            i += 1
        if self.pinned_total + delta_pin + self.private_total + priv - req.private > self.total:
            return False
        # commit
        holders = self.holders
        done = start[path[idx]] // bs + h if idx < len(path) else full
        i = idx
        while done < full and i < len(path):
            n = path[i]
            n0 = start[n] // bs
            nb = end[n] // bs - n0
            e = min(nb, full - n0)
            if e > 0:
                if i != idx or h == 0:
                    holders[n] = holders.get(n, 0) + 1
                c = cached.get(n, 0)
                if e > c:
                    cached[n] = e
                    self.cached_total += e - c
                p = pin.get(n, 0)
                if e > p:
                    pin[n] = e
                    self.pinned_total += e - p
            done = n0 + e
            if e >= nb and done < full:
                i += 1
                h = 0
            else:
                h = e
                break
        req.hold_idx, req.hold_blocks = i, h
        return self._settle_private(req, priv)

    def _settle_private(self, req: Req, priv: int) -> bool:
        """Set req's partial (unhashed) block count and evict what no longer fits."""
        self.private_total = private = self.private_total + priv - req.private
        req.private = priv
        over = self.cached_total + private - self.total  # evict what no longer fits
        if over > 0:
            self.evict(over)
        return True

    def decode_advance(self, new_blocks: int, filled_blocks: int) -> None:
        """Aggregate effect of decode steps: `new_blocks` partial blocks allocated and
        `filled_blocks` partial blocks became full (hashed, still referenced)."""
        self.private_total = private = self.private_total + new_blocks - filled_blocks
        self.cached_total = cached = self.cached_total + filled_blocks
        self.pinned_total += filled_blocks
        over = cached + private - self.total  # evict what no longer fits
        if over > 0:
            self.evict(over)

    def settle_decode(self, req: Req, computed: int) -> None:
        """Bring req's per-node holding up to `computed` tokens after aggregated decode steps
        (totals were already counted by decode_advance; the new blocks are all in req's output
        segment, which nobody else holds)."""
        bs = self.bs
        last = len(req.path) - 1
        n = req.path[last]
        if req.hold_idx < last:
            req.hold_idx, req.hold_blocks = last, 0
        h = computed // bs - self.start[n] // bs
        if h > req.hold_blocks:
            if req.hold_blocks == 0:
                self.holders[n] = self.holders.get(n, 0) + 1
            self.cached[n] = h
            self.pin[n] = h
            req.hold_blocks = h
        req.private = 1 if computed % bs else 0

    def release(self, req: Req) -> None:
        """Drop req's references (finish or preemption); its blocks stay cached, newest
        sequence position first in line for eviction (vLLM frees blocks in reverse order)."""
        path, holders, pin, lru = req.path, self.holders, self.pin, self.lru
        last = req.hold_idx if req.hold_blocks else req.hold_idx - 1
        last = last if last < len(path) else len(path) - 1
        for i in range(last, -1, -1):
            n = path[i]
            k = holders.get(n, 0)
            if k <= 0:
                continue
            if k == 1:
                del holders[n]
                self.pinned_total -= pin.pop(n, 0)
                if not self.prefix_caching:
                    self.cached_total -= self.cached.pop(n, 0)
                elif self.cached.get(n, 0):
                    lru[n] = None
                    lru.move_to_end(n)
            else:
                holders[n] = k - 1
        self.private_total -= req.private
        req.private = 0
        req.hold_idx = req.hold_blocks = 0

    def evict(self, count: int) -> None:
        """Evict `count` cached blocks nothing references, least recently used first."""
        cached, pin, lru = self.cached, self.pin, self.lru
        self.evicted_total += count
        while count > 0:
            n = next(iter(lru))  # StopIteration here would be an accounting bug
            c = cached.get(n, 0)
            e = c - pin.get(n, 0)
            if e <= 0:
                del lru[n]
                continue
            take = e if e < count else count
            count -= take
            self.cached_total -= take
            if c == take:
                del cached[n]
                del lru[n]
            else:
                cached[n] = c - take
                if take == e:  # the rest is pinned: not evictable until released
                    del lru[n]
                # else it stays first in line with its remaining evictable blocks

    def check(self, lazy_full: int = 0, private: int | None = None) -> None:
        """Recount every total from the per-node maps (tests; O(nodes)). `lazy_full` = blocks
        filled by aggregated decode steps not yet settled into their nodes; `private` = the
        expected partial blocks of running requests."""
        assert self.cached_total == sum(self.cached.values()) + lazy_full, "cached_total drifted"
        assert self.pinned_total == sum(self.pin.values()) + lazy_full, "pinned_total drifted"
        assert self.private_total >= 0, "negative private blocks"
        if private is not None:
            assert self.private_total == private, "private blocks leaked"
        assert self.pinned_total + self.private_total <= self.total, "over-committed"
        assert self.cached_total + self.private_total <= self.total, "more blocks than HBM"
        for n, p in self.pin.items():
            assert 0 < p <= self.cached.get(n, 0), f"node {n} pinned beyond cached"
        for n, k in self.holders.items():
            assert k > 0 and n in self.pin, f"node {n} held but not pinned"


class PrefixLRU:
    """A CPU-side KV store (native offload pool, LMCache L1 or L2) in units of `unit` tokens,
    keeping per segment a leading run of units, evicting least-recently-used segments from
    their tails."""

    __slots__ = (
        "cached",
        "capacity",
        "end",
        "evicted",
        "lru",
        "partial",
        "partial_seq",
        "start",
        "unit",
        "used",
        "watch",
    )

    def __init__(self, capacity_units: float, unit_tokens: int, tree: ContentTree) -> None:
        self.capacity = capacity_units
        self.unit = unit_tokens
        self.start = tree.start
        self.end = tree.end
        self.cached: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        # objects no lookup can hit (LMCache's unfull last chunk of a prompt): negative keys
        # in `lru`, their size in units (< 1) here
        self.partial: dict[int, float] = {}
        self.partial_seq = 0
        self.used: float = 0
        self.evicted = 0
        self.watch: ChunkWatch | None = None  # told of every unit written and evicted

    def lookup(self, path: list[int], max_units: int) -> int:
        return leading_cached(
            path, self.start, self.end, self.cached, unit=self.unit, limit=max_units
        )

    def nodes(self) -> Iterator[int]:
        """Every node the store has an entry for (ContentTree.prune keeps them)."""
        yield from self.cached
        for n in self.lru:
            if n >= 0:
                yield n

    def touch(self, path: list[int], units: int) -> None:
        """Mark the segments covering the first `units` units as recently used."""
        u, start, lru = self.unit, self.start, self.lru
        for n in reversed(path):
            if start[n] // u < units and n in self.cached:
                lru[n] = None
                lru.move_to_end(n)

    def store(self, path: list[int], from_tokens: int, to_tokens: int) -> int:
        """Store the full units of tokens [from_tokens, to_tokens) of `path`; returns the units
        newly written (units already present are skipped, as both vLLM and LMCache do)."""
        u, start, end, cached, lru = self.unit, self.start, self.end, self.cached, self.lru
        lo, hi = from_tokens // u, to_tokens // u
        if hi <= lo or self.capacity < 1:
            return 0
        written = 0
        touched: list[int] = []
        for n in path:
            n0 = start[n] // u
            nb = end[n] // u - n0
            if n0 + nb <= lo:
                continue
            if n0 >= hi:
                break
            e = min(nb, hi - n0)
            c = cached.get(n, 0)
            if e > c:
                cached[n] = e
                written += e - c
                if self.watch is not None:
                    self.watch.written(n, n0 + c, n0 + e)
            touched.append(n)
        for n in reversed(touched):
            lru[n] = None
            lru.move_to_end(n)
        self.used += written
        over = self.used - self.capacity
        if over > 0:
            self._evict(int(over) + (0 if over == int(over) else 1))
        return written

    def store_partial(self, units: float) -> bool:
        """Keep an object of `units` (< 1) that no lookup can hit, as LMCache keeps the unfull
        last chunk of a prompt (`save_unfull_chunk`): it takes room and is evicted in LRU
        order. False when the store cannot hold a unit."""
        if units <= 0 or self.capacity < 1:
            return False
        self.partial_seq -= 1
        key = self.partial_seq
        self.partial[key] = units
        self.lru[key] = None
        self.used += units
        over = self.used - self.capacity
        if over > 0:
            self._evict(math.ceil(over))
        return True

    def make_room(self, units: int) -> None:
        """Free room for a transient buffer of `units` (LMCache reads an L2 chunk into a
        buffer of its L1 allocator, evicting L1's LRU chunks when it is full, and frees the
        buffer after the load): evicts what does not fit and inserts nothing."""
        over = self.used + units - self.capacity
        if over > 0:
            self._evict(math.ceil(over))

    def _evict(self, count: float) -> None:
        cached, lru, partial = self.cached, self.lru, self.partial
        while count > 0 and lru:
            n, _ = lru.popitem(last=False)
            if n < 0:
                w = partial.pop(n)
                count -= w
                self.used -= w
                self.evicted += 1
                continue
            c = cached.get(n, 0)
            if c <= 0:
                continue
            whole = math.ceil(count)  # = count unless a partial object was evicted before
            take = c if c < whole else whole
            if self.watch is not None:
                n0 = self.start[n] // self.unit
                self.watch.evicted(n, n0 + c - take, n0 + c)
            count -= take
            self.used -= take
            self.evicted += take
            if c == take:
                del cached[n]
            else:
                cached[n] = c - take
                lru[n] = None
                lru.move_to_end(n, last=False)
