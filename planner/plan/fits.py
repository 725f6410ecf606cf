"""Every fit `kvscope plan` runs, as JSON-ready entries plus the Evidence they yield.

A fit the data cannot support never fails the plan: InsufficientHistory, a refused
argument or a numerical failure becomes an entry with ``can_tell: false`` and ``why``.
Each entry has the same keys (``estimate``, ``interval``, ``n``, ``method``, ``can_tell``,
``why``, ``warnings``, ``unit``, ``basis``, ``assumptions``) plus fit-specific extras.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.decide.evidence import ValueCI
from planner.domain import costmodel
from planner.domain.hardware import GPU, Model
from planner.domain.values import finite
from planner.fit.common import Estimate, FitResult, Interval
from planner.fit.gain import GainFit
from planner.fit.hitrate import HitRateFit
from planner.fit.mfu import MfuFit
from planner.fit.preempt import PreemptionFit

if TYPE_CHECKING:
    from planner.fit.orchestrate import FitReport

GIB = 1024**3
LEVEL = 0.95
NO_HW = "model/gpu/tp unknown or not in the hardware catalogue: no FLOPs"


@dataclass(frozen=True, slots=True)
class Hardware:
    """The model group the fits and priors are for (resolved in the hardware catalogue)."""

    model: Model
    gpu: GPU
    tp: int


@dataclass(frozen=True, slots=True, eq=False)
class FitRun:
    """One fit: its result (None when it could not run) and its JSON entry."""

    name: str
    result: FitResult | None
    entry: dict[str, Any]


def interval_dict(iv: Interval) -> dict[str, Any] | None:
    lo, hi = finite(iv.lo), finite(iv.hi)
    if lo is None and hi is None:
        return None
    return {"lo": lo, "hi": hi, "level": finite(iv.level)}


def estimate_dict(e: Estimate) -> dict[str, Any]:
    return {"estimate": finite(e.value), "interval": interval_dict(e.interval), "unit": e.unit}


def value_ci(est: float, lo: float, hi: float, level: float) -> ValueCI | None:
    """A ValueCI when the three numbers are finite and ordered, else None."""
    if not all(finite(v) is not None for v in (est, lo, hi, level)):
        return None
    if not lo <= est <= hi or not 0 < level < 1:
        return None
    return ValueCI(float(est), float(lo), float(hi), float(level))


def cannot_entry(what: str, why: str, n: int = 0, method: str | None = None) -> dict[str, Any]:
    """The entry of a fit that did not run."""
    return {
        "what": what,
        "estimate": None,
        "interval": None,
        "unit": None,
        "n": n,
        "method": method,
        "can_tell": False,
        "why": why,
        "warnings": [],
        "basis": [],
        "assumptions": [],
    }


def entry_of(fit: FitResult, seconds: float) -> dict[str, Any]:
    return {
        "what": fit.what,
        "estimate": finite(fit.estimate),
        "interval": interval_dict(fit.interval),
        "unit": fit.unit,
        "n": fit.n,
        "method": fit.method,
        "can_tell": fit.can_tell,
        "why": fit.why,
        "warnings": list(fit.warnings),
        "basis": list(fit.basis),
        "assumptions": list(fit.assumptions),
        "seconds": round(seconds, 3),
    }


def peak_flops(hw: Hardware) -> float:
    """Dense peak of the engine's GPUs in the model's GEMM dtype (costmodel's rule: FP8
    weights run FP8 GEMMs, else bf16; datasheet figures in planner/domain/data/hardware.yaml)."""
    per_gpu = hw.gpu.fp8_flops if hw.model.weight_bytes_per_param <= 1 else hw.gpu.bf16_flops
    return per_gpu * hw.tp


def _flops(hw: Hardware) -> Callable[[float], float]:
    """The prefill FLOPs of a prompt length (rounded to whole tokens; each length costed
    once: the MFU fit asks for one per window)."""
    model = hw.model
    known: dict[int, float] = {}

    def flops(tokens: float) -> float:
        n = max(1, round(tokens))
        if n not in known:
            known[n] = costmodel.prefill_flops(model, n)
        return known[n]

    return flops


def cost_model(hw: Hardware | None) -> tuple[Callable[[float], float] | None, float | None]:
    """The MFU fit's ``prefill_flops`` and ``peak_flops`` for ``hw`` (None without it)."""
    return (_flops(hw), peak_flops(hw)) if hw is not None else (None, None)


def fit_runs(report: FitReport) -> dict[str, FitRun]:
    """Each fit of ``report`` (planner.fit.orchestrate.fit_all) by name, with its JSON entry."""
    runs: dict[str, FitRun] = {}
    for o in report.fits:
        if o.result is not None:
            run = FitRun(o.name, o.result, entry_of(o.result, o.seconds or 0.0))
        else:
            entry = cannot_entry(o.what, o.why or "not fitted", o.available or 0)
            run = FitRun(o.name, None, entry)
        _extras(run)
        runs[o.name] = run
    return runs


def _extras(run: FitRun) -> None:
    """Fit-specific fields beside the common ones."""
    fit, e = run.result, run.entry
    if isinstance(fit, PreemptionFit):
        e |= {
            "slope": estimate_dict(fit.slope),
            "base_rate_per_s": estimate_dict(fit.base_rate),
            "family": fit.family,
            "cov_type": fit.cov_type,
        }
    elif isinstance(fit, GainFit):
        e |= {
            "verdict": fit.verdict,
            "direction": fit.direction,
            "support": [finite(x) for x in fit.support],
            "roots": list(fit.roots),
            "windows_by_mode": dict(fit.windows_by_mode),
            "engines_by_mode": dict(fit.engines_by_mode),
            "cov_type": fit.cov_type,
        }
    elif isinstance(fit, MfuFit):
        e |= {
            "overhead_s": estimate_dict(fit.overhead_s),
            "prefill_tokens_per_s": estimate_dict(fit.prefill_tokens_per_s),
            "reference_prompt_tokens": finite(fit.reference_prompt_tokens),
            "shape_p": finite(fit.shape_p),
        }
    elif isinstance(fit, HitRateFit):
        e |= {
            "hit_at_largest_l1": estimate_dict(fit.hit_at_largest),
            "largest_l1_gib": finite(fit.size_range[1] / GIB),
            "spline_df": fit.spline_df,
            "cov_type": fit.cov_type,
            "evicting_share": finite(fit.evicting_share),
            "predictions": [
                {
                    "l1_gib": p.size_bytes / GIB,
                    "hit_ratio": finite(p.hit_ratio),
                    "interval": interval_dict(p.interval),
                    "extrapolated": p.extrapolated,
                }
                for p in fit.predictions
            ],
        }


def equal_kv_at(run: FitRun, u_now: float | None) -> dict[str, Any] | None:
    """The equal-KV-use diagnostic at the current KV use: its nearest grid point (relative
    tokens/s of the mode over none at that KV use), or None. A diagnostic only: it is not the
    effect of offload at today's load, nor its capacity gain (planner/plan/verdict.py)."""
    fit: GainFit | None = run.result  # type: ignore[assignment]
    if fit is None or not fit.grid or u_now is None:
        return None
    lo, hi = fit.support
    point = min(fit.grid, key=lambda p: abs(p.u - u_now))
    return {
        "u": point.u,
        "in_support": lo <= u_now <= hi,
        "tokens_per_s_difference": finite(point.gain),
        "tokens_per_s_difference_interval": interval_dict(point.gain_interval),
        "relative": finite(point.relative),
        "relative_interval": interval_dict(point.relative_interval),
    }


def mfu_evidence(run: FitRun) -> ValueCI | None:
    fit = run.result
    if fit is None or not fit.can_tell:
        return None
    ci = value_ci(fit.estimate, fit.interval.lo, fit.interval.hi, fit.interval.level)
    return ci if ci is not None and ci.hi <= 1 else None


def hit_curve(run: FitRun, points: int = 24) -> tuple[tuple[float, float], ...] | None:
    """(L1 GiB, hit ratio) along the fitted curve over the sizes seen (log-spaced, smallest
    to largest), when the fit can tell: the spline is not extrapolated for sizing."""
    fit: HitRateFit | None = run.result  # type: ignore[assignment]
    if fit is None or not fit.can_tell:
        return None
    lo, hi = fit.size_range
    if not all(finite(v) for v in (lo, hi)) or lo <= 0:
        return None
    sizes = [lo * (hi / lo) ** (i / (points - 1)) for i in range(points)]
    rates = fit.curve(sizes).tolist()
    if not all(finite(r) is not None for r in rates):
        return None
    return tuple((s / GIB, min(max(r, 0.0), 1.0)) for s, r in zip(sizes, rates, strict=True))
