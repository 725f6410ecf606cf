"""The statistical fits on an analysis frame, each with intervals and a "cannot tell" reason.

``preempt`` (preemption knee), ``gain`` (tokens/s at equal KV use: a diagnostic; with
``gain_curve`` and ``gain_crossings``), ``units``/``effects``/``capacity``/``switchback``
(the verdict's units, today's effects, capacity at the SLO, a canary switchback), ``mfu``
(prefill MFU), ``hitrate`` (LMCache L1 curve), ``reuse`` (hit ratio vs KV capacity, AET),
``common`` and ``lsq`` (shared pieces, least squares in passes over rows), ``registry`` (every
fit the planner runs: name, description, function, inputs), ``orchestrate`` (:func:`fit_all`: the
registered fits on a frame, each one's failure isolated). Methods: planner/fit/METHODS.md
"""

from planner.fit.common import Estimate, FitResult, Interval
from planner.fit.gain import GainFit, GainPoint, fit_gain
from planner.fit.hitrate import HitRateFit, fit_hitrate
from planner.fit.mfu import MfuFit, fit_mfu
from planner.fit.orchestrate import FitOutcome, FitReport, fit_all, not_fitted
from planner.fit.preempt import PreemptionFit, fit_preemption
from planner.fit.registry import EQUAL_KV, FIT_NAMES, FITS, FitSpec
from planner.fit.reuse import (
    Histogram,
    ReuseFit,
    ReuseInputs,
    TierGain,
    fit_reuse,
    lmcache_pool_gain,
    native_offload_gain,
)

__all__ = ["EQUAL_KV", "FITS", "FIT_NAMES", "Estimate", "FitOutcome", "FitReport", "FitResult",
           "FitSpec", "GainFit", "GainPoint", "Histogram", "HitRateFit", "Interval", "MfuFit",
           "PreemptionFit", "ReuseFit", "ReuseInputs", "TierGain", "fit_all", "fit_gain",
           "fit_hitrate", "fit_mfu", "fit_preemption", "fit_reuse", "lmcache_pool_gain",
           "native_offload_gain", "not_fitted"]  # fmt: skip
