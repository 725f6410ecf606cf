"""The statistical fits on an analysis frame, each with intervals and a "cannot tell" reason.

- ``preempt``: preemptions vs KV use (a GLM with a hinge knee, profile-likelihood interval);
- ``gain``: tokens/s per offload mode at equal KV use, and its break-even (``gain_curve``,
  ``gain_crossings``): a diagnostic, not the effect of offload (offload changes KV use);
- ``units``, ``effects``, ``capacity``, ``switchback``: the verdict's units of evidence (engines
  or LMCache pools), today's effects, capacity at the SLO, and a canary run as a switchback;
- ``mfu``: prefill MFU from TTFT on low-load windows;
- ``hitrate``: the LMCache L1 hit-rate curve vs L1 size (``HitRateFit.curve`` evaluates it);
- ``reuse``: the LRU hit ratio vs KV capacity from vLLM's sampled block-residency
  histograms (AET), and what a native CPU offload or an LMCache pool of X GiB would add;
- ``common``: estimates, intervals, weights and covariance pieces the fits share;
- ``registry``: every fit the planner runs (``FITS``: name, description, function, inputs);
- ``run``: :func:`fit_all`, the registered fits on a frame, each one's failure isolated.
"""

from planner.fit.common import Estimate, FitResult, Interval
from planner.fit.gain import GainFit, GainPoint, fit_gain
from planner.fit.hitrate import HitRateFit, fit_hitrate
from planner.fit.mfu import MfuFit, fit_mfu
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
from planner.fit.run import FitOutcome, FitReport, fit_all, not_fitted

__all__ = ["EQUAL_KV", "FITS", "FIT_NAMES", "Estimate", "FitOutcome", "FitReport", "FitResult",
           "FitSpec", "GainFit", "GainPoint", "Histogram", "HitRateFit", "Interval", "MfuFit",
           "PreemptionFit", "ReuseFit", "ReuseInputs", "TierGain", "fit_all", "fit_gain",
           "fit_hitrate", "fit_mfu", "fit_preemption", "fit_reuse", "lmcache_pool_gain",
           "native_offload_gain", "not_fitted"]  # fmt: skip
