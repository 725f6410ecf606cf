"""Ending steps and requests on a simulated engine: commit a mixed step or a decode jump,
count re-prefill, finish requests, and check or observe the engine (a mixin of Engine).

Separate from engine.py (planning, admission, preemption) only to keep modules short; the
attributes below are owned and initialised by Engine.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from planner.simulate.content import ContentTree
from planner.simulate.decode import DECODE, DecodeBatch
from planner.simulate.kvcache import BlockPool
from planner.simulate.offload import Connector
from planner.simulate.request import Req
from planner.simulate.residency import KVResidency
from planner.simulate.telemetry import EngineSnapshot, EngineTelemetry

# Req.state values (DECODE = 3 lives in decode.py)
WAITING, LOADING, PREFILL, DONE, LOADED = 0, 1, 2, 4, 5


class EngineCommit:
    idx: int
    node: int
    bs: int
    tree: ContentTree
    conn: Connector
    has_conn: bool
    tel: EngineTelemetry
    pool: BlockPool
    res: KVResidency | None
    dec: DecodeBatch
    waiting: deque[Req]
    loading: list[Req]
    running: dict[int, Req]
    prefilling: dict[int, Req]
    on_finish: Callable[[Req, float], None]
    seg_start: float
    seg_usage: float
    seg_a: float
    seg_b: float
    seg_k: int
    seg_chunks: list[tuple[Req, int]]
    kv_integral: float
    busy_time: float
    steps: int
    computed_tokens: int
    reprefill_tokens: int
    _step0: bool

    # --- commit -----------------------------------------------------------------------------
    # The commits run once per event; the bookkeeping shared by both (run statistics, the
    # iteration-tokens observation, completions) is written out in each rather than called.
    def _commit_mixed(self, now: float) -> None:
        dec, tel = self.dec, self.tel
        r = dec.r
        dec.d += 1  # dec.advance(1)
        dec.s += r
        res = self.res
        if res is not None:
            res.now = now
            if r:
                res.log_steps(dec.d - 1, self.seg_start, now - self.seg_start, 0.0)
        tokens = r
        if r:
            tel.counters["generation_tokens_total"] += r
            tel.hist["inter_token_latency_seconds"].observe(now - self.seg_start, r)
        conn, has_conn = self.conn, self.has_conn
        for req, n in self.seg_chunks:
            c0 = req.computed
            req.computed = c1 = c0 + n
            tokens += n
            self._mark_computed(req, c0, c1)
            if has_conn:  # the base Connector stores nothing
                conn.store(req, c0, c1, now)
            if c1 == req.prompt_len + req.generated:
                self._prefill_done(req, now)
        self.seg_chunks = []
        # run statistics of the step
        dur = now - self.seg_start
        pool = self.pool
        usage = (pool.pinned_total + pool.private_total) / pool.total
        self.kv_integral += (self.seg_usage + usage) / 2.0 * dur
        self.busy_time += dur
        self.steps += 1
        hist = tel.hist["iteration_tokens"]  # observe(tokens, 1)
        pending = hist.pending
        pending.append(tokens)
        if len(pending) >= hist.limit:
            hist.flush()
        heap = dec.heap
        if heap and heap[0][0] <= dec.d:
            for req in dec.pop_done():
                self._finish(req, now)

    def _commit_jump(self, now: float) -> None:
        dec, pool, k = self.dec, self.pool, self.seg_k
        res = self.res
        if res is not None:
            res.now = now
            res.log_steps(dec.d, self.seg_start, self.seg_a, self.seg_b)
        if k > 1:
            new, filled = dec.blocks(k - 1, 1)
            if res is not None:
                free = pool.total - pool.cached_total - pool.private_total
                res.jump = (self.seg_start, self.seg_a, self.seg_b, k, free)
                res.memo.clear()
                res.allocated(new)
            pool.decode_advance(new, filled)
            if res is not None:
                res.jump = None
        r = dec.r
        dec.d += k  # dec.advance(k)
        dec.s += r * k
        tel = self.tel
        tel.counters["generation_tokens_total"] += r * k
        tel.hist["inter_token_latency_seconds"].observe_linear(self.seg_a, self.seg_b, k, r)
        # run statistics of the k steps
        dur = now - self.seg_start
        usage = (pool.pinned_total + pool.private_total) / pool.total
        self.kv_integral += (self.seg_usage + usage) / 2.0 * dur
        self.busy_time += dur
        self.steps += k
        tel.hist["iteration_tokens"].observe(r, k)
        heap = dec.heap
        if heap and heap[0][0] <= dec.d:
            for req in dec.pop_done():
                self._finish(req, now)

    def _mark_computed(self, req: Req, c0: int, c1: int) -> None:
        """Count prefill tokens [c0, c1); those computed before anywhere are re-prefill."""
        tree = self.tree
        start, end, hw = tree.start, tree.end, tree.hw
        self.computed_tokens += c1 - c0
        for n in req.path:  # (integers: a conditional is max()/min() without the call)
            s, e = start[n], end[n]
            if e <= c0:
                continue
            if s >= c1:
                break
            lo = s if s > c0 else c0
            hi = e if e < c1 else c1
            had = hw[n]
            seen = s + had
            if seen > lo:
                self.reprefill_tokens += (seen if seen < hi else hi) - lo
            hw[n] = hi - s if hi - s > had else had

    def _mark_decoded(self, req: Req, computed: int) -> None:
        n = req.path[-1]
        hw = self.tree.hw
        hw[n] = max(hw[n], computed - self.tree.start[n])

    def _prefill_done(self, req: Req, now: float) -> None:
        del self.prefilling[req.seq]
        req.generated += 1
        req.last_token_t = now
        if req.first_token < 0:
            req.first_token = now
            tel = self.tel
            tel.counters["prompt_tokens_total"] += req.prompt_len
            cached = req.cached_prompt if req.cached_prompt > 0 else 0
            tel.counters["prompt_tokens_cached_total"] += cached
            tel.first_token(now - req.arrival, req.prompt_len - cached)
        self.tel.counters["generation_tokens_total"] += 1
        if req.generated >= req.output_len:
            self._finish(req, now)
        else:
            req.state = DECODE
            self.dec.add(req, req.computed, req.output_len - req.generated)

    def _finish(self, req: Req, now: float) -> None:
        pool = self.pool
        if req.state == DECODE:
            c = self.dec.remove(req)
            req.generated = req.output_len
            pool.settle_decode(req, c)
            n = req.path[-1]  # self._mark_decoded(req, c)
            hw = self.tree.hw
            done = c - self.tree.start[n]
            hw[n] = done if done > hw[n] else hw[n]
        else:
            c = req.computed
        self.running.pop(req.seq, None)
        if self.has_conn:
            self.conn.store_on_release(req, c, now)
        pool.release(req)
        req.state = DONE
        tel = self.tel
        tel.finished["stop"] += 1
        tel.request_done(
            (
                req.arrival,
                req.first_scheduled,
                req.first_token,
                now,
                req.prompt_len,
                req.output_len,
                req.num_preemptions,
            )
        )
        self.on_finish(req, now)

    # --- observation ------------------------------------------------------------------------
    def check(self) -> None:
        """Block accounting against a recount (tests): between events, every decoding request
        has its blocks allocated for one more token than it has computed."""
        bs, lazy, private = self.bs, 0, 0
        for req in self.running.values():
            if req.state == DECODE:
                c = self.dec.computed(req) + (1 if self._step0 else 0)
                n0 = self.tree.start[req.path[-1]] // bs
                held = req.hold_blocks if req.hold_idx == len(req.path) - 1 else 0
                lazy += max(0, c // bs - n0 - held)
                private += 1 if c % bs else 0
            else:
                private += req.private
        for req in self.loading:
            private += req.private
        for req in self.waiting:
            if req.state == LOADED:
                private += req.private
        self.pool.check(lazy, private)
        assert self.dec.r == sum(1 for r in self.running.values() if r.state == DECODE)
        assert all(r.state == PREFILL for r in self.prefilling.values())

    def snapshot(self, t: float) -> EngineSnapshot:
        pool = self.pool
        gauges = {
            "requests_running": float(len(self.running)),
            "requests_waiting": float(len(self.waiting) + len(self.loading)),
            "kv_cache_usage_ratio": pool.used / pool.total,
            "offload_cpu_usage_ratio": self.conn.usage_ratio(),
        }
        facts = {"num_gpu_blocks": pool.total, "block_size": self.bs}
        return self.tel.snapshot(
            engine=self.idx, node=self.node, offload=self.conn.mode, t=t, gauges=gauges, facts=facts
        )
