"""advise's calibration band (planner/advise/sim_band.json) is what the calibration table gives:
a simulator change that moves the table's errors must regenerate the file
(`benchmarks/calibrate_sim.py --write-band`)."""

from __future__ import annotations

import json

from benchmarks import calibrate_sim
from planner.advise.sim import BAND_FILE, SIM_GAIN_TOLERANCE, SIM_GAIN_TOLERANCE_REL


def test_band_file_matches_calibration_table() -> None:
    rows = calibrate_sim.all_rows()
    band = calibrate_sim.gain_band(rows)
    assert json.loads(BAND_FILE.read_text()) == band
    assert (band["absolute"], band["relative"]) == (SIM_GAIN_TOLERANCE, SIM_GAIN_TOLERANCE_REL)


def test_band_covers_every_throughput_delta_row() -> None:
    rows = calibrate_sim.all_rows()
    checked = 0
    for r in rows:
        if r["figure"] in ("input throughput", "throughput") and r["error_pp"] is not None:
            g = abs(float(r["published"]))
            assert abs(r["error_pp"]) / 100 <= SIM_GAIN_TOLERANCE + SIM_GAIN_TOLERANCE_REL * g
            checked += 1
    assert checked >= 9
