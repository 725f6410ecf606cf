"""advise's bands (planner/advise/sim_band.json) are what the calibration table gives: a
simulator change that moves the table's errors must regenerate the file
(`benchmarks/calibrate_sim.py --write-band`). The leave-one-publication-out figures match a
brute-force loop, and identity rows (HBM only vs HBM only) are in no headline figure."""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks import calibrate_sim
from planner.advise.sim import BAND_FILE, BAND_KIND, BANDS, band_halfwidth


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    return calibrate_sim.all_rows()


def _row(
    pub: str, g: float, miss_pp: float, regime: str = "fits", identity: bool = False
) -> dict[str, Any]:
    """One throughput-change row of a hand-made table: published gain g, simulated g + miss."""
    return {
        "source": pub,
        "publication": pub,
        "metric": "throughput change",
        "identity": identity,
        "regime": regime,
        "case": f"g {g}",
        "figure": "throughput",
        "published": g,
        "simulated": g + miss_pp / 100,
        "error_pp": miss_pp,
        "unit": "change",
    }


# Three publications in "fits" (A and B each with a small and a large gain, C one row), one
# "spills" row; hand-computed: holding B out, the band of A and C is ±(5 pp + 10 % of |g|),
# which B's rows exceed by 1 pp (g 0.2) and 15 pp (g 2.0); A and C stay inside the others'.
SMALL = [
    _row("A", 0.1, 5.0),
    _row("A", 1.0, -15.0),
    _row("B", 0.2, -8.0),
    _row("B", 2.0, 40.0),
    _row("C", 0.4, 3.0),
    _row("B", 0.3, 20.0, regime="spills"),
]


def _brute_force_loso(table: list[dict[str, Any]], regime: str) -> tuple[int, int, float]:
    """Rows, rows outside and the largest excess (pp): for each publication, gain_band of the
    table without its rows, against each of its rows."""
    pubs = {r["publication"] for r in table if r["regime"] == regime}
    checked, outside, excess = 0, 0, 0.0
    for pub in sorted(pubs):
        rest = [r for r in table if r["publication"] != pub]
        band = calibrate_sim.gain_band(rest)[regime]
        for r in table:
            if r["publication"] != pub or r["regime"] != regime or r["identity"]:
                continue
            checked += 1
            over = abs(r["error_pp"]) - 100 * (
                band["absolute"] + band["relative"] * abs(r["published"])
            )
            if over > 1e-7:
                outside += 1
                excess = max(excess, over)
    return checked, outside, excess


def test_gain_band_loso_matches_brute_force_loop_over_publications() -> None:
    band = calibrate_sim.gain_band(SMALL)
    fits = band["fits"]
    checked, outside, excess = _brute_force_loso(SMALL, "fits")
    assert (fits["loso_rows"], fits["loso_rows_outside"]) == (checked, outside) == (5, 2)
    assert fits["loso_excess_pp"] == pytest.approx(excess, abs=0.05)
    assert fits["loso_excess_pp"] == pytest.approx(15.0, abs=0.05)  # by hand: B's g 2.0 row
    # in-sample: a = the largest miss at gains <= 50 % (B's 8 pp), b covers B's 40 pp at 2.0
    assert (fits["absolute"], fits["relative"]) == pytest.approx((0.08, 0.16), abs=2e-4)
    assert (fits["rows"], fits["publications"], fits["kind"]) == (5, 3, BAND_KIND)
    spills = band["spills"]  # one publication: nothing to hold out
    assert spills["loso_rows_outside"] is None and spills["loso_excess_pp"] is None
    assert spills["loso_rows"] == 0 and spills["rows"] == 1


def test_loso_holds_out_whole_groups() -> None:
    points = [(r["publication"], abs(r["published"]), abs(r["error_pp"]) / 100) for r in SMALL[:5]]
    cv = calibrate_sim.loso(points)
    assert cv is not None and (cv.groups, cv.rows, cv.outside) == (3, 5, 2)
    # one group: no out-of-group check at all, not a zero
    assert calibrate_sim.loso([p for p in points if p[0] == "A"]) is None
    # with C's row in B's group, B holds out 3 rows and A's band alone leaves 2 outside
    merged = calibrate_sim.loso([("B" if g == "C" else g, x, e) for g, x, e in points])
    assert merged is not None and (merged.groups, merged.rows, merged.outside) == (2, 5, 2)


def test_gain_band_and_summary_leave_identity_rows_out() -> None:
    # an identity row given a (fake) 50 pp miss: were it counted, the band's a would be 50 pp
    fake = _row("C", 0.0, 50.0, identity=True)
    with_identity = calibrate_sim.gain_band([*SMALL, fake])
    plain = calibrate_sim.gain_band(SMALL)
    assert with_identity["fits"]["identity_rows_excluded"] == 1
    with_identity["fits"]["identity_rows_excluded"] = 0
    assert with_identity == plain
    summary = calibrate_sim.metric_summary([*SMALL, fake])
    tput = next(m for m in summary if m["metric"] == "throughput change")
    assert (tput["rows"], tput["identity_rows"]) == (6, 1)
    expected = sum(abs(r["error_pp"]) for r in SMALL) / 100 / len(SMALL)
    assert tput["mean_abs_error"] == pytest.approx(expected, abs=1e-4)
    assert tput["sign_wrong"] == 0


def test_calibration_summary_headline_excludes_identity_rows(rows: list[dict[str, Any]]) -> None:
    ident = calibrate_sim.identity_rows(rows)
    assert ident and all(r["published"] == 0 and r["simulated"] == 0 for r in ident)
    summary = {m["metric"]: m for m in calibrate_sim.metric_summary(rows)}
    assert sum(m["identity_rows"] for m in summary.values()) == len(ident)
    for metric, m in summary.items():
        mine = [r for r in rows if r.get("metric") == metric and r["published"] is not None]
        kept = [r for r in mine if not calibrate_sim.is_identity(r)]
        assert (m["rows"], m["identity_rows"]) == (len(kept), len(mine) - len(kept)), metric
        mean = sum(abs(calibrate_sim.signed_error(r)) for r in kept) / len(kept)
        assert m["mean_abs_error"] == pytest.approx(mean, abs=1e-4), metric
    text = calibrate_sim.render_metrics(list(summary.values()), rows)
    assert f"Identity rows, in no figure above ({len(ident)}" in text


def test_band_file_matches_calibration_table(rows: list[dict[str, Any]]) -> None:
    band = calibrate_sim.gain_band(rows)
    assert json.loads(BAND_FILE.read_text()) == band
    assert set(BANDS) == set(calibrate_sim.REGIMES)
    for regime, b in BANDS.items():
        stored, loaded = band[regime], b.to_dict()
        assert {k: loaded[k] for k in stored} == stored
        assert loaded["source"] == calibrate_sim.BAND_SOURCE and loaded["regime"] == regime
        assert "level" not in stored and stored["kind"] == BAND_KIND
    assert BANDS["fits"].identity_rows_excluded > 0  # GKE Test 1 and Test 2's 1 k


def test_band_covers_every_throughput_delta_row_of_its_regime(rows: list[dict[str, Any]]) -> None:
    checked = {regime: 0 for regime in calibrate_sim.REGIMES}
    for r in rows:
        if r["figure"] in calibrate_sim.BAND_FIGURES and not calibrate_sim.is_identity(r):
            g = abs(float(r["published"]))
            assert abs(r["error_pp"]) / 100 <= band_halfwidth(g, r["regime"]) + 1e-9, r
            checked[r["regime"]] += 1
    assert checked == {regime: BANDS[regime].rows for regime in calibrate_sim.REGIMES}
