"""advise's calibration bands (planner/advise/sim_band.json) are what the calibration table
gives: a simulator change that moves the table's errors must regenerate the file
(`benchmarks/calibrate_sim.py --write-band`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks import calibrate_sim
from planner.advise.sim import (
    BAND_FILE,
    BANDS,
    SIM_GAIN_TOLERANCE,
    SIM_GAIN_TOLERANCE_REL,
    sim_gain_tolerance,
)


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    return calibrate_sim.all_rows()


def test_band_file_matches_calibration_table(rows: list[dict[str, Any]]) -> None:
    band = calibrate_sim.gain_band(rows)
    assert json.loads(BAND_FILE.read_text()) == band
    fits = band["fits"]
    assert (fits["absolute"], fits["relative"]) == (SIM_GAIN_TOLERANCE, SIM_GAIN_TOLERANCE_REL)
    assert set(BANDS) == set(calibrate_sim.REGIMES)


def test_band_covers_every_throughput_delta_row_of_its_regime(rows: list[dict[str, Any]]) -> None:
    checked = {regime: 0 for regime in calibrate_sim.REGIMES}
    for r in rows:
        if r["figure"] in ("input throughput", "throughput") and r["error_pp"] is not None:
            g = abs(float(r["published"]))
            assert abs(r["error_pp"]) / 100 <= sim_gain_tolerance(g, r["regime"]) + 1e-9, r
            checked[r["regime"]] += 1
    assert checked["fits"] >= 12 and checked["spills"] >= 5
