"""Request streams: content identity (a prefix tree of token segments) and arrivals.

A request's prompt is a path of segments in a global ContentTree; two requests share KV
exactly as far as their paths share nodes (a block's hash covers every token before it, as
in vLLM's and LMCache's chained hashes). The last node of a path is the request's own output.
Every random stream has its own random.Random seeded with a string (sha512-seeded, so no
dependence on PYTHONHASHSEED).
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Iterator

from planner.simulate.workload_spec import WorkloadSpec


class ContentTree:
    """Segments of token content: node -> (parent, start token, end token)."""

    __slots__ = ("_interned", "end", "hw", "parent", "start")

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.start: list[int] = []
        self.end: list[int] = []
        self.hw: list[int] = []  # tokens of the node ever computed anywhere (re-prefill counting)
        self._interned: dict[tuple[int, object], int] = {}

    def new(self, parent: int, length: int) -> int:
        """A fresh node (content nobody else has) of `length` tokens after `parent` (-1 = root)."""
        start = self.end[parent] if parent >= 0 else 0
        self.parent.append(parent)
        self.start.append(start)
        self.end.append(start + length)
        self.hw.append(0)
        return len(self.parent) - 1

    def shared(self, parent: int, key: object, length: int) -> int:
        """The node for content `key` after `parent`, created once (same key = same tokens)."""
        node = self._interned.get((parent, key))
        if node is None:
            node = self.new(parent, length)
            self._interned[(parent, key)] = node
        return node

    def __len__(self) -> int:
        return len(self.parent)


class Req:
    """One request and its scheduler state (slotted: the simulator makes millions)."""

    __slots__ = (
        "affinity",
        "arrival",
        "cached_prompt",
        "client",
        "computed",
        "dec_c",
        "dec_d",
        "end_d",
        "engine",
        "ext_tokens",
        "first_scheduled",
        "first_token",
        "generated",
        "hold_blocks",
        "hold_idx",
        "last_token_t",
        "load_t",
        "looked",
        "num_preemptions",
        "output_len",
        "path",
        "private",
        "prompt_len",
        "ready_at",
        "rid",
        "seq",
        "state",
        "turn",
    )

    def __init__(
        self,
        rid: int,
        arrival: float,
        path: list[int],
        prompt_len: int,
        output_len: int,
        *,
        affinity: int,
        client: int = -1,
        turn: int = 0,
    ) -> None:
        self.rid = rid
        self.arrival = arrival
        self.path = path  # prompt segments, then the output segment
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.affinity = affinity
        self.client = client
        self.turn = turn
        self.engine = -1
        self.state = 0
        self.computed = 0  # tokens whose KV is computed (materialised)
        self.generated = 0  # output tokens produced
        self.hold_idx = 0  # GPU blocks held: all of path[:hold_idx] + hold_blocks of the next
        self.hold_blocks = 0
        self.private = 0  # a partial (unhashed) block held
        self.dec_c = 0  # lazy decode: computed tokens at decode counter dec_d
        self.dec_d = 0
        self.end_d = 0
        self.seq = 0  # admission order on its engine (preemption takes the newest)
        self.ext_tokens = 0
        self.ready_at = 0.0
        self.load_t = -1.0  # start of the async load its current residency began with
        self.first_scheduled = -1.0
        self.cached_prompt = -1  # prompt tokens found cached at the first admission
        self.first_token = -1.0
        self.last_token_t = -1.0
        self.num_preemptions = 0
        self.looked = False  # connector lookup already charged for this queueing

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.output_len


def _zipf_cdf(n: int, s: float) -> list[float]:
    weights = list(itertools.accumulate(1.0 / (i + 1) ** s for i in range(n)))
    return [w / weights[-1] for w in weights]


class Workload:
    """Produces requests: initial ones, one after each arrival (open loop) and after each
    completion (closed loop / next turn of a session)."""

    def __init__(self, spec: WorkloadSpec, seed: int, tree: ContentTree) -> None:
        self.spec = spec
        self.tree = tree
        self.rng_arrival = random.Random(f"{seed}:arrival")
        self.rng_len = random.Random(f"{seed}:lengths")
        self.rng_pick = random.Random(f"{seed}:pick")
        self.issued = 0
        self.exhausted = False
        self._sys_node = -1
        self._session = 0
        self._dataset: Iterator[tuple[int, int]] | None = None
        self._questions: dict[tuple[int, int], int] = {}
        self._cdf: list[float] = []
        self._trace_i = 0
        if spec.kind == "shared_prefix":
            self._init_shared_prefix()
        elif spec.kind == "rag":
            self._cdf = _zipf_cdf(spec.documents, spec.zipf_s)
        if spec.system_prompt_tokens and spec.kind in {"multi_turn", "rag", "synthetic"}:
            self._sys_node = tree.shared(-1, ("system",), spec.system_prompt_tokens)

    # --- arrival hooks ----------------------------------------------------------------------
    def initial(self) -> list[Req]:
        spec = self.spec
        if spec.kind == "trace":
            first = self._from_trace()
            return [first] if first else []
        if spec.concurrency is not None:
            out = []
            for client in range(spec.concurrency):
                req = self._fresh(0.0, client)
                if req is None:
                    break
                out.append(req)
            return out
        req = self._fresh(self._next_open_time(0.0), -1)
        return [req] if req else []

    def after_arrival(self, req: Req) -> Req | None:
        """Open loops schedule the next arrival when one arrives (one pending at a time)."""
        if self.spec.kind == "trace":
            return self._from_trace()
        if self.spec.qps is None or req.turn > 0:
            return None
        return self._fresh(self._next_open_time(req.arrival), -1)

    def after_completion(self, req: Req, t: float) -> Req | None:
        spec = self.spec
        if spec.kind == "multi_turn" and req.turn + 1 < spec.turns:
            return self._next_turn(req, t + spec.think_time_s)
        if spec.concurrency is not None and spec.kind != "trace":
            return self._fresh(t + spec.think_time_s, req.client)
        return None

    # --- arrival processes -------------------------------------------------------------------
    def _next_open_time(self, t: float) -> float:
        spec, rng = self.spec, self.rng_arrival
        assert spec.qps is not None
        if spec.arrival == "poisson":
            return t + rng.expovariate(spec.qps)
        if spec.arrival == "bursty":
            shape = spec.burstiness
            return t + rng.gammavariate(shape, 1.0 / (spec.qps * shape))
        import math

        peak = spec.qps * (1.0 + spec.diurnal_amplitude)
        while True:  # thinning (Lewis & Shedler) of a sinusoidal rate
            t += rng.expovariate(peak)
            rate = spec.qps * (
                1.0 + spec.diurnal_amplitude * math.sin(2.0 * math.pi * t / spec.diurnal_period_s)
            )
            if rng.random() * peak <= rate:
                return t

    # --- request construction ----------------------------------------------------------------
    def _count(self) -> bool:
        cap = self.spec.num_requests
        if cap is not None and self.issued >= cap:
            self.exhausted = True
            return False
        self.issued += 1
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
            rec.arrival_s,
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
