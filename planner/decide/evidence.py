"""The evidence record the decider and the sizer consume.

`kvscope plan` builds one Evidence per cluster or model group from the windows, the fits and
the forecast; tests and what-if questions build it by hand. Every field is optional: None
means "unknown", which lowers the decision score and is named in the output. Fractions are
0–1, sizes GiB, times seconds.

Where each field comes from: planner/decide/DECIDER.md#the-evidence-record-plannerdecideevidencepy
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from core.errors import ConfigError

MODES = ("none", "native", "lmcache", "both")
# Where a capacity ratio came from: the cluster's own windows (planner/plan/verdict.py,
# `kvscope plan`) or what-if runs of the simulator (planner/advise/sim.py, `kvscope advise`).
GAIN_PROVENANCES = ("measured", "simulated")


@dataclass(frozen=True, slots=True)
class ValueCI:
    """An estimate with its interval at `level` (0.95 = 95 % CI)."""

    estimate: float
    lo: float
    hi: float
    level: float = 0.95

    def __post_init__(self) -> None:
        values = (self.estimate, self.lo, self.hi, self.level)
        if not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
            raise ConfigError(f"interval values must be finite numbers, got {values!r}")
        if not self.lo <= self.estimate <= self.hi:
            raise ConfigError(f"interval needs lo <= estimate <= hi, got {values[:3]!r}")
        if not 0 < self.level < 1:
            raise ConfigError(f"interval level must be in (0, 1), got {self.level!r}")

    def pct(self) -> str:
        """ "+12 % [+5 %, +19 %]" for fractions."""
        return f"{self.estimate:+.1%} [{self.lo:+.1%}, {self.hi:+.1%}]".replace("%", " %")


# What an interval of a capacity ratio is: a confidence interval over independent units
# (measured), or the simulator's largest in-sample miss on published A/B runs (simulated: a
# band with no coverage claim, planner/advise/whatif.py).
INTERVAL_KINDS = ("confidence", "largest_in_sample_miss")


@dataclass(frozen=True, slots=True)
class CapacityEvidence:
    """The capacity of one offload mode relative to no offload, at the SLO.

    ``ratio`` = capacity(mode) / capacity(none) with its reported interval (90 % when
    measured); ``claim`` the 95 % interval a measured vote reads; ``lower_bound``: the ratio is
    at least ``ratio.lo``; ``units`` per arm; ``can_tell``/``why``/``settle``; ``provenance``
    "measured" or "simulated". Fields: planner/decide/DECIDER.md, "The Evidence record".
    """

    can_tell: bool
    ratio: ValueCI | None = None
    claim: ValueCI | None = None
    lower_bound: bool = False
    units: tuple[int, int] = (0, 0)
    design: str = "between engines"  # | "switchback" | "simulated"
    why: str = ""
    settle: str = ""
    provenance: str = "measured"
    interval_kind: str = "confidence"

    def __post_init__(self) -> None:
        if self.can_tell and self.ratio is None:
            raise ConfigError("a capacity ratio that can tell needs its interval")
        if self.provenance not in GAIN_PROVENANCES:
            raise ConfigError(
                f"capacity provenance must be one of {GAIN_PROVENANCES}, got {self.provenance!r}"
            )
        if self.interval_kind not in INTERVAL_KINDS:
            raise ConfigError(
                f"interval kind must be one of {INTERVAL_KINDS}, got {self.interval_kind!r}"
            )

    @property
    def gain(self) -> ValueCI | None:
        """The ratio as a relative gain (0.25 = +25 %), same interval kind."""
        r = self.ratio
        return None if r is None else ValueCI(r.estimate - 1, r.lo - 1, r.hi - 1, r.level)

    def text(self) -> str:
        """ "+25 % [+12 %, +39 %] (90 %, 2 + 4 engines)" or "at least +17 % (…)"."""
        g = self.gain
        if g is None:
            return "unknown"
        pct = f"{g.estimate:+.1%}".replace("%", " %")
        if self.interval_kind == "largest_in_sample_miss":
            return f"{g.pct()} (simulated; band = the simulator's largest in-sample miss)"
        t, c = self.units
        who = f"{t} + {c} units" if self.design != "switchback" else f"{t} + {c} blocks"
        if self.lower_bound:
            lo = f"{g.lo:+.1%}".replace("%", " %")
            return (
                f"at least {lo} ({g.level:.0%} lower bound, {who}: the engines with it never "
                f"missed the SLO, up to {pct} more load)"
            )
        return f"{g.pct()} ({g.level:.0%}, {who})"


_FRACTIONS = (
    "kv_util_p50",
    "kv_util_p95",
    "reprefill_share",
    "prefix_hit_ratio",
    "external_hit_ratio",
    "cross_engine_reuse",
    "cross_node_reuse",
    "lmcache_up_fraction",
)
_COUNTS = ("tp", "engines", "engines_per_node", "nodes")
_NON_NEGATIVE = (
    "preemptions_per_1k",
    "prompt_tokens_mean",
    "prompt_tokens_p90",
    "distinct_prefix_tokens",
    "cpu_tier_native_gib",
    "cpu_tier_pool_gib",
    "cpu_dram_per_node_gib",
    "demand_now",
    "engine_capacity",
)


@dataclass(frozen=True, slots=True)
class Evidence:
    """What kvscope knows about one cluster or model group (None = unknown).

    Fields such as ``cross_engine_reuse``, ``reprefill_share``, ``l1_hit_curve``, ``demand_*``,
    ``engine_capacity`` and ``prompt_tokens_p90_censored`` (the p90 is only a lower bound) are
    explained in planner/decide/DECIDER.md, "The Evidence record".
    """

    model: str | None = None
    gpu: str | None = None
    tp: int | None = None
    vllm_version: str | None = None
    engines: int | None = None
    engines_per_node: int | None = None
    nodes: int | None = None
    current_mode: str | None = None
    kv_util_p50: float | None = None
    kv_util_p95: float | None = None
    preemptions_per_1k: float | None = None
    reprefill_share: float | None = None
    prompt_tokens_mean: float | None = None
    prompt_tokens_p90: float | None = None
    prompt_tokens_p90_censored: bool = False  # the p90 is only known as >= prompt_tokens_p90
    prefix_hit_ratio: float | None = None
    external_hit_ratio: float | None = None
    cross_engine_reuse: float | None = None
    cross_node_reuse: float | None = None
    distinct_prefix_tokens: float | None = None
    native_capacity: CapacityEvidence | None = None
    lmcache_capacity: CapacityEvidence | None = None
    overhead_zero_hit: ValueCI | None = None
    effective_mfu: ValueCI | None = None
    l2_tier: str | None = None
    lmcache_up_fraction: float | None = None
    lmcache_healthy: bool | None = None
    cpu_dram_per_node_gib: float | None = None
    l1_hit_curve: tuple[tuple[float, float], ...] | None = None
    # the recommended CPU tier from the engines' own reuse (planner/plan/tier.py): native GiB
    # per engine, LMCache L1 GiB per pool; None when the plan's cpu_tier cannot tell
    cpu_tier_native_gib: float | None = None
    cpu_tier_pool_gib: float | None = None
    demand_now: float | None = None
    demand_peak: ValueCI | None = None
    demand_unit: str = "tokens/s"
    engine_capacity: float | None = None
    time_to_saturation_s: ValueCI | None = None
    demand_basis: str = ""  # which forecast demand_peak follows and why (plan_forecast.py)

    def __post_init__(self) -> None:
        for name in (*_FRACTIONS, *_COUNTS, *_NON_NEGATIVE):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"evidence field {name!r} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ConfigError(f"evidence field {name!r} is {value!r}: use None for unknown")
            if name in _FRACTIONS and not 0 <= value <= 1:
                raise ConfigError(f"evidence field {name!r} must be in [0, 1], got {value!r}")
            if name in _COUNTS and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"evidence field {name!r} must be an integer >= 1")
            if value < 0:
                raise ConfigError(f"evidence field {name!r} must be >= 0, got {value!r}")
        if self.current_mode is not None and self.current_mode not in MODES:
            raise ConfigError(f"evidence field 'current_mode' must be one of {MODES}")
        if self.engine_capacity == 0:
            raise ConfigError("evidence field 'engine_capacity' must be > 0")
        for size, rate in self.l1_hit_curve or ():
            if not (math.isfinite(size) and size > 0 and 0 <= rate <= 1):
                raise ConfigError(f"l1_hit_curve point ({size!r}, {rate!r}) needs GiB > 0, 0-1")

    def known(self) -> tuple[str, ...]:
        """Names of the fields that are set (for `rests on` summaries)."""
        return tuple(f.name for f in fields(self) if getattr(self, f.name) is not None)
