"""What each offload mode does today: latency, preemptions and re-prefill at the cluster's load.

WLS of each outcome (log latency; counts per 1k requests) on the mode and the traffic mix,
weighted by finished requests, errors clustered on units (engines or LMCache pools) with CR2
and Bell–McCaffrey df (Imbens & Kolesár 2016). Cannot tell with fewer than MIN_UNITS units
per arm (a lone canary: use a switchback).

Method: planner/fit/METHODS.md#effects
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from core.errors import ConfigError, InsufficientHistory
from planner.fit.common import (
    Interval,
    check_level,
    exp_or_inf,
    nan_interval,
    recorded_warnings,
    t_quantile,
)
from planner.fit.cr2 import cr2
from planner.fit.units import (
    TRAFFIC,
    Balance,
    balance,
    balance_warnings,
    engine_codes,
    traffic,
    unit_codes,
)
from planner.frames.groups import text_values

if TYPE_CHECKING:
    import numpy.typing as npt

    Array = npt.NDArray[np.float64]

# A measured comparison needs at least this many independent units in each arm: with one,
# the unit and the mode are the same contrast and no interval separates them.
MIN_UNITS = 2
MIN_WINDOWS_PER_ARM = 30
NO_OFFLOAD = "none"


@dataclass(frozen=True, slots=True)
class Outcome:
    """One outcome of the today estimand: a frame column (or a derived one) and its scale."""

    name: str
    label: str
    unit: str
    log: bool  # compared as a ratio (log scale) or as a difference


OUTCOMES: tuple[Outcome, ...] = (
    Outcome("ttft_p50_s", "TTFT p50 (per window)", "s", True),
    Outcome("ttft_p90_s", "TTFT p90 (per window)", "s", True),
    Outcome("ttft_p99_s", "TTFT p99 (per window)", "s", True),
    Outcome("e2e_mean_s", "end-to-end latency (mean)", "s", True),
    Outcome("preemptions_per_1k", "preemptions per 1k requests", "per 1k requests", False),
    Outcome(
        "reprefill_tokens_per_1k",
        "re-prefilled prompt tokens per 1k requests (preemptions × mean prompt length)",
        "tokens per 1k requests",
        False,
    ),
)


@dataclass(frozen=True, slots=True)
class Effect:
    """One outcome's effect of the mode: a ratio (log outcomes) or a difference."""

    outcome: str
    label: str
    unit: str
    scale: str  # "ratio" | "difference"
    control: float  # request-weighted mean of the control arm (in ``unit``)
    estimate: float  # ratio (mode / none) or difference (mode − none)
    interval: Interval
    df: float  # Bell–McCaffrey degrees of freedom of the mode contrast
    windows: int
    can_tell: bool
    why: str

    @property
    def excludes_null(self) -> bool:
        """The interval excludes "no effect" (ratio 1, difference 0)."""
        null = 1.0 if self.scale == "ratio" else 0.0
        return self.can_tell and (self.interval.lo > null or self.interval.hi < null)


@dataclass(frozen=True, slots=True)
class TodayEffects:
    """Every outcome's effect of one mode against no offload, and what it rests on."""

    mode: str
    units_treated: int
    units_control: int
    engines_treated: int
    engines_control: int
    effects: tuple[Effect, ...]
    balance: tuple[Balance, ...]
    covariates: tuple[str, ...]
    level: float
    method: str
    assumptions: tuple[str, ...]
    warnings: tuple[str, ...]
    can_tell: bool
    why: str


def derived_outcomes(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with the per-window count outcomes of OUTCOMES added."""
    req = frame["requests"].to_numpy(dtype=float)
    pre = frame["preemptions"].to_numpy(dtype=float)
    prompt = frame["prompt_tokens_mean"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_1k = np.where(req > 0, 1000.0 * pre / req, np.nan)
    return frame.assign(preemptions_per_1k=per_1k, reprefill_tokens_per_1k=per_1k * prompt)


def fit_today(
    frame: pd.DataFrame,
    units: Sequence[object] | npt.NDArray[np.object_],
    *,
    mode: str,
    level: float = 0.90,
    outcomes: tuple[Outcome, ...] = OUTCOMES,
    adjust: bool = True,
) -> TodayEffects:
    """The today estimand of ``mode`` against ``none`` (METHODS.md#effects). ``units`` gives
    each frame row its unit (planner.fit.units.unit_keys). Raises InsufficientHistory when
    an arm has fewer than MIN_WINDOWS_PER_ARM windows with finished requests."""
    check_level(level)
    if mode == NO_OFFLOAD:
        raise ConfigError("the today estimand compares an offload mode with 'none'")
    if len(units) != len(frame):
        raise ConfigError(f"units has {len(units)} entries for {len(frame)} frame rows")
    data = derived_outcomes(frame)
    unit = np.asarray(units, dtype=object)
    modes = text_values(data["offload_mode"])
    req = data["requests"].to_numpy(dtype=float)
    use = np.isin(modes, (mode, NO_OFFLOAD)) & (req > 0)
    treated_all = modes == mode
    n_t, n_c = int((use & treated_all).sum()), int((use & ~treated_all).sum())
    require_n = min(n_t, n_c)
    if require_n < MIN_WINDOWS_PER_ARM:
        raise InsufficientHistory(
            f"today's effect of {mode} (windows with finished requests, fewer arm)",
            MIN_WINDOWS_PER_ARM,
            require_n,
        )
    eng, _ = engine_codes(frame)  # one code per source/engine key (data's rows are frame's)
    units_of = _Units(unit)
    ut, uc = units_of.count(use & treated_all), units_of.count(use & ~treated_all)
    et, ec = _count(eng[use & treated_all]), _count(eng[use & ~treated_all])
    cov = traffic(data)
    bal = balance(cov[use], treated_all[use], req[use])
    warns = balance_warnings(bal, mode)
    shared = ut < et
    unit_word = "engines or LMCache pools" if shared else "engines"
    method = (
        "WLS of each outcome (log scale for latencies) on the mode"
        + (" and traffic mix (" + ", ".join(TRAFFIC) + ")" if adjust else "")
        + f", weighted by requests; CR2 errors clustered on {unit_word}, Bell–McCaffrey df; "
        f"{level:.0%} intervals"
    )
    assumptions = (
        "association between engines: what the traffic covariates do not capture "
        "(hardware, placement) enters only through the spread between units",
        "windows of one unit are dependent; units are independent (engines sharing an LMCache "
        "pool are one unit)",
        "the traffic adjustment is linear; with standardised differences above 0.25 it is "
        "not trusted to remove them",
    )
    if min(ut, uc) < MIN_UNITS:
        why = (
            f"{ut} unit(s) ran {mode} and {uc} ran without offload: a measured effect needs "
            f"at least {MIN_UNITS} independent {unit_word} in each arm"
            + (" (engines sharing one LMCache pool count once)" if shared else "")
            + "; run a switchback on the canary, or offload on more engines"
        )
        effects = tuple(cannot_effect(o, level, why) for o in outcomes)
        return TodayEffects(mode, ut, uc, et, ec, effects, bal, (), level, method,
                            assumptions, tuple(warns), False, why)  # fmt: skip
    covariates = [c for c in TRAFFIC if adjust]
    designs = _Designs()
    with recorded_warnings() as caught:
        effects = tuple(
            _effect(data, o, use, treated_all, units_of, cov, covariates, req, level, designs)
            for o in outcomes
        )
    warns += caught
    told = any(e.can_tell for e in effects)
    why = "" if told else "no outcome could be estimated: " + effects[0].why
    return TodayEffects(mode, ut, uc, et, ec, effects, bal, tuple(covariates), level,
                        method, assumptions, tuple(warns), told, why)  # fmt: skip


def _count(values: npt.NDArray[np.object_] | npt.NDArray[np.int64]) -> int:
    """How many distinct values (as text) there are."""
    return len({str(v) for v in pd.unique(values)}) if values.size else 0


class _Units:
    """The units of the rows as codes of their text: equal texts one code, numbered in
    sorted text order, so a group of rows numbers its units as ``np.unique`` of the texts
    does, with no string compared per row. Units not all ``str`` are read through their texts:
    the distinct values' texts (count) and each row's text (groups)."""

    def __init__(self, units: npt.NDArray[np.object_]) -> None:
        self.units = units
        codes, uniques = unit_codes(units)
        self.text = all(isinstance(u, str) for u in uniques)
        names = np.asarray(uniques if self.text else [], dtype=object)
        texts, rank = np.unique(names, return_inverse=True)
        self.texts = texts.size
        self.codes: npt.NDArray[np.int64] = (
            rank.astype(np.int64)[codes] if self.text else np.zeros(0, dtype=np.int64)
        )

    def count(self, rows: npt.NDArray[np.bool_]) -> int:
        """How many distinct units (as text) the rows have."""
        if not self.text:
            return _count(self.units[rows])
        return int(np.count_nonzero(np.bincount(self.codes[rows], minlength=self.texts)))

    def groups(self, rows: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
        """Per row of ``rows``: its unit's index among the rows' sorted unit texts."""
        if not self.text:
            out: npt.NDArray[np.int64] = np.unique(
                self.units[rows].astype(str), return_inverse=True
            )[1].astype(np.int64)
            return out
        of = self.codes[rows]
        present = np.bincount(of, minlength=self.texts) > 0
        out = (np.cumsum(present) - 1).astype(np.int64)[of]
        return out


def _design(
    ok: npt.NDArray[np.bool_],
    treated: npt.NDArray[np.bool_],
    cov: pd.DataFrame,
    covariates: list[str],
    w: Array,
) -> Array | str:
    """The WLS design of the rows ``ok``: intercept, mode, each covariate centred and scaled
    (a constant one left out; the last ones left out while the columns are collinear);
    or the covariate that differs only between the arms."""
    d = treated[ok].astype(float)
    cols = [np.ones(d.size), d]
    for c in covariates:
        v = cov[c].to_numpy(dtype=float)[ok]
        v = v - np.average(v, weights=w)
        if np.ptp(v) == 0:
            continue  # constant: nothing to adjust for
        v = v / np.sqrt(np.average(v * v, weights=w))
        if np.linalg.matrix_rank(np.column_stack([cols[0], d, v])) < 3:
            return c
        cols.append(v)
    x: Array = np.column_stack(cols)
    while np.linalg.matrix_rank(x) < x.shape[1] and x.shape[1] > 2:
        x = x[:, :-1]  # covariates collinear among themselves: the last is left out
    return x


class _Designs:
    """The designs of fit_today's outcomes by their rows: outcomes observed on the same
    windows share one (it depends on nothing else), built and rank-checked once."""

    def __init__(self) -> None:
        self.seen: list[tuple[npt.NDArray[np.bool_], Array | str]] = []

    def of(self, ok: npt.NDArray[np.bool_], build: Callable[[], Array | str]) -> Array | str:
        for rows, design in self.seen:
            if np.array_equal(rows, ok):
                return design
        design = build()
        self.seen.append((ok, design))
        return design


def cannot_effect(o: Outcome, level: float, why: str, windows: int = 0) -> Effect:
    scale = "ratio" if o.log else "difference"
    return Effect(o.name, o.label, o.unit, scale, math.nan, math.nan, nan_interval(level),
                  math.nan, windows, False, why)  # fmt: skip


def _effect(  # noqa: PLR0917, PLR0913 - one outcome of fit_today, its arrays passed through
    data: pd.DataFrame,
    o: Outcome,
    use: npt.NDArray[np.bool_],
    treated: npt.NDArray[np.bool_],
    unit: _Units,
    cov: pd.DataFrame,
    covariates: list[str],
    weight: Array,
    level: float,
    designs: _Designs,
) -> Effect:
    if o.name not in data.columns:
        return cannot_effect(o, level, f"the windows have no {o.label}")
    y = data[o.name].to_numpy(dtype=float)
    ok = use & np.isfinite(y) & (y > 0 if o.log else True)
    for c in covariates:
        ok &= np.isfinite(cov[c].to_numpy(dtype=float))
    if min(int((ok & treated).sum()), int((ok & ~treated).sum())) < MIN_WINDOWS_PER_ARM:
        return cannot_effect(o, level, f"fewer than {MIN_WINDOWS_PER_ARM} windows with {o.label} "
                       "in an arm", int(ok.sum()))  # fmt: skip
    groups = unit.groups(ok)
    if min(unit.count(ok & treated), unit.count(ok & ~treated)) < MIN_UNITS:
        return cannot_effect(o, level, f"fewer than {MIN_UNITS} units report {o.label} in an arm",
                       int(ok.sum()))  # fmt: skip
    w = weight[ok]
    control = float(np.average(y[ok & ~treated], weights=weight[ok & ~treated]))
    yy = np.log(y[ok]) if o.log else y[ok]
    x = designs.of(ok, lambda: _design(ok, treated, cov, covariates, w))
    if isinstance(x, str):
        return cannot_effect(o, level, f"{TRAFFIC[x]} differs only between the arms, "
                             "never within one: the mode cannot be told from it",
                             int(ok.sum()))  # fmt: skip
    b, se, df = wls_cr2(yy, x, w, groups, column=1)
    t = t_quantile(level, df) if math.isfinite(df) and df > 0 else math.inf
    lo, hi = b - t * se, b + t * se
    if o.log:
        est, iv = math.exp(b), Interval(exp_or_inf(lo), exp_or_inf(hi), level)
    else:
        est, iv = b, Interval(lo, hi, level)
    told = math.isfinite(se) and se > 0 and math.isfinite(t)
    why = "" if told else "the mode's standard error is not finite (too few units vary)"
    return Effect(o.name, o.label, o.unit, "ratio" if o.log else "difference", control, est,
                  iv, df, int(ok.sum()), told, why)  # fmt: skip


def wls_cr2(
    y: Array, x: Array, w: Array, groups: npt.NDArray[np.int64], *, column: int
) -> tuple[float, float, float]:
    """(coefficient, CR2 standard error, Bell–McCaffrey ν) of ``x[:, column]`` in the WLS
    fit of ``y`` on ``x`` with weights ``w`` and clusters ``groups`` (planner/fit/cr2.py)."""
    sw = np.sqrt(w / np.mean(w))
    xs, ys = x * sw[:, None], y * sw
    xtx_inv: Array = np.linalg.inv(xs.T @ xs).astype(np.float64)
    beta = xtx_inv @ (xs.T @ ys)
    resid = ys - xs @ beta
    v = cr2(xs, resid, groups, xtx_inv)
    c = np.zeros(x.shape[1])
    c[column] = 1.0
    var = float(v.cov[column, column])
    df = float(v.df(c[None, :])[0])
    return float(beta[column]), math.sqrt(var) if var > 0 else math.nan, df
