"""Roll the snapshots of one source into fixed windows (one Window per series per window).

Windows are [start, start + window_s), ``start`` a multiple of ``window_s`` (UTC epoch s).
Counters: PromQL's ``increase()`` with resets, deltas chained from the previous window's last
sample; gauges: time-weighted means; histograms: observations and quantiles as PromQL's
histogram_quantile, bucket deltas kept for ``keep_buckets`` signals; derived ratios;
non-finite samples skipped and counted. ``export_state``/``restore_state`` carry it across
a restart.

Semantics: collector/DESIGN.md#rollup
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from operator import add, sub
from typing import Any

from core.catalog import BUCKET_SIGNALS, DERIVED_RATIOS
from core.errors import ConfigError
from core.records import Kind, Labels, SignalSample, Snapshot, Window

SeriesKey = tuple[str, Labels]
QUANTILES = (0.5, 0.9, 0.99)
INF = math.inf


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """PromQL's histogram_quantile on cumulative (upper bound, count) buckets ending with +Inf.

    Port of Prometheus 2.42 promql/quantile.go ``bucketQuantile``: linear interpolation inside
    the bucket holding the rank (the first bucket starts at 0 unless its bound is <= 0); a rank
    in the +Inf bucket returns the highest finite bound. None where PromQL returns NaN (no
    observations, no +Inf bucket, fewer than two buckets).
    """
    return histogram_quantiles((q,), buckets)[0]


def histogram_quantiles(
    qs: Sequence[float], buckets: Sequence[tuple[float, float]]
) -> list[float | None]:
    """histogram_quantile for several quantiles of the same buckets (prepared once)."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][0] != INF:
        return [_bucket_quantile(q, None) for q in qs]
    # coalesceBuckets: merge equal bounds; ensureMonotonic: counts never decrease.
    merged: list[list[float]] = []
    for bound, count in ordered:
        if merged and merged[-1][0] == bound:
            merged[-1][1] += count
        else:
            merged.append([bound, count])
    running = -INF
    for pair in merged:
        running = max(running, pair[1])
        pair[1] = running
    return [_bucket_quantile(q, merged) for q in qs]


def _bucket_quantile(q: float, merged: list[list[float]] | None) -> float | None:
    """bucketQuantile on coalesced, monotonic buckets (None: no +Inf bucket)."""
    if math.isnan(q):
        return None
    if q < 0:
        return -INF
    if q > 1:
        return INF
    if merged is None or len(merged) < 2:
        return None
    observations = merged[-1][1]
    if observations == 0:
        return None
    rank = q * observations
    b = next((i for i in range(len(merged) - 1) if merged[i][1] >= rank), len(merged) - 1)
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    bucket_start = 0.0
    bucket_end, count = merged[b]
    if b > 0:
        bucket_start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    return bucket_start + (bucket_end - bucket_start) * (rank / count)


@dataclass(slots=True)
class _Point:
    """The last valid sample of a series (kept across windows)."""

    kind: Kind
    ts: float
    value: float
    sum: float | None = None
    bounds: tuple[float, ...] = ()
    counts: tuple[float, ...] = ()


@dataclass(slots=True)
class _WindowAccumulator:
    """What one series accumulates inside the open window."""

    kind: Kind
    from_ts: float  # start of the span covered (previous sample, else first sample)
    prev: _Point | None  # last sample before the window or, later, the latest sample
    samples: int = 0
    last_ts: float = 0.0
    last: float = 0.0
    delta: float | None = None
    resets: int = 0
    # gauges
    weighted: float = 0.0
    lo: float = INF
    hi: float = -INF
    # histograms
    sum_delta: float | None = None
    sum_known: bool = True
    bounds: tuple[float, ...] = ()
    bucket_delta: list[float] = field(default_factory=list)
    layout_mixed: bool = False


class Rollup:
    """Roll the snapshots of one source into windows; semantics: DESIGN.md#rollup."""

    def __init__(
        self,
        source: str,
        window_s: float = 60.0,
        ratios: Sequence[tuple[str, str, str]] | None = None,
        stale_windows: int = 5,
        keep_buckets: Collection[str] | None = None,
    ) -> None:
        """``ratios``: the derived ratios (default: the catalogue's DERIVED_RATIOS);
        ``keep_buckets``: the histogram signals whose windows keep their bucket counts
        (default: the catalogue's BUCKET_SIGNALS)."""
        if not (math.isfinite(window_s) and window_s > 0):
            raise ConfigError(f"rollup window_s must be a positive number of seconds: {window_s}")
        if stale_windows < 1:
            raise ConfigError(f"rollup stale_windows must be >= 1: {stale_windows}")
        if ratios is None or keep_buckets is None:
            ratios = DERIVED_RATIOS if ratios is None else ratios
            keep_buckets = BUCKET_SIGNALS if keep_buckets is None else keep_buckets
        self.source = source
        self.window_s = float(window_s)
        self.ratios: tuple[tuple[str, str, str], ...] = tuple(ratios)
        self.stale_windows = stale_windows
        self.keep_buckets: frozenset[str] = frozenset(keep_buckets)
        self.skipped: Counter[str] = Counter()
        self._state: dict[SeriesKey, _Point] = {}
        self._accumulators: dict[SeriesKey, _WindowAccumulator] = {}
        self._layouts: set[tuple[float, ...]] = set()  # bucket bounds already validated
        self._open: int | None = None  # index of the open window (start = index * window_s)
        self._last_ts = -INF
        self._closed_until = -INF

    @property
    def tracked_series(self) -> int:
        """How many series the rollup keeps state for (bounded by stale_windows)."""
        return len(self._state)

    def add(self, snapshot: Snapshot) -> list[Window]:
        """Add one snapshot; return the windows it closed (sorted by start, signal, labels)."""
        ts = snapshot.timestamp
        if not math.isfinite(ts) or ts <= self._last_ts or ts < self._closed_until:
            self.skipped["out_of_order"] += 1
            return []
        self._last_ts = ts
        index = math.floor(ts / self.window_s)
        closed: list[Window] = []
        if self._open is not None and index > self._open:
            closed = self._close()
        self._open = index
        for sample in snapshot.samples:
            self._add_sample(sample, ts)
        return closed

    def flush(self) -> list[Window]:
        """Close the open window (clean stop); later snapshots inside it are out of order."""
        if self._open is None:
            return []
        return self._close()

    # -- checkpoint (collector.checkpoint: what a restarted collector resumes from) ---------

    @property
    def last_timestamp(self) -> float | None:
        """The newest snapshot's time (None: none added yet)."""
        return None if self._last_ts == -INF else self._last_ts

    def export_state(self) -> dict[str, Any]:
        """Everything :meth:`restore_state` needs to carry on as if never stopped, as plain
        data for JSON (the store's hand-off; floats may be ±Infinity: json's default
        ``allow_nan`` writes them) and marshal (the checkpoint): the open window's
        accumulators and each series' last sample (the previous sample of the next window's
        counter and histogram deltas)."""
        # tuples as they are (JSON writes them as arrays, marshal as tuples; restore_state
        # takes both): a checkpoint of every target is written at every save (up to every
        # tick), so this runs once per target and save
        series = [[s, labels, _point_out(point)] for (s, labels), point in self._state.items()]
        open_series = [[key[0], key[1], _accumulator_row(acc, self._state.get(key))]
                       for key, acc in self._accumulators.items()]  # fmt: skip
        return {
            "window_s": self.window_s,
            "open": self._open,
            "last_ts": self._last_ts,
            "closed_until": self._closed_until,
            "series": series,
            "open_series": open_series,
            "skipped": dict(self.skipped),
        }

    def restore_state(self, data: Mapping[str, Any]) -> None:
        """Take the state :meth:`export_state` wrote (same ``window_s``, else ConfigError;
        malformed data raises KeyError, TypeError or ValueError and leaves this rollup as it
        was)."""
        if float(data["window_s"]) != self.window_s:
            raise ConfigError(
                f"rollup state of {self.source} has window {data['window_s']} s, not "
                f"{self.window_s:g} s"
            )
        state = {_key_in(s, labels): _point_in(p) for s, labels, p in data["series"]}
        accs = {}
        for s, labels, a in data["open_series"]:
            key = _key_in(s, labels)
            accs[key] = _accumulator_from_row(a, state.get(key))
        opened = None if data["open"] is None else int(data["open"])
        last_ts, closed_until = float(data["last_ts"]), float(data["closed_until"])
        skipped = Counter({str(k): int(v) for k, v in data["skipped"].items()})
        self._open, self._last_ts, self._closed_until = opened, last_ts, closed_until
        self._state, self._accumulators, self.skipped = state, accs, skipped

    # -- per sample -------------------------------------------------------------------------

    def _add_sample(self, sample: SignalSample, ts: float) -> None:
        key = (sample.signal, sample.labels)
        if sample.kind == "counter":
            self._add_counter(key, sample.value, ts)
        elif sample.kind == "gauge":
            self._add_gauge(key, sample.value, ts)
        elif sample.kind == "histogram":
            self._add_histogram(key, sample, ts)
        else:
            self.skipped["kind"] += 1

    def _accumulator(self, key: SeriesKey, kind: Kind, ts: float) -> _WindowAccumulator:
        acc = self._accumulators.get(key)
        if acc is not None and acc.kind == kind:
            return acc
        prev = self._state.get(key)
        if prev is not None and prev.kind != kind:
            prev = None
        acc = _WindowAccumulator(kind=kind, from_ts=prev.ts if prev is not None else ts, prev=prev)
        self._accumulators[key] = acc
        return acc

    def _add_counter(self, key: SeriesKey, value: float, ts: float) -> None:
        if math.isnan(value):
            self.skipped["nan"] += 1
            return
        if math.isinf(value):
            self.skipped["inf"] += 1
            return
        if value < 0:
            self.skipped["negative"] += 1
            return
        acc = self._accumulator(key, "counter", ts)
        prev = acc.prev
        if prev is not None:
            if value < prev.value:
                acc.resets += 1
                increase = value
            else:
                increase = value - prev.value
            acc.delta = (acc.delta or 0.0) + increase
        point = _Point("counter", ts, value)
        acc.prev = point
        self._state[key] = point
        acc.samples += 1
        acc.last_ts = ts
        acc.last = value

    def _add_gauge(self, key: SeriesKey, value: float, ts: float) -> None:
        if math.isnan(value):
            self.skipped["nan"] += 1
            return
        if math.isinf(value):
            self.skipped["inf"] += 1
            return
        acc = self._accumulator(key, "gauge", ts)
        if acc.samples:
            acc.weighted += acc.last * (ts - acc.last_ts)
        else:
            acc.from_ts = ts
        acc.lo = min(acc.lo, value)
        acc.hi = max(acc.hi, value)
        acc.samples += 1
        acc.last_ts = ts
        acc.last = value
        self._state[key] = _Point("gauge", ts, value)

    def _add_histogram(self, key: SeriesKey, sample: SignalSample, ts: float) -> None:  # noqa: PLR0912 - each histogram reset / bucket change case in line, per sample
        bounds, counts = sample.bounds, sample.counts
        if not bounds or len(bounds) != len(counts):
            self.skipped["malformed_histogram"] += 1
            return
        total = sum(counts, sample.value + (sample.sum or 0.0))
        if not math.isfinite(total):  # one pass in C; NaN/Inf anywhere shows up here
            self.skipped["nan" if math.isnan(total) else "inf"] += 1
            return
        if bounds not in self._layouts:
            if bounds[-1] != INF or any(a >= b for a, b in pairwise(bounds)):
                self.skipped["malformed_histogram"] += 1
                return
            if len(self._layouts) > 1_000:  # bounded even against a hostile exporter
                self._layouts.clear()
            self._layouts.add(bounds)
        acc = self._accumulator(key, "histogram", ts)
        prev = acc.prev
        if prev is not None:
            deltas = list(map(sub, counts, prev.counts)) if prev.bounds == bounds else []
            d_count = sample.value - prev.value
            if not deltas or d_count < 0 or min(deltas) < 0:  # reset or new bucket layout
                acc.resets += 1
                d_count, d_sum, deltas = sample.value, sample.sum, list(counts)
            else:
                d_sum = None if sample.sum is None or prev.sum is None else sample.sum - prev.sum
            acc.delta = (acc.delta or 0.0) + d_count
            if d_sum is None:
                acc.sum_known = False
            else:
                acc.sum_delta = (acc.sum_delta or 0.0) + d_sum
            if not acc.bounds:
                acc.bounds, acc.bucket_delta = bounds, deltas
            elif acc.bounds == bounds:
                acc.bucket_delta = list(map(add, acc.bucket_delta, deltas))
            else:
                acc.layout_mixed = True
        point = _Point("histogram", ts, sample.value, sample.sum, bounds, counts)
        acc.prev = point
        self._state[key] = point
        acc.samples += 1
        acc.last_ts = ts
        acc.last = sample.value

    # -- closing ----------------------------------------------------------------------------

    def _close(self) -> list[Window]:
        assert self._open is not None
        start = self._open * self.window_s
        end = start + self.window_s
        windows: list[Window] = []
        counters: dict[SeriesKey, Window] = {}
        for (signal, labels), acc in self._accumulators.items():
            window = self._window(signal, labels, acc, start, end)
            windows.append(window)
            if acc.kind == "counter":
                counters[(signal, labels)] = window
        windows.extend(self._ratios(counters, start))
        windows.sort(key=lambda w: (w.signal, w.labels))
        self._accumulators = {}
        self._open = None
        self._closed_until = end
        horizon = end - self.stale_windows * self.window_s
        stale = [key for key, point in self._state.items() if point.ts < horizon]
        for key in stale:
            del self._state[key]
        return windows

    def _window(
        self, signal: str, labels: Labels, acc: _WindowAccumulator, start: float, end: float
    ) -> Window:
        span = acc.last_ts - acc.from_ts
        rate = None if acc.delta is None or span <= 0 else acc.delta / span
        mean = lo = hi = sum_delta = None
        quantiles: list[float | None] = [None, None, None]
        bucket_bounds: tuple[float, ...] = ()
        bucket_counts: tuple[float, ...] = ()
        if acc.kind == "counter":
            pass
        elif acc.kind == "gauge":
            rate = None
            weighted = acc.weighted + acc.last * (end - acc.last_ts)
            mean, lo, hi = weighted / (end - acc.from_ts), acc.lo, acc.hi
        else:
            sum_delta = acc.sum_delta if acc.sum_known and acc.delta is not None else None
            mean = sum_delta / acc.delta if sum_delta is not None and acc.delta else None
            if acc.bounds and not acc.layout_mixed:
                quantiles = histogram_quantiles(
                    QUANTILES, tuple(zip(acc.bounds, acc.bucket_delta, strict=True))
                )
                if signal in self.keep_buckets:
                    bucket_bounds = acc.bounds[:-1]  # the last is +Inf (_add_histogram)
                    bucket_counts = per_bucket(acc.bucket_delta)
        return Window(
            source=self.source,
            signal=signal,
            labels=labels,
            start=start,
            length_s=self.window_s,
            kind=acc.kind,
            samples=acc.samples,
            delta=acc.delta,
            rate=rate,
            resets=acc.resets,
            mean=mean,
            min=lo,
            max=hi,
            last=acc.last,
            p50=quantiles[0],
            p90=quantiles[1],
            p99=quantiles[2],
            sum_delta=sum_delta,
            bucket_bounds=bucket_bounds,
            bucket_counts=bucket_counts,
        )

    def _ratios(self, counters: dict[SeriesKey, Window], start: float) -> list[Window]:
        out: list[Window] = []
        for ratio, numerator, denominator in self.ratios:
            for (signal, labels), den in counters.items():
                if signal != denominator:
                    continue
                num = counters.get((numerator, labels))
                if num is not None:
                    out.append(ratio_window(ratio, num, den))
        return out


def per_bucket(cumulative: Sequence[float]) -> tuple[float, ...]:
    """The count of each bucket from cumulative bucket counts (``le`` order): the first as
    it is, then each one's difference from the one before (negative only where the
    cumulative counts decrease, an exporter that is not cumulative: kept as exposed)."""
    return tuple(b - a for a, b in pairwise((0.0, *cumulative)))


def ratio_window(ratio: str, num: Window, den: Window) -> Window:
    """The ratio window of two counter windows of one series and start: mean = Δnum / Δden
    (None when Δden is 0 or either delta is unknown), delta = Δden (the weight)."""
    known = num.delta is not None and den.delta is not None
    value = num.delta / den.delta if num.delta is not None and den.delta else None
    return Window(
        source=den.source,
        signal=ratio,
        labels=den.labels,
        start=den.start,
        length_s=den.length_s,
        kind="ratio",
        samples=min(num.samples, den.samples),
        delta=den.delta if known else None,
        mean=value,
    )


# --------------------------------------------------------------------------- state as JSON


def _key_in(signal: str, labels: Sequence[Sequence[str]]) -> SeriesKey:
    return str(signal), tuple((str(k), str(v)) for k, v in labels)


def _point_out(p: _Point) -> list[Any]:
    return [p.kind, p.ts, p.value, p.sum, p.bounds, p.counts]


def _point_in(row: Sequence[Any]) -> _Point:
    kind, ts, value, total, bounds, counts = row
    if kind not in _KINDS:
        raise ValueError(f"unknown series kind {kind!r}")
    return _Point(kind, float(ts), float(value), None if total is None else float(total),
                  tuple(map(float, bounds)), tuple(map(float, counts)))  # fmt: skip


def _accumulator_row(a: _WindowAccumulator, latest: _Point | None) -> list[Any]:
    """An accumulator as a row; its previous sample and bucket bounds are usually the series'
    latest sample and its bounds, written once (as "latest") to halve a histogram's size."""
    prev: Any = None if a.prev is None else _point_out(a.prev)
    if a.prev is not None and a.prev is latest:
        prev = "latest"
    bounds: Any = "latest" if latest is not None and a.bounds == latest.bounds else list(a.bounds)
    return [a.kind, a.from_ts, prev, a.samples, a.last_ts, a.last, a.delta, a.resets,
            a.weighted, a.lo, a.hi, a.sum_delta, a.sum_known, bounds,
            list(a.bucket_delta), a.layout_mixed]  # fmt: skip


def _accumulator_from_row(row: Sequence[Any], latest: _Point | None) -> _WindowAccumulator:
    (kind, from_ts, prev, samples, last_ts, last, delta, resets, weighted, lo, hi,
     sum_delta, sum_known, bounds, bucket_delta, layout_mixed) = row  # fmt: skip
    if kind not in _KINDS:
        raise ValueError(f"unknown series kind {kind!r}")
    if "latest" in (prev, bounds) and latest is None:
        raise ValueError("an open series refers to a latest sample that is not there")
    if prev == "latest":
        prev_point: _Point | None = latest
    else:
        prev_point = None if prev is None else _point_in(prev)
    if bounds == "latest":
        assert latest is not None
        bounds = latest.bounds
    return _WindowAccumulator(
        kind=kind, from_ts=float(from_ts), prev=prev_point,
        samples=int(samples), last_ts=float(last_ts), last=float(last),
        delta=None if delta is None else float(delta), resets=int(resets),
        weighted=float(weighted), lo=float(lo), hi=float(hi),
        sum_delta=None if sum_delta is None else float(sum_delta), sum_known=bool(sum_known),
        bounds=tuple(map(float, bounds)), bucket_delta=list(map(float, bucket_delta)),
        layout_mixed=bool(layout_mixed),
    )  # fmt: skip


_KINDS = ("counter", "gauge", "histogram")
