"""The planner's fitted models, and :func:`fit_all` running every fit the data supports.

One module per model (each documents its model, estimator, interval method and
assumptions, and says when the data cannot tell):

* :func:`fit_preemption` (planner.fit.preempt) — preemptions vs KV utilization: the knee
  where preemptions start (profile likelihood) and the rate's rise above it.
* :func:`fit_gain` (planner.fit.gain) — throughput vs utilization × offload mode: the
  gain of offload at each utilization and the break-even utilization.
* :func:`fit_mfu` (planner.fit.mfu) — effective prefill MFU from TTFT vs prompt length at
  low load.
* :func:`fit_hitrate` (planner.fit.hitrate) — LMCache L1 hit ratio vs size, for sizing.

Every fit takes a frame from :func:`planner.frames.frames.engine_frame`, checks the history it
needs first (raising :class:`core.errors.InsufficientHistory`), records warnings per
fit, seeds its RNG, bounds its time and returns a frozen result with an interval beside
every number (see :mod:`planner.fit.common`).

A frame whose engines form several model groups (its ``group`` column: served model, GPU,
TP; planner/frames/groups.py) is fitted per group: throughput against KV utilization of an
8B model on one GPU and of a 70B on four has no common curve. :func:`fit_all` then returns
each group's report in ``groups`` and fits nothing across them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from functools import partial
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError, InsufficientHistory
from planner.fit.common import Estimate, FitResult, Interval
from planner.fit.gain import NOT_OFFLOAD, GainFit, GainPoint, fit_gain
from planner.fit.hitrate import HitPrediction, HitRateFit, fit_hitrate
from planner.fit.mfu import MfuFit, fit_mfu
from planner.fit.preempt import PreemptionFit, fit_preemption
from planner.model.values import json_ready

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "Estimate", "FitReport", "FitResult", "GainFit", "GainPoint", "HitPrediction",
    "HitRateFit", "Interval", "MfuFit", "PreemptionFit", "Skipped", "fit_all", "fit_gain",
    "fit_hitrate", "fit_mfu", "fit_preemption",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Skipped:
    """A fit :func:`fit_all` could not run, and why (history counts when that was the cause)."""

    what: str
    reason: str
    required: int | None = None
    available: int | None = None


@dataclass(frozen=True, slots=True)
class FitReport:
    """Every fit the data supported; the others are listed in ``skipped``."""

    preemption: PreemptionFit | None
    gains: tuple[GainFit, ...]
    mfu: MfuFit | None
    hitrate: HitRateFit | None
    skipped: tuple[Skipped, ...]
    seconds: tuple[tuple[str, float], ...]  # wall time per fit
    groups: tuple[tuple[str, FitReport], ...] = ()  # (group, its report) with several groups

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (NaN and infinities become None); ``groups`` (each group's
        report and its ``name``) only when the frame held several model groups."""
        out: dict[str, Any] = {
            f.name: json_ready(getattr(self, f.name)) for f in fields(self) if f.name != "groups"
        }
        if self.groups:
            out["groups"] = [{"name": name, **r.as_dict()} for name, r in self.groups]
        return out


Flops = Callable[[float], float]


def fit_all(
    frame: pd.DataFrame,
    *,
    util: str = "kv_util",
    prefill_flops: Flops | Mapping[str, Flops] | None = None,
    peak_flops: float | Mapping[str, float] | None = None,
    level: float = 0.95,
    seed: int = 0,
    target_fraction: float = 0.9,
    group: str | None = None,
) -> FitReport:
    """Run every fit on ``frame``; a fit lacking history is listed in ``skipped``.

    The gain is fitted once per offload mode present (``native``, ``lmcache``) against
    ``none``. The MFU fit runs only with ``prefill_flops`` and ``peak_flops`` (from the cost
    model and the hardware table). Errors other than InsufficientHistory propagate.

    Model groups (module docstring): with several, each group is fitted alone and its
    report is in ``groups`` (the top-level fits are then None, with one ``skipped`` entry
    saying why); ``prefill_flops`` / ``peak_flops`` may map a group to its own (one cost
    model for several groups is not applied: a model's FLOPs are not another's). ``group``
    fits that group alone; an unknown one is a ConfigError naming the groups.
    """
    from planner.frames.groups import split_groups

    fit = partial(_fit_one, util=util, level=level, seed=seed, target_fraction=target_fraction)
    parts = split_groups(frame) if "group" in frame.columns else []
    if group is not None:
        known = ", ".join(repr(g.name) for g in parts) or "none"
        parts = [g for g in parts if g.name == group]
        if not parts:
            raise ConfigError(f"group {group!r} is not in the frame; its groups are {known}")
        frame = frame[parts[0].rows]
    if len(parts) <= 1:
        name = parts[0].name if parts else None
        return fit(frame, _of(prefill_flops, name), _of(peak_flops, name))
    one_model = prefill_flops is not None and not isinstance(prefill_flops, Mapping)
    reports = []
    for g in parts:
        if one_model:
            why = "one cost model for several model groups: pass prefill_flops per group"
            reports.append((g.name, fit(frame[g.rows], None, None, no_cost=why)))
        else:
            flops, peak = _of(prefill_flops, g.name), _of(peak_flops, g.name)
            reports.append((g.name, fit(frame[g.rows], flops, peak)))
    why = (
        f"the frame holds {len(parts)} model groups ({', '.join(g.name for g in parts)}): "
        "each is fitted alone (groups); no fit across them"
    )
    return FitReport(None, (), None, None, (Skipped("all", why),), (), tuple(reports))


def _of(value: Any, name: str | None) -> Any:
    """A per-group argument's value for group ``name`` (a plain value stands for every one)."""
    if isinstance(value, Mapping):
        return value.get(name) if name is not None else None
    return value


def _fit_one(
    frame: pd.DataFrame,
    prefill_flops: Flops | None,
    peak_flops: float | None,
    *,
    util: str,
    level: float,
    seed: int,
    target_fraction: float,
    no_cost: str | None = None,
) -> FitReport:
    """Every fit on one frame (one model group)."""
    skipped: list[Skipped] = []
    seconds: list[tuple[str, float]] = []

    def run(what: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return fn()
        except InsufficientHistory as exc:
            skipped.append(Skipped(what, str(exc), exc.required, exc.available))
            return None
        finally:
            seconds.append((what, time.perf_counter() - t0))

    preemption = run("preemption", lambda: fit_preemption(frame, util=util, level=level))
    modes: list[str] = []
    if "offload_mode" in frame.columns:
        modes = sorted(str(m) for m in frame["offload_mode"].dropna().unique()
                       if str(m) not in NOT_OFFLOAD)  # fmt: skip
    if not modes:
        skipped.append(Skipped("gain", "no windows from engines with offload (native|lmcache)"))
    gains: list[GainFit] = []
    for mode in modes:
        g = run(f"gain/{mode}", partial(fit_gain, frame, offload=mode, util=util, level=level,
                                        seed=seed))  # fmt: skip
        if g is not None:
            gains.append(g)
    mfu = None
    if prefill_flops is None or peak_flops is None:
        skipped.append(
            Skipped("mfu", no_cost or "no cost model given (prefill_flops and peak_flops)")
        )
    else:
        flops, peak = prefill_flops, peak_flops
        mfu = run("mfu", lambda: fit_mfu(frame, flops, peak, level=level))
    hitrate = run(
        "hitrate", lambda: fit_hitrate(frame, level=level, target_fraction=target_fraction)
    )
    return FitReport(
        preemption=preemption,
        gains=tuple(gains),
        mfu=mfu,
        hitrate=hitrate,
        skipped=tuple(skipped),
        seconds=tuple(seconds),
    )
