"""One simulated vLLM v1 engine: continuous batching, chunked prefill, paged KV, preemption.

Scheduling follows vLLM v1's Scheduler.schedule() (decodes before prefill chunks, FCFS
admission, recompute preemption of the newest request, the prefix hit capped at prompt − 1,
connector loads async or blocking); decode-only stretches advance k steps at once
(decode.py); step times from planner.domain.costmodel.step_seconds (roofline).

Design: planner/simulate/METHODS.md#engine; parameters: PARAMETERS.md
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from planner.domain import costmodel
from planner.simulate.commit import LOADED, LOADING, PREFILL, WAITING
from planner.simulate.content import ContentTree
from planner.simulate.decode import DECODE, DecodeBatch
from planner.simulate.kvcache import BlockPool, leading_cached
from planner.simulate.offload import Connector
from planner.simulate.queues import EngineQueues
from planner.simulate.request import Req
from planner.simulate.residency import KVResidency
from planner.simulate.residency_pool import TrackedBlockPool
from planner.simulate.scenario import ClusterSpec
from planner.simulate.telemetry import EngineTelemetry

IDLE, MIXED, JUMP, WAIT = 0, 1, 2, 3


class StepCost:
    """Step time of one engine from the cost model (roofline, planner/domain/costmodel.py)."""

    def __init__(self, spec: ClusterSpec) -> None:
        # step(prefill, decode_seqs, decode_kv_tokens); decode(decode_seqs, decode_kv_tokens)
        # is step([], ...) bit for bit, cheaper (every decode jump evaluates two)
        self.step, self.decode = costmodel.step_seconds_fns(
            spec.model,
            spec.gpu,
            spec.tensor_parallel,
            mfu=spec.mfu,
            hbm_efficiency=spec.hbm_efficiency,
            overhead_s=spec.step_overhead_s,
        )


class Engine(EngineQueues):
    # slotted: an engine has more attributes than a split-keys instance dict keeps fast
    # (Python 3.11 specialises slot access), and the event loop reads them on every event
    __slots__ = (
        "_seq",
        "_step0",
        "avoided_tokens",
        "bs",
        "busy_time",
        "computed_tokens",
        "conn",
        "cost",
        "dec",
        "factor",
        "has_conn",
        "horizon",
        "idx",
        "kv_integral",
        "load_wait_s",
        "loading",
        "loads",
        "max_jump",
        "max_req_preemptions",
        "max_seqs",
        "max_tokens",
        "node",
        "on_finish",
        "pool",
        "preempted_after_load",
        "preemptions",
        "prefilling",
        "rejected",
        "reprefill_tokens",
        "res",
        "resume_in_place",
        "running",
        "seg",
        "seg_a",
        "seg_b",
        "seg_chunks",
        "seg_end",
        "seg_k",
        "seg_start",
        "seg_usage",
        "spec",
        "stall_s",
        "steps",
        "tel",
        "tree",
        "waiting",
    )

    def __init__(  # noqa: PLR0913 - the engine's configuration, keyword-only
        self,
        idx: int,
        node: int,
        spec: ClusterSpec,
        tree: ContentTree,
        *,
        connector: Connector,
        tel: EngineTelemetry,
        cost: StepCost,
        on_finish: Callable[[Req, float], None],
        horizon: float,
        residency: KVResidency | None = None,
    ) -> None:
        """`residency`: vLLM's --kv-cache-metrics collector for this engine (None: off;
        ignored without prefix caching, where vLLM observes nothing)."""
        self.idx, self.node, self.spec = idx, node, spec
        self.tree = tree
        self.conn = connector
        self.tel = tel
        self.cost = cost
        self.on_finish = on_finish
        self.horizon = horizon  # decode jumps stop at the first step boundary past it
        self.bs = spec.block_size
        self.res = residency if spec.enable_prefix_caching else None
        self.dec = DecodeBatch(spec.block_size)
        self.pool = self._new_pool()
        self.waiting: deque[Req] = deque()
        self.loading: list[Req] = []
        self.running: dict[int, Req] = {}  # admission seq -> request (prefill and decode)
        self.prefilling: dict[int, Req] = {}
        self.max_seqs = spec.max_num_seqs
        self.max_tokens = spec.max_num_batched_tokens
        self.factor = 1.0 + connector.step_overhead
        self.has_conn = connector.mode != "none"
        self.resume_in_place = spec.resume_after_load == "in_place"
        self.max_jump = 1 << 40  # decode steps per event (1 = naive per-step loop)
        self._seq = 0
        self._step0 = False  # this step's decode blocks are already allocated
        # the segment in flight: one mixed step, or k decode steps of times a + b·j
        self.seg = IDLE
        self.seg_start = self.seg_end = self.seg_a = self.seg_b = 0.0
        self.seg_k = 0
        self.seg_chunks: list[tuple[Req, int]] = []
        self.seg_usage = 0.0
        # run statistics
        self.steps = 0
        self.kv_integral = 0.0
        self.busy_time = 0.0
        self.preemptions = 0
        self.reprefill_tokens = 0
        self.avoided_tokens = 0
        self.computed_tokens = 0
        self.rejected = 0
        self.stall_s = 0.0  # step time spent in blocking connector lookups and loads
        self.loads = 0  # requests admitted after an async load
        self.load_wait_s = 0.0  # their time from the load's start to admission
        self.preempted_after_load = 0  # preemptions of requests resumed by an async load
        self.max_req_preemptions = 0  # most preemptions of one request (starvation)

    # --- cluster interface ----------------------------------------------------------------
    def load_estimate(self) -> int:
        return len(self.running) + len(self.waiting) + len(self.loading)

    def on_arrival(self, req: Req, now: float) -> bool:
        """Queue req; True when the engine's next event time changed."""
        if req.prompt_len + req.output_len > self.pool.total * self.bs:
            self.rejected += 1  # vLLM refuses requests longer than its KV capacity
            self.tel.finished["abort"] += 1
            return False
        req.engine, req.state = self.idx, WAITING
        self.waiting.append(req)
        if self.seg in (IDLE, WAIT):
            if self.seg == WAIT:
                self._end_wait(now)
            self._plan(now)
            return True
        if self.seg == JUMP and len(self.waiting) == 1 and len(self.running) < self.max_seqs:
            # cut the jump only if the request could get blocks for its first chunk: blocks
            # only shrink during a jump, so otherwise it waits for a completion anyway
            p_eff = req.prompt_len + req.generated
            hit = self.pool.lookup(req.path, (p_eff - 1) // self.bs) * self.bs
            chunk = min(p_eff - hit, self.max_tokens - self.dec.r)
            if self.pool.available + 1 >= chunk // self.bs or self.conn.mode != "none":
                return self._truncate(now, after=True)
        return False

    def on_event(self, now: float) -> None:
        """The segment in flight ends at `now`: commit it and plan the next one."""
        seg = self.seg
        if seg == JUMP:
            self._commit_jump(now)
        elif seg == MIXED:
            self._commit_mixed(now)
        elif seg == WAIT:
            self._end_wait(now)
        self.seg = IDLE
        self._plan(now)

    def _end_wait(self, now: float) -> None:
        self.kv_integral += self.seg_usage * (now - self.seg_start)
        self.seg = IDLE

    def split(self, t: float) -> bool:
        """Cut a decode jump at its last step boundary <= t (telemetry between advances)."""
        return self.seg == JUMP and self._truncate(t, after=False)

    def restart(self, now: float, connector: Connector) -> list[Req]:
        """Restart the engine at `now` with `connector` (a new offload configuration): the
        steps done by `now` are committed (the decode steps of a jump that ended by then, a
        step that ended at `now`), the step in flight is lost, the HBM prefix cache and the
        connector's engine-local state (native offload's CPU pool) are gone with the process.
        Returns the requests it held (waiting, loading, running), aborted, oldest first: the
        caller sends them again. Run statistics and telemetry go on (PARAMETERS.md,
        "Switchback")."""
        seg, lost_from = self.seg, self.seg_start
        if seg == JUMP:
            m = self._steps_by(now - self.seg_start)
            if m >= 1:
                self.seg_k = m
                lost_from = self.seg_start + self._cum(m)
                self._commit_jump(lost_from)
        elif seg == MIXED and self.seg_end <= now:
            lost_from = self.seg_end
            self._commit_mixed(lost_from)
        elif seg == WAIT:
            self._end_wait(now)
        if seg in (JUMP, MIXED) and now > lost_from:  # the step the restart cut short
            pool = self.pool
            self.kv_integral += (
                (pool.pinned_total + pool.private_total) / pool.total * (now - lost_from)
            )
            self.busy_time += now - lost_from
        held = [*self.waiting, *self.loading, *self.running.values()]
        spec = self.spec
        self.dec = DecodeBatch(spec.block_size)
        self.pool = self._new_pool()
        self.waiting = deque()
        self.loading = []
        self.running = {}
        self.prefilling = {}
        self.conn = connector
        self.factor = 1.0 + connector.step_overhead
        self.has_conn = connector.mode != "none"
        self._step0 = False
        self.seg = IDLE
        self.seg_chunks = []
        self.seg_start = self.seg_end = now
        return sorted(held, key=lambda r: (r.arrival, r.rid))

    def _new_pool(self) -> BlockPool:
        """An empty HBM block pool (a tracked one with --kv-cache-metrics)."""
        spec, res = self.spec, self.res
        if res is None:
            return BlockPool(
                spec.num_gpu_blocks, spec.block_size, self.tree, spec.enable_prefix_caching
            )
        res.reset()
        res.dec = self.dec
        res.oldest = self._oldest_decode
        return TrackedBlockPool(spec.num_gpu_blocks, spec.block_size, self.tree, res)

    def _oldest_decode(self) -> int:
        """The first decode step of the longest-decoding running request (its blocks' births
        are read from the step log when it leaves)."""
        return min(
            (r.dec_d for r in self.running.values() if r.state == DECODE), default=self.dec.d
        )

    # --- planning ---------------------------------------------------------------------------
    def _plan(self, now: float) -> None:  # noqa: PLR0912, PLR0915 - one scheduler step in one function, as vLLM's schedule()
        if self.loading:
            self._promote_loaded(now)
        dec, pool, res = self.dec, self.pool, self.res
        if res is not None:
            res.now = now
        budget = self.max_tokens
        preempted = False
        self._step0 = False
        if dec.r:
            bs, cnt = dec.bs, dec.cnt
            need = cnt[-dec.d % bs]  # = dec.blocks(1), inlined: this runs every event
            while need > pool.total - pool.pinned_total - pool.private_total and self.running:
                self._preempt_newest(now)
                preempted = True
                need = cnt[-dec.d % bs]
            # pool.decode_advance(need, filled), inlined: this runs every event
            filled = cnt[(-dec.d - 1) % bs]
            pool.private_total = private = pool.private_total + need - filled
            pool.cached_total = cached = pool.cached_total + filled
            pool.pinned_total += filled
            if res is not None and need:
                res.allocated(need)
            if cached + private > pool.total:
                pool.evict(cached + private - pool.total)
            self._step0 = True
            budget -= dec.r
        chunks: list[tuple[Req, int]] = []
        if self.prefilling:
            reserve = pool.reserve
            for req in list(self.prefilling.values()):
                if req.state != PREFILL or budget <= 0:
                    continue
                n = req.prompt_len + req.generated - req.computed
                n = n if n < budget else budget
                while not reserve(req, req.computed + n):
                    victim = self._preempt_newest(now)
                    preempted = True
                    if victim is req:
                        break
                if req.state == PREFILL:
                    chunks.append((req, n))
                    budget -= n
        extra = 0.0
        if self.waiting and (not preempted or (not chunks and not dec.r)):
            # (an empty step admits anyway; _admit does nothing without a waiting request)
            extra, budget = self._admit(now, budget, chunks)
        if not chunks and not dec.r:
            self.seg = IDLE
            if self.loading:
                self.seg = WAIT
                self.seg_start = now
                self.seg_usage = (pool.pinned_total + pool.private_total) / pool.total
                self.seg_end = min(r.ready_at for r in self.loading)
            return
        self.seg_start = now
        self.seg_usage = (pool.pinned_total + pool.private_total) / pool.total  # pool.used
        if not chunks and not preempted and extra == 0.0:
            self._plan_jump(now)
            return
        prefill = [(n, r.computed) for r, n in chunks]
        secs = self.cost.step(prefill, dec.r, dec.s) * self.factor + extra
        self.stall_s += extra
        if chunks and self.conn.store_overhead_s:
            secs += self.conn.store_overhead_s
        if chunks and self.conn.sync_store:
            store_s = self.conn.store_seconds(chunks)
            secs += store_s
            self.stall_s += store_s
        self.seg, self.seg_chunks, self.seg_k, self.seg_a = MIXED, chunks, 1, secs
        self.seg_end = now + secs

    def _admit(self, now: float, budget: int, chunks: list[tuple[Req, int]]) -> tuple[float, int]:  # noqa: PLR0912, PLR0915 - admission in one pass, as vLLM's schedule() admits
        """Admit waiting requests FCFS; returns (blocking seconds, budget left)."""
        pool, conn, bs = self.pool, self.conn, self.bs
        waiting, extra = self.waiting, 0.0
        reserve, max_seqs = pool.reserve, self.max_seqs
        caching, start, end, cached = pool.prefix_caching, pool.start, pool.end, pool.cached
        # a head that cannot get blocks ends the admission, unless nothing runs (_unblock)
        while waiting and budget > 0 and len(self.running) < max_seqs:
            req = waiting[0]
            p_eff = req.prompt_len + req.generated
            if req.state == LOADED:
                n = min(p_eff - req.computed, budget)
                if not reserve(req, req.computed + n):
                    if not self.running and not chunks and self._unblock(chunks):
                        continue
                    break
            else:
                limit = (p_eff - 1) // bs  # hit = pool.lookup(req.path, limit) * bs
                hit = 0
                if caching and limit > 0:
                    hit = leading_cached(req.path, start, end, cached, unit=bs, limit=limit) * bs
                ext = 0
                if self.has_conn:
                    # a blocked head is looked up again every step; the connector answers
                    # repeats from its per-request cache, so only the first one costs
                    if not req.looked:
                        extra += conn.lookup_overhead_s
                    ext = conn.lookup(req, p_eff, hit, not req.looked)
                    req.looked = True
                if ext and conn.is_async:
                    if not reserve(req, hit + ext):
                        if not self.running and not chunks and self._unblock(chunks):
                            continue
                        break
                    if self.res is not None and hit:
                        self.res.accessed(req.path, hit // bs)
                    self._count_lookup(req, p_eff, hit, ext)
                    waiting.popleft()
                    req.computed = hit + ext
                    req.ready_at = conn.load(req, hit, ext, now)
                    req.load_t = now
                    req.state = LOADING
                    if self.resume_in_place:  # what-if: its place is taken now
                        self._seq += 1
                        req.seq = self._seq
                    self.loading.append(req)
                    if req.first_scheduled < 0:
                        req.first_scheduled = now
                    continue
                n = p_eff - hit - ext
                n = n if n < budget else budget
                if not reserve(req, hit + ext + n):
                    if not self.running and not chunks and self._unblock(chunks):
                        continue
                    break
                if self.res is not None and hit:
                    self.res.accessed(req.path, hit // bs)
                self._count_lookup(req, p_eff, hit, ext)
                if ext:
                    extra += conn.load(req, hit, ext, now)
                req.computed = hit + ext
            waiting.popleft()
            if req.state == LOADED:
                self.loads += 1
                self.load_wait_s += now - req.load_t
                req.state = PREFILL
                self._enter_after_load(req)
            else:
                req.state = PREFILL
                self._seq += 1
                req.seq = self._seq
                self.running[req.seq] = req
                self.prefilling[req.seq] = req
            if req.first_scheduled < 0:
                req.first_scheduled = now
            chunks.append((req, n))
            budget -= n
        return extra, budget

    def _count_lookup(self, req: Req, p_eff: int, hit: int, ext: int) -> None:
        tel = self.tel.counters
        tel["prefix_cache_queries_total"] += p_eff
        tel["prefix_cache_hits_total"] += hit
        if self.has_conn:
            tel["external_prefix_cache_queries_total"] += p_eff
            tel["external_prefix_cache_hits_total"] += ext
        self.avoided_tokens += ext
        if req.cached_prompt < 0:
            req.cached_prompt = hit + ext  # cached prompt tokens of the first admission
            req.ext_tokens = ext

    def _plan_jump(self, now: float) -> None:
        dec, pool = self.dec, self.pool
        r, s = dec.r, dec.s
        available = pool.total - pool.pinned_total - pool.private_total
        # k = min(steps to the next completion, steps the free blocks allow, max_jump)
        k = dec.next_end() - dec.d
        fit = 1 + dec.steps_within(available, 1)
        k = k if k < fit else fit
        k = k if k < self.max_jump else self.max_jump
        step, factor = self.cost.decode, self.factor
        a = step(r, s) * factor
        b = 0.0
        if k > 1:
            b = (step(r, s + r * (k - 1)) * factor - a) / (k - 1)
        self.seg, self.seg_k, self.seg_a, self.seg_b = JUMP, k, a, b
        self.seg_end = now + (k * a + b * k * (k - 1) / 2.0)  # now + self._cum(k)
        limit = self.horizon
        if self.loading:
            limit = min(limit, *(r.ready_at for r in self.loading))
        if self.seg_end > limit > now:
            self.seg_k = min(k, self._steps_by(limit - now) + 1)
            self.seg_end = now + self._cum(self.seg_k)

    def _cum(self, m: int) -> float:
        return m * self.seg_a + self.seg_b * m * (m - 1) / 2.0

    def _steps_by(self, elapsed: float) -> int:
        """Steps of the current jump that end by `elapsed` seconds after its start."""
        a, b, k = self.seg_a, self.seg_b, self.seg_k
        if b <= 1e-15 * a:
            m = int(elapsed / a) if a > 0 else k
        else:
            h = a - b / 2.0
            m = int((-h + math.sqrt(h * h + 2.0 * b * elapsed)) / b)
        m = max(0, min(k, m))
        while m < k and self._cum(m + 1) <= elapsed:
            m += 1
        while m > 0 and self._cum(m) > elapsed:
            m -= 1
        return m

    def _truncate(self, t: float, *, after: bool) -> bool:
        m = self._steps_by(t - self.seg_start)
        k = min(self.seg_k, m + 1) if after else m
        if k >= self.seg_k or k < 1:
            return False
        self.seg_k = k
        self.seg_end = self.seg_start + self._cum(k)
        return True
