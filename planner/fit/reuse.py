"""KV-block reuse: the LRU hit ratio vs KV capacity, and what a CPU tier of X GiB would add,
from vLLM's sampled block-residency histograms by the average-eviction-time (AET) model of
Hu et al. [source: hu-aet-2016]; inputs from vLLM ``--kv-cache-metrics``
[source: vllm-kv-cache-metrics].

The reuse-gap density below the HBM eviction time is corrected for under-counting and
censoring; three tail families extrapolate past it; native CPU offload and an LMCache pool
are LRUs on the engine's stream. Intervals are model-based (bootstrap ∪ tails ∪ anchors).

Method: planner/fit/METHODS.md#reuse
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from core.errors import ConfigError
from planner.domain.costmodel import kv_bytes_per_token_engine
from planner.fit.common import Estimate, Interval, check_level, fmt, recorded_warnings

if TYPE_CHECKING:
    import numpy.typing as npt

    from planner.domain.hardware import Model

    Array = npt.NDArray[np.float64]
    _Fn = Callable[[Sequence["_Curve"], Sequence[float]], tuple[Array, Array]]

GIB = float(2**30)
FAMILIES = ("exponential", "power", "lognormal")
ANCHORS = ("measured", "model")
COMBOS = tuple((fam, anc) for anc in ANCHORS for fam in FAMILIES)
DEFAULT_SAMPLE_RATE = 0.01  # vLLM --kv-cache-metrics-sample [source: vllm-kv-cache-metrics]
SLOPE_WINDOW = 8.0  # power and exponential tails: buckets overlapping [T/8, T]
SHAPE_WINDOW = 64.0  # log-normal tail: buckets overlapping [T/64, T]
TAIL_SPAN = 1e6  # the tail grid runs from T to T·1e6
TAIL_POINTS = 600
REPRO_ABS = 0.05  # the fit cannot tell past a reproduction error of max(5 pp, 25 % of H)
REPRO_REL = 0.25
WIDE_ABS = 0.01  # families "disagree widely" past max(1 pp, half the largest of them)
WIDE_REL = 0.5
KNEE_SPAN = 1000.0  # the knee is looked for up to 1000× the onset capacity
KNEE_POINTS = 300
METHOD = (
    "AET (Hu et al. 2016) on vLLM's sampled reuse-gap histogram: renewal under-count weights "
    "fixed by the measured hits, inverse-censoring weights from idle-before-evict, F scaled to "
    "the measured hit ratio at T_hbm; exponential / power / log-normal tails past T_hbm capped "
    "by today's miss ratio; model-based interval = Poisson bootstrap of the sampled counts ∪ "
    "tail families ∪ measured- vs model-anchored curve (the HBM reproduction error)"
)


# --- inputs ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram as per-bucket counts: ``counts[i]`` observations in
    (bounds[i-1], bounds[i]] (the first bucket from 0), ``counts[-1]`` those above the last
    finite bound (+Inf). ``len(counts) == len(bounds) + 1``; checked by :class:`ReuseInputs`."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]

    @classmethod
    def from_cumulative(
        cls, bounds: Sequence[float], cumulative: Sequence[float], total: float
    ) -> Histogram:
        """From Prometheus ``le`` buckets: ``cumulative[i]`` observations ≤ bounds[i] and
        ``total`` (the ``+Inf`` bucket, i.e. ``_count``)."""
        cum = [float(c) for c in cumulative]
        if len(cum) != len(bounds):
            raise ConfigError(
                f"histogram: {len(cum)} cumulative counts for {len(bounds)} finite bounds"
            )
        full = [*cum, float(total)]
        if any(b < a for a, b in zip([0.0, *full[:-1]], full, strict=True)):
            raise ConfigError(f"histogram: cumulative counts must not decrease, got {full}")
        counts = [b - a for a, b in zip([0.0, *full[:-1]], full, strict=True)]
        return cls(tuple(float(b) for b in bounds), tuple(counts))

    @property
    def total(self) -> float:
        return float(sum(self.counts))


@dataclass(frozen=True, slots=True)
class ReuseInputs:
    """One engine's (or one LMCache pool's merged) vLLM KV residency data over a window.

    Rates are per second over ``window_s``; ``lookups_per_s`` and ``hits_per_s`` are in
    blocks (``prefix_cache_queries`` / ``prefix_cache_hits`` tokens/s ÷ ``block_size``).
    ``allocations_per_s`` defaults to the sampled evictions ÷ (``sample_rate`` × window);
    ``unhittable_per_s`` is a floor on accesses that can never hit (e.g. requests/s: one
    partial, never-hashed block each), 0 if unknown.
    """

    reuse_gap: Histogram
    idle_before_evict: Histogram
    lifetime: Histogram
    window_s: float
    lookups_per_s: float
    hits_per_s: float
    hbm_blocks: int
    block_size: int
    sample_rate: float = DEFAULT_SAMPLE_RATE
    allocations_per_s: float | None = None
    unhittable_per_s: float = 0.0
    name: str = ""

    def __post_init__(self) -> None:
        for what, h in (
            ("reuse_gap", self.reuse_gap),
            ("idle_before_evict", self.idle_before_evict),
            ("lifetime", self.lifetime),
        ):
            _check_histogram(h, f"{self.name or 'engine'}: {what}")
        who = self.name or "engine"
        _positive(self.window_s, f"{who}: window_s")
        if not math.isfinite(self.lookups_per_s) or self.lookups_per_s <= 0:
            raise ConfigError(
                f"{who}: lookups_per_s must be > 0 (prefix-cache queries ÷ block_size), "
                f"got {self.lookups_per_s}: no lookups, no hit ratio to model"
            )
        if not math.isfinite(self.hits_per_s) or self.hits_per_s < 0:
            raise ConfigError(f"{who}: hits_per_s must be >= 0, got {self.hits_per_s}")
        if self.hits_per_s > self.lookups_per_s * (1 + 1e-9):
            raise ConfigError(
                f"{who}: hits_per_s {self.hits_per_s} exceeds lookups_per_s {self.lookups_per_s}"
            )
        if isinstance(self.hbm_blocks, bool) or not isinstance(self.hbm_blocks, int):
            raise ConfigError(f"{who}: hbm_blocks must be an integer, got {self.hbm_blocks!r}")
        if self.hbm_blocks <= 0:
            raise ConfigError(f"{who}: hbm_blocks (num_gpu_blocks) must be > 0")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int):
            raise ConfigError(f"{who}: block_size must be an integer, got {self.block_size!r}")
        if self.block_size <= 0:
            raise ConfigError(f"{who}: block_size must be > 0, got {self.block_size}")
        if not (0.0 < self.sample_rate <= 1.0):
            raise ConfigError(f"{who}: sample_rate must be in (0, 1], got {self.sample_rate}")
        if self.allocations_per_s is not None:
            _positive(self.allocations_per_s, f"{who}: allocations_per_s")
        if not math.isfinite(self.unhittable_per_s) or self.unhittable_per_s < 0:
            raise ConfigError(f"{who}: unhittable_per_s must be >= 0, got {self.unhittable_per_s}")


def _positive(value: float, what: str) -> None:
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{what} must be a finite number > 0, got {value}")


def _check_histogram(h: Histogram, what: str) -> None:
    b, c = h.bounds, h.counts
    if not b:
        raise ConfigError(f"{what}: histogram has no finite bounds")
    if len(c) != len(b) + 1:
        raise ConfigError(
            f"{what}: {len(c)} counts for {len(b)} finite bounds (need one per bucket plus +Inf)"
        )
    if any(not math.isfinite(x) or x <= 0 for x in b):
        raise ConfigError(f"{what}: bounds must be finite and > 0, got {b}")
    if any(y <= x for x, y in itertools.pairwise(b)):
        raise ConfigError(f"{what}: bounds must ascend strictly, got {b}")
    if any(not math.isfinite(x) or x < 0 for x in c):
        raise ConfigError(f"{what}: counts must be finite and >= 0, got {c}")


# --- outputs -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Reproduction:
    """The full AET model run at today's HBM capacity against what was measured."""

    hit_ratio: float  # prefix-cache hit ratio the model gives at C = hbm_blocks
    measured: float  # measured prefix-cache hit ratio (hits / lookups)
    error: float  # hit_ratio − measured
    eviction_time_s: float  # the model's eviction time at C = hbm_blocks
    measured_eviction_time_s: float  # T_hbm (median idle-before-evict)


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """The LRU hit-ratio curve at one HBM capacity (blocks): prefix-cache hit ratio."""

    capacity_blocks: float
    hit_ratio: Estimate  # model-based interval
    eviction_time_s: float  # point estimate, measured anchor
    extrapolated: bool  # needs F past T_hbm
    beyond_histogram: bool  # needs reuse gaps past the top finite bucket
    can_tell: bool
    why: str


@dataclass(frozen=True, slots=True)
class TierPoint:
    """What a tier of ``size_gib`` adds, with model-based intervals."""

    size_gib: float
    capacity_blocks: float
    extra_hit_ratio: Estimate  # extra prefix-cache hits / lookups
    avoided_prefill_tokens_per_s: Estimate
    eviction_time_s: float  # the tier's eviction time (point, measured anchor)
    families: dict[str, float]  # extra hit ratio per tail family (measured anchor)
    extrapolated: bool
    beyond_histogram: bool  # needs reuse gaps past the top finite bucket
    can_tell: bool
    why: str


@dataclass(frozen=True, slots=True)
class Knee:
    """Smallest tier size past the onset of gains where the marginal extra hits per GiB fall
    below ``fraction`` of their initial slope (None when not reached / no gain)."""

    size_gib: Estimate | None
    onset_gib: float  # size at which gains start (the HBM size for an inclusive tier)
    fraction: float
    extrapolated: bool
    why: str


@dataclass(frozen=True, slots=True)
class TierGain:
    """A tier's extra hits per size and its knee."""

    mode: str  # "native" | "lmcache"
    engines: tuple[str, ...]
    points: tuple[TierPoint, ...]
    knee: Knee
    lower_bound: bool  # LMCache pools: cross-engine reuse is not seen
    method: str
    assumptions: tuple[str, ...]


# --- internal model ----------------------------------------------------------------------------
@dataclass(slots=True)
class _Tail:
    kind: str
    f_t: float  # density at T (per access per second)
    a: float = 0.0  # power/exponential: log-slope β; lognormal: (a, b, c) of ln f = a+b·u+c·u²
    b: float = 0.0
    c: float = 0.0
    tau: float = 0.0


@dataclass(slots=True)
class _Body:
    """One fit of F (the original counts or one bootstrap replicate)."""

    t_hbm: float
    hit: float  # H over the AET stream (hits / (hits + allocations))
    lam: float  # AET accesses per second
    cap: float  # HBM blocks
    avail: float  # (lookups − hits − floor) / λ: the most any tail may add
    edges: Array  # finite gap bucket edges, from 0
    dens: Array  # density per finite bucket, scaled so that F(T_hbm) = H
    kappa: float
    weight: float  # hits per recorded gap (renewal)
    excess: float  # share of the sampled hits put on short gaps
    rho: float  # recorded gaps / renewal prediction
    slope: float  # local log-slope at T_hbm (nan when unknown)
    tails: dict[str, _Tail]


@dataclass(slots=True)
class _Curve:
    """F and occupancy on a t grid for one (body, family, anchor)."""

    t: Array
    cdf: Array
    occ: Array  # blocks an LRU with eviction time t holds
    t0: float  # the HBM eviction time on this curve
    f0: float  # F there


def _bucket_edges(bounds: tuple[float, ...]) -> Array:
    return np.concatenate([[0.0], np.asarray(bounds, dtype=np.float64)])


def _survival_integral(edges: Array, cdf: Array, x: Array) -> Array:
    """∫_0^x S(t) dt for S = 1 − CDF, the CDF linear within buckets and flat past the last."""
    s = 1.0 - cdf
    widths = np.diff(edges)
    cum = np.concatenate([[0.0], np.cumsum(widths * (s[:-1] + s[1:]) / 2.0)])
    x = np.asarray(x, dtype=np.float64)
    k = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 1)
    out = np.empty_like(x)
    last = k >= len(edges) - 1
    out[last] = cum[-1] + s[-1] * (x[last] - edges[-1])
    i = k[~last]
    dx = x[~last] - edges[i]
    slope = (s[i + 1] - s[i]) / widths[i]
    out[~last] = cum[i] + s[i] * dx + slope * dx * dx / 2.0
    return out


def _median(edges: Array, cdf: Array) -> float:
    i = int(np.searchsorted(cdf, 0.5, side="left"))
    lo, hi = cdf[i - 1], cdf[i]
    return float(edges[i - 1] + (edges[i] - edges[i - 1]) * (0.5 - lo) / (hi - lo))


def _wls(x: Array, y: Array, w: Array, degree: int) -> Array:
    sw = np.sqrt(w)
    design = np.vander(x, degree + 1, increasing=True)
    coef, *_ = np.linalg.lstsq(design * sw[:, None], y * sw, rcond=None)
    out: Array = np.asarray(coef, dtype=np.float64)
    return out


def _fit_tails(
    edges: Array, dens: Array, counts: Array, t_hbm: float
) -> tuple[dict[str, _Tail], float]:
    """The tail families from the corrected density of the buckets just below T_hbm."""
    lo, hi = edges[:-1], edges[1:]
    mid = np.where(lo > 0, np.sqrt(np.maximum(lo, 1e-300) * hi), hi / 2.0)
    use = (counts > 0) & (dens > 0) & (hi <= t_hbm * (1.0 + 1e-9))
    tails: dict[str, _Tail] = {}
    slope = math.nan

    def window(factor: float) -> npt.NDArray[np.bool_]:
        sel: npt.NDArray[np.bool_] = use & (hi > t_hbm / factor)
        return sel

    sel = window(SLOPE_WINDOW)
    factor = SLOPE_WINDOW
    while sel.sum() < 2 and factor < 1e4 and use.sum() >= 2:
        factor *= 4.0
        sel = window(factor)
    lt = math.log(t_hbm)
    if sel.sum() >= 2:
        coef = _wls(np.log(mid[sel]), np.log(dens[sel]), counts[sel], 1)
        beta = float(np.clip(coef[1], -10.0, 3.0))
        f_t = float(np.exp(coef[0] + coef[1] * lt))
        slope = beta
        tails["power"] = _Tail("power", f_t, a=beta)
        tails["exponential"] = _Tail("exponential", f_t, a=beta, tau=t_hbm / max(-beta, 1.0))
    elif sel.sum() == 1:
        f_t = float(dens[sel][0])
        tails["exponential"] = _Tail("exponential", f_t, a=math.nan, tau=t_hbm)
        tails["power"] = _Tail("power", f_t, a=0.0)  # slope unknown: flat until capped
    wide = use & (hi > t_hbm / SHAPE_WINDOW)
    if wide.sum() >= 3:
        u = np.log(mid[wide])
        coef = _wls(u, np.log(dens[wide]), counts[wide], 2)
        if coef[2] < 0:
            a, b, c = (float(v) for v in coef)
            f_t = math.exp(min(a + b * lt + c * lt * lt, 700.0))
            tails["lognormal"] = _Tail("lognormal", f_t, a=a, b=b, c=c)
    return tails, slope


def _tail_mass(tail: _Tail, t_hbm: float, t: Array) -> Array:
    """∫_T^t f for t ≥ T (the extra reuse mass a tail adds between T and t)."""
    from scipy.special import erf  # noqa: PLC0415 - start-up: scipy.special (~0.09 s) loads when this runs, not on `import planner.plan`

    if tail.f_t <= 0:
        zero: Array = np.zeros_like(t)
        return zero
    if tail.kind == "exponential":
        out: Array = tail.f_t * tail.tau * -np.expm1(-(t - t_hbm) / tail.tau)
        return out
    if tail.kind == "power":
        beta = tail.a
        r = t / t_hbm
        if abs(beta + 1.0) < 1e-9:
            out = tail.f_t * t_hbm * np.log(r)
        else:
            with np.errstate(over="ignore"):
                out = tail.f_t * t_hbm / (beta + 1.0) * (np.power(r, beta + 1.0) - 1.0)
        return out
    # lognormal: ∫ exp(a + (b+1)u + c u²) du, u = ln t
    a, b, c = tail.a, tail.b, tail.c
    u0 = -(b + 1.0) / (2.0 * c)
    e0 = a - (b + 1.0) ** 2 / (4.0 * c)
    k = math.sqrt(-c)
    scale = math.exp(min(e0, 700.0)) * math.sqrt(math.pi) / (2.0 * k)
    out = scale * (erf(k * (np.log(t) - u0)) - erf(k * (math.log(t_hbm) - u0)))
    return out


def _body(  # noqa: PLR0915 - the fit's steps in order, each may end it with a reason
    inp: ReuseInputs,
    gap: Array,
    idle: Array,
    n_res: float,
) -> _Body:
    """Fit F below T_hbm and its tails from (possibly resampled) counts."""
    s, win = inp.sample_rate, inp.window_s
    who = inp.name or "engine"
    if idle.sum() <= 0:
        raise ConfigError(
            f"{who}: the idle-before-evict histogram is empty: no sampled block was evicted "
            "(is --kv-cache-metrics on, and the HBM cache full?)"
        )
    i_edges = _bucket_edges(inp.idle_before_evict.bounds)
    i_cdf = np.concatenate([[0.0], np.cumsum(idle[:-1])]) / idle.sum()
    if i_cdf[-1] < 0.5:
        raise ConfigError(
            f"{who}: the median idle-before-evict is past the top finite bucket "
            f"({inp.idle_before_evict.bounds[-1]:g} s): the HBM eviction time is beyond the "
            "histogram"
        )
    t_hbm = _median(i_edges, i_cdf)
    allocs = inp.allocations_per_s
    if allocs is None:
        allocs = n_res / (s * win)
    lam = inp.hits_per_s + allocs
    hit = inp.hits_per_s / lam
    n_hits = s * win * inp.hits_per_s  # hits the sampled blocks carry
    n_acc = s * win * lam
    floor = min(inp.unhittable_per_s / lam, 1.0)
    # only lookups can hit: the accesses past today's prompt misses (decode-time blocks)
    # and the floor never do, so a tail adds at most (lookups − hits − floor) / λ
    lookable = (inp.lookups_per_s - inp.hits_per_s - inp.unhittable_per_s) / lam
    avail = max(0.0, min(1.0 - hit - floor, lookable))

    g_edges = _bucket_edges(inp.reuse_gap.bounds)
    fin = gap[:-1]
    n_gaps = float(gap.sum())
    if n_gaps <= 0:
        raise ConfigError(
            f"{who}: the reuse-gap histogram is empty: no sampled block was hit twice before "
            "eviction, so F below T_hbm cannot be estimated"
        )
    if fin.sum() <= 0:
        raise ConfigError(
            f"{who}: every reuse gap is past the top finite bucket "
            f"({inp.reuse_gap.bounds[-1]:g} s): the histogram cannot place them"
        )
    if inp.hits_per_s <= 0:
        raise ConfigError(f"{who}: reuse gaps were recorded but hits_per_s is 0")
    p = hit
    renewal = p * p + p**3 + p**4  # recorded gaps per residency
    weight = 1.0 / (p * (1.0 - p**3)) if 0.0 < p < 1.0 else math.inf
    rho = n_gaps / (n_res * renewal) if n_res > 0 and renewal > 0 else math.nan
    if weight * n_gaps > n_hits:
        weight = max(n_hits / n_gaps, 1.0)
    hits_b = weight * fin
    excess = max(0.0, n_hits - weight * n_gaps)
    if excess > 0:
        lo, hi = g_edges[:-1], g_edges[1:]
        mid = np.where(lo > 0, np.sqrt(lo * hi), hi / 2.0)
        hot = np.where(mid < t_hbm, fin * t_hbm / mid, 0.0)
        if hot.sum() <= 0:
            hot = np.where(np.arange(fin.size) == int(np.argmax(fin > 0)), 1.0, 0.0)
        hits_b = hits_b + excess * hot / hot.sum()
    s_int = _survival_integral(i_edges, i_cdf, g_edges)
    exposure = np.maximum(np.diff(s_int), 1e-12 * np.diff(g_edges))
    dens = hits_b / (n_acc * exposure)
    phi = np.concatenate([[0.0], np.cumsum(dens * np.diff(g_edges))])
    phi_t = float(np.interp(t_hbm, g_edges, phi))
    kappa = hit / phi_t if phi_t > 0 else math.nan
    if not math.isfinite(kappa):
        raise ConfigError(f"{who}: no reuse gap below the HBM eviction time {t_hbm:.3g} s")
    dens = dens * kappa
    tails, slope = _fit_tails(g_edges, dens, fin, t_hbm)
    return _Body(
        t_hbm=t_hbm,
        hit=hit,
        lam=lam,
        cap=float(inp.hbm_blocks),
        avail=avail,
        edges=g_edges,
        dens=dens,
        kappa=kappa,
        weight=weight,
        excess=excess / n_hits if n_hits > 0 else 0.0,
        rho=rho,
        slope=slope,
        tails=tails,
    )


def _curve(body: _Body, family: str, anchor: str) -> _Curve | None:
    """F and occupancy on a grid for one family and anchor (None when the family is not
    available for this body)."""
    tail = body.tails.get(family)
    if tail is None:
        return None
    t_b = body.edges[body.edges < body.t_hbm]
    phi = np.concatenate([[0.0], np.cumsum(body.dens * np.diff(body.edges))])
    f_b = np.interp(t_b, body.edges, phi)
    t_t = body.t_hbm * np.geomspace(1.0, TAIL_SPAN, TAIL_POINTS)
    f_t = body.hit + np.minimum(_tail_mass(tail, body.t_hbm, t_t), body.avail)
    t = np.concatenate([t_b, t_t])
    cdf = np.minimum(np.concatenate([f_b, f_t]), 1.0)
    cdf = np.maximum.accumulate(cdf)
    gaps = np.diff(t)
    occ = body.lam * np.concatenate([[0.0], np.cumsum(gaps * (2.0 - cdf[:-1] - cdf[1:]) / 2.0)])
    occ = occ + 1e-9 * t  # strictly increasing for the inversion
    k = len(t_b)
    if anchor == "measured":
        occ = occ - occ[k] + body.cap
        return _Curve(t, cdf, occ, body.t_hbm, body.hit)
    t0 = float(np.interp(body.cap, occ, t))
    return _Curve(t, cdf, occ, t0, float(np.interp(t0, t, cdf)))


def _pool(
    curves: Sequence[_Curve], lams: Sequence[float], capacity: Array
) -> tuple[list[Array], Array]:
    """Per engine extra hits/s, and the pool's eviction time, for an LRU of ``capacity``
    blocks over the merged streams, each engine hitting F_e(max(T_e, T_pool))."""
    if len(curves) == 1:
        grid, occ = curves[0].t, curves[0].occ
    else:
        grid = np.unique(np.concatenate([cv.t for cv in curves]))
        occ = np.zeros_like(grid)
        for cv in curves:
            occ += np.interp(grid, cv.t, cv.occ, left=cv.occ[0], right=cv.occ[-1])
        occ = np.maximum.accumulate(occ) + 1e-9 * grid
    t_pool = np.interp(capacity, occ, grid)
    per = [
        lam * (np.interp(np.maximum(t_pool, cv.t0), cv.t, cv.cdf) - cv.f0)
        for cv, lam in zip(curves, lams, strict=True)
    ]
    return per, t_pool


# --- the fit -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ReuseFit:
    """F fitted to one engine's (or merged pool's) histograms, with bootstrap replicates."""

    name: str
    inputs: ReuseInputs
    t_hbm: float  # median idle-before-evict (s)
    hit_ratio: float  # measured prefix-cache hit ratio
    access_hit_ratio: float  # hits / (hits + allocations): H of the AET stream
    accesses_per_s: float  # λ = hits/s + allocations/s
    rho: float  # recorded gaps / renewal prediction (1 = renewal holds)
    weight: float  # hits per recorded gap
    excess_share: float  # share of hits put on short gaps (hot blocks)
    kappa: float  # censoring-corrected F(T_hbm) scaled to H by this factor
    tail_slope: float  # log-slope of the gap density at T_hbm (nan when unknown)
    families: tuple[str, ...]  # tail families the data supports
    reproduction: Reproduction
    level: float
    n_boot: int
    warnings: tuple[str, ...]
    can_tell: bool
    why: str
    _bodies: tuple[_Body, ...]  # [0] = the original counts, then the replicates
    _memo: dict[tuple[int, str, str], _Curve | None] = field(
        default_factory=dict, compare=False, repr=False
    )

    def _curve(self, rep: int, family: str, anchor: str) -> _Curve | None:
        key = (rep, family, anchor)
        if key not in self._memo:
            self._memo[key] = _curve(self._bodies[rep], family, anchor)
        return self._memo[key]

    @property
    def top_bound_s(self) -> float:
        """Top finite bucket of the reuse-gap histogram: past it nothing can be placed."""
        return float(self.inputs.reuse_gap.bounds[-1])

    def curve(self, capacities_blocks: Sequence[float]) -> tuple[CurvePoint, ...]:
        """The LRU prefix-cache hit ratio h(C) = λ·F(T(C)) / lookups at HBM capacities."""
        caps = np.asarray([float(c) for c in capacities_blocks], dtype=np.float64)
        if caps.size and (not np.all(np.isfinite(caps)) or np.any(caps <= 0)):
            raise ConfigError(f"capacities must be finite and > 0, got {list(capacities_blocks)}")
        scale = 1.0 / self.inputs.lookups_per_s

        def hits(curves: Sequence[_Curve], lams: Sequence[float]) -> tuple[Array, Array]:
            return _hbm_hits(curves[0], lams[0], caps)

        vals, times = _evaluate([self], hits, caps.size)
        out = []
        for j, c in enumerate(caps):
            est, spread = _estimate(vals[:, :, j] * scale, self.level)
            t_pt = times[j]
            extrap = t_pt > self.t_hbm * (1 + 1e-9)
            beyond = t_pt > self.top_bound_s
            base = self.hit_ratio
            ok, why = _tell(self, (spread[0] - base, spread[1] - base), est.value, extrap, beyond)
            point = CurvePoint(
                float(c), _clip(est, 0.0, 1.0), float(t_pt), bool(extrap), bool(beyond), ok, why
            )
            out.append(point)
        return tuple(out)


def _hbm_hits(cv: _Curve, lam: float, caps: Array) -> tuple[Array, Array]:
    t = np.interp(caps, cv.occ, cv.t)
    out: Array = lam * np.interp(t, cv.t, cv.cdf)
    return out, t


def fit_reuse(  # noqa: PLR0912, PLR0915 - each input check names its own field
    inputs: ReuseInputs, *, level: float = 0.9, n_boot: int = 200, seed: int = 0
) -> ReuseFit:
    """Fit the reuse-time distribution of one engine (or one LMCache pool's merged stream)
    and check it reproduces today's HBM hit ratio (planner/fit/METHODS.md#reuse)."""
    check_level(level)
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 0:
        raise ConfigError(f"n_boot must be an integer >= 0, got {n_boot!r}")
    who = inputs.name or "engine"
    gap = np.asarray(inputs.reuse_gap.counts, dtype=np.float64)
    idle = np.asarray(inputs.idle_before_evict.counts, dtype=np.float64)
    n_res = inputs.lifetime.total
    with recorded_warnings() as warns:
        if n_res <= 0:
            raise ConfigError(
                f"{who}: the lifetime histogram is empty: no sampled block was evicted"
            )
        original = _body(inputs, gap, idle, n_res)
        rng = np.random.default_rng(seed)
        bodies = [original]
        failed = 0
        for _ in range(n_boot):
            g = rng.poisson(gap).astype(np.float64)
            i = rng.poisson(idle).astype(np.float64)
            r = n_res * i.sum() / idle.sum()  # one lifetime and one idle per eviction
            try:
                bodies.append(_body(inputs, g, i, max(r, 1.0)))
            except ConfigError:
                failed += 1
        notes = []
        if failed:
            notes.append(f"{failed} of {n_boot} bootstrap replicates had too few counts to fit")
        if abs(idle.sum() - n_res) > 3.0 * math.sqrt(max(n_res, 1.0)) + 1.0:
            notes.append(
                f"idle-before-evict ({idle.sum():.0f}) and lifetime ({n_res:.0f}) counts differ: "
                "both are observed once per sampled eviction"
            )
        if inputs.allocations_per_s is not None:
            implied = n_res / (inputs.sample_rate * inputs.window_s)
            if abs(implied - inputs.allocations_per_s) > 0.25 * inputs.allocations_per_s:
                notes.append(
                    f"allocations_per_s {fmt(inputs.allocations_per_s)} vs "
                    f"{fmt(implied)} implied by the sampled evictions"
                )
        misses = inputs.lookups_per_s - inputs.hits_per_s
        if original.lam - inputs.hits_per_s < 0.8 * misses:
            notes.append(
                f"allocations/s {fmt(original.lam - inputs.hits_per_s)} below the prompt misses/s "
                f"{fmt(misses)}: every missed block is allocated"
            )
    fams = tuple(f for f in FAMILIES if f in original.tails)
    lam_ratio = original.lam / inputs.lookups_per_s
    t0s, h0s = [], []
    for fam in fams:
        cv = _curve(original, fam, "model")  # the fit is not built yet
        assert cv is not None
        t0s.append(cv.t0)
        h0s.append(cv.f0 * lam_ratio)
    h_meas = inputs.hits_per_s / inputs.lookups_per_s
    h0 = float(np.median(h0s)) if h0s else math.nan
    repro = Reproduction(
        hit_ratio=h0,
        measured=h_meas,
        error=h0 - h_meas,
        eviction_time_s=float(np.median(t0s)) if t0s else math.nan,
        measured_eviction_time_s=original.t_hbm,
    )
    can_tell, why = True, ""
    if not fams:
        can_tell, why = (
            False,
            (
                "no complete histogram bucket below the HBM eviction time holds a reuse gap: "
                "no tail can be fitted"
            ),
        )
    elif original.t_hbm > inputs.reuse_gap.bounds[-1]:
        can_tell, why = False, "the HBM eviction time is past the top finite bucket"
    elif abs(repro.error) > max(REPRO_ABS, REPRO_REL * h_meas):
        can_tell, why = (
            False,
            (
                f"the model does not reproduce today's HBM hit ratio: {fmt(h0)} at "
                f"{inputs.hbm_blocks} blocks vs {fmt(h_meas)} measured (eviction time "
                f"{fmt(repro.eviction_time_s)} s vs {fmt(original.t_hbm)} s)"
            ),
        )
    return ReuseFit(
        name=who,
        inputs=inputs,
        t_hbm=original.t_hbm,
        hit_ratio=h_meas,
        access_hit_ratio=original.hit,
        accesses_per_s=original.lam,
        rho=original.rho,
        weight=original.weight,
        excess_share=original.excess,
        kappa=original.kappa,
        tail_slope=original.slope,
        families=fams,
        reproduction=repro,
        level=level,
        n_boot=len(bodies) - 1,
        warnings=(*warns, *notes),
        can_tell=can_tell,
        why=why,
        _bodies=tuple(bodies),
    )


# --- evaluation over replicates, families and anchors ------------------------------------------
def _evaluate(fits: Sequence[ReuseFit], fn: _Fn, width: int) -> tuple[Array, Array]:
    """values[rep, combo, j] of ``fn(curves, lams) -> (values[j], times[j])`` for every
    replicate and (family, anchor) combination (NaN where a family is missing), and the
    point eviction times (original counts, median over the measured-anchor families)."""
    n_rep = min(len(f._bodies) for f in fits)
    vals = np.full((n_rep, len(COMBOS), width), np.nan)
    times = np.full((len(FAMILIES), width), np.nan)
    for r in range(n_rep):
        for k, (fam, anc) in enumerate(COMBOS):
            curves = _curves(fits, r, fam, anc)
            if curves is None:
                continue
            v, t = fn(curves, [f._bodies[r].lam for f in fits])
            vals[r, k] = v
            if r == 0 and anc == "measured":
                times[FAMILIES.index(fam)] = t
    t_pt = np.full(width, np.nan)
    for j in range(width):
        col = times[:, j][np.isfinite(times[:, j])]
        if col.size:
            t_pt[j] = float(np.median(col))
    return vals, t_pt


def _curves(fits: Sequence[ReuseFit], rep: int, fam: str, anc: str) -> list[_Curve] | None:
    out = []
    for f in fits:
        cv = f._curve(rep, fam, anc)
        if cv is None:
            return None
        out.append(cv)
    return out


def _estimate(vals: Array, level: float) -> tuple[Estimate, tuple[float, float]]:
    """Point (median over families and anchors, original counts) and model-based interval
    (union of each combination's bootstrap percentile interval and the point values); also
    the family spread (min, max over combinations on the original counts)."""
    point_vals = vals[0][np.isfinite(vals[0])]
    if point_vals.size == 0:
        nan = math.nan
        return Estimate(nan, Interval(nan, nan, level)), (nan, nan)
    point = float(np.median(point_vals))
    lo, hi = float(point_vals.min()), float(point_vals.max())
    spread = (lo, hi)
    if vals.shape[0] > 1:
        boot = vals[1:]
        q = ((1.0 - level) / 2.0 * 100.0, (1.0 + level) / 2.0 * 100.0)
        for k in range(vals.shape[1]):
            col = boot[:, k]
            col = col[np.isfinite(col)]
            if col.size >= 2:
                a, b = np.percentile(col, q)
                lo, hi = min(lo, float(a)), max(hi, float(b))
    return Estimate(point, Interval(lo, hi, level)), spread


def _clip(est: Estimate, lo: float, hi: float) -> Estimate:
    iv = est.interval

    def c(x: float) -> float:
        return min(max(x, lo), hi) if math.isfinite(x) else x

    return Estimate(c(est.value), Interval(c(iv.lo), c(iv.hi), iv.level), est.unit)


def _tell(
    fit: ReuseFit, spread: tuple[float, float], point: float, extrap: bool, beyond: bool
) -> tuple[bool, str]:
    if not fit.can_tell:
        return False, fit.why
    if beyond:
        return False, (
            f"needs reuse gaps past the top finite bucket ({fit.top_bound_s:g} s) of vLLM's "
            f"histogram: families give {fmt(spread[0])} to {fmt(spread[1])}"
        )
    lo, hi = spread
    if extrap and hi - lo > max(WIDE_ABS, WIDE_REL * max(abs(hi), abs(lo))):
        return False, (
            f"tail families disagree widely: {fmt(lo)} to {fmt(hi)} "
            f"({fmt((hi - lo) * 100)} pp apart)"
        )
    if not math.isfinite(point):
        return False, "no tail family fits"
    return True, "extrapolated past the HBM eviction time" if extrap else ""


# --- tiers -------------------------------------------------------------------------------------
def bytes_per_block(model: Model, block_size: int) -> float:
    """KV bytes of one block of the whole engine (what a CPU tier stores per block)."""
    if block_size <= 0:
        raise ConfigError(f"block_size must be > 0, got {block_size}")
    return block_size * kv_bytes_per_token_engine(model)


def native_offload_gain(
    fit: ReuseFit,
    sizes_gib: Sequence[float],
    *,
    bytes_per_block: float,
    knee_fraction: float = 0.1,
) -> TierGain:
    """What vLLM's native CPU offload of each size (GiB per engine) adds to one engine: an
    inclusive LRU over the engine's whole access stream (METHODS.md#reuse)."""
    return _tier_gain("native", [fit], sizes_gib, bytes_per_block, knee_fraction)


def lmcache_pool_gain(
    fits: Sequence[ReuseFit],
    sizes_gib: Sequence[float],
    *,
    bytes_per_block: float,
    knee_fraction: float = 0.1,
) -> TierGain:
    """What an LMCache L1 pool of each size (GiB) shared by ``fits``' engines adds: one LRU
    over their merged streams. A lower bound (cross-engine reuse is invisible here)."""
    if not fits:
        raise ConfigError("an LMCache pool needs at least one engine's fit")
    levels = {f.level for f in fits}
    if len(levels) > 1:
        raise ConfigError(f"fits of one pool must share a level, got {sorted(levels)}")
    return _tier_gain("lmcache", list(fits), sizes_gib, bytes_per_block, knee_fraction)


def _tier_gain(
    mode: str,
    fits: list[ReuseFit],
    sizes_gib: Sequence[float],
    per_block: float,
    knee_fraction: float,
) -> TierGain:
    _positive(per_block, "bytes_per_block")
    if not 0.0 < knee_fraction < 1.0:
        raise ConfigError(f"knee_fraction must be in (0, 1), got {knee_fraction}")
    sizes = np.asarray([float(x) for x in sizes_gib], dtype=np.float64)
    if sizes.size == 0 or not np.all(np.isfinite(sizes)) or np.any(sizes < 0):
        raise ConfigError(f"sizes_gib must be finite and >= 0, got {list(sizes_gib)}")
    caps = sizes * GIB / per_block
    lookups = sum(f.inputs.lookups_per_s for f in fits)
    bsize = [f.inputs.block_size for f in fits]
    level = fits[0].level

    def extra(curves: Sequence[_Curve], lams: Sequence[float]) -> tuple[Array, Array]:
        per, t_pool = _pool(curves, lams, caps)
        total: Array = np.sum(per, axis=0)
        return total, t_pool

    def tokens(curves: Sequence[_Curve], lams: Sequence[float]) -> tuple[Array, Array]:
        per, t_pool = _pool(curves, lams, caps)
        total: Array = np.sum([p * b for p, b in zip(per, bsize, strict=True)], axis=0)
        return total, t_pool

    vals, times = _evaluate(fits, extra, caps.size)
    tok, _ = _evaluate(fits, tokens, caps.size)
    top = min(f.top_bound_s for f in fits)
    t_min = min(f.t_hbm for f in fits)
    points = []
    for j in range(caps.size):
        est, spread = _estimate(vals[:, :, j] / lookups, level)
        tok_est, _ = _estimate(tok[:, :, j], level)
        t_pt = float(times[j])
        fam_vals = {
            fam: float(vals[0, k, j] / lookups)
            for k, fam in enumerate(FAMILIES)
            if math.isfinite(vals[0, k, j])
        }
        extrap = bool(math.isfinite(t_pt) and t_pt > t_min * (1 + 1e-9))
        beyond = bool(math.isfinite(t_pt) and t_pt > top)
        ok, why = _tell(fits[0], spread, est.value, extrap, beyond)
        for f in fits[1:]:
            if not f.can_tell:
                ok, why = False, f"{f.name}: {f.why}"
        if ok and extrap:
            why = "extrapolated past the HBM eviction time"
        elif ok and est.value <= 0:
            why = "holds no block HBM would not: an inclusive LRU adds nothing"
        if mode == "lmcache":
            why = "lower bound (cross-engine reuse not seen)" + (f"; {why}" if why else "")
        points.append(
            TierPoint(
                size_gib=float(sizes[j]),
                capacity_blocks=float(caps[j]),
                extra_hit_ratio=est,
                avoided_prefill_tokens_per_s=tok_est,
                eviction_time_s=t_pt,
                families=fam_vals,
                extrapolated=extrap,
                beyond_histogram=beyond,
                can_tell=ok,
                why=why,
            )
        )
    knee = _knee(fits, per_block, knee_fraction, level)
    assumptions: tuple[str, ...] = (
        "LRU eviction and a stationary access stream over the window (AET)",
        "renewal under-count correction: each access hits next with the measured probability",
        "reuse past the HBM eviction time extrapolated by the tail families",
        "the tier sees the engine's whole access stream (inclusive with HBM)",
    )
    if mode == "lmcache":
        assumptions = (
            *assumptions,
            "no cross-engine reuse (a lower bound); LMCache chunk granularity ignored",
        )
    return TierGain(
        mode=mode,
        engines=tuple(f.name for f in fits),
        points=tuple(points),
        knee=knee,
        lower_bound=mode == "lmcache",
        method=METHOD,
        assumptions=assumptions,
    )


def _knee(fits: list[ReuseFit], per_block: float, fraction: float, level: float) -> Knee:
    """The knee on every replicate and (family, anchor); see :class:`Knee`."""
    n_rep = min(len(f._bodies) for f in fits)
    knees = np.full((n_rep, len(COMBOS)), np.nan)
    onset_pt = math.nan
    gains = False  # some point-fit combination gains past the onset
    for r in range(n_rep):
        for k, (fam, anc) in enumerate(COMBOS):
            good = _curves(fits, r, fam, anc)
            if good is None:
                continue
            lams = [f._bodies[r].lam for f in fits]
            onset = _onset(good)
            if r == 0 and anc == "measured" and not math.isfinite(onset_pt):
                onset_pt = onset
            caps = onset * (
                1.0 + np.concatenate([[0.0], np.geomspace(1e-4, KNEE_SPAN, KNEE_POINTS)])
            )
            per, _ = _pool(good, lams, caps)
            slope = np.diff(np.sum(per, axis=0)) / np.diff(caps)
            if slope[0] <= 0:
                continue
            gains = gains or r == 0
            below = np.nonzero(slope < fraction * slope[0])[0]
            if below.size:
                knees[r, k] = caps[below[0]] * per_block / GIB
    onset_gib = onset_pt * per_block / GIB if math.isfinite(onset_pt) else math.nan
    lost = [f for f in fits if not f.families]
    if lost:
        return Knee(None, onset_gib, fraction, True, f"{lost[0].name}: {lost[0].why}")
    if not np.isfinite(knees[0]).any():
        why = (
            f"not reached within {KNEE_SPAN:g}x the onset"
            if gains
            else "no gain past the onset: no reuse mass beyond the HBM eviction time"
        )
        return Knee(None, onset_gib, fraction, True, why)
    est, _ = _estimate(knees, level)
    return Knee(est, onset_gib, fraction, True, "extrapolated past the HBM eviction time")


def _onset(curves: Sequence[_Curve]) -> float:
    """Pool capacity (blocks) at which the pool's eviction time reaches the first engine's."""
    t_first = min(cv.t0 for cv in curves)
    return float(sum(np.interp(t_first, cv.t, cv.occ) for cv in curves))
