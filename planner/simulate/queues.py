"""Requests leaving and re-entering a simulated engine's batch: async loads that finish,
their entry into the running queue, the no-deadlock escape, and preemption (a mixin of
Engine, which owns and initialises the attributes below).

Queue order follows vLLM v1's Scheduler (vllm/v1/core/sched/scheduler.py): loads done go
ahead of a preempted request (``skipped_waiting``), and a request resumed after a load is
appended to ``running``, so it is the next preemption victim.

Design: planner/simulate/METHODS.md#queues
"""

from __future__ import annotations

from planner.simulate.commit import LOADED, WAITING, EngineCommit
from planner.simulate.decode import DECODE
from planner.simulate.request import Req


class EngineQueues(EngineCommit):
    loading: list[Req]
    resume_in_place: bool
    preemptions: int
    preempted_after_load: int
    max_req_preemptions: int
    _seq: int

    def _promote_loaded(self, now: float) -> None:
        if not self.loading:
            return
        ready = [r for r in self.loading if r.ready_at <= now]
        if ready:
            self.loading = [r for r in self.loading if r.ready_at > now]
            for req in sorted(ready, key=lambda r: (r.ready_at, r.rid), reverse=True):
                req.state = LOADED
                self.waiting.appendleft(req)

    def _enter_after_load(self, req: Req) -> None:
        """A request whose async load is done enters `running`. vLLM appends it
        (vllm/v1/core/sched/scheduler.py, Scheduler.schedule(): a WAITING_FOR_REMOTE_KVS
        request that is ready is scheduled like a new one, `self.running.append(request)`),
        behind the requests admitted while it loaded, and FCFS preemption takes the last
        (`self.running.pop()`). `in_place` keeps the seq taken when its load began."""
        if not self.resume_in_place:
            self._seq += 1
            req.seq = self._seq
        newest = next(reversed(self.running), -1)
        self.running[req.seq] = req
        self.prefilling[req.seq] = req
        if newest > req.seq:  # in_place behind requests admitted while it loaded
            self.running = dict(sorted(self.running.items()))
            self.prefilling = dict(sorted(self.prefilling.items()))

    def _unblock(self, chunks: list[tuple[Req, int]]) -> bool:
        """The waiting head cannot get blocks while nothing runs: only requests whose KV was
        loaded (and wait behind the head) hold blocks. Let the first of them go first, or if
        the head is one, send the others back to plain waiting (their KV stays in the
        connector's cache) so the engine cannot deadlock. True = retry the admission."""
        if self.running or chunks:
            return False
        waiting = self.waiting
        for i in range(1, len(waiting) if waiting[0].state != LOADED else 0):
            if waiting[i].state == LOADED:
                req = waiting[i]
                del waiting[i]
                waiting.appendleft(req)
                return True
        freed = False
        for req in list(waiting)[1:]:
            if req.state == LOADED:
                self.pool.release(req)
                req.computed = 0
                req.state = WAITING
                req.looked = False
                req.load_t = -1.0
                freed = True
        return freed

    def _preempt_newest(self, now: float) -> Req:
        seq = next(reversed(self.running))
        req = self.running.pop(seq)
        pool = self.pool
        if req.state == DECODE:
            c = self.dec.remove(req)
            req.generated = c - req.prompt_len + 1
            pool.settle_decode(req, c + 1 if self._step0 else c)
            self._mark_decoded(req, c)
        else:
            del self.prefilling[seq]
            c = req.computed
        if self.has_conn:
            self.conn.store_on_release(req, c, now)
        pool.release(req)
        req.computed = 0
        req.state = WAITING
        req.looked = False
        req.num_preemptions += 1
        self.max_req_preemptions = max(self.max_req_preemptions, req.num_preemptions)
        if req.load_t >= 0.0:
            self.preempted_after_load += 1
            req.load_t = -1.0
        waiting = self.waiting
        if waiting and waiting[0].state == LOADED:
            # requests whose loads are done stay ahead of the victim: vLLM parks them in
            # `skipped_waiting`, which FCFS serves first (Scheduler.
            # _select_waiting_queue_for_scheduling: `self.skipped_waiting or self.waiting`),
            # and prepends the victim to `waiting` (Scheduler._preempt_request)
            i = 1
            while i < len(waiting) and waiting[i].state == LOADED:
                i += 1
            waiting.insert(i, req)
        else:
            waiting.appendleft(req)
        self.preemptions += 1
        self.tel.counters["preemptions_total"] += 1
        return req
