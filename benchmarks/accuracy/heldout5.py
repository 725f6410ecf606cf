"""Held-out set 5, frozen before it was run: synthetic clusters (benchmarks/accuracy/fitsynth.py)
on which the planned experiment (planner/plan/experiment.py) is tried.

Each case is drawn from ``random.Random(SEED * 1000 + index)``; nothing here was tuned on the
results (this file is committed before benchmarks/accuracy/study_experiment.py first ran it).
A case: engines, how many run native offload at first (spread evenly), the pilot history in
60 s windows, the generator's additive gain (``gain_slope · (u − break_even)`` tokens/s;
negative slopes: offload costs above u*), window noise and engine spread in tokens/s.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SEED = 5005
CASES = 24


@dataclass(frozen=True, slots=True)
class Case:
    index: int
    seed: int  # of the synthetic cluster
    engines: int
    treated: int  # engines with native offload in the pilot
    pilot_windows: int  # per engine
    break_even: float
    gain_slope: float
    noise_tokens_per_s: float
    engine_sd_tokens_per_s: float

    @property
    def name(self) -> str:
        return f"heldout5-{self.index:02d}"


def case(index: int) -> Case:
    """Case ``index`` of the frozen set."""
    rng = random.Random(SEED * 1000 + index)
    engines = rng.choice((8, 12, 16))
    noise = rng.uniform(300.0, 900.0)
    return Case(
        index=index,
        seed=rng.randrange(1, 2**31),
        engines=engines,
        treated=rng.choice((2, 3)),
        pilot_windows=rng.choice((60, 90, 120, 180)),
        break_even=round(rng.uniform(0.2, 0.6), 3),
        gain_slope=rng.choice((-1500.0, -500.0, 500.0, 1000.0, 2000.0, 4000.0)),
        noise_tokens_per_s=round(noise, 1),
        engine_sd_tokens_per_s=round(noise * rng.uniform(0.05, 0.3), 1),
    )


def cases() -> tuple[Case, ...]:
    """The whole frozen set."""
    return tuple(case(i) for i in range(CASES))
