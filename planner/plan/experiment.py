"""The experiment that settles a gain fit that cannot tell: a power calculation.

When the offload gain's interval contains 0 at the current KV use, or the break-even is not
bounded, more of the same data will not necessarily help: the fit clusters its errors by
engine, so the number of engines in each mode, not the number of windows, bounds its
precision. This module plans an A/B — offload on ``k`` of the ``n`` engines for ``H`` more
hours — that reaches the target with the stated power, from the fit's own noise.

Model of the planned standard error
-----------------------------------
Residuals of log throughput (per mode, the same piecewise-linear shape in log KV use as the
gain fit, weighted by requests) split into a window part with variance ``σ_w²/w`` (w the
window's requests) and an engine part ``σ_b²`` (one-way random-effects moments). The
engine part is taken at its 80 % upper confidence limit from the history (Browne 1995: a
pilot's point estimate under-powers the study about half of the time). The
standard error of the gain at one KV use, for ``k`` treated and ``c`` control engines with
request weight ``W_t`` / ``W_c`` per engine inside the fit's support, is modelled as

    se² = σ_b²·(1/k + 1/c) + κ·σ_w²·(1/(k·W_t) + 1/(c·W_c))

(the variance of a difference of engine means; Donner & Klar 2000, "Design and Analysis of
Cluster Randomization Trials", ch. 5): an engine effect shifts the whole curve, so it enters
the gain at any KV use one for one, while ``κ`` — how much more a point of the piecewise-
linear curve costs in window noise than a mean — is calibrated so the formula gives the fit's
own standard error for the current design (at least 5 % of it is left to the windows).
``W`` grows by the cluster's own request rate per engine-hour inside the support (the load
of the history, assumed to continue). As H → ∞ the se tends to
``σ_b·√(1/k + 1/c)``: past that, only more engines in the A/B help.

Targets (two-sided level α of the fit, power 1 − β; Cohen 1988 ch. 2 for the normal form):

* the gain at the current KV use excludes 0: ``se ≤ δ / (t_{ν,1−α/2} + z_{1−β})`` with
  δ the larger of the fitted |gain| and the minimum effect of interest (log scale);
* the break-even within ±h: the gain at u* ± h, ≈ ±|g'(u*)|·h, excludes 0 on each side, so
  δ = |g'(u*)|·h at u*, with g' the slope of the fitted gain there.

Critical values: the ones the gain fit will use on the planned design (planner/fit/gain.py
chooses the covariance by the engines in each mode): t(n − 1) with CR1 (n ≥ MIN_CLUSTERS
engines), the normal with HC3 (fewer than 2 engines in a mode), and with CR2 (fewer than
MIN_CLUSTERS engines) the Bell–McCaffrey ν of the gain contrast at the target's KV use,
computed by planner.fit.cr2 on the planned design's X: the history's windows in their
modes plus, per engine, its history's windows again in its planned mode with their
weights scaled by H / (history hours) — the load assumed to continue. ν depends on X only
(the working model Var(e) = σ²I), and scaling a cluster's rows by √r is the same to it as
repeating them r times (X_g'X_g and the nonzero spectrum of H_gg agree), so this is the
ν of H more hours of the same load. The basis is the fit's default (DEFAULT_KNOTS knots at
quantiles of the pooled log KV use); a refit that cross-validates more knots may differ.
ν is small when few engines are in one arm (≈ the Welch–Satterthwaite ν of two engine means,
tests/planner/test_fit_cr2.py), so it is part of what more engines buy.

The smallest design is the one with the fewest treated engine-hours (k·H) that meets every
target; engines keep their mode (the engines already treated stay treated; the switched
ones' earlier windows still count for the control arm but not for W_t, which is
conservative).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from planner.fit.common import MIN_CLUSTERS, fmt, t_quantile

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pandas as pd

    from planner.fit.gain import GainFit

    Array = npt.NDArray[np.float64]

POWER = 0.8
HALF_WIDTH = 0.05  # ±5 pp of KV use on the break-even
MIN_EFFECT = 0.02  # smallest relative gain worth detecting (2 %)
HOURS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 36, 48, 72, 96, 120, 168)  # at most a week
SATURATED = 0.95  # as planner.fit.gain.SATURATED_UTIL
KNOTS = 3  # planner.fit.gain_curve.DEFAULT_KNOTS
# The engine variance is planned at its one-sided 80 % upper confidence limit, so the design
# reaches its power in at least ~80 % of clusters like this one (Browne 1995, Statistics in
# Medicine 14(17):1933–1940, "On the use of a pilot sample for sample size determination").
UCL = 0.8


@dataclass(frozen=True, slots=True)
class Noise:
    """The fit's window and engine noise on the log scale, and the load that feeds it."""

    sigma_w: float  # SD of a window's log throughput × √requests
    sigma_b: float  # SD of an engine's mean log throughput (engine effect)
    icc: float  # within-engine correlation of windows of mean weight
    design_effect: float  # 1 + (m − 1)·icc for the mean engine's m windows
    weight_per_engine_hour: float  # requests per engine-hour inside the support
    windows_per_engine_hour: float
    hours: float  # history length
    treated: tuple[str, ...]  # engines of the offload mode
    control: tuple[str, ...]  # engines without offload
    weight_treated: float  # mean requests per treated engine inside the support
    weight_control: float


@dataclass(frozen=True, slots=True)
class Target:
    """One thing to settle: at KV use ``u``, an effect ``delta`` (log) to detect."""

    what: str
    u: float
    delta: float
    se_now: float
    se_needed: float


@dataclass(frozen=True, slots=True)
class Design:
    """The planned A/B and what it is expected to give."""

    mode: str
    engines: int
    treated: int  # k, the existing treated engines included
    switch: tuple[str, ...]  # control engines to switch to the offload mode
    hours: float
    reachable: bool
    targets: tuple[Target, ...]
    se_planned: tuple[float, ...]  # per target
    power: tuple[float, ...]  # per target
    df: tuple[float, ...]  # per target: ν of the refit's t interval (inf: normal)
    noise: Noise
    kappa: tuple[float, ...]
    assumptions: tuple[str, ...]
    text: str


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _z(p: float) -> float:
    from scipy import stats

    return float(stats.norm.ppf(p))


@dataclass(frozen=True, slots=True)
class _Rows:
    """The fit's windows inside its support: log KV use, log throughput, offload flag,
    request weight, engine group and engine name."""

    data: pd.DataFrame
    u: Array
    y: Array
    d: npt.NDArray[np.bool_]
    w: Array
    g: npt.NDArray[np.int64]


def _rows(frame: pd.DataFrame, fit: GainFit) -> _Rows | None:
    import numpy as np

    from planner.fit.common import engine_groups

    need = {"kv_util", "tokens_per_s", "offload_mode", "source"}
    lo, hi = fit.support
    if not need <= set(frame.columns) or not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    mode = frame["offload_mode"].astype(str)
    label = fit.offload
    on = (mode == label) if label != "offload" else ~mode.isin(["none", "unknown"])
    data = frame[on | (mode == "none")]
    data = data.dropna(subset=["kv_util", "tokens_per_s"])
    u = data["kv_util"].to_numpy(dtype=float)
    y = data["tokens_per_s"].to_numpy(dtype=float)
    keep = (u > 0) & (y > 0) & (u <= SATURATED) & (u >= lo) & (u <= hi)
    data = data[keep]
    if len(data) < 20:
        return None
    u, y = np.log(u[keep]), np.log(y[keep])
    d = (data["offload_mode"].astype(str) != "none").to_numpy()
    w = (
        np.maximum(np.nan_to_num(data["requests"].to_numpy(dtype=float), nan=1.0), 1.0)
        if "requests" in data.columns
        else np.ones(len(data))
    )
    return _Rows(data=data, u=u, y=y, d=d, w=w, g=engine_groups(data))


def noise_of(frame: pd.DataFrame, fit: GainFit) -> Noise | None:
    """Window and engine noise of the fit's data (module docstring); None without data."""
    import numpy as np
    import pandas as pd

    from planner.fit.gain_curve import basis_matrix, knots_at

    rows = _rows(frame, fit)
    if rows is None:
        return None
    data, u, y, d, w, g = rows.data, rows.u, rows.y, rows.d, rows.w, rows.g
    resid = np.zeros(len(data))
    for arm in (False, True):
        m = d == arm
        x = basis_matrix(u[m], knots_at(u[m], KNOTS), float(np.mean(u[m])))
        sw = np.sqrt(w[m])
        beta, *_ = np.linalg.lstsq(x * sw[:, None], y[m] * sw, rcond=None)
        resid[m] = y[m] - x @ beta
    codes, inv = np.unique(g, return_inverse=True)
    e = codes.size
    wsum = np.bincount(inv, weights=w, minlength=e)
    rbar = np.bincount(inv, weights=w * resid, minlength=e) / wsum
    n = len(data)
    dof = max(n - e - 2 * (KNOTS + 2), 1)
    s2w = float(np.sum(w * (resid - rbar[inv]) ** 2) / dof)
    between = float(np.var(rbar, ddof=1)) if e > 1 else 0.0
    if e > 1:  # the pilot's upper confidence limit (Browne 1995): a short history cannot
        # tell the engine spread from the window noise, and its point estimate is often 0
        from scipy import stats

        between *= (e - 1) / float(stats.chi2.ppf(1.0 - UCL, e - 1))
    s2b = max(0.0, between - float(np.mean(s2w / wsum)))
    start = data["start"].to_numpy(dtype=float) if "start" in data.columns else None
    length = (
        data["window_s"].to_numpy(dtype=float) if "window_s" in data.columns else np.full(n, 60.0)
    )
    if start is not None:
        span = float(start.max() + length[np.argmax(start)] - start.min())
    else:
        span = float(np.sum(length)) / e
    hours = max(span / 3600.0, 1.0 / 60.0)
    mean_w = float(np.mean(w))
    m_e = n / e
    icc = s2b / (s2b + s2w / mean_w) if s2b + s2w > 0 else 0.0
    src = data["source"].astype(str).to_numpy()
    treated = tuple(sorted(set(src[d])))
    control = tuple(sorted(set(src[~d])))
    arm_w = pd.Series(w).groupby(d).sum()
    return Noise(
        sigma_w=math.sqrt(s2w),
        sigma_b=math.sqrt(s2b),
        icc=icc,
        design_effect=1.0 + (m_e - 1.0) * icc,
        weight_per_engine_hour=float(wsum.mean()) / hours,
        windows_per_engine_hour=m_e / hours,
        hours=hours,
        treated=treated,
        control=control,
        weight_treated=float(arm_w.get(True, 0.0)) / max(len(treated), 1),
        weight_control=float(arm_w.get(False, 0.0)) / max(len(control), 1),
    )


def model_var(noise: Noise, k: int, c: int, w_t: float, w_c: float) -> tuple[float, float]:
    """The engine and the window parts of se² (module docstring), the latter with κ = 1."""
    s2b, s2w = noise.sigma_b**2, noise.sigma_w**2
    return s2b * (1.0 / k + 1.0 / c), s2w * (
        1.0 / (k * max(w_t, 1e-9)) + 1.0 / (c * max(w_c, 1e-9))
    )


def _log_point(fit: GainFit, u: float) -> tuple[float, float, float]:
    """(u of the nearest grid point, log gain, its se) from the fit's pointwise interval."""
    p = min(fit.grid, key=lambda q: abs(q.u - u))
    iv = p.relative_interval
    g = math.log1p(p.relative)
    lo, hi = math.log1p(iv.lo), math.log1p(iv.hi)
    # the fit's own critical value at that point: t(ν) with its ν (Bell–McCaffrey with CR2)
    return p.u, g, (hi - lo) / (2.0 * t_quantile(iv.level, _finite(p.df)))


def _finite(df: float) -> float:
    """ν for t_quantile: a contrast with no variance (NaN ν) is taken as normal."""
    return df if math.isfinite(df) and df > 0 else math.inf


def planned_df(
    rows: _Rows, history_hours: float, treated: frozenset[str], hours: float, us: list[float]
) -> list[float]:
    """Bell–McCaffrey ν of the gain at each KV use in ``us`` for the planned design: the
    history's windows in their modes, then ``hours`` more of the same load with the engines
    in ``treated`` on offload (module docstring, "Critical values")."""
    import numpy as np

    from planner.fit.cr2 import cr2
    from planner.fit.gain_curve import basis_matrix, knots_at

    src = rows.data["source"].astype(str).to_numpy()
    xs = np.concatenate([rows.u, rows.u])
    d = np.concatenate([rows.d, np.isin(src, sorted(treated))]).astype(float)
    w = np.concatenate([rows.w, rows.w * (hours / history_hours)])
    g = np.concatenate([rows.g, rows.g])
    centre = 0.5 * (float(xs.min()) + float(xs.max()))
    kn = knots_at(xs, KNOTS)
    x = basis_matrix(xs, kn, centre)
    design = np.hstack([x, x * d[:, None]]) * np.sqrt(w)[:, None]
    bread = np.linalg.pinv(design.T @ design)
    fitted = cr2(design, np.zeros(xs.size), g, bread)
    b = basis_matrix(np.log(np.asarray(us, dtype=float)), kn, centre)
    return [float(v) for v in fitted.df(np.hstack([np.zeros_like(b), b]))]


def _slope(fit: GainFit, u: float) -> float:
    """|d log-gain / d u| of the fitted curve at u (central difference on its grid)."""
    pts = sorted(fit.grid, key=lambda q: q.u)
    if len(pts) < 3:
        return math.nan
    i = min(range(len(pts)), key=lambda j: abs(pts[j].u - u))
    a, b = pts[max(i - 1, 0)], pts[min(i + 1, len(pts) - 1)]
    if b.u <= a.u:
        return math.nan
    return abs(math.log1p(b.relative) - math.log1p(a.relative)) / (b.u - a.u)


def needs_experiment(fit: GainFit, u_now: float | None) -> list[str]:
    """What the fit cannot tell: "gain" (its interval at u_now contains 0) and/or
    "break-even" (not located, or its interval is open at the edge)."""
    out: list[str] = []
    if not fit.grid:
        return out
    lo, hi = fit.support
    if u_now is not None and lo <= u_now <= hi:
        iv = min(fit.grid, key=lambda q: abs(q.u - u_now)).relative_interval
        if iv.lo <= 0.0 <= iv.hi:
            out.append("gain")
    if fit.verdict in ("positive_above", "negative_below", "undetermined") or (
        fit.verdict == "crosses" and not fit.can_tell
    ):
        out.append("break-even")
    return out


def _break_even_at(fit: GainFit) -> float:
    if fit.verdict == "crosses" and math.isfinite(fit.estimate):
        return fit.estimate
    if fit.verdict == "positive_above" and math.isfinite(fit.interval.hi):
        return fit.interval.hi
    if fit.verdict == "negative_below" and math.isfinite(fit.interval.lo):
        return fit.interval.lo
    if fit.roots:
        return fit.roots[0]
    return math.nan


def plan_experiment(
    frame: pd.DataFrame,
    fit: GainFit,
    u_now: float | None,
    *,
    power: float = POWER,
    half_width: float = HALF_WIDTH,
    min_effect: float = MIN_EFFECT,
    hours: tuple[float, ...] = HOURS,
) -> Design | None:
    """The smallest A/B (module docstring) settling what ``fit`` cannot tell at ``u_now``;
    None when the fit can tell (nothing to settle) or its data give no noise estimate."""
    what = needs_experiment(fit, u_now)
    if not what:
        return None
    rows = _rows(frame, fit)
    noise = noise_of(frame, fit)
    if rows is None or noise is None:
        return None
    level = fit.interval.level if math.isfinite(fit.interval.level) else 0.95
    k0, c0 = len(noise.treated), len(noise.control)
    n = k0 + c0
    if k0 < 1 or c0 < 1:
        return None
    z = _z(power)
    targets: list[Target] = []
    notes: list[str] = []
    if "gain" in what and u_now is not None:
        u, g, se = _log_point(fit, u_now)
        delta = max(abs(g), math.log1p(min_effect))
        targets.append(Target("gain", u, delta, se, math.nan))
    if "break-even" in what:
        ub = _break_even_at(fit)
        s = _slope(fit, ub) if math.isfinite(ub) else math.nan
        if math.isfinite(s) and s > 0:
            u, _, se = _log_point(fit, ub)
            delta = s * half_width
            targets.append(Target("break-even", u, delta, se, math.nan))
        else:
            notes.append(
                "the break-even cannot be planned: the fitted gain has no slope to locate it by"
            )
    targets = [t for t in targets if math.isfinite(t.se_now) and t.se_now > 0]
    if not targets:
        return None
    b_now, w_now = model_var(noise, k0, c0, noise.weight_treated, noise.weight_control)
    # κ: what the window part costs at this point of the curve, from the fit's own se
    kappa = tuple(max(t.se_now**2 - b_now, 0.05 * t.se_now**2) / w_now for t in targets)
    rate = noise.weight_per_engine_hour
    # switch the busiest control engines: their load is nearest the break-even
    busy = _busiest(frame, noise.control)
    dfs: dict[tuple[int, float], list[float]] = {}

    def df_of(k: int, h: float) -> list[float]:
        """ν of each target's interval in the fit of the planned design (module docstring):
        the covariance planner/fit/gain.py will choose for k of n engines on offload."""
        if (k, h) not in dfs:
            if k < 2 or c0 < 2 or n < 4:  # HC3: t(n − p), the normal at these sizes
                dfs[k, h] = [math.inf] * len(targets)
            elif n >= MIN_CLUSTERS:  # CR1
                dfs[k, h] = [float(n - 1)] * len(targets)
            else:  # CR2 with Bell–McCaffrey ν
                arm = frozenset((*noise.treated, *busy[: k - k0]))
                nus = planned_df(rows, noise.hours, arm, h, [t.u for t in targets])
                dfs[k, h] = [_finite(v) for v in nus]
        return dfs[k, h]

    def needed(k: int, h: float) -> list[float]:
        return [
            t.delta / (t_quantile(level, v) + z) for t, v in zip(targets, df_of(k, h), strict=True)
        ]

    def se_of(k: int, h: float) -> list[float]:
        w_t = (k0 * (noise.weight_treated + rate * h) + (k - k0) * rate * h) / k
        w_c = noise.weight_control + rate * h
        b, w = model_var(noise, k, n - k, w_t, w_c)
        return [math.sqrt(b + kp * w) for kp in kappa]

    best: tuple[float, int, float] | None = None
    ks = range(max(k0, 2), n - 1) if n >= 4 else range(k0, k0 + 1)
    for k in ks:
        for h in hours:
            ses = se_of(k, h)
            if all(s <= q for s, q in zip(ses, needed(k, h), strict=True)):
                cand = (k * h, k, h)
                if best is None or cand < best:
                    best = cand
                break
    reachable = best is not None
    if best is None:  # the most the cluster can give: half its engines, the longest run
        k = max(min(n // 2, n - 2), k0) if n >= 4 else k0
        best = (k * hours[-1], k, float(hours[-1]))
    _, k, h = best
    ses = se_of(k, h)
    nus = df_of(k, h)
    crits = [t_quantile(level, v) for v in nus]
    targets = [replace(t, se_needed=q) for t, q in zip(targets, needed(k, h), strict=True)]
    pw = tuple(
        _normal_cdf(t.delta / s - q) + _normal_cdf(-t.delta / s - q)
        for s, t, q in zip(ses, targets, crits, strict=True)
    )
    switch = tuple(busy[: k - k0])
    mode = fit.offload
    floor = noise.sigma_b * math.sqrt(1.0 / k + 1.0 / max(n - k, 1))
    assumptions = (
        f"noise from the fit's windows: σ_w {fmt(noise.sigma_w)} (log tokens/s × √requests), "
        f"engine SD σ_b {fmt(noise.sigma_b)} (80 % upper confidence limit), within-engine "
        f"correlation {noise.icc:.2f}, design effect {noise.design_effect:.0f} "
        f"({fmt(noise.windows_per_engine_hour)} windows per engine-hour): "
        + (
            "the engines, not the windows, bound the precision"
            if noise.sigma_b > 0
            else "the history does not resolve an engine spread (planned as 0: if the engines "
            "differ, the design is optimistic and more engines, not hours, are needed)"
        ),
        f"load stays as in the history: {fmt(rate)} requests per engine-hour inside the "
        f"fit's support [{fmt(fit.support[0])}, {fmt(fit.support[1])}]",
        "effect assumed: "
        + "; ".join(
            f"{t.what} at KV use {t.u:.2f}: "
            + (
                f"{math.expm1(t.delta):+.1%} (the larger of the fitted gain and {min_effect:.0%})"
                if t.what == "gain"
                else f"slope of the fitted gain × {half_width * 100:.0f} pp = {t.delta:.3g} (log)"
            )
            for t in targets
        ),
        f"{level:.0%} intervals with {_critical_text(n, k, c0, nus)}, power {power:.0%}; "
        "the switched engines' earlier windows are not counted for the offload arm",
        f"with unlimited hours the gain's se cannot fall below {fmt(floor)} (log) on {k} of {n} "
        "engines",
        *notes,
    )
    aim = " and ".join(
        "the gain's interval excluding 0"
        if t.what == "gain"
        else f"the break-even within ±{half_width * 100:.0f} pp"
        for t in targets
    )
    if reachable and switch:
        text = (
            f"run {mode} offload on {k} of {n} engines (switch {', '.join(switch)}) for "
            f"~{h:g} h at current load to get {aim} with {min(pw):.0%} power"
        )
    elif reachable:
        text = (
            f"keep {mode} offload on the {k} of {n} engines that run it and collect ~{h:g} h "
            f"more at current load to get {aim} with {min(pw):.0%} power"
        )
    else:
        text = (
            f"not reachable within {hours[-1]} h with {n} engines: {k} of {n} on {mode} offload "
            f"for {h:g} h gives {min(pw):.0%} power for {aim}; more engines are needed"
        )
    return Design(
        mode=mode, engines=n, treated=k, switch=switch, hours=float(h), reachable=reachable,
        targets=tuple(targets), se_planned=tuple(ses), power=pw, df=tuple(nus), noise=noise,
        kappa=kappa, assumptions=assumptions, text=text,
    )  # fmt: skip


def _critical_text(n: int, k: int, c0: int, nus: list[float]) -> str:
    """The critical values the refit will use, as the fit chooses them (module docstring)."""
    if k < 2 or c0 < 2 or n < 4:
        return "normal critical values (HC3: too few engines in a mode to cluster)"
    if n >= MIN_CLUSTERS:
        return f"t({n - 1}) (engine-clustered, CR1)"
    shown = ", ".join(fmt(v) for v in nus)
    return (
        f"t(ν), ν = {shown} (CR2 with Bell–McCaffrey degrees of freedom of the planned "
        f"design: {k} of {n} engines on offload)"
    )


def _busiest(frame: pd.DataFrame, sources: tuple[str, ...]) -> list[str]:
    """``sources`` by mean KV use, highest first (ties by name)."""
    if "kv_util" not in frame.columns:
        return sorted(sources)
    sub = frame[frame["source"].astype(str).isin(sources)]
    means = sub.groupby(sub["source"].astype(str))["kv_util"].mean()
    return sorted(sources, key=lambda s: (-float(means.get(s, 0.0)), s))


def design_entry(
    design: Design, configs: dict[str, str] | None, why_no_config: str
) -> dict[str, Any]:
    """The JSON of a design, with the configs for the switched engines."""
    return {
        "text": design.text,
        "mode": design.mode,
        "engines": design.engines,
        "treated": design.treated,
        "switch": list(design.switch),
        "hours": design.hours,
        "reachable": design.reachable,
        "targets": [
            {
                "what": t.what,
                "u": t.u,
                "effect_log": t.delta,
                "se_now": t.se_now,
                "se_needed": t.se_needed,
                "se_planned": s,
                "power": p,
                "df": v if math.isfinite(v) else None,
            }
            for t, s, p, v in zip(
                design.targets, design.se_planned, design.power, design.df, strict=True
            )
        ],
        "noise": {
            "sigma_window": design.noise.sigma_w,
            "sigma_engine": design.noise.sigma_b,
            "icc": design.noise.icc,
            "design_effect": design.noise.design_effect,
            "requests_per_engine_hour": design.noise.weight_per_engine_hour,
        },
        "assumptions": list(design.assumptions),
        "configs": configs or {},
        "configs_why": "" if configs else why_no_config,
    }
