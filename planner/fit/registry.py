"""The registry of the planner's fits: each fit's name, description, function and inputs.

A fit's ``name`` is its one spelling everywhere: the plan's ``fits`` keys, the skipped
list and the timings. ``needs`` names the keyword arguments its function takes beside the
frame; :func:`arguments` assembles them from :class:`FitInputs`, or says why the fit
cannot run (no cost model; no engine of its offload mode). planner.fit.orchestrate.fit_all runs
the registered fits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from core.errors import ConfigError
from planner.fit.common import FitResult
from planner.fit.gain import fit_gain
from planner.fit.hitrate import fit_hitrate
from planner.fit.mfu import fit_mfu
from planner.fit.preempt import fit_preemption

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["EQUAL_KV", "FITS", "FIT_NAMES", "NO_COST", "FitInputs", "FitSpec", "Need",
           "arguments", "fit_specs"]  # fmt: skip

Flops = Callable[[float], float]
# util: the pressure column; level: the interval level; seed: the RNG seed;
# target_fraction: the hit-rate sizing target; cost: prefill_flops and peak_flops;
# offload: the fit's offload mode (which must have engines in the frame)
Need = Literal["util", "level", "seed", "target_fraction", "cost", "offload"]
# The fit of tokens/s against KV use per mode (planner/fit/gain.py) is named for what it
# measures: tokens/s at equal KV use, not a throughput gain (offload lowers KV use).
EQUAL_KV = "equal_kv_"
NO_COST = "no cost model given (prefill_flops and peak_flops)"


@dataclass(frozen=True, slots=True)
class FitSpec:
    """One registered fit: ``fn(frame, **arguments(spec, inputs))`` gives its result."""

    name: str
    what: str
    fn: Callable[..., FitResult]
    needs: tuple[Need, ...]
    offload: str | None = None


@dataclass(frozen=True, slots=True)
class FitInputs:
    """What the fits of one frame (one model group) are given."""

    frame: pd.DataFrame
    util: str = "kv_util"
    level: float = 0.95
    seed: int = 0
    target_fraction: float = 0.9
    prefill_flops: Flops | None = None
    peak_flops: float | None = None
    no_cost: str = NO_COST  # why there is no cost model, when there is none


def _equal_kv(mode: str) -> FitSpec:
    what = f"tokens/s at equal KV use ({mode} vs none)"
    return FitSpec(EQUAL_KV + mode, what, fit_gain, ("offload", "util", "level", "seed"), mode)


FITS: tuple[FitSpec, ...] = (
    FitSpec("preemption_knee", "preemption knee", fit_preemption, ("util", "level")),
    _equal_kv("native"),
    _equal_kv("lmcache"),
    FitSpec("prefill_mfu", "prefill MFU", fit_mfu, ("cost", "level")),
    FitSpec(
        "lmcache_hitrate", "LMCache L1 hit-rate curve", fit_hitrate, ("level", "target_fraction")
    ),
)
FIT_NAMES: tuple[str, ...] = tuple(spec.name for spec in FITS)


def fit_specs(names: Iterable[str] | None = None) -> tuple[FitSpec, ...]:
    """The registered fits called ``names`` (one name may be a plain string) in registry
    order, every one for None; an unknown name is a ConfigError naming the registered fits."""
    if names is None:
        return FITS
    wanted = {names} if isinstance(names, str) else set(names)
    unknown = sorted(wanted - {spec.name for spec in FITS})
    if unknown:
        known = ", ".join(spec.name for spec in FITS)
        raise ConfigError(f"unknown fit(s) {', '.join(map(repr, unknown))}; the fits are {known}")
    return tuple(spec for spec in FITS if spec.name in wanted)


def arguments(spec: FitSpec, inputs: FitInputs) -> dict[str, Any] | str:
    """The keyword arguments of ``spec.fn`` beside the frame, or why the fit cannot run."""
    args: dict[str, Any] = {}
    for need in spec.needs:
        if need == "cost":
            if inputs.prefill_flops is None or inputs.peak_flops is None:
                return inputs.no_cost
            args |= {"prefill_flops": inputs.prefill_flops, "peak_flops": inputs.peak_flops}
        elif need == "offload":
            if spec.offload is None or spec.offload not in _modes(inputs.frame):
                return f"no engine ran {spec.offload} offload"
            args["offload"] = spec.offload
        else:
            args[need] = getattr(inputs, need)
    return args


def _modes(frame: pd.DataFrame) -> set[str]:
    """The offload modes of the frame's rows, as strings."""
    if "offload_mode" not in frame.columns:
        return set()
    return {str(v) for v in frame["offload_mode"].unique()}
