"""DecodeBatch's closed-form block counts against counting every sequence step by step."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.simulate.decode import DecodeBatch
from planner.simulate.request import Req


def _brute(dec: DecodeBatch, reqs: list[Req], k: int, offset: int) -> tuple[int, int]:
    """A sequence with c computed tokens allocates a block at a step where c % bs == 0 and
    fills one where (c + 1) % bs == 0; at step j from now it has computed(req) + j."""
    bs, alloc, filled = dec.bs, 0, 0
    for req in reqs:
        c = dec.computed(req)
        for j in range(offset, offset + k):
            alloc += (c + j) % bs == 0
            filled += (c + j + 1) % bs == 0
    return alloc, filled


@settings(max_examples=200, deadline=None)
@given(
    bs=st.sampled_from([1, 2, 16, 32]),
    joins=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 5000)), max_size=12),
    k=st.integers(0, 100),
    offset=st.integers(0, 3),
)
def test_blocks_match_a_per_sequence_count(
    bs: int, joins: list[tuple[int, int]], k: int, offset: int
) -> None:
    dec = DecodeBatch(bs)
    reqs: list[Req] = []
    for i, (wait, computed) in enumerate(joins):
        dec.advance(wait)  # sequences join at different decode steps (phases)
        req = Req(i, 0.0, [0], computed, 10_000, affinity=0)
        req.seq = i
        dec.add(req, computed, 10_000)
        reqs.append(req)
    assert dec.blocks(k, offset) == _brute(dec, reqs, k, offset)
