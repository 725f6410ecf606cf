"""Request streams: the requests a workload sends, open-loop arrivals and follow-ups.

A request's prompt is a path of segments in the global ContentTree; every random stream has
its own string-seeded random.Random. Looping (``period``) restarts the arrival process each
period with fresh draws while the content catalogue, ids, sessions and clients carry over;
stages (a rate ramp) run one pass.

Design: planner/simulate/METHODS.md#workload
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Iterator

from core.errors import ConfigError
from planner.simulate.content import ContentTree
from planner.simulate.request import Req
from planner.simulate.workload_spec import WorkloadSpec

__all__ = ["ContentTree", "Req", "Workload"]


def _zipf_cdf(n: int, s: float) -> list[float]:
    weights = list(itertools.accumulate(1.0 / (i + 1) ** s for i in range(n)))
    return [w / weights[-1] for w in weights]


class Workload:
    """Produces requests: initial ones, one after each arrival (open loop) and after each
    completion (closed loop / next turn of a session)."""

    def __init__(
        self, spec: WorkloadSpec, seed: int, tree: ContentTree, *, period: float | None = None
    ) -> None:
        """`period`: loop the arrival process every `period` simulated seconds
        (METHODS.md#workload); None = one pass (a batch run)."""
        self.spec = spec
        self.tree = tree
        self.seed = seed
        self.period = period
        self.loop = 0  # index of the current loop
        self.offset = 0.0  # simulated time the current loop started
        self.loop_end = period if period is not None else math.inf
        self._streams()
        self.issued = 0  # requests ever issued (request ids)
        self._loop_issued = 0  # in this loop (the num_requests cap)
        self._idle: list[int] = []  # closed-loop clients a cap stopped (looping only)
        self.exhausted = False
        self._sys_node = -1
        self._session = 0
        self._dataset: Iterator[tuple[int, int]] | None = None
        self._questions: dict[tuple[int, int], int] = {}
        self._cdf: list[float] = []
        self._trace_i = 0
        self._rate = spec.qps if spec.qps is not None else 0.0  # open-loop arrivals per second
        self._items: list[tuple[int, int]] = []  # a finite shared-prefix dataset, in order
        self._stage = -1  # the current stage of a ramp (-1: none yet / no ramp)
        self._stage_left = 0  # requests the current stage has still to issue
        self._stage_open = 0  # issued and not finished
        self.stage_starts: list[float] = []
        self.stage_first_rid: list[int] = []
        if spec.stages and period is not None:
            raise ConfigError("workload.stages: a rate ramp runs once; it cannot loop")
        if spec.kind == "shared_prefix":
            self._init_shared_prefix()
        elif spec.kind == "rag":
            self._cdf = _zipf_cdf(spec.documents, spec.zipf_s)
        if spec.system_prompt_tokens and spec.kind in {"multi_turn", "rag", "synthetic"}:
            self._sys_node = tree.shared(-1, ("system",), spec.system_prompt_tokens)

    def _streams(self) -> None:
        """The random streams of the current loop (loop 0: those of a run without looping)."""
        tag = f"{self.seed}" if self.loop == 0 else f"{self.seed}:loop{self.loop}"
        self.rng_arrival = random.Random(f"{tag}:arrival")
        self.rng_len = random.Random(f"{tag}:lengths")
        self.rng_pick = random.Random(f"{tag}:pick")

    # --- arrival hooks ----------------------------------------------------------------------
    def initial(self) -> list[Req]:
        spec = self.spec
        if spec.stages:
            return [self._start_stage(0.0)]
        if spec.kind == "trace":
            first = self._from_trace()
            return [first] if first else []
        if spec.concurrency is not None:
            out = []
            for client in range(spec.concurrency):
                req = self._fresh(0.0, client)
                if req is None:
                    if self.period is not None:
                        self._idle.extend(range(client, spec.concurrency))
                    break
                out.append(req)
            return out
        return self._first_open()

    def _first_open(self) -> list[Req]:
        t = self.offset + self._next_open_time(0.0)
        req = self._fresh(t, -1) if t < self.loop_end else None
        return [req] if req else []

    def after_arrival(self, req: Req) -> Req | None:
        """Open loops schedule the next arrival when one arrives (one pending at a time); a
        looping one stops at the end of its loop (next_loop starts the next)."""
        if self.spec.kind == "trace":
            return self._from_trace()
        if self.spec.stages:
            if not self._stage_left:
                return None
            return self._fresh(self._next_open_time(req.arrival), -1)
        if self.spec.qps is None or req.turn > 0:
            return None
        t = self.offset + self._next_open_time(req.arrival - self.offset)
        if t >= self.loop_end:
            return None
        return self._fresh(t, -1)

    def after_completion(self, req: Req, t: float) -> Req | None:
        spec = self.spec
        if spec.stages:
            self._stage_open -= 1
            if self._stage_left or self._stage_open or self._stage + 1 >= len(spec.stages):
                return None
            return self._start_stage(t + spec.stage_gap_s)  # the stage has drained
        if spec.kind == "multi_turn" and req.turn + 1 < spec.turns:
            nxt = self._next_turn(req, t + spec.think_time_s)
        elif spec.concurrency is not None and spec.kind != "trace":
            nxt = self._fresh(t + spec.think_time_s, req.client)
        else:
            return None
        if nxt is None and self.period is not None and req.client >= 0:
            self._idle.append(req.client)  # stopped by the cap: the next loop restarts it
        return nxt

    def next_loop(self) -> list[Req]:
        """Start the next loop (at simulated time `loop_end`): fresh random streams, the
        per-loop cap and dataset reset; returns the loop's first requests (open loop: its
        first arrival; trace: its first record; closed loop: the clients a cap stopped)."""
        if self.period is None:
            raise RuntimeError("next_loop() on a workload without a period")
        spec = self.spec
        self.loop += 1
        self.offset = self.loop * self.period
        self.loop_end = (self.loop + 1) * self.period
        self._streams()
        self._loop_issued = 0
        self.exhausted = False
        self._trace_i = 0
        if spec.kind == "shared_prefix":
            self._init_shared_prefix()
        if spec.kind == "trace":
            first = self._from_trace()
            return [first] if first else []
        if spec.concurrency is None:
            return self._first_open()
        idle, self._idle = sorted(self._idle), []
        out: list[Req] = []
        for i, client in enumerate(idle):
            req = self._fresh(self.offset, client)
            if req is None:
                self._idle.extend(idle[i:])
                break
            out.append(req)
        return out

    def durable_nodes(self) -> list[int]:
        """Content future requests can name again, whatever holds it now: the catalogue
        (system prompt, prefix groups, documents a request starts with, trace prefixes, the
        shared-prefix questions). Deeper shared chains (a RAG request's later documents) are
        combinations, kept only while something holds them (ContentTree.prune)."""
        out = self.tree.interned_after({-1, self._sys_node})
        out.extend(self._questions.values())
        return out

    def _start_stage(self, t: float) -> Req:
        """Stage k+1 of a ramp starts at t: its rate, its count and (restart) the dataset."""
        spec = self.spec
        self._stage += 1
        stage = spec.stages[self._stage]
        self._rate, self._stage_left = stage.qps, stage.requests
        self.stage_starts.append(t)
        self.stage_first_rid.append(self.issued)
        if self._items and (spec.stage_dataset == "restart" or self._stage == 0):
            self._dataset = itertools.cycle(self._items)  # a ramp cycles a finite dataset
        req = self._fresh(self._next_open_time(t), -1)
        assert req is not None  # a stage sends >= 1 request (workload_spec._stages)
        return req

    # --- arrival processes -------------------------------------------------------------------
    def _next_open_time(self, t: float) -> float:
        spec, rng = self.spec, self.rng_arrival
        rate = self._rate
        if spec.arrival == "poisson":
            return t + rng.expovariate(rate)
        if spec.arrival == "bursty":
            shape = spec.burstiness
            return t + rng.gammavariate(shape, 1.0 / (rate * shape))
        peak = rate * (1.0 + spec.diurnal_amplitude)
        while True:  # thinning (Lewis & Shedler) of a sinusoidal rate
            t += rng.expovariate(peak)
            now = rate * (
                1.0 + spec.diurnal_amplitude * math.sin(2.0 * math.pi * t / spec.diurnal_period_s)
            )
            if rng.random() * peak <= now:
                return t

    # --- request construction ----------------------------------------------------------------
    def _count(self) -> bool:
        if self._stage >= 0:  # a ramp: the stage's own count
            self._stage_left -= 1
            self._stage_open += 1
            self.issued += 1
            return True
        cap = self.spec.num_requests
        if cap is not None and self._loop_issued >= cap:
            self.exhausted = True
            return False
        self.issued += 1
        self._loop_issued += 1
        return True

    def _finish(
        self,
        t: float,
        path: list[int],
        prompt_len: int,
        affinity: int,
        *,
        client: int,
        turn: int = 0,
    ) -> Req:
        out_len = self.spec.output_tokens.sample(self.rng_len)
        path.append(self.tree.new(path[-1], out_len))
        return Req(
            self.issued - 1,
            t,
            path,
            prompt_len,
            out_len,
            affinity=affinity,
            client=client,
            turn=turn,
        )

    def _fresh(self, t: float, client: int) -> Req | None:
        kind = self.spec.kind
        if kind == "shared_prefix":
            return self._shared_prefix(t, client)
        if kind == "multi_turn":
            return self._new_session(t, client)
        if not self._count():
            return None
        if kind == "rag":
            return self._rag(t, client)
        own = self.spec.prompt_tokens.sample(self.rng_len)
        path = []
        parent = self._sys_node
        if parent >= 0:
            path.append(parent)
        node = self.tree.new(parent, own)
        path.append(node)
        return self._finish(t, path, self.tree.end[node], self.issued, client=client)

    def _init_shared_prefix(self) -> None:
        spec = self.spec
        if spec.popularity == "zipf":
            self._cdf = _zipf_cdf(spec.groups, spec.zipf_s)
            return
        items = [(g, i) for g in range(spec.groups) for i in range(spec.prompts_per_group)]
        if spec.order == "shuffled":
            self.rng_pick.shuffle(items)
        self._items = items
        self._dataset = itertools.cycle(items) if spec.repeat else iter(items)

    def _shared_prefix(self, t: float, client: int) -> Req | None:
        spec = self.spec
        if self._dataset is not None:
            item = next(self._dataset, None)
            if item is None:
                self.exhausted = True
                return None
            g, i = item
        else:
            g = bisect.bisect_left(self._cdf, self.rng_pick.random())
            i = self.rng_pick.randrange(spec.prompts_per_group)
        if not self._count():
            return None
        prefix = self.tree.shared(-1, ("group", g), spec.system_prompt_tokens)
        q_node = self._questions.get((g, i))
        if q_node is None:
            q_node = self.tree.new(prefix, spec.question_tokens.sample(self.rng_len))
            self._questions[(g, i)] = q_node
        prompt = self.tree.end[q_node]
        return self._finish(t, [prefix, q_node], prompt, g, client=client)

    def _rag(self, t: float, client: int) -> Req:
        spec = self.spec
        docs: list[int] = []
        while len(docs) < spec.docs_per_request:
            d = bisect.bisect_left(self._cdf, self.rng_pick.random())
            if d not in docs:
                docs.append(d)
        path: list[int] = []
        parent = self._sys_node
        if parent >= 0:
            path.append(parent)
        for d in docs:
            parent = self.tree.shared(parent, ("doc", d), spec.doc_tokens)
            path.append(parent)
        q = self.tree.new(parent, spec.question_tokens.sample(self.rng_len))
        path.append(q)
        return self._finish(t, path, self.tree.end[q], docs[0], client=client)

    def _new_session(self, t: float, client: int) -> Req | None:
        if not self._count():
            return None
        self._session += 1
        path: list[int] = []
        parent = self._sys_node
        if parent >= 0:
            path.append(parent)
        q = self.tree.new(parent, self.spec.question_tokens.sample(self.rng_len))
        path.append(q)
        return self._finish(t, path, self.tree.end[q], self._session, client=client)

    def _next_turn(self, prev: Req, t: float) -> Req | None:
        if not self._count():
            return None
        path = list(prev.path)  # history: earlier prompts and the previous answer
        q = self.tree.new(path[-1], self.spec.question_tokens.sample(self.rng_len))
        path.append(q)
        return self._finish(
            t, path, self.tree.end[q], prev.affinity, client=prev.client, turn=prev.turn + 1
        )

    def _from_trace(self) -> Req | None:
        recs = self.spec.trace
        if self._trace_i >= len(recs):
            self.exhausted = True
            return None
        rec = recs[self._trace_i]
        t = self.offset + rec.arrival_s
        if t >= self.loop_end:  # looping: the rest of the trace lies beyond the period
            self._trace_i = len(recs)
            return None
        self._trace_i += 1
        if not self._count():
            return None
        path: list[int] = []
        parent = -1
        affinity = self.issued
        if rec.prefix_group is not None:
            parent = self.tree.shared(
                -1, ("trace", rec.prefix_group, rec.prefix_tokens), rec.prefix_tokens
            )
            path.append(parent)
            affinity = -1 - parent  # stable per prefix group
        if rec.prompt_tokens > rec.prefix_tokens or not path:
            path.append(self.tree.new(parent, rec.prompt_tokens - rec.prefix_tokens))
        req = Req(
            self.issued - 1,
            t,
            path,
            rec.prompt_tokens,
            rec.output_tokens,
            affinity=affinity,
        )
        req.path.append(self.tree.new(path[-1], rec.output_tokens))
        return req

    @property
    def closed_loop(self) -> bool:
        return self.spec.concurrency is not None
