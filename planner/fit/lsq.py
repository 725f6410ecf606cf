"""Least squares in passes over the rows, with the HC3 and CR1 sandwiches.

The solution is statsmodels' ``OLS.fit(method="pinv")``: the same cut-off for small
singular values (``rcond = 1e-15``) and the same rank rule. It is reached through a QR
of ``[X | y]`` folded over passes of rows, so only k×k matrices and one pass are held:
statsmodels keeps the n×k pseudo-inverse beside the SVD's n×k factors, six times the
design, which at 1,000 engines × 7 days is more than the plan's whole memory budget.
tests/planner/test_fit_lsq.py checks every output against statsmodels.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

    Array = npt.NDArray[np.float64]

ROWS_PER_PASS = 1 << 15  # rows per pass: 32,768 × (k + 1) floats, ~4 MB at k = 15
RCOND = 1e-15  # statsmodels.tools.tools.pinv_extended's default


@dataclass(frozen=True, slots=True)
class LeastSquares:
    """The least-squares fit of y on x: ``whiten`` is V·S⁻¹ over the kept singular values,
    so ``x @ whiten`` are the rows of the design's left singular vectors and
    ``bread = whiten @ whiten.T`` is pinv(X'X); ``rank`` is the design's."""

    params: Array
    whiten: Array
    resid: Array
    rank: int

    @property
    def bread(self) -> Array:
        out: Array = self.whiten @ self.whiten.T
        return out


def solve(y: Array, x: Array, rows_per_pass: int = ROWS_PER_PASS) -> LeastSquares:
    """The minimum-norm least-squares solution of ``x @ b ≈ y`` (module docstring)."""
    n, k = x.shape
    r = np.zeros((0, k + 1))
    for a in range(0, n, rows_per_pass):
        b = min(n, a + rows_per_pass)
        stacked = np.empty((r.shape[0] + b - a, k + 1))
        stacked[: r.shape[0]] = r
        stacked[r.shape[0] :, :k] = x[a:b]
        stacked[r.shape[0] :, k] = y[a:b]
        r = np.asarray(np.linalg.qr(stacked, mode="r"))
    rx = np.zeros((k, k))
    rows = min(r.shape[0], k)
    rx[:rows] = r[:rows, :k]
    qty = np.zeros(k)
    qty[:rows] = r[:rows, k]
    u, s, vt = np.linalg.svd(rx)
    keep = s > RCOND * s.max() if s.size and s.max() > 0 else np.zeros(k, dtype=bool)
    inv = np.where(keep, 1.0 / np.where(keep, s, 1.0), 0.0)
    params = vt.T @ (inv * (u.T @ qty))
    whiten = (vt.T * inv)[:, keep]
    # numpy.linalg.matrix_rank of diag(s), as statsmodels counts it
    rank = int((s > s.max() * k * np.finfo(np.float64).eps).sum()) if s.size else 0
    if rank < k:  # statsmodels' advisory, word for word
        from statsmodels.tools.sm_exceptions import SingularMatrixWarning  # noqa: PLC0415 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`

        warnings.warn(
            "The design matrix is rank-deficient. "
            "The model parameters are not uniquely determined.",
            SingularMatrixWarning,
            stacklevel=2,
        )
    return LeastSquares(params, whiten, y - x @ params, rank)


def cov_hc3(x: Array, fit: LeastSquares, rows_per_pass: int = ROWS_PER_PASS) -> Array:
    """HC3: W · Σ z_i z_i' (e_i / (1 − h_i))² · W', z_i = W' x_i, h_i = |z_i|² (W: whiten)."""
    w = fit.whiten
    meat = np.zeros((w.shape[1], w.shape[1]))
    for a in range(0, x.shape[0], rows_per_pass):
        z = x[a : a + rows_per_pass] @ w
        h = (z * z).sum(axis=1)
        scale = (fit.resid[a : a + rows_per_pass] / (1.0 - h)) ** 2
        meat += z.T @ (z * scale[:, None])
    out: Array = w @ meat @ w.T
    return out


def cov_cr1(
    x: Array, fit: LeastSquares, groups: npt.NDArray[np.int64], rows_per_pass: int = ROWS_PER_PASS
) -> Array:
    """CR1: W · Σ_g s_g s_g' · W' · G/(G−1) · (n−1)/(n−k), s_g = Σ_{i in g} z_i e_i."""
    n, k = x.shape
    w = fit.whiten
    _, codes = np.unique(groups, return_inverse=True)
    n_groups = int(codes.max()) + 1 if codes.size else 0
    sums = np.zeros((n_groups, w.shape[1]))
    for a in range(0, n, rows_per_pass):
        scores = (x[a : a + rows_per_pass] @ w) * fit.resid[a : a + rows_per_pass, None]
        at = codes[a : a + rows_per_pass]
        for j in range(w.shape[1]):
            sums[:, j] += np.bincount(at, weights=scores[:, j], minlength=n_groups)
    cov: Array = w @ (sums.T @ sums) @ w.T * (n_groups / (n_groups - 1.0) * ((n - 1.0) / (n - k)))
    return cov
