"""One simulated request and its scheduler state (Workload makes them, engines move them)."""

from __future__ import annotations


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

    def retry(self, t: float) -> None:
        """Start over at `t`, as sent again by its client: its engine restarted and aborted it
        (vLLM's default shutdown aborts in-flight requests), so nothing of its progress is
        kept; the engine it reaches sees a new request arriving at `t`."""
        self.arrival = t
        self.engine = -1
        self.state = 0
        self.computed = 0
        self.generated = 0
        self.hold_idx = 0
        self.hold_blocks = 0
        self.private = 0
        self.dec_c = 0
        self.dec_d = 0
        self.end_d = 0
        self.seq = 0
        self.ext_tokens = 0
        self.ready_at = 0.0
        self.load_t = -1.0
        self.first_scheduled = -1.0
        self.cached_prompt = -1
        self.first_token = -1.0
        self.last_token_t = -1.0
        self.num_preemptions = 0
        self.looked = False

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.output_len
