"""Locating the break-even on a fitted gain curve (planner/fit/gain.py explains the
rules): sign changes, the ones the data locate, those inside an edge stretch, and the
engine bootstrap of u*."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from planner.fit.common import Budget
from planner.fit.gain_curve import GainCurve

if TYPE_CHECKING:
    import numpy.typing as npt

    Array = npt.NDArray[np.float64]


def roots_of(u: Array, gain: Array) -> list[float]:
    """Sign changes of the gain on the grid, linearly interpolated."""
    s = np.sign(gain)
    idx = np.flatnonzero(s[:-1] * s[1:] < 0)
    exact = np.flatnonzero(s == 0)
    out = [float(u[i] - gain[i] * (u[i + 1] - u[i]) / (gain[i + 1] - gain[i])) for i in idx]
    return sorted(out + [float(u[i]) for i in exact])


def located_crossings(
    u: Array, gain: Array, ok: npt.NDArray[np.bool_], *, pick: str = "first"
) -> list[tuple[float, float, float, bool]]:
    """Sign changes of ``gain`` that the data locate: (root, lo, hi, rising) for each pair of
    consecutive grid points where the interval excludes 0 (``~ok``) with opposite signs.

    [lo, hi] is the accepted stretch between them (widened to the root when it falls between
    grid points); root the first sign change of the estimate between them, or with
    ``pick="steep"`` the steepest one (a flat gain near 0 wanders across it shallowly). A sign
    change in an accepted stretch reaching the grid's edge, or with one sign on both sides, is
    not located. Method: planner/fit/METHODS.md#break-even
    """
    sig = np.flatnonzero(~ok)
    out: list[tuple[float, float, float, bool]] = []
    for a, b in zip(sig[:-1].tolist(), sig[1:].tolist(), strict=True):
        if (gain[a] > 0) == (gain[b] > 0):
            continue
        seg = slice(a, b + 1)
        found = roots_of(u[seg], gain[seg])
        root = found[0]
        if pick == "steep" and len(found) > 1:
            slope = np.abs(np.gradient(gain[seg], u[seg]))
            root = max(found, key=lambda r: float(np.interp(r, u[seg], slope)))
        lo, hi = (float(u[a + 1]), float(u[b - 1])) if b > a + 1 else (root, root)
        out.append((root, min(lo, root), max(hi, root), bool(gain[b] > 0)))
    return out


def edge_crossing(
    u: Array, gain: Array, ok: npt.NDArray[np.bool_]
) -> tuple[float, float, float, bool, bool, bool] | None:
    """A sign change of the estimate inside a stretch of accepted points at an edge of the
    grid (the low one first): (root, lo, hi, rising, open_lo, open_hi), else None. The
    break-even may then lie anywhere in that stretch or beyond the edge."""
    sig = np.flatnonzero(~ok)
    if not sig.size:
        return None
    for a, b, at_lo in ((0, int(sig[0]), True), (int(sig[-1]), u.size - 1, False)):
        roots = roots_of(u[a : b + 1], gain[a : b + 1])
        if roots:
            root = roots[-1] if at_lo else roots[0]
            rising = bool(gain[b] > 0) if at_lo else bool(gain[a] < 0)
            lo, hi = (float(u[0]), float(u[max(b - 1, 0)])) if at_lo else (
                float(u[min(a + 1, u.size - 1)]), float(u[-1]))  # fmt: skip
            return root, min(lo, root), max(hi, root), rising, at_lo, not at_lo
    return None


def bootstrap_break_even(  # noqa: PLR0913 - the fit's arrays and its bootstrap options
    design: Array, y: Array, d: Array, g: npt.NDArray[np.int64], *, curve: GainCurve,
    root: float, fine: Array, level: float, n_boot: int, budget_s: float, seed: int,
) -> tuple[float, float, bool, bool, int]:  # fmt: skip
    """Percentile interval of u* over engine-resampled refits.

    Engines are resampled with replacement within strata (only-none, only-offload, both),
    so each replicate keeps both modes. Per-engine X'X and X'y make a replicate cost one
    small solve. Replicates with no crossing count against the interval (open ends).
    """
    rng = np.random.default_rng(seed)
    p = curve.p
    ng = int(g.max()) + 1
    q = design.shape[1]
    xtx = np.zeros((ng, q, q))
    xty = np.zeros((ng, q))
    for e in range(ng):
        m = g == e
        xtx[e] = design[m].T @ design[m]
        xty[e] = design[m].T @ y[m]
    share = np.bincount(g, weights=d, minlength=ng) / np.maximum(np.bincount(g, minlength=ng), 1)
    kind = np.where(share == 0, 0, np.where(share == 1, 1, 2))
    strata = [np.flatnonzero(kind == k) for k in (0, 1, 2) if np.any(kind == k)]
    bfine = curve.basis(fine)
    budget = Budget(budget_s)
    found: list[float] = []
    done = 0
    for _ in range(n_boot):
        if budget.spent:
            break
        w = np.zeros(ng)
        for members in strata:
            np.add.at(w, rng.choice(members, size=members.size, replace=True), 1.0)
        beta = np.linalg.lstsq(np.tensordot(w, xtx, 1), w @ xty, rcond=None)[0]
        roots = roots_of(fine, bfine @ beta[p:])
        done += 1
        if roots:
            found.append(min(roots, key=lambda r: abs(r - root)))
    tail = (1.0 - level) / 2.0
    missing = done - len(found)
    if not found:
        return float(fine[0]), float(fine[-1]), True, True, done
    lo, hi = np.quantile(found, [tail, 1.0 - tail])
    open_end = missing / max(done, 1) > tail
    return float(lo), float(hi), open_end, open_end, done
