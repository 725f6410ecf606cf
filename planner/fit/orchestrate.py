"""The orchestrator: :func:`fit_all` runs the registered fits (planner.fit.registry) on a
frame, each timed and isolated (lacking history, a refusal or an error becomes that fit's
outcome with a reason; the others still run).

A frame of several model groups (its ``group`` column: served model, GPU, TP) is fitted
per group, since an 8B model on one GPU and a 70B on four share no curve; the report then
holds each group's report and nothing fitted across them. Methods: planner/fit/METHODS.md
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError, InsufficientHistory, KvscopeError
from planner.domain.values import json_ready
from planner.fit.common import Estimate, FitResult, Interval, check_level
from planner.fit.gain import GainFit, GainPoint, fit_gain
from planner.fit.hitrate import HitPrediction, HitRateFit, fit_hitrate
from planner.fit.mfu import MfuFit, fit_mfu
from planner.fit.preempt import PreemptionFit, fit_preemption
from planner.fit.registry import FIT_NAMES, FITS, NO_COST, FitInputs, FitSpec, arguments, fit_specs
from planner.frames.groups import split_groups

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "FITS", "FIT_NAMES", "Estimate", "FitOutcome", "FitReport", "FitResult", "FitSpec",
    "GainFit", "GainPoint", "HitPrediction", "HitRateFit", "Interval", "MfuFit",
    "PreemptionFit", "fit_all", "fit_gain", "fit_hitrate", "fit_mfu", "fit_preemption",
    "not_fitted",
]  # fmt: skip

log = logging.getLogger(__name__)
Flops = Callable[[float], float]
SEVERAL_COST = "one cost model for several model groups: pass prefill_flops per group"
SKIPPED_KEYS = ("name", "what", "why", "required", "available")  # FitReport.as_dict's skipped


@dataclass(frozen=True, slots=True)
class FitOutcome:
    """One registered fit on one frame: its result, or None and ``why`` (with the history
    counts when that was the cause); ``seconds``, its wall time, when it ran."""

    name: str
    what: str
    result: FitResult | None
    why: str | None = None
    required: int | None = None
    available: int | None = None
    seconds: float | None = None


@dataclass(frozen=True, slots=True)
class FitReport:
    """Each selected fit's outcome, in registry order; with several model groups, each
    group's report in ``groups`` (and every outcome here says why nothing was fitted)."""

    fits: tuple[FitOutcome, ...]
    groups: tuple[tuple[str, FitReport], ...] = ()

    def result(self, name: str) -> FitResult | None:
        """Fit ``name``'s result (None when it could not run); ConfigError for a name
        that is not registered or not in this report."""
        for outcome in self.fits:
            if outcome.name == name:
                return outcome.result
        fit_specs([name])  # an unregistered name: the ConfigError names the registered fits
        held = ", ".join(o.name for o in self.fits) or "none"
        raise ConfigError(f"fit {name!r} was not run: this report holds {held}")

    @property
    def skipped(self) -> tuple[FitOutcome, ...]:
        """The fits that could not run, each with its reason."""
        return tuple(o for o in self.fits if o.result is None)

    @property
    def seconds(self) -> tuple[tuple[str, float], ...]:
        """(name, wall time) of each fit that ran, successful or not."""
        return tuple((o.name, o.seconds) for o in self.fits if o.seconds is not None)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (NaN and infinities become None): ``fits`` (each result by
        name), ``skipped``, ``seconds``; ``groups`` only with several model groups."""
        out: dict[str, Any] = {
            "fits": {o.name: json_ready(o.result) for o in self.fits},
            "skipped": [{k: getattr(o, k) for k in SKIPPED_KEYS} for o in self.skipped],
            "seconds": {name: json_ready(s) for name, s in self.seconds},
        }
        if self.groups:
            out["groups"] = [{"name": name, **r.as_dict()} for name, r in self.groups]
        return out


def fit_all(  # noqa: PLR0913 - keyword-only inputs of the fits it runs
    frame: pd.DataFrame,
    *,
    util: str = "kv_util",
    prefill_flops: Flops | Mapping[str, Flops] | None = None,
    peak_flops: float | Mapping[str, float] | None = None,
    level: float = 0.95,
    seed: int = 0,
    target_fraction: float = 0.9,
    group: str | None = None,
    fits: Iterable[str] | None = None,
    no_cost: str = NO_COST,
) -> FitReport:
    """Run the registered fits (``fits``: those names; every one by default) on ``frame``,
    each timed and isolated: lacking history, a refusal or a failure is that fit's outcome
    with ``why``, and the others run. MFU needs ``prefill_flops`` and ``peak_flops`` (else
    ``no_cost`` is its reason); each gain fit needs engines of its offload mode.

    Several model groups (module docstring) are each fitted alone into ``groups``; the
    cost arguments may map a group to its own (one cost model is not applied to several).
    ``group`` fits that group alone. An unknown group or fit name is a ConfigError.
    """
    check_level(level)
    specs = fit_specs(fits)

    def inputs(part: pd.DataFrame, name: str | None, *, several: bool = False) -> FitInputs:
        if several:  # one cost model is not applied to several model groups
            return FitInputs(part, util, level, seed, target_fraction, None, None, SEVERAL_COST)
        flops, peak = _of(prefill_flops, name), _of(peak_flops, name)
        return FitInputs(part, util, level, seed, target_fraction, flops, peak, no_cost)

    parts = split_groups(frame) if "group" in frame.columns else []
    if group is not None:
        known = ", ".join(repr(g.name) for g in parts) or "none"
        parts = [g for g in parts if g.name == group]
        if not parts:
            raise ConfigError(f"group {group!r} is not in the frame; its groups are {known}")
        frame = frame[parts[0].rows]
    if len(parts) <= 1:
        return _fit_group(specs, inputs(frame, parts[0].name if parts else None))
    one_model = prefill_flops is not None and not isinstance(prefill_flops, Mapping)
    reports = tuple(
        (g.name, _fit_group(specs, inputs(frame[g.rows], g.name, several=one_model))) for g in parts
    )
    why = (
        f"the frame holds {len(parts)} model groups ({', '.join(g.name for g in parts)}): "
        "each is fitted alone (groups); no fit across them"
    )
    return not_fitted(why, specs, groups=reports)


def not_fitted(
    why: str, specs: Iterable[FitSpec] = FITS, *, groups: tuple[tuple[str, FitReport], ...] = ()
) -> FitReport:
    """A report in which every fit of ``specs`` did not run, for the same reason."""
    return FitReport(tuple(FitOutcome(s.name, s.what, None, why) for s in specs), groups)


def _of(value: Any, name: str | None) -> Any:
    """A per-group argument's value for group ``name`` (a plain value stands for every one)."""
    if isinstance(value, Mapping):
        return value.get(name) if name is not None else None
    return value


def _fit_group(specs: Iterable[FitSpec], inputs: FitInputs) -> FitReport:
    """Every fit of ``specs`` on one frame (one model group)."""
    return FitReport(tuple(_attempt(spec, inputs) for spec in specs))


def _attempt(spec: FitSpec, inputs: FitInputs) -> FitOutcome:
    """One fit on one frame; whatever stops it becomes its outcome's ``why``."""
    t0 = time.perf_counter()
    required = available = None
    try:
        args = arguments(spec, inputs)
        if isinstance(args, str):  # an input it needs is missing: not run, not timed
            return FitOutcome(spec.name, spec.what, None, args)
        result = spec.fn(inputs.frame, **args)
    except InsufficientHistory as exc:
        why, required, available = str(exc), exc.required, exc.available
    except KvscopeError as exc:
        why = f"fit refused: {exc}"
    except Exception as exc:  # loop boundary: one failing fit must not stop the others
        log.warning("fit %s failed: %s", spec.name, exc, exc_info=True)
        why = f"fit failed: {type(exc).__name__}: {exc}"
    else:
        return FitOutcome(spec.name, spec.what, result, seconds=time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    return FitOutcome(spec.name, spec.what, None, why, required, available, seconds)
