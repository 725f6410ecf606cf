"""Windows of one step (60 s) summed into windows of a longer one (STEP_S), per series.

Counts and deltas are summed, rates re-derived, gauge means time-weighted, ratio and
histogram means exact (Σnum / Σden); p50/p90/p99 are the delta-weighted mean of the windows'
quantiles (an approximation). NaN is unknown throughout, never 0.

Rules: store/DESIGN.md#downsample_math
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Floats = npt.NDArray[np.float64]
    Ints = npt.NDArray[np.int64]

STEP_S = 300.0
SUMS = ("length_s", "samples", "resets", "delta", "sum_delta")
BY_DELTA = ("p50", "p90", "p99")
# kinds whose mean is weighted by delta (else by length)
DELTA_MEAN_KINDS = ("histogram", "ratio")


def buckets(sid: Ints, start: Floats) -> Ints:
    """Index of each row's first row in its (series, bucket) group; rows sorted by series,
    then start."""
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

    bucket = np.floor(start / STEP_S)
    if sid.size == 0:
        return np.zeros(0, dtype=np.int64)
    new = np.ones(sid.size, dtype=bool)
    new[1:] = (sid[1:] != sid[:-1]) | (bucket[1:] != bucket[:-1])
    first: Ints = np.flatnonzero(new)
    return first


def _sum(x: Floats, first: Ints) -> Floats:
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

    known = ~np.isnan(x)
    total: Floats = np.add.reduceat(np.where(known, x, 0.0), first)
    any_known = np.add.reduceat(known.astype(np.int64), first) > 0
    out: Floats = np.where(any_known, total, np.nan)
    return out


def _weighted(x: Floats, w: Floats, first: Ints) -> Floats:
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

    ok = ~np.isnan(x) & ~np.isnan(w) & (w > 0)
    num = np.add.reduceat(np.where(ok, x * np.where(ok, w, 0.0), 0.0), first)
    den = np.add.reduceat(np.where(ok, w, 0.0), first)
    with np.errstate(invalid="ignore", divide="ignore"):
        out: Floats = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    return out


def _last(x: Floats, first: Ints) -> Floats:
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

    idx = np.where(~np.isnan(x), np.arange(x.size), -1)
    pick = np.maximum.reduceat(idx, first)
    out: Floats = np.where(pick >= 0, x[np.maximum(pick, 0)], np.nan)
    return out


def downsample(
    sid: Ints, cols: dict[str, Floats], delta_mean: npt.NDArray[np.bool_]
) -> tuple[Ints, dict[str, Floats]]:
    """The longer windows of rows sorted by series then start (DESIGN.md#downsample_math);
    ``delta_mean``: per row, whether its series' mean is weighted by delta."""
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

    first = buckets(sid, cols["start"])
    out: dict[str, Floats] = {"start": np.floor(cols["start"][first] / STEP_S) * STEP_S}
    for name in SUMS:
        out[name] = _sum(cols[name], first)
    delta, rate, length = cols["delta"], cols["rate"], cols["length_s"]
    with np.errstate(invalid="ignore", divide="ignore"):
        span = np.where(rate > 0, delta / np.where(rate > 0, rate, 1.0), length)
    span = np.where(np.isnan(delta) | np.isnan(rate), np.nan, span)
    covered = _sum(span, first)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["rate"] = np.where(covered > 0, out["delta"] / covered, np.where(
            covered == 0, 0.0, np.nan))  # fmt: skip
    weight = np.where(delta_mean, delta, length)
    out["mean"] = _weighted(cols["mean"], weight, first)
    for name in BY_DELTA:
        out[name] = _weighted(cols[name], delta, first)
    out["min"] = np.fmin.reduceat(cols["min"], first) if first.size else cols["min"][:0]
    out["max"] = np.fmax.reduceat(cols["max"], first) if first.size else cols["max"][:0]
    out["last"] = _last(cols["last"], first)
    return sid[first], out
