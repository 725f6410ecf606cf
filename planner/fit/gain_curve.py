"""The gain model's pieces (planner/fit/gain.py explains the model): the piecewise-linear
basis, its knots chosen by leave-one-engine-out cross-validation, the window weights, and
the fitted curve with its pointwise intervals."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from planner.fit.common import Interval

if TYPE_CHECKING:
    import numpy.typing as npt
    import pandas as pd

    Array = npt.NDArray[np.float64]

CANDIDATE_KNOTS = (1, 2, 3, 4, 5, 6)  # interior knots tried by cross-validation
DEFAULT_KNOTS = 3  # without enough engines to cross-validate
_ROWS = 65_536  # rows whose cells' coefficients are gathered at once (in cache, not 64 MB)


@dataclass(frozen=True, slots=True)
class GainPoint:
    """The gain at one utilization: absolute (response units) and relative to no offload."""

    u: float
    gain: float
    gain_interval: Interval
    relative: float
    relative_interval: Interval
    # the degrees of freedom of the interval's t quantile (Bell–McCaffrey ν with CR2, G − 1
    # with CR1, n − p with HC3; inf: normal): its half-width / t_ν is the gain's se
    df: float = math.inf


def window_weights(data: pd.DataFrame, column: str | None) -> tuple[Array | None, str]:
    """Window weights for the log-scale fit: the variance of a window's log throughput is
    about (1 + CV² of tokens per request) / (requests in it) — a window's throughput is a
    sum over its requests — so a window with few requests (low load, long prompts) is
    weighted down in proportion (at least 1). None (unweighted) without the column."""
    if column is None or column not in data.columns:
        return None, "unweighted"
    r = data[column].to_numpy(dtype=float)
    if not np.isfinite(r).any():
        return None, f"unweighted (no {column} counts)"
    out: Array = np.maximum(np.nan_to_num(r, nan=1.0), 1.0)
    return out, f"windows weighted by {column} (at least 1): var(log tokens/s) ∝ 1/{column}"


def _knot_probs(k: int) -> Array:
    """The quantile levels of ``k`` equally spaced interior knots."""
    out: Array = np.arange(1, k + 1) / (k + 1)
    return out


def knots_at(x: Array, k: int) -> Array:
    """``k`` interior knots at equally spaced quantiles of ``x``."""
    if not k:
        return np.zeros(0)
    out: Array = np.unique(np.quantile(x, _knot_probs(k)))
    return out


def choose_knots(
    x: Array, y: Array, d: Array, g: npt.NDArray[np.int64], centre: float, *, sw: Array
) -> tuple[int, str]:
    """The number of knots K in CANDIDATE_KNOTS with the least leave-one-engine-out
    weighted squared error, or DEFAULT_KNOTS with fewer than 4 engines (``g``).

    Each engine is predicted by the fit on all the others, but only its windows inside the
    utilization range the other engines of its mode cover: utilization follows each
    engine's load, so the busiest engine alone may cover the top of the range, and scoring
    the extrapolation there rewarded the stiffest curve (1 knot) where the gain has a sharp
    knee. Per-engine cross-products make every refit a small solve (:func:`knot_scores`)."""
    scores = knot_scores(x, y, d, g, centre, sw=sw)
    if not scores:
        return DEFAULT_KNOTS, f"knots: {DEFAULT_KNOTS} (fewer than 4 engines: not cross-validated)"
    best = min(scores, key=lambda k: scores[k])
    listed = ", ".join(f"{k}: {v:.4g}" for k, v in scores.items())
    how = "leave-one-engine-out error inside the other engines' range"
    return best, f"knots: {best}, by {how} ({listed})"


def knot_scores(
    x: Array, y: Array, d: Array, g: npt.NDArray[np.int64], centre: float, *, sw: Array
) -> dict[int, float]:
    """Each candidate K's mean squared weighted error of every engine's windows inside the
    other engines' range, predicted by the fit on the other engines (choose_knots); empty
    with fewer than 4 engines (not cross-validated)."""
    codes, inv = np.unique(g, return_inverse=True)
    if codes.size < 4:
        return {}
    # rows sorted once by (engine, mode) cell; X = [B, d·B] so an engine's X'X is assembled
    # from its cells' B'WB (d = 0: top-left block only; d = 1: all four blocks)
    cell = inv * 2 + (d > 0.5)
    order = np.argsort(cell, kind="stable")
    cell_sorted = cell[order]
    cuts = np.searchsorted(cell_sorted, np.arange(2 * codes.size + 1))
    xs, yw, ws = x[order], (y * sw)[order], sw[order]
    inside = _inside_others(xs, cuts, codes.size)
    probs = [_knot_probs(k) for k in CANDIDATE_KNOTS]
    every = np.quantile(x, np.concatenate(probs))  # one pass for every candidate's knots
    splits = np.cumsum([len(p) for p in probs])[:-1]
    scores: dict[int, float] = {}
    for k, kn in zip(CANDIDATE_KNOTS, np.split(every, splits), strict=True):
        bw = basis_columns(xs, np.unique(kn), centre, scale=ws)  # (p, rows): not transposed
        p = bw.shape[0]
        xtx = np.zeros((codes.size, 2 * p, 2 * p))
        xty = np.zeros((codes.size, 2 * p))
        for c in range(2 * codes.size):
            a, b = cuts[c], cuts[c + 1]
            if a == b:
                continue
            gram, rhs = bw[:, a:b] @ bw[:, a:b].T, bw[:, a:b] @ yw[a:b]
            e = c // 2
            xtx[e, :p, :p] += gram
            xty[e, :p] += rhs
            if c % 2:
                xtx[e, :p, p:] += gram
                xtx[e, p:, :p] += gram
                xtx[e, p:, p:] += gram
                xty[e, p:] += rhs
        a_out = xtx.sum(axis=0)[None] - xtx  # X'X without engine e, for every e at once
        b_out = xty.sum(axis=0)[None] - xty
        try:
            beta = np.linalg.solve(a_out, b_out[..., None])[..., 0]
        except np.linalg.LinAlgError:  # an engine alone identifies a column: min-norm fits
            pairs = zip(a_out, b_out, strict=True)
            beta = np.stack([np.linalg.lstsq(a, b, rcond=None)[0] for a, b in pairs])
        coef = np.repeat(beta[:, :p], 2, axis=0)  # each cell's: its engine's β (+ γ, d = 1)
        coef[1::2] += beta[:, p:]
        fitted = np.empty(yw.size)
        for lo in range(0, yw.size, _ROWS):  # each row's own dot product, a block at a time
            hi = min(yw.size, lo + _ROWS)
            fitted[lo:hi] = np.einsum("ji,ij->i", bw[:, lo:hi], coef[cell_sorted[lo:hi]])
        r = (yw - fitted)[inside]
        scores[k] = float(r @ r) / max(r.size, 1)
    return scores


def _inside_others(xs: Array, cuts: npt.NDArray[np.int64], engines: int) -> npt.NDArray[np.bool_]:
    """Per row (sorted by (engine, mode) cell): does x lie inside the range the OTHER
    engines of the same mode cover?"""
    lo = np.full(2 * engines, np.inf)
    hi = np.full(2 * engines, -np.inf)
    for c in range(2 * engines):
        if cuts[c + 1] > cuts[c]:
            lo[c], hi[c] = xs[cuts[c] : cuts[c + 1]].min(), xs[cuts[c] : cuts[c + 1]].max()
    out = np.zeros(xs.size, dtype=bool)
    for c in range(2 * engines):
        others = [o for o in range(c % 2, 2 * engines, 2) if o != c]
        if not others or cuts[c + 1] == cuts[c]:
            continue
        seg = xs[cuts[c] : cuts[c + 1]]
        out[cuts[c] : cuts[c + 1]] = (seg >= lo[others].min()) & (seg <= hi[others].max())
    return out


def basis_columns(u: Array, knots: Array, centre: float, *, scale: Array | None = None) -> Array:
    """:func:`basis_matrix` transposed: one contiguous row per basis function."""
    knots = np.asarray(knots, dtype=np.float64)
    cols = np.empty((2 + knots.size, u.size), dtype=np.result_type(u.dtype, np.float64))
    cols[0] = 1.0
    np.subtract(u, centre, out=cols[1])
    np.subtract(u[None, :], knots[:, None], out=cols[2:])
    np.maximum(0.0, cols[2:], out=cols[2:])
    if scale is not None:
        cols *= scale  # each element once: the products of the rows times scale[:, None]
    return cols


def basis_matrix(
    u: Array, knots: Array, centre: float, *, scale: Array | None = None, out: Array | None = None
) -> Array:
    """Rows [1, u - centre, max(0, u - k) for each knot k], one per u (C order), each row
    times its ``scale`` when given, written into ``out`` when given.

    Built a column at a time in contiguous rows, then transposed in one copy: the values
    of ``np.column_stack`` of the columns (times ``scale[:, None]``), in half its time."""
    cols = basis_columns(u, knots, centre, scale=scale)
    if out is None:
        made: Array = np.ascontiguousarray(cols.T)
        return made
    out[...] = cols.T
    return out


@dataclass(frozen=True, slots=True)
class GainCurve:
    """The fitted model: basis (knots, centre), coefficients (β then γ), covariance."""

    knots: Array
    centre: float
    params: Array
    cov: Array
    log: bool = False  # the model is log(response) on log(u): the gain is a log ratio

    def basis(self, u: Array) -> Array:
        return basis_matrix(np.log(u) if self.log else u, self.knots, self.centre)

    @property
    def p(self) -> int:
        return int(self.params.size // 2)

    def gain_contrasts(self, u: Array) -> Array:
        """Rows c with c'θ = g(u) for the coefficients θ = (β, γ)."""
        b = self.basis(u)
        out: Array = np.hstack([np.zeros_like(b), b])
        return out

    def gain(self, u: Array) -> tuple[Array, Array]:
        """g(u) = B(u)'γ and its standard error (log units on the log scale)."""
        b = self.basis(u)
        p = self.p
        var = np.einsum("ij,jk,ik->i", b, self.cov[p:, p:], b)
        return b @ self.params[p:], np.sqrt(np.maximum(var, 0.0))

    def points(
        self, u: Array, tq: float | Array, level: float, df: float | Array = math.inf
    ) -> tuple[GainPoint, ...]:
        """Absolute and relative gain with pointwise intervals at each u (``tq``: the t
        critical value, one for all u or one per u; ``df``: its degrees of freedom)."""
        tq = np.broadcast_to(np.asarray(tq, dtype=np.float64), u.shape)
        nu = np.broadcast_to(np.asarray(df, dtype=np.float64), u.shape)
        b = self.basis(u)
        none = b @ self.params[: self.p]
        gain, se = self.gain(u)
        if self.log:
            # r = exp(g) − 1 with the interval mapped through exp (exact for the Wald
            # interval of g); absolute gain = exp(none) · r (the geometric-mean curve of no
            # offload times the ratio; its interval leaves none's own error out)
            base = np.exp(none)
            rel_l = np.expm1(gain)
            with np.errstate(over="ignore"):  # a t quantile of ν ≪ 1: that end is +∞
                lo_l, hi_l = np.expm1(gain - tq * se), np.expm1(gain + tq * se)
            return tuple(
                GainPoint(
                    u=float(u[i]),
                    gain=float(base[i] * rel_l[i]),
                    gain_interval=Interval(
                        float(base[i] * lo_l[i]), float(base[i] * hi_l[i]), level
                    ),
                    relative=float(rel_l[i]),
                    relative_interval=Interval(float(lo_l[i]), float(hi_l[i]), level),
                    df=float(nu[i]),
                )
                for i in range(u.size)
            )
        # Relative gain r = g/none; gradient wrt (β, γ) = (−g/none² · B, B/none).
        jac = np.hstack([-(gain / none**2)[:, None] * b, b / none[:, None]])
        se_r = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", jac, self.cov, jac), 0.0))
        rel = gain / none

        def iv(x: float, s: float, q: float) -> Interval:
            return Interval(x - q * s, x + q * s, level)

        return tuple(
            GainPoint(
                u=float(u[i]),
                gain=float(gain[i]),
                gain_interval=iv(float(gain[i]), float(se[i]), float(tq[i])),
                relative=float(rel[i]),
                relative_interval=iv(float(rel[i]), float(se_r[i]), float(tq[i])),
                df=float(nu[i]),
            )
            for i in range(u.size)
        )
