"""planner.fit.gain_curve: the spline basis equals its definition, column by column
(np.column_stack of 1, u - centre and max(0, u - k)), bit for bit and C-ordered; the knots'
cross-validation scores equal a refit on the other engines for every engine, by lstsq."""

from __future__ import annotations

import numpy as np
import pytest

from planner.fit.gain_curve import (
    CANDIDATE_KNOTS,
    DEFAULT_KNOTS,
    basis_matrix,
    choose_knots,
    knot_scores,
)


def _by_definition(u: np.ndarray, knots: np.ndarray, centre: float) -> np.ndarray:
    cols = [np.ones_like(u), u - centre, *(np.maximum(0.0, u - k) for k in knots)]
    return np.column_stack(cols)


@pytest.mark.parametrize(
    ("u", "knots", "centre"),
    [
        (np.random.default_rng(0).uniform(0.0, 1.0, 10_000), np.array([0.2, 0.5, 0.8]), 0.5),
        (np.array([0.3, 0.5, 0.5, 0.7, -0.0, 0.0]), np.array([0.5]), 0.5),  # on a knot
        (np.log(np.random.default_rng(1).uniform(0.01, 1.0, 257)), np.array([-2.0, -1.0]), -1.5),
        (np.array([0.1, np.nan, 0.9]), np.array([0.4, 0.6]), 0.5),  # a missing value stays so
        (np.random.default_rng(2).uniform(0.0, 1.0, 50), np.zeros(0), 0.25),  # no knot
        (np.zeros(0), np.array([0.3]), 0.5),  # no row
    ],
)
def test_basis_matrix_is_its_definition_bit_for_bit(
    u: np.ndarray, knots: np.ndarray, centre: float
) -> None:
    got, want = basis_matrix(u, knots, centre), _by_definition(u, knots, centre)
    assert got.shape == want.shape == (u.size, 2 + knots.size)
    assert got.flags.c_contiguous and got.dtype == np.float64
    assert got.tobytes() == want.tobytes()  # the same bits: -0.0, NaN and all


def _brute_scores(  # noqa: PLR0917 - choose_knots' arguments
    x: np.ndarray, y: np.ndarray, d: np.ndarray, g: np.ndarray, centre: float, sw: np.ndarray
) -> dict[int, float]:
    """For each K, engine by engine: the weighted least squares on the other engines' rows
    (lstsq), its error on this engine's rows inside the range the other engines of the
    same mode (d) cover; the mean of the squared errors over all such rows."""
    out = {}
    mode = d > 0.5
    for k in CANDIDATE_KNOTS:
        knots = np.unique(np.quantile(x, np.arange(1, k + 1) / (k + 1)))
        b = basis_matrix(x, knots, centre)
        xw = np.column_stack([b, b * d[:, None]]) * sw[:, None]
        yw = y * sw
        errors = []
        for e in np.unique(g):
            rest = g != e
            beta = np.linalg.lstsq(xw[rest], yw[rest], rcond=None)[0]
            for m in (False, True):
                mine, others = (g == e) & (mode == m), rest & (mode == m)
                if not mine.any() or not others.any():
                    continue
                lo, hi = x[others].min(), x[others].max()
                pick = mine & (x >= lo) & (x <= hi)
                errors.append(yw[pick] - xw[pick] @ beta)
        r = np.concatenate(errors)
        out[k] = float(r @ r) / max(r.size, 1)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_knot_scores_are_leave_one_engine_out_refits(seed: int) -> None:
    rng = np.random.default_rng(seed)
    engines = 6
    g = np.repeat(np.arange(engines), 400)
    d = (g % 2).astype(np.float64)  # every other engine offloads
    # each engine covers its own range of u, each range holding every knot: a knot above
    # (nearly) all of the other engines' windows of a mode leaves that refit ill-conditioned,
    # where the normal equations (knot_scores) and lstsq on the rows part: left so
    load = rng.uniform(0.85, 1.0, engines)[g]
    x = np.clip(load * rng.uniform(0.2, 1.0, g.size), 0.0, 1.0)
    y = 100 * x + 30 * d * np.maximum(0.0, x - 0.6) + rng.normal(0, 5, g.size)
    sw = rng.uniform(0.5, 2.0, g.size)
    order = rng.permutation(g.size)  # rows in no particular order
    x, y, d, g, sw = x[order], y[order], d[order], g[order], sw[order]
    got = knot_scores(x, y, d, g, 0.5, sw=sw)
    want = _brute_scores(x, y, d, g, 0.5, sw)
    assert got.keys() == want.keys()
    for k in got:
        assert got[k] == pytest.approx(want[k], rel=1e-9), k
    best, why = choose_knots(x, y, d, g, 0.5, sw=sw)
    assert best == min(want, key=lambda k: want[k]) and why.startswith(f"knots: {best}, by")


def test_fewer_than_four_engines_are_not_cross_validated() -> None:
    rng = np.random.default_rng(0)
    g = np.repeat(np.arange(3), 50)
    x, y, sw = rng.uniform(size=g.size), rng.normal(size=g.size), np.ones(g.size)
    d = (g % 2).astype(np.float64)
    assert knot_scores(x, y, d, g, 0.5, sw=sw) == {}
    assert choose_knots(x, y, d, g, 0.5, sw=sw) == (
        DEFAULT_KNOTS,
        f"knots: {DEFAULT_KNOTS} (fewer than 4 engines: not cross-validated)",
    )
