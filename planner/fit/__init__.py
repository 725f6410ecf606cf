"""The statistical fits on an analysis frame, each with intervals and a "cannot tell" reason.

``preempt`` (preemption knee), ``gain`` (tokens/s at equal KV use: a diagnostic; with
``gain_curve`` and ``gain_crossings``), ``units``/``effects``/``capacity``/``switchback``
(the verdict's units, today's effects, capacity at the SLO, a canary switchback), ``mfu``
(prefill MFU), ``hitrate`` (LMCache L1 curve; ``HitRateFit.curve`` evaluates it), ``reuse``
(hit ratio vs KV capacity from vLLM's residency histograms, AET), ``common`` (shared
pieces), ``run`` (:func:`fit_all`, every fit the data supports).

Methods: planner/fit/METHODS.md
"""

from planner.fit.common import Estimate, FitResult, Interval
from planner.fit.gain import GainFit, GainPoint, fit_gain
from planner.fit.hitrate import HitRateFit, fit_hitrate
from planner.fit.mfu import MfuFit, fit_mfu
from planner.fit.preempt import PreemptionFit, fit_preemption
from planner.fit.reuse import (
    Histogram,
    ReuseFit,
    ReuseInputs,
    TierGain,
    fit_reuse,
    lmcache_pool_gain,
    native_offload_gain,
)
from planner.fit.run import FitReport, Skipped, fit_all

__all__ = ["Estimate", "FitReport", "FitResult", "GainFit", "GainPoint", "Histogram",
           "HitRateFit", "Interval", "MfuFit", "PreemptionFit", "ReuseFit", "ReuseInputs",
           "Skipped", "TierGain", "fit_all", "fit_gain", "fit_hitrate", "fit_mfu",
           "fit_preemption", "fit_reuse", "lmcache_pool_gain", "native_offload_gain"]  # fmt: skip
