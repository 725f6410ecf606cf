"""The verdict of a mode run as a switchback on a canary (planner/fit/switchback.py).

Today's effects: each outcome of planner/fit/effects.py OUTCOMES fitted with engine and
time-period fixed effects, errors clustered on time periods (CR2, Bell–McCaffrey ν); the units
are the canary's periods, not windows.

Capacity at the SLO: the canary's capacity (planner/fit/capacity.py ``unit_capacity``) in its
on-periods over its off-periods. Its interval comes from a seeded bootstrap of periods within
each arm (percentile; periods are the independent units): with few periods it is rough, which
is why at least MIN_PERIODS per arm are needed before it can tell.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from core.errors import InsufficientHistory, KvscopeError
from planner.domain.slo import Slo
from planner.fit.capacity import (
    CapacityComparison,
    UnitCapacity,
    unit_capacity,
    violations,
)
from planner.fit.common import Interval, exp_or_inf, nan_interval
from planner.fit.effects import OUTCOMES, Effect, TodayEffects, cannot_effect, derived_outcomes
from planner.fit.switchback import (
    DEFAULT_WASHOUT_S,
    carried_over,
    find_switchbacks,
    fit_switchback,
    switchback_periods,
)
from planner.fit.units import TRAFFIC, balance, engine_keys, traffic
from planner.frames.groups import text_values

if TYPE_CHECKING:
    import pandas as pd

MIN_PERIODS = 3  # per arm, before the bootstrap of the capacity ratio is read
N_BOOT = 2000


def switching_for(frame: pd.DataFrame, mode: str) -> list[str]:
    """Engines whose rows carry ``mode`` and ``none`` (and nothing else known)."""
    keys = engine_keys(frame)
    modes = text_values(frame["offload_mode"])
    out = []
    for e in find_switchbacks(frame):
        seen = set(modes[keys == e]) - {"unknown", "nan"}
        if seen == {mode, "none"}:
            out.append(e)
    return out


def switchback_today(frame: pd.DataFrame, mode: str, level: float) -> TodayEffects:
    """Today's effects of ``mode`` from the switchback (module docstring)."""
    data = derived_outcomes(frame)
    cov = traffic(data)
    data = data.assign(**{c: cov[c] for c in TRAFFIC})
    effects: list[Effect] = []
    periods_on = periods_off = 0
    warns: list[str] = []
    switching: tuple[str, ...] = ()
    controls: tuple[str, ...] = ()
    mode_of = text_values(data["offload_mode"])  # each row's mode, read once
    req = data["requests"].to_numpy(dtype=float)
    for o in OUTCOMES:
        try:
            fit = fit_switchback(data, offload=mode, outcome=o.name, log=o.log, level=level,
                                 covariates=tuple(TRAFFIC))  # fmt: skip
        except (InsufficientHistory, KvscopeError) as exc:
            effects.append(cannot_effect(o, level, str(exc)))
            continue
        arms = dict(fit.periods_by_arm)
        periods_on = max(periods_on, arms.get(mode, 0))
        periods_off = max(periods_off, arms.get("none", 0))
        switching, controls = fit.switching, fit.controls
        warns += list(fit.warnings)
        est = fit.ratio.value if o.log else fit.estimate
        iv = fit.ratio.interval if o.log else fit.interval
        y = data[o.name].to_numpy(dtype=float)
        ok = (mode_of == "none") & np.isfinite(y) & (req > 0)
        control = float(np.average(y[ok], weights=req[ok])) if ok.any() else math.nan
        effects.append(Effect(o.name, o.label, o.unit, "ratio" if o.log else "difference",
                              control, est, iv, fit.df, fit.n, fit.can_tell,
                              fit.why))  # fmt: skip
    bal = balance(cov, mode_of == mode, req)
    told = any(e.can_tell for e in effects)
    why = "" if told else "no outcome could be estimated: " + (effects[0].why if effects else "")
    method = (
        "switchback: WLS of each outcome on the mode, engine and time-block fixed effects and "
        "traffic mix, weighted by requests; CR2 errors clustered on time blocks, "
        f"Bell–McCaffrey df; {level:.0%} intervals"
    )
    assumptions = (
        "the canary is compared with itself, on against off, net of what the control engines "
        "saw in the same time blocks",
        "the first minutes after each switch, and the windows after them while a queue "
        "inherited from the other mode drains, are left out (washout); carry-over longer "
        "than that biases the effect",
        "time blocks are independent once their common level is removed",
    )
    return TodayEffects(mode, periods_on, periods_off, len(switching), len(controls),
                        tuple(effects), bal, tuple(TRAFFIC), level, method, assumptions,
                        tuple(warns), told, why)  # fmt: skip


def switchback_capacity(
    frame: pd.DataFrame,
    engine: str,
    mode: str,
    *,
    slo: Slo,
    level: float,
    claim_level: float,
    seed: int,
) -> CapacityComparison:
    """The canary's capacity on over off, its interval a bootstrap of periods (module docstring)."""
    keys = engine_keys(frame)
    rows = keys == engine
    sub = frame[rows]
    load = sub["tokens_per_s"].to_numpy(dtype=float)
    missed = violations(sub, slo)
    start = sub["start"].to_numpy(dtype=float)
    arm = text_values(sub["offload_mode"])
    wait = sub["waiting"].to_numpy(dtype=float)
    done = sub["requests"].to_numpy(dtype=float)
    periods = switchback_periods(frame, engine)
    period_of = np.full(start.size, -1)
    for i, b in enumerate(periods):
        # the washout after a switch is left out, as in the effects' fit
        inside = np.flatnonzero((start >= b.start) & (start < b.end))
        if i:
            inside = inside[~carried_over(start[inside], wait[inside], done[inside], b.start,
                                          DEFAULT_WASHOUT_S)]  # fmt: skip
        period_of[inside] = i
    keep = period_of >= 0
    load, missed, arm, period_of = load[keep], missed[keep], arm[keep], period_of[keep]
    by_arm = {a: [i for i, b in enumerate(periods) if b.mode == a] for a in (mode, "none")}
    caps = []
    for a in (mode, "none"):
        m = arm == a
        value, status = unit_capacity(load[m], missed[m])
        caps.append(UnitCapacity(f"{engine} ({a} blocks)", a, 1, value, status, int(m.sum()),
                                 int(missed[m].sum())))  # fmt: skip
    method = (
        f"switchback: the canary's capacity (load where the share of windows missing the SLO, "
        f"{slo.text()}, crosses 1/2) in its {mode} blocks over its blocks without; interval "
        f"from a seeded bootstrap of blocks within each arm ({N_BOOT} draws, percentile)"
    )
    assumptions = (
        "the canary's load differs between its blocks only by chance (a randomized schedule)",
        "blocks are independent; a bootstrap of few blocks is rough",
    )
    n_on, n_off = len(by_arm[mode]), len(by_arm["none"])
    base = CapacityComparison(mode, slo, math.nan, nan_interval(level), "",
                              nan_interval(claim_level), math.nan, caps[1].value, caps[0].value,
                              tuple(caps), n_on, n_off, method, assumptions, False, "",
                              "")  # fmt: skip
    settle = (
        f"at least {MIN_PERIODS} blocks per arm with windows past the SLO: continue the "
        "switchback through busier hours"
    )
    if min(n_on, n_off) < MIN_PERIODS:
        return replace(base, why=f"{n_on} {mode} and {n_off} off block(s): the switchback "
                       f"needs at least {MIN_PERIODS} per arm", settle=settle)  # fmt: skip
    if caps[1].status != "measured" or caps[0].status not in ("measured", "above"):
        where = "without offload" if caps[1].status != "measured" else f"with {mode}"
        return replace(base, why=f"the canary's windows {where} did not cross the SLO at a "
                       "load it carried, so its capacity there is unknown",
                       settle=settle)  # fmt: skip
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(N_BOOT):
        logs = []
        for a in (mode, "none"):
            pick = rng.choice(by_arm[a], size=len(by_arm[a]), replace=True)
            idx = np.concatenate([np.flatnonzero(period_of == i) for i in pick])
            value, status = unit_capacity(load[idx], missed[idx])
            logs.append(math.log(value) if math.isfinite(value) and value > 0 else math.nan)
        draws.append(logs[0] - logs[1])
    d = np.asarray(draws)
    d = d[np.isfinite(d)]
    if d.size < N_BOOT // 2:
        return replace(base, why="the bootstrap of blocks gave too few finite capacities",
                       settle=settle)  # fmt: skip
    lower = caps[0].status == "above"
    ratio = caps[0].value / caps[1].value

    def pct(lv: float) -> Interval:
        lo, hi = np.quantile(d, [(1 - lv) / 2, (1 + lv) / 2])
        return Interval(exp_or_inf(lo), math.inf if lower else exp_or_inf(hi), lv)

    iv, claim = pct(level), pct(claim_level)
    if not iv.lo <= ratio:
        iv = replace(iv, lo=min(iv.lo, ratio))
        claim = replace(claim, lo=min(claim.lo, ratio))
    return replace(base, ratio=ratio, interval=iv, claim_interval=claim,
                   bound="lower" if lower else "", can_tell=True)  # fmt: skip
