"""The decode batch of one engine, advanced k steps at a time in closed form.

Between events (an arrival it can admit, a completion, a prefill chunk, a block shortage)
every running sequence gains one token per step, so the batch needs no per-request work:
- a sequence with c computed tokens allocates a block when c % block_size == 0 and fills one
  when (c + 1) % block_size == 0; counting the sequences per phase (c - D) mod block_size
  gives the blocks the next k steps allocate in O(block_size);
- the KV read grows by R tokens per step, so step times form an arithmetic series;
- completions come from a heap keyed by the decode-step index at which each sequence ends.
Per-request state is materialised (lazily) only when the request itself leaves the batch.
"""

from __future__ import annotations

import heapq

from planner.simulate.request import Req

DECODE = 3  # Req.state while in this batch (engine.py owns the state constants)


class DecodeBatch:
    __slots__ = ("bs", "cnt", "d", "heap", "r", "s")

    def __init__(self, block_size: int) -> None:
        self.bs = block_size
        self.cnt = [0] * block_size  # sequences per phase (c - d) mod bs
        self.r = 0  # sequences
        self.s = 0  # sum of computed tokens (KV read per step)
        self.d = 0  # decode steps taken by this engine so far
        self.heap: list[tuple[int, int, Req]] = []

    def add(self, req: Req, computed: int, steps_left: int) -> None:
        self.cnt[(computed - self.d) % self.bs] += 1
        self.r += 1
        self.s += computed
        req.dec_c, req.dec_d = computed, self.d
        req.end_d = self.d + steps_left
        heapq.heappush(self.heap, (req.end_d, req.seq, req))

    def computed(self, req: Req) -> int:
        return req.dec_c + self.d - req.dec_d

    def remove(self, req: Req) -> int:
        """Take req out of the batch; returns its computed tokens now."""
        c = req.dec_c + self.d - req.dec_d
        self.cnt[(req.dec_c - req.dec_d) % self.bs] -= 1
        self.r -= 1
        self.s -= c
        req.end_d = -1  # its heap entry is stale from now on
        return c

    def blocks(self, k: int, offset: int = 0) -> tuple[int, int]:
        """(blocks allocated, blocks filled) by steps offset .. offset+k-1 from now."""
        if k <= 0 or self.r == 0:
            return 0, 0
        bs = self.bs
        q, rem = divmod(k, bs)
        full = q * self.r
        if rem == 0:
            return full, full
        # _partial(rem, offset, 0) and _partial(rem, offset, 1) in one pass: the second
        # window is the first moved down by one phase (0 < rem < bs, so it cannot wrap)
        cnt = self.cnt
        top = (-(self.d + offset)) % bs
        low = top - rem + 1
        alloc = sum(cnt[low : top + 1]) if low >= 0 else sum(cnt[: top + 1]) + sum(cnt[low:])
        return full + alloc, full + alloc - cnt[top] + cnt[(low - 1) % bs]

    def steps_within(self, available: int, offset: int = 0) -> int:
        """How many steps from `offset` on fit in `available` new blocks (large if R == 0)."""
        if self.r == 0:
            return 1 << 40
        q, rem = divmod(available, self.r)
        cnt, bs = self.cnt, self.bs
        base = self.d + offset + q * bs
        m = 0
        while m < bs:
            rem -= cnt[(-(base + m)) % bs]
            if rem < 0:
                break
            m += 1
        return q * bs + m

    def next_end(self) -> int:
        """Decode-step index of the next completion (large if none)."""
        heap = self.heap
        while heap:
            end, seq, req = heap[0]
            if req.end_d == end and req.seq == seq and req.state == DECODE:
                return end
            heapq.heappop(heap)
        return 1 << 60

    def pop_done(self) -> list[Req]:
        """Sequences whose last token was produced by now (still in the batch)."""
        out: list[Req] = []
        heap = self.heap
        while heap and heap[0][0] <= self.d:
            end, seq, req = heapq.heappop(heap)
            if req.end_d == end and req.seq == seq and req.state == DECODE:
                out.append(req)
        return out

    def advance(self, k: int) -> None:
        self.d += k
        self.s += self.r * k
