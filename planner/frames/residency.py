"""KV residency histograms: the bucket counts of the residency families summed per engine or pool.

:func:`residency_histograms` sums the kept bucket counts (``Store.read_buckets``) of vLLM's
KV block families per engine and of LMCache's L1 reuse gaps per pool over a time range;
per key and signal only the windows of the latest bucket layout are summed, the others
counted in :attr:`BucketCounts.dropped`.

Rules: planner/frames/METHODS.md#residency
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
    windows summed; ``dropped``: the windows of other bucket layouts left out
    (METHODS.md#residency)."""

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
    latest layout added up, the others' windows counted as dropped (METHODS.md#residency)."""
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
    ``since <= start < until`` (METHODS.md#residency). ``signals``: some of the catalogue's
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
