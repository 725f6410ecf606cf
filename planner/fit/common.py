"""What every fit in :mod:`planner.fit.orchestrate` shares: result records, history checks, warning
capture, robust covariances (planner.fit.lsq; CR2 from planner.fit.cr2) and time budgets.

Every result has ``estimate`` with ``interval``, ``n``, ``method``, ``assumptions``,
``basis``, ``warnings`` (caught during this fit only) and ``can_tell`` / ``why``.

Conventions: planner/fit/METHODS.md#common
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from core.errors import ConfigError, InsufficientHistory
from planner.fit.cr2 import CR2, cr2
from planner.fit.lsq import cov_cr1, cov_hc3, solve

if TYPE_CHECKING:
    import numpy.typing as npt

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
    """Fields common to every fit result (METHODS.md#common)."""

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


def exp_or_inf(x: float) -> float:
    """exp(x), +inf past the largest finite double (a t quantile on a tiny ν overflows it)."""
    return math.exp(x) if x < 709.0 else math.inf


def nan_interval(level: float) -> Interval:
    """The interval of a quantity the data cannot estimate."""
    return Interval(math.nan, math.nan, level)


def require_history(what: str, available: int, required: int) -> None:
    """Raise :class:`InsufficientHistory` when fewer than ``required`` windows are usable."""
    if available < required:
        raise InsufficientHistory(what, required, available)


def check_level(level: float) -> None:
    """Levels are probabilities strictly between 0 and 1."""
    if not 0.0 < level < 1.0:
        raise ConfigError(f"confidence level must be in (0, 1), got {level}")


@contextmanager
def recorded_warnings() -> Iterator[list[str]]:
    """Record (not print, not raise) the warnings raised inside; the list fills on exit.

    ``simplefilter("always")`` is set only inside this context (``catch_warnings`` restores
    the previous filters on exit), so pytest's ``filterwarnings = error`` does not turn a
    numerical library's advisory into a failure and nothing leaks to the caller.
    """
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
    from scipy import stats  # noqa: PLC0415 - start-up: scipy.stats (~0.6 s) loads when this runs, not on `import planner.plan`

    q = 0.5 + level / 2.0
    if not math.isfinite(df) or df > 1e6:
        return float(stats.norm.ppf(q))
    return float(stats.t.ppf(q, df))


def chi2_quantile(level: float, df: int = 1) -> float:
    """Upper ``level`` quantile of chi-square with ``df`` degrees of freedom."""
    from scipy import stats  # noqa: PLC0415 - start-up: scipy.stats (~0.6 s) loads when this runs, not on `import planner.plan`

    return float(stats.chi2.ppf(level, df))


def engine_groups(data: pd.DataFrame) -> npt.NDArray[np.int64]:
    """Integer engine id per row from ``source`` and ``engine`` (all 0 when absent)."""
    if not {"source", "engine"} <= set(data.columns):
        return np.zeros(len(data), dtype=np.int64)
    src, _ = pd.factorize(data["source"])
    eng, uniq = pd.factorize(data["engine"])
    codes, _ = pd.factorize(src.astype(np.int64) * (len(uniq) + 1) + eng)
    return codes.astype(np.int64)


def robust_cov_kind(groups: Array | npt.NDArray[np.int64]) -> tuple[str, int]:
    """``("cluster", G)`` with G engines when G >= MIN_CLUSTERS, else ``("HC3", G)``."""
    g = int(np.unique(groups).size)
    return ("cluster", g) if g >= MIN_CLUSTERS else ("HC3", g)


def sandwich(
    jac: Array, resid: Array, weights: Array, groups: npt.NDArray[np.int64] | None
) -> Array:
    """Sandwich covariance of a (weighted) least-squares fit with Jacobian ``jac``.

    ``bread = (J'WJ)^-1``, scores ``s = J' W r`` per observation; statsmodels'
    ``cov_cluster`` sums them per cluster ``g`` (``groups``, CR1) and ``cov_white_simple``
    takes them per observation (HC1), each with its finite-sample factor
    ``G/(G-1)·(n-1)/(n-p)`` or ``n/(n-p)``.
    """
    from statsmodels.stats import sandwich_covariance as sw  # noqa: PLC0415 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`

    jw = jac * weights[:, None]
    bread = np.linalg.pinv(jw.T @ jac)
    scores = jw * resid[:, None]
    if groups is None:
        cov = sw.cov_white_simple((scores, bread), use_correction=True)
    else:
        cov = sw.cov_cluster((scores, bread), np.asarray(groups), use_correction=True)
    out: Array = np.asarray(cov, dtype=np.float64)
    return out


@dataclass(frozen=True, slots=True)
class RobustOLS:
    """An OLS fit with a robust covariance (:func:`ols_robust`) and the degrees of freedom
    of a contrast's t interval under it."""

    params: Array
    cov: Array
    kind: str  # "HC3" | "cluster" (CR1) | "CR2"
    df_resid: float  # n − p (HC3's t)
    clusters: int
    cr2: CR2 | None = None

    def df(self, contrasts: Array) -> Array:
        """ν for each row c of ``contrasts``: Bell–McCaffrey with CR2 (planner.fit.cr2),
        G − 1 with CR1, n − p with HC3."""
        rows = np.atleast_2d(contrasts).shape[0]
        if self.cr2 is not None:
            return self.cr2.df(contrasts)
        out: Array = np.full(rows, self.clusters - 1.0 if self.kind == "cluster" else self.df_resid)
        return out


def ols_robust(y: Array, x: Array, groups: npt.NDArray[np.int64] | None, kind: str) -> RobustOLS:
    """OLS with a robust covariance: ``kind`` "HC3", "cluster" (CR1) or "CR2" (cluster,
    bias-reduced, with Bell–McCaffrey degrees of freedom: planner.fit.cr2; use it with few
    clusters). The fit and the HC3 / CR1 sandwiches are statsmodels' ``OLS.fit(cov_type=…)``
    computed in passes over rows (planner.fit.lsq), so memory stays near one copy of ``x``.
    Method: planner/fit/METHODS.md#robust-ols-ols_robust
    """
    if kind not in ("HC3", "cluster", "CR2"):
        raise ValueError(f"unknown covariance {kind!r}")  # programming error
    if kind != "HC3" and groups is None:
        raise ValueError("cluster covariance needs groups")  # programming error
    fit = solve(y, x)
    extra: CR2 | None = None
    if kind == "HC3":
        cov = cov_hc3(x, fit)
    elif kind == "cluster":
        assert groups is not None
        cov = cov_cr1(x, fit, groups)
    else:
        assert groups is not None
        extra = cr2(x, fit.resid, groups, fit.bread)
        cov = extra.cov
    clusters = int(np.unique(groups).size) if groups is not None else 0
    return RobustOLS(
        params=fit.params,
        cov=cov,
        kind=kind,
        df_resid=float(x.shape[0] - fit.rank),
        clusters=clusters,
        cr2=extra,
    )


def fmt(value: float, digits: int = 3) -> str:
    """A number for a message: ``nan`` stays ``nan``, otherwise ``digits`` significant."""
    return "nan" if not math.isfinite(value) else f"{value:.{digits}g}"
