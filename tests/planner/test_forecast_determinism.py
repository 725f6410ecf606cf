"""planner.forecast.demand is a function of its input: same series + seed -> the same numbers.

Before: candidates were skipped once half of max_seconds had passed and the simulation past
80 %, so on a loaded machine the same series gave another model and another P(saturation),
with nothing saying so. Now the work is bounded by counts (optimiser caps, origins, simulated
draws); max_seconds is a guard whose cuts are recorded in ``Forecast.truncated``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from planner.forecast.demand import forecast_demand
from planner.forecast.saturation import (
    MAX_SIM_DRAWS,
    MIN_SIMULATED_PATHS,
    SIMULATED_PATHS,
    simulated_paths,
)

T0 = 1_699_920_000.0
HOUR = 3600.0
ROOT = Path(__file__).resolve().parents[2]


def rising(hours: float, seed: int) -> pd.Series:
    """1-minute KV demand rising towards a 2e4 capacity with noise (crossing likely, not sure)."""
    rng = np.random.default_rng(seed)
    t = T0 + 60.0 * np.arange(int(hours * 60))
    h = (t - T0) / HOUR
    return pd.Series(1e4 + 8e2 * h + rng.normal(0.0, 400.0, t.size), index=t)


SCRIPT = """
import json, sys
import numpy as np, pandas as pd
from planner.forecast.demand import forecast_demand
t = np.array(json.loads(sys.argv[1])); v = np.array(json.loads(sys.argv[2]))
f = forecast_demand(pd.Series(v, index=t), horizon_s=6 * 3600, capacity=2e4, seed=5)
print(json.dumps(f.to_dict(timings=False), sort_keys=True))
"""


def test_forecast_same_series_twice_identical_numbers_and_probability() -> None:
    s = rising(6, seed=2)
    a = forecast_demand(s, horizon_s=6 * HOUR, capacity=2e4, seed=5)
    b = forecast_demand(s.copy(), horizon_s=6 * HOUR, capacity=2e4, seed=5)
    assert a.truncated == () and b.truncated == ()
    assert a.saturation_probability is not None and 0.0 < a.saturation_probability < 1.0
    assert a.to_dict(timings=False) == b.to_dict(timings=False)
    assert (a.points, a.time_to_saturation_lo_s, a.time_to_saturation_hi_s) == (
        b.points,
        b.time_to_saturation_lo_s,
        b.time_to_saturation_hi_s,
    )


def test_forecast_other_process_and_hash_seed_same_numbers() -> None:
    s = rising(6, seed=2)
    here = forecast_demand(s, horizon_s=6 * HOUR, capacity=2e4, seed=5).to_dict(timings=False)
    args = [json.dumps(s.index.tolist()), json.dumps(s.tolist())]
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": "12345", "PYTHONWARNINGS": "ignore"},
        timeout=300,
    )
    there = json.loads(out.stdout)
    assert there == json.loads(json.dumps(here, sort_keys=True))


def test_forecast_other_seed_probability_within_monte_carlo_error() -> None:
    s = rising(6, seed=2)
    a = forecast_demand(s, horizon_s=6 * HOUR, capacity=2e4, seed=5)
    b = forecast_demand(s, horizon_s=6 * HOUR, capacity=2e4, seed=6)
    assert a.method == b.method and a.points == b.points
    assert a.saturation_probability is not None and b.saturation_probability is not None
    assert a.saturation_probability_se is not None and a.saturation_probability_se > 0
    assert a.saturation_paths == SIMULATED_PATHS
    # two independent estimates of one p: their difference has sd sqrt(2)·se; 4.5 sd allowed
    se = max(a.saturation_probability_se, b.saturation_probability_se or 0.0)
    assert abs(a.saturation_probability - b.saturation_probability) <= 4.5 * 2**0.5 * se
    assert any("Monte Carlo standard error" in x for x in a.assumptions)


def test_forecast_guard_cut_is_recorded_as_speed_dependent() -> None:
    s = rising(6, seed=2)
    f = forecast_demand(s, horizon_s=HOUR, capacity=2e4, max_seconds=1e-9)
    assert f.method.startswith("naive")
    assert [c.status.startswith("skipped") for c in f.candidates] == [False, True, True, True]
    assert f.truncated == (
        "candidate ETS(A,Ad,N) not tried",
        "candidate ETS(A,A,N) not tried",
        "candidate SARIMAX(1,0,0)+[1,t] not tried",
        "crossing probability not simulated",
    )
    assert f.saturation_probability is None and f.saturation_paths is None
    assert any("depends on the machine's speed" in w for w in f.warnings)
    assert f.to_dict()["truncated"] == list(f.truncated)


def test_forecast_ample_budget_same_result_as_default() -> None:
    s = rising(6, seed=3)
    a = forecast_demand(s, horizon_s=2 * HOUR, capacity=2e4, seed=1, max_seconds=1e6)
    b = forecast_demand(s, horizon_s=2 * HOUR, capacity=2e4, seed=1)
    assert a.truncated == b.truncated == ()
    assert a.to_dict(timings=False) == b.to_dict(timings=False)


@pytest.mark.parametrize(
    ("steps", "paths"),
    [(1, SIMULATED_PATHS), (2_000, SIMULATED_PATHS), (4_000, 500), (10_000, MIN_SIMULATED_PATHS)],
)
def test_simulated_paths_depend_on_the_horizon_only(steps: int, paths: int) -> None:
    assert simulated_paths(steps) == paths
    assert paths * steps <= max(MAX_SIM_DRAWS, MIN_SIMULATED_PATHS * steps)


def test_forecast_long_horizon_fewer_paths_recorded() -> None:
    s = rising(4, seed=4)
    f = forecast_demand(s, horizon_s=4_000 * 60.0, capacity=2e4, seed=1, models=("naive",))
    assert len(f.points) == 4_000 and f.saturation_paths == 500
    assert f.saturation_probability_se is not None


def test_forecast_to_dict_without_timings_drops_only_timings() -> None:
    f = forecast_demand(rising(6, seed=2), horizon_s=HOUR, models=("naive",))
    full, bare = f.to_dict(), f.to_dict(timings=False)
    assert "fit_seconds" in full and "fit_seconds" not in bare
    assert all("fit_seconds" not in c for c in bare["candidates"])
    assert set(full) - set(bare) == {"fit_seconds"}
