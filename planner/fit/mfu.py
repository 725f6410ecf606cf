"""Effective prefill MFU from TTFT vs prompt length at low load.

ttft = t0 + θ·F + ε on low-load windows, F the prefill FLOPs of the window's mean prompt net
of its local prefix hits (cost model: linear + causal attention); MFU = 1/(θ·peak). WLS by
TTFT count, CR2 by engine with Bell–McCaffrey df (HC3 with one engine), plus a shape check
of the cost model's linear/quadratic mix.

Method: planner/fit/METHODS.md#mfu
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from core.errors import ConfigError
from planner.fit.common import (
    Estimate,
    FitResult,
    Interval,
    RobustOLS,
    check_level,
    engine_groups,
    fmt,
    nan_interval,
    ols_robust,
    recorded_warnings,
    require_history,
    t_quantile,
)

if TYPE_CHECKING:
    import numpy.typing as npt
    import pandas as pd

    Array = npt.NDArray[np.float64]

WHAT = "prefill MFU"


@dataclass(frozen=True, slots=True)
class MfuFit(FitResult):
    """``estimate`` = effective prefill MFU (0-1)."""

    seconds_per_flop: Estimate  # θ
    overhead_s: Estimate  # t0
    prefill_tokens_per_s: Estimate  # at the median prompt length
    reference_prompt_tokens: float
    shape_p: float  # robust p-value of the extra linear term (cost-model shape check)
    cov_type: str  # "CR2" (by engine, Bell–McCaffrey df) | "HC3" (one engine)
    prompt_range: tuple[float, float]


@dataclass(frozen=True, slots=True)
class _Windows:
    """The low-load windows' arrays, one entry per window."""

    ttft: Array  # mean TTFT (s)
    prompt: Array  # mean prompt tokens
    w: Array  # weight: the TTFT count (1 where missing)
    hit: Array  # local + external hit ratio
    new_tokens: Array  # prompt tokens prefilled (not cached)
    flops: Array  # prefill FLOPs net of the cached part
    groups: npt.NDArray[np.int64]  # engine


@dataclass(frozen=True, slots=True)
class _Regression:
    """The WLS of TTFT on [1, FLOPs / scale] and the cost-model shape check."""

    ols: RobustOLS
    df: Array  # ν per coefficient
    scale: float  # the mean FLOPs the regressor is divided by
    shape_p: float
    warnings: tuple[str, ...]


def fit_mfu(  # noqa: PLR0913 - keyword-only fit options with defaults
    frame: pd.DataFrame,
    prefill_flops: Callable[[float], float],
    peak_flops: float,
    *,
    level: float = 0.95,
    max_running: float = 2.0,
    max_waiting: float = 0.1,
    max_prefix_hit: float = 1.0,
    max_external_hit: float = 0.1,
    min_windows: int = 20,
) -> MfuFit:
    """Fit TTFT = t0 + θ·[F(prompt) − F(cached)] on low-load windows; MFU = 1/(θ·peak_flops).

    ``prefill_flops(prompt_tokens)`` returns the FLOPs of one whole prompt (e.g.
    ``lambda s: costmodel.prefill_flops(model, s, 0)``); the cached part of a prompt is
    subtracted (METHODS.md#mfu). Raises InsufficientHistory when fewer than
    ``min_windows`` low-load windows have TTFT and prompt-length data.
    """
    check_level(level)
    if not (math.isfinite(peak_flops) and peak_flops > 0):
        raise ConfigError(f"peak_flops must be a positive number of FLOP/s, got {peak_flops}")
    data = _low_load(frame, max_running, max_waiting, max_prefix_hit, max_external_hit)
    require_history(f"{WHAT} (low-load windows)", len(data), min_windows)
    win = _windows(data, prefill_flops)
    load = (
        f"running <= {max_running}, waiting <= {max_waiting}, "
        f"prefix hit <= {max_prefix_hit}, external hit <= {max_external_hit}"
    )
    fit = _unanswered(win, level=level, peak_flops=peak_flops, load=load)
    flops = win.flops
    spread = float(np.std(flops) / np.mean(flops)) if np.mean(flops) > 0 else 0.0
    if spread < 0.1:
        return replace(
            fit,
            why=f"prompt FLOPs barely vary (FLOPs CV {spread:.2f} < 0.1): overhead and "
            "compute time cannot be separated",
        )
    reg = _regress(win, fit.cov_type)
    return _answer(fit, reg, prefill_flops=prefill_flops, peak_flops=peak_flops, level=level)


def _windows(data: pd.DataFrame, prefill_flops: Callable[[float], float]) -> _Windows:
    """The windows' TTFT, prompt, weight, hit ratio, new tokens, FLOPs and engine."""
    ttft = data["ttft_mean_s"].to_numpy(dtype=float)
    prompt = data["prompt_tokens_mean"].to_numpy(dtype=float)
    w = data["ttft_count"].to_numpy(dtype=float) if "ttft_count" in data else np.ones(len(data))
    w = np.where(np.isfinite(w) & (w > 0), w, 1.0)
    hit = np.zeros(len(data))
    for col in ("prefix_hit_ratio", "external_hit_ratio"):
        if col in data.columns:
            h = data[col].to_numpy(dtype=float)
            hit = 1.0 - (1.0 - hit) * (1.0 - np.clip(np.where(np.isfinite(h), h, 0.0), 0, 1))
    new_tokens = prompt * (1.0 - hit)  # cached tokens need no prefill ...
    flops = _flops_after_cache(prefill_flops, prompt, prompt * hit)  # ... but are attended to
    return _Windows(ttft, prompt, w, hit, new_tokens, flops, engine_groups(data))


def _unanswered(win: _Windows, *, level: float, peak_flops: float, load: str) -> MfuFit:
    """The answer when the data cannot tell: what the fit rests on, how it is made."""
    prompt = win.prompt
    n_eng = int(np.unique(win.groups).size)
    cov_type = "CR2" if n_eng >= 2 else "HC3"
    n = len(prompt)
    ref = float(np.median(prompt))
    basis = (
        f"{n} low-load windows ({load}) from {n_eng} engines",
        f"mean local+external hit {fmt(float(np.mean(win.hit)))}: cached tokens attended to, "
        "not prefilled",
        f"prompt tokens (window means) in [{fmt(prompt.min())}, {fmt(prompt.max())}], "
        f"peak {fmt(peak_flops)} FLOP/s",
    )
    independence = (
        f"errors clustered by engine ({n_eng} engines: independent across engines, any "
        "correlation within one)"
        if cov_type == "CR2"
        else "one engine: the interval treats its windows as independent (too narrow if "
        "its windows are correlated, e.g. by drift)"
    )
    assumptions = (
        "low load: no queueing or decode interference in the windows used",
        "window-mean prompt length and hit ratio stand in for each request's "
        "(Jensen bias if a window mixes hits and misses)",
        "one MFU for all engines given",
        independence,
    )
    errors = (
        "CR2 errors by engine, t with Bell–McCaffrey df"
        if cov_type == "CR2"
        else "HC3 errors (one engine), t(n − 2)"
    )
    method = f"WLS ttft ~ t0 + θ·[F(prompt) − F(cached)], weights = TTFT count; {errors}"
    nan_est = Estimate(math.nan, nan_interval(level))
    # the answer when the data cannot tell; the fitted one replaces what it learns
    return MfuFit(
        what=WHAT, unit="fraction of peak", n=n, method=method, assumptions=assumptions,
        basis=basis, cov_type=cov_type, prompt_range=(float(prompt.min()), float(prompt.max())),
        reference_prompt_tokens=ref, estimate=math.nan, interval=nan_interval(level),
        warnings=(), can_tell=False, why="", seconds_per_flop=nan_est, overhead_s=nan_est,
        prefill_tokens_per_s=nan_est, shape_p=math.nan,
    )  # fmt: skip


def _regress(win: _Windows, cov_type: str) -> _Regression:
    """WLS of TTFT on FLOPs in units of the mean prompt's, and the p-value of an extra term
    linear in the new tokens (the cost model's shape check)."""
    ttft, flops, new_tokens, w, groups = win.ttft, win.flops, win.new_tokens, win.w, win.groups
    n = len(ttft)
    scale = float(np.mean(flops))  # work in units of the mean prompt's FLOPs
    with recorded_warnings() as caught:
        fit1 = _wls(ttft, np.column_stack([np.ones(n), flops / scale]), w, groups, cov_type)
        lin = new_tokens / max(float(np.mean(new_tokens)), 1e-12)
        x2 = np.column_stack([np.ones(n), flops / scale, lin])
        shape_p = math.nan
        if np.linalg.matrix_rank(x2) == 3 and abs(np.corrcoef(flops, lin)[0, 1]) < 0.99999:
            fit2 = _wls(ttft, x2, w, groups, cov_type)
            se2 = math.sqrt(max(float(fit2.cov[2, 2]), 1e-300))
            df2 = float(fit2.df(np.array([0.0, 0.0, 1.0]))[0])
            shape_p = _two_sided_p(float(fit2.params[2]) / se2, df2)
        df1 = fit1.df(np.eye(2))  # per coefficient: Bell–McCaffrey (CR2) or n − 2 (HC3)
    return _Regression(fit1, df1, scale, shape_p, tuple(caught))


def _answer(
    fit: MfuFit,
    reg: _Regression,
    *,
    prefill_flops: Callable[[float], float],
    peak_flops: float,
    level: float,
) -> MfuFit:
    """MFU = 1/(θ·peak), t0 and the prefill rate at the median prompt, with intervals."""
    params, scale, ref = reg.ols.params, reg.scale, fit.reference_prompt_tokens
    tq0, tq1 = (t_quantile(level, float(d)) for d in reg.df)
    se = np.sqrt(np.maximum(np.diag(reg.ols.cov), 0.0))
    t0_iv = Interval(float(params[0] - tq0 * se[0]), float(params[0] + tq0 * se[0]), level)
    theta = float(params[1]) / scale
    th_lo = float(params[1] - tq1 * se[1]) / scale
    th_hi = float(params[1] + tq1 * se[1]) / scale
    f_ref = float(prefill_flops(ref))
    mfu = _inv(theta * peak_flops, 1.0)
    mfu_iv = Interval(_inv(th_hi * peak_flops, 1.0), _inv(th_lo * peak_flops, 1.0), level)
    rate_iv = Interval(_inv(th_hi * f_ref, ref), _inv(th_lo * f_ref, ref), level)
    rate = Estimate(_inv(theta * f_ref, ref), rate_iv, "tokens/s")
    t0 = Estimate(float(params[0]), t0_iv, "s")
    why = ""
    if th_lo <= 0:
        why = "TTFT does not rise detectably with prompt FLOPs (θ's interval reaches 0)"
    elif mfu > 1:
        why = f"implausible MFU {mfu:.2f} > 1: check peak_flops and the cost model"
    return replace(
        fit,
        estimate=mfu,
        interval=mfu_iv,
        warnings=reg.warnings,
        can_tell=not why,
        why=why,
        seconds_per_flop=Estimate(theta, Interval(th_lo, th_hi, level), "s/FLOP"),
        overhead_s=t0,
        prefill_tokens_per_s=rate,
        shape_p=reg.shape_p,
    )


def _inv(x: float, k: float) -> float:
    return k / x if x > 0 else math.inf


def _flops_after_cache(
    prefill_flops: Callable[[float], float], prompt: Array, cached: Array
) -> Array:
    """FLOPs of prefilling ``prompt − cached`` tokens after ``cached`` context tokens:
    F(prompt) − F(cached), exact for a causal cost model (METHODS.md#mfu)."""
    whole = np.array([float(prefill_flops(float(p))) for p in prompt])
    ctx = np.array([float(prefill_flops(float(c))) if c >= 1.0 else 0.0 for c in cached])
    out: Array = np.maximum(whole - ctx, 0.0)
    return out


def _low_load(
    frame: pd.DataFrame,
    max_running: float,
    max_waiting: float,
    max_prefix_hit: float,
    max_external_hit: float,
) -> pd.DataFrame:
    """Windows with TTFT and prompt data at low load; missing hit ratios count as no hits."""
    need = ["ttft_mean_s", "prompt_tokens_mean", "running", "waiting"]
    if not all(c in frame.columns for c in need):
        return frame.iloc[0:0]
    data = frame.dropna(subset=need)
    keep = (
        (data["running"] <= max_running)
        & (data["waiting"] <= max_waiting)
        & (data["prompt_tokens_mean"] > 0)
        & (data["ttft_mean_s"] > 0)
    )
    for col, cap in (
        ("prefix_hit_ratio", max_prefix_hit),
        ("external_hit_ratio", max_external_hit),
    ):
        if col in data.columns:
            keep &= ~(data[col] > cap)  # NaN (no queries) passes
    return data[keep]


def _wls(y: Array, x: Array, w: Array, groups: npt.NDArray[np.int64], cov_type: str) -> RobustOLS:
    """WLS as OLS on rows scaled by √w (planner.fit.common.ols_robust): CR2 by engine or HC3."""
    root = np.sqrt(w)
    return ols_robust(y * root, x * root[:, None], groups if cov_type == "CR2" else None, cov_type)


def _two_sided_p(t: float, df: float) -> float:
    from scipy import stats  # noqa: PLC0415 - start-up: scipy.stats (~0.6 s) loads when this runs, not on `import planner.plan`

    return float(2.0 * stats.t.sf(abs(t), max(df, 1.0)))
