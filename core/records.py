"""Small immutable records that flow collector -> store -> planner.

Times are UTC epoch seconds (floats) everywhere: SQLite hands back naive datetimes, so
kvscope never relies on tz-aware datetimes crossing the store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["counter", "gauge", "histogram", "ratio"]
# Label sets are tuples of (name, value) pairs sorted by name: hashable and canonical.
Labels = tuple[tuple[str, str], ...]


def labels_of(mapping: Mapping[str, str]) -> Labels:
    """Canonical (sorted, hashable) form of a label mapping."""
    return tuple(sorted(mapping.items()))


@dataclass(frozen=True, slots=True)
class SignalSample:
    """One canonical series value read from one exposition.

    counter/gauge: ``value``. histogram: ``value`` is the observation count, ``sum`` the
    observation sum, ``bounds`` the bucket upper bounds (increasing, ending with +Inf) and
    ``counts`` their cumulative counts; ``buckets`` pairs them. Two flat tuples rather than
    pairs: the reader and the roll-up make and take one of these per histogram per scrape.
    """

    signal: str
    kind: Kind
    labels: Labels
    value: float
    bounds: tuple[float, ...] = ()
    counts: tuple[float, ...] = ()
    sum: float | None = None

    @property
    def buckets(self) -> tuple[tuple[float, float], ...]:
        """The (upper bound, cumulative count) pairs."""
        return tuple(zip(self.bounds, self.counts, strict=True))

    @classmethod
    def histogram(
        cls,
        signal: str,
        labels: Labels,
        value: float,
        buckets: tuple[tuple[float, float], ...],
        sum: float | None = None,
    ) -> SignalSample:
        """A histogram sample from (upper bound, cumulative count) pairs."""
        bounds = tuple(b for b, _ in buckets)
        counts = tuple(c for _, c in buckets)
        return cls(signal, "histogram", labels, value, bounds, counts, sum)


# What collector.parse found wrong with one sample, a value never a syntax error: the scrape
# stays up and the sample is dropped or kept as its kind says (collector/DESIGN.md#parse).
AnomalyKind = Literal[
    "nan",  # NaN value (counter, bucket, count: dropped; gauge, _sum: see parse.py)
    "inf",  # +Inf or -Inf value
    "negative_counter",  # a counter, bucket or _count below 0
    "duplicate_series",  # name + labels already seen in this exposition: the first wins
    "type_conflict",  # a second TYPE line for a family with another type
    "bad_bucket",  # a _bucket sample without a numeric le label
    "histogram_no_inf_bucket",  # a histogram without its le="+Inf" bucket
    "histogram_not_cumulative",  # bucket counts decrease with le (kept, as PromQL does)
]
ANOMALY_KINDS: tuple[AnomalyKind, ...] = (
    "nan", "inf", "negative_counter", "duplicate_series", "type_conflict", "bad_bucket",
    "histogram_no_inf_bucket", "histogram_not_cumulative",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One anomalous sample (or TYPE line) of an exposition: what, where, and what was done.

    ``name`` is the sample name as written (the family for a TYPE line), ``labels`` its labels
    as written (sorted), ``line`` its 1-based line, ``dropped`` whether the sample was left out
    of the snapshot (False: kept, with this warning).
    """

    kind: AnomalyKind
    name: str
    labels: Labels
    line: int
    dropped: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One exposition (one scrape of one target) read into canonical terms."""

    target: str
    timestamp: float
    samples: tuple[SignalSample, ...]
    # Engine facts, e.g. {"cache_config": ({"engine": "0", "block_size": "16", ...}, ...)}.
    facts: Mapping[str, tuple[Mapping[str, str], ...]] = field(default_factory=dict)
    unknown_families: tuple[str, ...] = ()
    # Value anomalies of canonical series, in line order (never a reason to fail the scrape).
    anomalies: tuple[Anomaly, ...] = ()


@dataclass(frozen=True, slots=True)
class ScrapeOutcome:
    """What happened when one target was scraped once (written to the store as-is)."""

    target: str
    started: float
    duration_s: float
    up: bool
    bytes: int = 0
    series: int = 0
    # "connect", "timeout", "truncated", "http_status", "too_large", "parse", "redirect", …
    error_kind: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Window:
    """One series rolled up over [start, start + length_s); the fields of each kind below.

    counter: ``delta`` (increase with resets handled), ``rate`` (delta per second), ``resets``.
    gauge: ``mean``/``min``/``max``/``last``. histogram: ``delta`` observations, ``sum_delta``,
    ``p50``/``p90``/``p99`` as PromQL's histogram_quantile. ratio (derived): ``mean`` =
    numerator delta / denominator delta, ``delta`` = the denominator's (the weight).
    ``bucket_bounds`` / ``bucket_counts``: per-bucket observations (not cumulative, +Inf last)
    of ``keep_buckets`` signals, when known in one layout; ``()``: not kept.
    """

    source: str
    signal: str
    labels: Labels
    start: float
    length_s: float
    kind: Kind
    samples: int
    delta: float | None = None
    rate: float | None = None
    resets: int = 0
    mean: float | None = None
    min: float | None = None
    max: float | None = None
    last: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    sum_delta: float | None = None
    bucket_bounds: tuple[float, ...] = ()
    bucket_counts: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class BucketSum:
    """The bucket counts of one series' windows in one bucket layout, summed (Store.sum_buckets).

    ``bounds``: the finite upper bounds; ``counts``: observations per bucket (not cumulative,
    the +Inf bucket last) over ``windows`` windows, the first starting at ``first``, the last
    at ``last``. A series whose layout changed has one BucketSum per layout.
    """

    source: str
    signal: str
    labels: Labels
    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    windows: int
    first: float
    last: float


OFFLOAD_MODES = ("none", "native", "lmcache")  # what an engine runs: no offload or which


@dataclass(frozen=True, slots=True)
class Saved:
    """A target's roll-up state as a checkpoint holds it."""

    name: str
    url: str
    written: float  # when the checkpoint was written
    state: dict[str, Any]  # collector.rollup.Rollup.export_state()

    @property
    def last_ts(self) -> float:
        return float(self.state.get("last_ts") or 0.0)
