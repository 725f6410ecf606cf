"""What every fit in :mod:`planner.fit.run` shares: result records, history checks, warning
capture, robust covariances and time budgets.

Conventions of every fit result
-------------------------------
* ``estimate`` with ``interval`` (``lo``, ``hi``, ``level``) — never a number without one.
* ``n`` windows actually used, ``method`` (model + estimator + interval method),
  ``assumptions`` (what must hold for the interval to mean what it says) and ``basis``
  (facts about the data used: ranges, engines, modes).
* ``warnings``: every warning raised by the numerical libraries during *this* fit, recorded
  with :func:`warnings.catch_warnings` (no global filter is changed).
* ``can_tell`` / ``why``: ``False`` with a plain-language reason when the data cannot answer
  (no events, no overlap, an interval that is not bounded by the data, ...). The estimate
  may still be filled in then; read it together with ``why``.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from collector.errors import InsufficientHistory

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pandas as pd

    Array = npt.NDArray[np.float64]

# At least this many engines before errors are clustered by engine: cluster-robust
# covariances with few clusters are biased downwards (Cameron & Miller 2015, J. Human
# Resources 50(2), section VI "few clusters"), and ~10 is their rule-of-thumb floor.
MIN_CLUSTERS = 10


@dataclass(frozen=True, slots=True)
class Interval:
    """A confidence interval ``[lo, hi]`` at ``level`` (e.g. 0.95). NaN ends mean unknown."""

    lo: float
    hi: float
    level: float

    def covers(self, value: float) -> bool:
        """True when ``lo <= value <= hi``."""
        return self.lo <= value <= self.hi

    @property
    def width(self) -> float:
        """``hi - lo``."""
        return self.hi - self.lo


NO_INTERVAL_LEVEL = float("nan")


@dataclass(frozen=True, slots=True)
class Estimate:
    """A secondary quantity of a fit with its interval and unit."""

    value: float
    interval: Interval
    unit: str = ""


@dataclass(frozen=True, slots=True)
class FitResult:
    """Fields common to every fit result (see the module docstring)."""

    what: str
    estimate: float
    interval: Interval
    unit: str
    n: int
    method: str
    assumptions: tuple[str, ...]
    basis: tuple[str, ...]
    warnings: tuple[str, ...]
    can_tell: bool
    why: str


def nan_interval(level: float) -> Interval:
    """The interval of a quantity the data cannot estimate."""
    return Interval(math.nan, math.nan, level)


def require_history(what: str, available: int, required: int) -> None:
    """Raise :class:`InsufficientHistory` when fewer than ``required`` windows are usable."""
    if available < required:
        raise InsufficientHistory(what, required, available)


def check_level(level: float) -> None:
    """Levels are probabilities strictly between 0 and 1."""
    from collector.errors import ConfigError

    if not 0.0 < level < 1.0:
        raise ConfigError(f"confidence level must be in (0, 1), got {level}")


@contextmanager
def recorded_warnings() -> Iterator[list[str]]:
    """Record (not print, not raise) the warnings raised inside; the list fills on exit.

    ``simplefilter("always")`` is set only inside this context (``catch_warnings`` restores
    the previous filters on exit), so pytest's ``filterwarnings = error`` does not turn a
    numerical library's advisory into a failure and nothing leaks to the caller.
    """
    import numpy as np

    out: list[str] = []
    # numpy floating-point trouble (overflow, 0/0, …) becomes a recorded RuntimeWarning
    # rather than silence; underflow to 0 is routine (exp of very negative) and ignored.
    errs = np.errstate(divide="warn", over="warn", invalid="warn", under="ignore")
    with warnings.catch_warnings(record=True) as caught, errs:
        warnings.simplefilter("always")
        yield out
    seen: set[str] = set()
    for w in caught:
        text = f"{w.category.__name__}: {w.message}"
        if text not in seen:
            seen.add(text)
            out.append(text)


class Budget:
    """A wall-clock budget for loops (bootstraps, grids): ``spent`` turns true after it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._end = time.monotonic() + seconds

    @property
    def spent(self) -> bool:
        """True once the budget is used up."""
        return time.monotonic() >= self._end


def t_quantile(level: float, df: float) -> float:
    """Two-sided critical value: Student t with ``df`` (normal when df is inf or > 1e6)."""
    from scipy import stats

    q = 0.5 + level / 2.0
    if not math.isfinite(df) or df > 1e6:
        return float(stats.norm.ppf(q))
    return float(stats.t.ppf(q, df))


def chi2_quantile(level: float, df: int = 1) -> float:
    """Upper ``level`` quantile of chi-square with ``df`` degrees of freedom."""
    from scipy import stats

    return float(stats.chi2.ppf(level, df))


def engine_groups(data: pd.DataFrame) -> npt.NDArray[np.int64]:
    """Integer engine id per row from ``source`` and ``engine`` (all 0 when absent)."""
    import numpy as np
    import pandas as pd

    if not {"source", "engine"} <= set(data.columns):
        return np.zeros(len(data), dtype=np.int64)
    src, _ = pd.factorize(data["source"])
    eng, uniq = pd.factorize(data["engine"])
    codes, _ = pd.factorize(src.astype(np.int64) * (len(uniq) + 1) + eng)
    return codes.astype(np.int64)


def robust_cov_kind(groups: Array | npt.NDArray[np.int64]) -> tuple[str, int]:
    """``("cluster", G)`` with G engines when G >= MIN_CLUSTERS, else ``("HC3", G)``."""
    import numpy as np

    g = int(np.unique(groups).size)
    return ("cluster", g) if g >= MIN_CLUSTERS else ("HC3", g)


def sandwich(
    jac: Array, resid: Array, weights: Array, groups: npt.NDArray[np.int64] | None
) -> Array:
    """Sandwich covariance of a (weighted) least-squares fit with Jacobian ``jac``.

    ``bread = (J'WJ)^-1``, ``meat = Σ_g s_g s_g'`` with scores ``s = J' W r`` summed per
    cluster ``g`` (``groups``) or per observation (HC0) — with the finite-sample factor
    ``G/(G-1)·(n-1)/(n-p)`` (clusters) or ``n/(n-p)`` (HC1) that statsmodels also uses.
    """
    import numpy as np

    n, p = jac.shape
    jw = jac * weights[:, None]
    bread = np.linalg.pinv(jw.T @ jac)
    scores = jw * resid[:, None]
    if groups is None:
        meat = scores.T @ scores
        factor = n / max(n - p, 1)
    else:
        codes, inv = np.unique(groups, return_inverse=True)
        g = codes.size
        summed = np.zeros((g, p))
        np.add.at(summed, inv, scores)
        meat = summed.T @ summed
        factor = g / max(g - 1, 1) * (n - 1) / max(n - p, 1)
    cov: Array = bread @ meat @ bread * factor
    return cov


def ols_robust(
    y: Array, x: Array, groups: npt.NDArray[np.int64] | None, kind: str
) -> tuple[Array, Array]:
    """OLS coefficients and a robust covariance: ``kind`` "HC3", "cluster" (CR1) or "CR2"
    (cluster, bias-reduced: :func:`_cr2_meat`; use it with few clusters).

    Normal equations in numpy (the design has few columns, so X'X is small and this costs
    one pass over the data — much faster than statsmodels' SVD on millions of rows).
    Conventions match statsmodels ``OLS.fit(cov_type=...)``: HC3 weights residuals by
    ``1/(1-h_ii)²``; CR1 scales by ``G/(G-1)·(n-1)/(n-p)``; tests check both against it.
    """
    import numpy as np

    n, p = x.shape
    xtx_inv = np.linalg.pinv(x.T @ x)
    beta = xtx_inv @ (x.T @ y)
    resid = y - x @ beta
    if kind == "CR2":
        if groups is None:
            raise ValueError("cluster covariance needs groups")  # programming error
        meat = _cr2_meat(x, resid, groups, np.asarray(xtx_inv, dtype=np.float64))
    elif kind == "cluster":
        if groups is None:
            raise ValueError("cluster covariance needs groups")  # programming error
        codes, inv = np.unique(groups, return_inverse=True)
        g = codes.size
        scores = np.zeros((g, p))
        for j in range(p):
            scores[:, j] = np.bincount(inv, weights=x[:, j] * resid, minlength=g)
        meat = scores.T @ scores * (g / max(g - 1, 1) * (n - 1) / max(n - p, 1))
    else:
        lev = np.einsum("ij,jk,ik->i", x, xtx_inv, x)
        xe = x * (resid / np.maximum(1.0 - lev, 1e-12))[:, None]
        meat = xe.T @ xe
    cov: Array = xtx_inv @ meat @ xtx_inv
    out: Array = beta
    return out, cov


def _cr2_meat(x: Array, resid: Array, groups: npt.NDArray[np.int64], xtx_inv: Array) -> Array:
    """Σ_g X_g' A_g e_g (…)' with A_g = (I − H_gg)^(−1/2), the bias-reduced linearization
    (CR2) of Bell & McCaffrey (2002, Survey Methodology 28(2)), recommended with few clusters
    by Imbens & Kolesár (2016, Rev. Econ. Stat. 98(4)) and Pustejovsky & Tipton (2018).

    H_gg = Z Z' with Z = X_g (X'X)^(−1/2); with Z'Z = V Λ V', f(Z Z') = I + Z V diag(
    (f(λ) − 1)/λ) V' Z' for f(λ) = (1 − λ)^(−1/2) — so each cluster costs O(n_g p²), never
    an n_g × n_g matrix (a cluster may hold a week of 1-minute windows)."""
    import numpy as np

    lam, vec = np.linalg.eigh(xtx_inv)
    root = vec @ np.diag(np.sqrt(np.maximum(lam, 0.0))) @ vec.T  # (X'X)^(−1/2)
    codes, inv = np.unique(groups, return_inverse=True)
    p = x.shape[1]
    meat = np.zeros((p, p))
    for c in range(codes.size):
        m = inv == c
        z = x[m] @ root
        e = resid[m]
        lz, vz = np.linalg.eigh(z.T @ z)
        lz = np.clip(lz, 0.0, 1.0 - 1e-9)
        with np.errstate(divide="ignore", invalid="ignore"):
            w = np.where(lz > 1e-12, ((1.0 - lz) ** -0.5 - 1.0) / lz, 0.5)
        adj = e + z @ (vz @ (w * (vz.T @ (z.T @ e))))
        score = x[m].T @ adj
        meat += np.outer(score, score)
    return meat


def fmt(value: float, digits: int = 3) -> str:
    """A number for a message: ``nan`` stays ``nan``, otherwise ``digits`` significant."""
    return "nan" if not math.isfinite(value) else f"{value:.{digits}g}"
