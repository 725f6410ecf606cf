"""store.downsample_math against a brute force: each 5-minute window summed window by window
in plain Python, on random series with gaps, unknown values and every kind."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from store.downsample_math import STEP_S, downsample

COLS = ("start", "length_s", "samples", "delta", "rate", "resets", "mean", "min", "max", "last",
        "p50", "p90", "p99", "sum_delta")  # fmt: skip


def _rows(rng: random.Random, series: int) -> list[tuple[int, bool, dict[str, float]]]:
    out = []
    for s in range(series):
        by_delta = rng.random() < 0.5
        t = 1_764_000_000.0 + 60.0 * rng.randrange(10)
        for _ in range(rng.randrange(1, 40)):
            t += 60.0 * rng.choice((1, 1, 1, 2, 7))

            def v(lo: float = 0.0, hi: float = 10.0) -> float:
                return math.nan if rng.random() < 0.15 else rng.uniform(lo, hi)

            rate = v(0.0, 2.0)
            row = {"start": t, "length_s": 60.0, "samples": float(rng.randrange(1, 5)),
                   "delta": v(), "rate": 0.0 if rng.random() < 0.1 else rate,
                   "resets": float(rng.randrange(2)), "mean": v(), "min": v(), "max": v(),
                   "last": v(), "p50": v(), "p90": v(), "p99": v(), "sum_delta": v()}  # fmt: skip
            out.append((s, by_delta, row))
    return out


def _brute(rows: list[tuple[int, bool, dict[str, float]]]) -> list[dict[str, float]]:
    groups: dict[tuple[int, int], list[tuple[bool, dict[str, float]]]] = {}
    for s, by_delta, r in rows:
        groups.setdefault((s, math.floor(r["start"] / STEP_S)), []).append((by_delta, r))
    out = []
    for (_s, _b), members in sorted(groups.items()):
        rs = [r for _, r in members]

        def total(name: str, rs: list[dict[str, float]] = rs) -> float:
            known = [r[name] for r in rs if not math.isnan(r[name])]
            return sum(known) if known else math.nan

        def wmean(name: str, weight: list[float], rs: list[dict[str, float]] = rs) -> float:
            pairs = [(r[name], w) for r, w in zip(rs, weight, strict=True)
                     if not math.isnan(r[name]) and not math.isnan(w) and w > 0]  # fmt: skip
            den = sum(w for _, w in pairs)
            return sum(x * w for x, w in pairs) / den if den > 0 else math.nan

        got = {"start": math.floor(rs[0]["start"] / STEP_S) * STEP_S}
        for name in ("length_s", "samples", "resets", "delta", "sum_delta"):
            got[name] = total(name)
        spans = []
        for r in rs:
            if math.isnan(r["delta"]) or math.isnan(r["rate"]):
                continue
            spans.append(r["delta"] / r["rate"] if r["rate"] > 0 else r["length_s"])
        covered = sum(spans) if spans else math.nan
        got["rate"] = (got["delta"] / covered if covered > 0 else 0.0 if covered == 0
                       else math.nan)  # fmt: skip
        deltas = [r["delta"] for r in rs]
        got["mean"] = wmean("mean", deltas if members[0][0] else [r["length_s"] for r in rs])
        for name in ("p50", "p90", "p99"):
            got[name] = wmean(name, deltas)
        mins = [r["min"] for r in rs if not math.isnan(r["min"])]
        maxs = [r["max"] for r in rs if not math.isnan(r["max"])]
        lasts = [r["last"] for r in rs if not math.isnan(r["last"])]
        got["min"] = min(mins) if mins else math.nan
        got["max"] = max(maxs) if maxs else math.nan
        got["last"] = lasts[-1] if lasts else math.nan
        out.append(got)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_downsample_matches_a_window_by_window_sum(seed: int) -> None:
    rows = _rows(random.Random(seed), series=6)
    sid = np.asarray([s for s, _, _ in rows], dtype=np.int64)
    cols = {c: np.asarray([r[c] for _, _, r in rows], dtype=np.float64) for c in COLS}
    by_delta = np.asarray([b for _, b, _ in rows], dtype=bool)
    out_sid, out = downsample(sid, cols, by_delta)
    want = _brute(rows)
    assert len(out_sid) == len(want)
    for i, w in enumerate(want):
        for name, value in w.items():
            got = float(out[name][i])
            assert (math.isnan(got) and math.isnan(value)) or got == pytest.approx(
                value, rel=1e-12, abs=1e-12
            ), (i, name, got, value)


def test_downsample_of_nothing_is_nothing() -> None:
    empty = {c: np.zeros(0) for c in COLS}
    out_sid, out = downsample(np.zeros(0, dtype=np.int64), empty, np.zeros(0, dtype=bool))
    assert out_sid.size == 0 and all(v.size == 0 for v in out.values())
