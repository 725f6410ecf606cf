"""The simulator gives, bit for bit, what the implementation before its optimisation gave
(issue 13: faster, results identical for a seed): short runs of the bundled scenarios, a
mixed cluster with async LMCache and in-place resume, the naive per-step loop and a served
(looping, pruned) run, against tests/planner/simulate/fixtures/golden_sim.json (golden.py
says how it was recorded)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.planner.simulate import golden


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(golden.FIXTURE.read_text(encoding="utf-8"))
    return doc


@pytest.fixture(scope="module")
def now() -> dict[str, Any]:
    # through a JSON round trip, as the fixture was written (tuples become lists)
    doc: dict[str, Any] = json.loads(json.dumps(golden.golden(), sort_keys=True))
    return doc


def test_golden_covers_every_run(recorded: dict[str, Any], now: dict[str, Any]) -> None:
    assert sorted(now) == sorted(recorded)
    # the runs exercise what they are there for (a fixture of empty runs would prove nothing)
    assert recorded["saturated_16x_h100"]["summary"]["preemptions"] > 1000
    assert recorded["mixed_async_in_place"]["summary"]["preempted_after_load"] > 0
    assert recorded["multi_turn"]["summary"]["async_loads"] > 0
    assert recorded["rag_bursty"]["summary"]["avoided_reprefill_tokens"] > 0
    assert recorded["demo_served"]["prunes"] > 0 and recorded["demo_served"]["loops"] > 0


@pytest.mark.parametrize(
    "name",
    [*golden.BATCH, "mixed_async_in_place", "saturated_naive", "demo_served"],
)
def test_run_identical_to_recorded(
    name: str, recorded: dict[str, Any], now: dict[str, Any]
) -> None:
    want, got = recorded[name], now[name]
    if "summary" in want:  # readable first: the totals a user sees
        assert got["summary"] == want["summary"]
    assert got == want
