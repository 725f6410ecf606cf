"""KV residency histograms: the bucket counts of the residency families summed per engine or pool.

A hit-ratio-vs-capacity curve needs the *distribution* of vLLM's KV block reuse gaps (and of
its lifetime and idle-before-eviction siblings) and of the LMCache MP server's L1 chunk reuse
gaps, not three quantiles a window. The collector keeps the bucket counts of each window of
these histograms — the catalogue's ``keep_buckets`` signals (core.catalog
BUCKET_SIGNALS), read back with ``Store.read_buckets`` — and :func:`residency_histograms`
sums them over a time range:

* the key is the engine for vLLM's families: ``source/engine`` (``source`` alone for a
  series without an ``engine`` label), the engine key planner.fit.units.engine_keys gives a
  frame row;
* and the LMCache pool for the L1 family: the LMCache server's series carry no ``engine``
  label, so by the same rule their key is the server's source (its pool); the series of
  its L1 tags (one per server in LMCache 0.5.6, ``_default``) are summed.

Selectors are the plan's (``cluster``, ``since``/``until`` as ``Store.read_frame`` takes
them) plus ``sources``, e.g. a model group's (planner.frames.groups.GroupSlice.sources).

Bucket layouts: counts of two layouts cannot be added bucket by bucket (an exporter
upgraded between windows with other bounds; a window in which the layout changed has no
counts at all, as it has no quantiles: collector.rollup). Per key and signal only the windows
of the *latest* layout — the newest window's (ties: the last series by labels) — are summed;
the others are counted in :attr:`BucketCounts.dropped`. Each series' windows are added in
start order, then the series of a key in labels order: integer counts (a direct collector's)
are exact; Prometheus mode's fractional ones as exact as float64 additions are.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.catalog import BUCKET_SIGNALS, ENGINE_LABEL
from core.errors import ConfigError
from core.records import BucketSum, Labels

if TYPE_CHECKING:
    from store.store import Store

RESIDENCY_SIGNALS: tuple[str, ...] = tuple(sorted(BUCKET_SIGNALS))


@dataclass(frozen=True, slots=True)
class BucketCounts:
    """Observations per bucket over a time range.

    ``bounds``: the finite upper bounds (increasing); ``counts``: one per bucket, not
    cumulative, ``len(bounds) + 1`` of them, the last the +Inf bucket's. ``windows``: the
    windows summed; ``dropped``: the windows of other bucket layouts left out (module
    docstring)."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    windows: int = 0
    dropped: int = 0

    def __post_init__(self) -> None:
        if len(self.counts) != len(self.bounds) + 1:
            raise ValueError(
                f"BucketCounts: {len(self.counts)} counts for {len(self.bounds)} finite bounds "
                "(want one more: the +Inf bucket)"
            )

    def total(self) -> float:
        """Every observation counted (the +Inf bucket's cumulative count)."""
        return sum(self.counts, 0.0)


def key_of(source: str, labels: Labels) -> str:
    """The engine (``source/engine``) or, for a series without an engine label (an LMCache
    server's L1 family), the source a series' counts are summed under."""
    engine = dict(labels).get(ENGINE_LABEL, "")
    return f"{source}/{engine}" if engine else source


def combine(sums: Iterable[BucketSum]) -> dict[str, dict[str, BucketCounts]]:
    """key -> signal -> the counts of the series' BucketSums (``Store.sum_buckets``) of the
    latest layout added up, the others' windows counted as dropped (module docstring)."""
    groups: dict[tuple[str, str], list[BucketSum]] = {}
    for b in sums:
        groups.setdefault((key_of(b.source, b.labels), b.signal), []).append(b)
    out: dict[str, dict[str, BucketCounts]] = {}
    for (key, signal), parts in groups.items():
        latest = max(parts, key=lambda b: (b.last, b.labels)).bounds
        same = sorted((b for b in parts if b.bounds == latest), key=lambda b: b.labels)
        counts = [0.0] * (len(latest) + 1)
        for b in same:
            counts = [x + y for x, y in zip(counts, b.counts, strict=True)]
        windows = sum(b.windows for b in same)
        out.setdefault(key, {})[signal] = BucketCounts(
            latest, tuple(counts), windows=windows, dropped=sum(b.windows for b in parts) - windows
        )
    return {key: dict(sorted(by.items())) for key, by in sorted(out.items())}


def residency_histograms(
    store: Store,
    *,
    cluster: str | None = None,
    sources: Sequence[str] | None = None,
    since: float | None = None,
    until: float | None = None,
    signals: Sequence[str] = RESIDENCY_SIGNALS,
) -> dict[str, dict[str, BucketCounts]]:
    """key (engine or LMCache pool) -> signal -> bucket counts summed over the windows with
    ``since <= start < until`` (module docstring). ``signals``: some of the catalogue's
    keep_buckets signals (another one is a ConfigError: its buckets are never kept). A
    family no window has is absent from the result, never an error."""
    unknown = sorted(set(signals) - BUCKET_SIGNALS)
    if unknown:
        raise ConfigError(
            f"no bucket counts are kept for {', '.join(unknown)} (the histograms that keep "
            f"them: {', '.join(RESIDENCY_SIGNALS)}; core.catalog keep_buckets)"
        )
    sums = store.sum_buckets(
        signals=list(signals), sources=sources, cluster=cluster, since=since, until=until
    )
    return combine(sums)
