"""The 5-minute tier on real SQLite and PostgreSQL stores: old days moved and read back, the
sums and bucket counts kept exactly, late writes, retention, and the CLI."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from core.errors import ConfigError
from core.records import Window
from kvscope.cli import app
from store.store import Store

DAY = 86_400.0
D0 = 20_420 * DAY  # 2025-11-28T00:00:00Z


def _day(day: float, minutes: int = 1440) -> list[Window]:
    out = []
    for m in range(minutes):
        t = day + 60.0 * m
        x = (m % 13) / 13
        out.append(Window("e1", "kv_cache_usage_ratio", (("engine", "0"),), t, 60.0, "gauge", 4,
                          mean=x, min=x / 2, max=x, last=x))  # fmt: skip
        d = float(m % 3)
        out.append(Window("e1", "preemptions_total", (("engine", "0"),), t, 60.0, "counter", 4,
                          delta=d, rate=d / 60, resets=0, last=float(m)))  # fmt: skip
        out.append(Window("e1", "kv_block_lifetime_seconds", (), t, 60.0, "histogram", 4,
                          delta=3.0, rate=0.05, mean=2.0, sum_delta=6.0, p50=1.0 + m % 2,
                          bucket_bounds=(1.0, 10.0), bucket_counts=(1.0, 2.0, 0.0)))  # fmt: skip
    return out


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    with Store(db_url) as s:
        s.migrate()
        yield s


def test_old_days_move_to_five_minute_windows_with_their_sums_kept(store: Store) -> None:
    rows = _day(D0) + _day(D0 + DAY, minutes=120)
    store.write_windows(rows)

    def sums() -> list[tuple[object, ...]]:  # BucketSum's but for how many windows
        return [(b.source, b.signal, b.labels, b.bounds, b.counts, b.first, b.last)
                for b in store.sum_buckets()]  # fmt: skip

    buckets_before = sums()
    done = store.downsample(D0 + DAY + 3600.0)  # only whole days: day 0
    assert (done.before, done.days, done.windows_in, done.windows_out) == (
        D0 + DAY, 1, 3 * 1440 - 0, 3 * 288)  # fmt: skip
    got = store.read_windows(since=D0, until=D0 + DAY)
    assert len(got) == 3 * 288 and {w.length_s for w in got} == {300.0}
    first = [w for w in got if w.signal == "preemptions_total"]
    assert sum(w.delta or 0.0 for w in first) == sum(
        w.delta or 0.0 for w in rows if w.signal == "preemptions_total" and w.start < D0 + DAY
    )
    assert (first[0].start, first[0].samples, first[0].delta, first[0].last) == (D0, 20, 4.0, 4.0)
    gauge = next(w for w in got if w.signal == "kv_cache_usage_ratio")
    assert gauge.mean == pytest.approx(sum(m % 13 / 13 for m in range(5)) / 5)
    assert (gauge.min, gauge.max, gauge.last) == (0.0, 4 / 13, 4 / 13)
    hist = next(w for w in got if w.signal == "kv_block_lifetime_seconds")
    assert (hist.delta, hist.sum_delta, hist.mean) == (15.0, 30.0, 2.0)
    assert hist.p50 == pytest.approx((1 + 2 + 1 + 2 + 1) / 5)  # delta-weighted: an approximation
    assert hist.bucket_counts == (5.0, 10.0, 0.0)
    assert sums() == buckets_before  # bucket counts summed exactly
    later = store.read_windows(since=D0 + DAY)
    assert len(later) == 3 * 120 and {w.length_s for w in later} == {60.0}
    assert store.stats()["windows"] == 3 * 288 + 3 * 120
    assert store.downsample(D0 + DAY + 3600.0).windows_in == 0  # nothing left to move


def test_a_late_write_into_a_downsampled_day_replaces_its_five_minutes(store: Store) -> None:
    store.write_windows(_day(D0) + _day(D0 + DAY, minutes=90))
    store.downsample(D0 + DAY)
    late = Window("e1", "kv_cache_usage_ratio", (("engine", "0"),), D0 + 600.0, 60.0, "gauge",
                  9, mean=0.5, min=0.5, max=0.5, last=0.5)  # fmt: skip
    store.write_windows([late])
    assert len(store.read_windows(signals=["kv_cache_usage_ratio"], since=D0, until=D0 + DAY)) == (
        288 + 1
    )  # the late minute beside its 5-minute tier until the next run
    store.downsample(D0 + DAY)
    got = store.read_windows(signals=["kv_cache_usage_ratio"], since=D0, until=D0 + DAY)
    assert len(got) == 288
    bucket = next(w for w in got if w.start == D0 + 600.0)
    assert (bucket.mean, bucket.samples, bucket.length_s) == (0.5, 9, 60.0)


def test_retention_prunes_the_five_minute_tier_exactly(store: Store) -> None:
    store.write_windows(_day(D0) + _day(D0 + DAY, minutes=90))
    store.downsample(D0 + DAY)
    cutoff = D0 + 6 * 3600.0 + 60.0  # 06:01: the 06:00 window started before it
    pruned = store.prune(cutoff)
    assert pruned.windows == 3 * (6 * 12 + 1)
    left = store.read_windows(until=D0 + DAY)
    assert min(w.start for w in left) == D0 + 6 * 3600.0 + 300.0
    assert len(left) == 3 * (288 - 6 * 12 - 1)


def test_read_frame_spans_both_tiers_in_order(store: Store) -> None:
    store.write_windows(_day(D0) + _day(D0 + DAY, minutes=30))
    store.downsample(D0 + DAY)
    frame = store.read_frame(signals=["kv_cache_usage_ratio"], columns=["start", "length_s"])
    assert list(frame["start"]) == sorted(frame["start"])
    assert len(frame) == 288 + 30
    assert frame["length_s"].tolist() == [300.0] * 288 + [60.0] * 30


def test_downsample_bad_arguments_refused(store: Store) -> None:
    with pytest.raises(ConfigError, match="finite time"):
        store.downsample(math.nan)
    with pytest.raises(ConfigError, match=">= 1"):
        store.downsample(D0, batch=0)


def test_db_seal_and_downsample_cli(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    with Store(url) as s:
        s.migrate()
        s.write_windows(_day(D0, minutes=180))
    runner = CliRunner()
    sealed = runner.invoke(app, ["db", "seal", "--db", url])
    assert sealed.exit_code == 0, sealed.output
    assert json.loads(sealed.stdout)["windows_sealed"] == 0  # the writes sealed their hours
    moved = runner.invoke(app, ["db", "downsample", "--older-than", "1h", "--db", url])
    assert moved.exit_code == 0, moved.output
    out = json.loads(moved.stdout)
    assert (out["days"], out["windows_in"], out["windows_out"]) == (1, 3 * 180, 3 * 36)
    bad = runner.invoke(app, ["db", "downsample", "--older-than", "soon", "--db", url])
    assert bad.exit_code != 0
