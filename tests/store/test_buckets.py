"""Bucket counts of the keep_buckets histograms: catalogue flag, rollup (against a brute-force
reference on real expositions), checkpoint, BLOB codec, store (both backends), schema 8 -> 9,
retention, spool, and a real direct collection."""

from __future__ import annotations

import asyncio
import json
import marshal
import math
import random
import re
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.parse import read_exposition
from collector.promsource import PrometheusSource, _buckets, signal_query
from collector.rollup import Rollup, per_bucket
from collector.run import collect_direct
from collector.run_config import DirectConfig
from collector.scrape import Target, TargetSet
from collector.spool import _decode, _encode
from core.catalog import BUCKET_SIGNALS, KV_RESIDENCY_BUCKETS, SIGNALS, SignalDef, Spelling
from core.errors import StoreError
from core.records import SignalSample, Snapshot, Window
from store.buckets import F64, U8, U16, U32, ZERO, decode_buckets, encode_buckets
from store.store import Store
from tests import services
from tests.collector.bucketexpo import (
    ENGINE,
    INF,
    L1_FAMILY,
    POOL,
    VLLM_FAMILIES,
    Hist,
    Raw,
    brute_windows,
    catalogue_bounds,
    random_walk,
    render,
)
from tests.collector.exposerver import Body, expo_server

GAP = "kv_block_reuse_gap_seconds"
B3 = (0.1, 1.0)  # a small layout: 3 buckets with +Inf
B4 = (0.1, 0.5, 1.0)  # another one


def _windows(points: list[tuple[float, str]], rollup: Rollup | None = None) -> list[Window]:
    """Real expositions read and rolled up (60 s windows), every window closed."""
    rollup = rollup or Rollup("engine-a")
    out: list[Window] = []
    for ts, text in points:
        out += rollup.add(read_exposition(text, "engine-a", ts))
    return out + rollup.flush()


def _gap(
    ts: float, bounds: tuple[float, ...], cumulative: tuple[float, ...], *, no_inf: bool = False
) -> tuple[float, str]:
    return ts, render([Hist(GAP, ENGINE, bounds, cumulative, no_inf=no_inf)])


def _by_start(windows: list[Window], signal: str = GAP) -> dict[float, Window]:
    return {w.start: w for w in windows if w.signal == signal}


# ---- the catalogue flag ---------------------------------------------------------------------


def test_catalogue_flags_the_four_residency_histograms_only() -> None:
    assert {*VLLM_FAMILIES, L1_FAMILY} == BUCKET_SIGNALS
    assert all(SIGNALS[s].kind == "histogram" for s in BUCKET_SIGNALS)
    assert {SIGNALS[s].buckets for s in VLLM_FAMILIES} == {KV_RESIDENCY_BUCKETS}


def test_keep_buckets_on_a_counter_is_refused() -> None:
    with pytest.raises(ValueError, match=r"'c'.*histograms only"):
        SignalDef("c", "counter", "x", "h", "vllm", (Spelling("f", ()),), keep_buckets=True)


# ---- the rollup -----------------------------------------------------------------------------

# (name, scrapes as (ts, finite bounds, cumulative counts[, no +Inf]), expected per window start:
# (finite bounds, counts per bucket) or () for no counts)
EDGE_CASES = [
    ("steady", [(0, B3, (1, 2, 3)), (20, B3, (2, 4, 6)), (40, B3, (2, 5, 9)), (70, B3, (3, 6, 10))],
     {0.0: (B3, (1, 2, 3)), 60.0: (B3, (1, 0, 0))}),
    ("reset_mid_window",  # 5 -> 1: a restart; its increase is the new counts
     [(0, B3, (4, 5, 5)), (20, B3, (5, 6, 7)), (40, B3, (0, 1, 1)), (50, B3, (1, 1, 2))],
     {0.0: (B3, (2, 0, 2))}),
    ("mixed_layout_mid_window", [(0, B3, (1, 1, 1)), (20, B3, (2, 2, 2)), (40, B4, (1, 1, 1, 1)),
                                 (70, B4, (1, 2, 2, 3))],
     {0.0: (), 60.0: (B4, (0, 1, 0, 1))}),
    ("layout_change_at_boundary", [(0, B3, (1, 1, 1)), (20, B3, (2, 2, 2)),
                                   (60, B4, (1, 1, 1, 1)), (80, B4, (1, 2, 3, 4))],
     {0.0: (B3, (1, 0, 0)), 60.0: (B4, (1, 1, 1, 1))}),
    ("first_sample_only", [(0, B3, (5, 5, 5))], {0.0: ()}),
    ("not_cumulative_kept_as_exposed", [(0, B3, (0, 0, 0)), (20, B3, (3, 1, 4))],
     {0.0: (B3, (3, -2, 3))}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "scrapes", "expected"), EDGE_CASES, ids=[c[0] for c in EDGE_CASES]
)
def test_rollup_bucket_counts_edge_cases(
    name: str, scrapes: list[tuple[float, tuple[float, ...], tuple[float, ...]]],
    expected: dict[float, tuple[()] | tuple[tuple[float, ...], tuple[float, ...]]],
) -> None:  # fmt: skip
    got = _by_start(_windows([_gap(float(t), b, tuple(map(float, c))) for t, b, c in scrapes]))
    assert set(got) == set(expected)
    for start, want in expected.items():
        w = got[start]
        assert (w.bucket_bounds, w.bucket_counts) == (want or ((), ())), (name, start)
        if want:  # the counts are the window's observations, bucket by bucket
            assert sum(w.bucket_counts) == w.delta
        else:
            assert w.p50 is None  # no counts exactly where there are no quantiles


def test_rollup_missing_inf_bucket_drops_that_scrape_only() -> None:
    """A scrape without its +Inf bucket is dropped by the parser (an anomaly): the window
    counts from the sample before it to the one after, as if it had not been scraped."""
    points = [_gap(0.0, B3, (1.0, 1.0, 1.0)), _gap(20.0, B3, (2.0, 2.0), no_inf=True),
              _gap(40.0, B3, (3.0, 4.0, 5.0))]  # fmt: skip
    assert read_exposition(points[1][1], "e", 20.0).anomalies[0].kind == "histogram_no_inf_bucket"
    w = _by_start(_windows(points))[0.0]
    assert (w.bucket_bounds, w.bucket_counts, w.samples) == (B3, (2.0, 1.0, 1.0), 2)


def test_rollup_sample_without_inf_bound_is_skipped_as_malformed() -> None:
    rollup = Rollup("e")
    bad = SignalSample.histogram(GAP, ENGINE, 2.0, ((0.1, 1.0), (1.0, 2.0)))
    for ts in (0.0, 20.0):
        rollup.add(Snapshot("e", ts, (bad,)))
    assert rollup.flush() == [] and rollup.skipped == {"malformed_histogram": 2}


def test_rollup_keeps_counts_of_flagged_families_only() -> None:
    """ttft is a histogram without keep_buckets: quantiles, no counts; a flagged family the
    exposition does not have has no window at all."""
    ttft = [Hist("ttft_seconds", ENGINE, B3, c) for c in ((1.0, 2.0, 3.0), (2.0, 4.0, 6.0))]
    windows = _windows([(0.0, render([ttft[0]])), (20.0, render([ttft[1]]))])
    (w,) = windows
    assert w.signal == "ttft_seconds" and w.p50 is not None and w.bucket_counts == ()
    # and a Rollup told to keep nothing keeps nothing, the flagged family included
    points = [_gap(0.0, B3, (1.0, 1.0, 1.0)), _gap(20.0, B3, (2.0, 2.0, 2.0))]
    (w,) = _windows(points, Rollup("engine-a", keep_buckets=()))
    assert w.p50 is not None and w.bucket_counts == ()


@pytest.mark.parametrize("seed", range(6))
def test_rollup_bucket_counts_equal_brute_force_on_random_scrapes(seed: int) -> None:
    """Random scrapes of all four families (irregular times, restarts, now and then another
    layout or a scrape without +Inf) parsed from their text: every window's counts equal the
    brute-force reference of the raw values."""
    rng = random.Random(seed)
    series = {(s, ENGINE): catalogue_bounds(s) for s in VLLM_FAMILIES}
    series[(L1_FAMILY, POOL)] = catalogue_bounds(L1_FAMILY)
    walks = {k: random_walk(rng, b, 60, reset_p=0.05) for k, b in series.items()}
    ts, points = 0.0, []
    raw: dict[tuple[str, tuple[tuple[str, str], ...]], list[Raw]] = {k: [] for k in series}
    for i in range(60):
        ts += rng.choice((7.0, 15.0, 15.0, 31.0, 64.0))
        hists = []
        for key, usual in series.items():
            bounds, cumulative = usual, walks[key][i]
            if rng.random() < 0.03:  # an exporter with other bounds for a while
                bounds, cumulative = usual[:-1], (*cumulative[:-2], cumulative[-1])
            no_inf = rng.random() < 0.03
            hists.append(Hist(key[0], key[1], bounds, cumulative, no_inf=no_inf))
            if not no_inf:  # the parser drops it, the reference never sees it
                raw[key].append((ts, (*bounds, INF), cumulative))
        points.append((ts, render(hists)))
    windows = _windows(points)
    mixed = 0
    for (signal, _), samples in raw.items():
        want = brute_windows(samples)
        got = _by_start(windows, signal)
        kept = {start for start, w in got.items() if w.bucket_counts}
        assert kept == {start for start, ref in want.items() if ref is not None}
        mixed += sum(ref is None for ref in want.values())
        for start, ref in want.items():
            w = got[start]
            if ref is None:
                assert w.bucket_counts == (), (signal, start)
            else:
                assert (w.bucket_bounds, w.bucket_counts) == (ref[0][:-1], ref[1]), (signal, start)
    assert mixed  # the layouts did change inside some windows


def test_per_bucket_of_cumulative_counts() -> None:
    assert per_bucket([2.0, 2.0, 5.0, 9.0]) == (2.0, 0.0, 3.0, 4.0)
    assert per_bucket([]) == ()


@pytest.mark.parametrize("codec", ["json", "marshal"])
def test_rollup_state_carries_the_bucket_accumulators(codec: str) -> None:
    """Stopped mid-window, state exported (as the store's hand-off: JSON; the checkpoint:
    marshal) and restored: exactly the windows of a rollup that never stopped."""
    rng = random.Random(7)
    walk = random_walk(rng, KV_RESIDENCY_BUCKETS, 24, reset_p=0.1)
    points = [_gap(10.0 * i + 3.0, KV_RESIDENCY_BUCKETS, c) for i, c in enumerate(walk)]
    whole = _windows(points)
    assert any(w.bucket_counts for w in whole)
    before = Rollup("engine-a")
    first = [w for ts, text in points[:14] for w in before.add(read_exposition(text, "e", ts))]
    state = before.export_state()
    state = (
        json.loads(json.dumps(state)) if codec == "json" else marshal.loads(marshal.dumps(state))
    )
    after = Rollup("engine-a")
    after.restore_state(state)
    assert first + _windows(points[14:], after) == whole


# ---- the BLOB -------------------------------------------------------------------------------

_bounds = st.lists(st.floats(allow_nan=False, allow_infinity=False), unique=True, max_size=40)
_count = st.one_of(st.integers(0, 2**40).map(float), st.floats(-1e12, 1e12))


@settings(max_examples=300, deadline=None)
@given(bounds=_bounds, data=st.data())
def test_blob_round_trips_any_finite_layout_and_counts_exactly(
    bounds: list[float], data: st.DataObject
) -> None:
    ordered = tuple(sorted(bounds))
    counts = tuple(data.draw(st.lists(_count, min_size=len(ordered) + 1,
                                      max_size=len(ordered) + 1)))  # fmt: skip
    assert decode_buckets(encode_buckets(ordered, counts)) == (ordered, counts)


@pytest.mark.parametrize(
    ("top", "kind", "size"),
    [(0.0, ZERO, 45), (255.0, U8, 67), (256.0, U16, 89), (65_536.0, U32, 133),
     (2.0**32, F64, 221), (0.5, F64, 221), (-1.0, F64, 221)],
)  # fmt: skip
def test_blob_counts_take_the_smallest_type_that_holds_them(
    top: float, kind: int, size: int
) -> None:
    counts = (0.0,) * 21 + (top,)
    blob = encode_buckets(KV_RESIDENCY_BUCKETS, counts)
    assert (blob[1], len(blob)) == (kind, size)  # 3 + 42 bytes of layout + 22 counts
    assert decode_buckets(blob) == (KV_RESIDENCY_BUCKETS, counts)


_GOOD = encode_buckets(B3, (1.0, 2.0, 3.0))


@pytest.mark.parametrize(
    ("bounds", "counts", "says"),
    [(B3, (1.0, 2.0), "2 counts for 2 finite bounds"),
     ((1.0, 0.5), (1.0, 1.0, 1.0), "finite and increasing"),
     ((0.5, 0.5), (1.0, 1.0, 1.0), "finite and increasing"),
     ((0.5, INF), (1.0, 1.0, 1.0), "finite and increasing"),
     (B3, (1.0, math.nan, 1.0), "counts must be finite")],
)  # fmt: skip
def test_blob_encode_refuses_what_no_window_can_be(
    bounds: tuple[float, ...], counts: tuple[float, ...], says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        encode_buckets(bounds, counts)


@pytest.mark.parametrize(
    ("blob", "says"),
    [(b"", "not a format-1"), (b"\x02" + _GOOD[1:], "not a format-1"),
     (_GOOD[:1] + b"\x09" + _GOOD[2:], "unknown counts type"),
     (_GOOD[:2] + b"\x7f" + _GOOD[3:], "past the end"),
     (_GOOD[:-1], "bytes of counts"), (_GOOD + b"\x00", "bytes of counts"),
     (bytes((1, U8, 0x80)), "varint runs past")],
)  # fmt: skip
def test_blob_decode_refuses_what_encode_never_wrote(blob: bytes, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        decode_buckets(blob)


# ---- the store ------------------------------------------------------------------------------

T0 = 1_764_000_000.0 - 1_764_000_000.0 % 86_400  # a UTC midnight


def _bw(start: float, counts: tuple[float, ...], *, source: str = "e1", samples: int = 4,
        bounds: tuple[float, ...] = KV_RESIDENCY_BUCKETS, signal: str = GAP) -> Window:  # fmt: skip
    return Window(source, signal, ENGINE, start, 60.0, "histogram", samples, delta=sum(counts),
                  p50=0.5, bucket_bounds=bounds, bucket_counts=counts)  # fmt: skip


def _mixed(start: float = T0) -> list[Window]:
    """Windows with counts of every type, and ones without (another histogram, a gauge)."""
    tops = (0.0, 3.0, 300.0, 70_000.0, 2.0**33, 0.25, -2.0)
    out = [_bw(start + 60.0 * i, (*(1.0,) * 21, top)) for i, top in enumerate(tops)]
    out.append(_bw(start, (1.0, 2.0), bounds=(0.1,), signal=L1_FAMILY, source="lmc"))
    out.append(
        Window("e1", "ttft_seconds", ENGINE, start, 60.0, "histogram", 4, delta=3.0, p50=0.1)
    )
    out.append(Window("e1", "kv_cache_usage_ratio", ENGINE, start, 60.0, "gauge", 4, mean=0.5))
    return out


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    with Store(db_url) as s:
        s.migrate()
        yield s


def test_store_round_trips_bucket_counts_and_reads_them_alone(store: Store) -> None:
    windows = _mixed()
    store.write_windows(windows)
    key = lambda w: (w.source, w.signal, w.start, w.labels)  # noqa: E731
    assert store.read_windows() == sorted(windows, key=key)
    kept = sorted((w for w in windows if w.bucket_counts), key=key)
    assert store.read_buckets() == kept
    assert store.read_buckets(signals=[L1_FAMILY]) == [w for w in kept if w.signal == L1_FAMILY]
    assert store.read_buckets(sources=["e1"], since=T0 + 60.0, until=T0 + 180.0) == kept[1:3]
    assert store.read_buckets(signals=["ttft_seconds"]) == []


def test_store_write_again_replaces_counts_and_keep_fuller_keeps_the_fuller(store: Store) -> None:
    full = _bw(T0, (*(2.0,) * 21, 9.0), samples=4)
    store.write_windows([full])
    partial = _bw(T0, (*(1.0,) * 21, 0.0), samples=2)
    store.write_windows([partial], keep_fuller=True)  # a restart's partial window
    assert store.read_buckets() == [full]
    store.write_windows([partial])  # the same window written again replaces it
    assert store.read_buckets() == [partial]
    store.write_windows([replace(partial, bucket_bounds=(), bucket_counts=())])
    assert store.read_buckets() == [] and store.read_windows()[0].p50 == 0.5


def test_store_refuses_counts_that_do_not_match_their_bounds(store: Store) -> None:
    bad = _bw(T0, (1.0, 2.0), bounds=(0.1, 0.2))
    with pytest.raises(
        StoreError, match=r"window e1 kv_block_reuse_gap_seconds at .*2 counts for 2"
    ):
        store.write_windows([bad])


def _drop_buckets_column(db_url: str) -> None:
    """The store as schema 8 left it: windows without the buckets column, version 8."""
    engine = sqlalchemy.create_engine(db_url)
    with engine.begin() as conn:
        if engine.dialect.name == "sqlite":
            assert sqlite3.sqlite_version_info >= (3, 35)  # DROP COLUMN
        conn.execute(sqlalchemy.text("ALTER TABLE windows DROP COLUMN buckets"))
        conn.execute(sqlalchemy.text("UPDATE schema_version SET version = 8"))
    engine.dispose()


@pytest.mark.parametrize("whole_partitions", [False, True])
def test_retention_deletes_the_counts_with_their_windows(
    store: Store, whole_partitions: bool
) -> None:
    days = [T0 + 86_400.0 * d for d in range(4)]
    store.write_windows([_bw(day + 60.0 * m, (*(1.0,) * 21, m)) for day in days for m in range(3)])
    done = store.prune(days[2] + 120.0, whole_partitions=whole_partitions)
    kept = {w.start for w in store.read_buckets()}
    if whole_partitions and store.dialect == "postgresql":  # the cutoff's day stays whole
        assert kept == {day + 60.0 * m for day in days[2:] for m in range(3)}
    else:
        assert kept == {days[2] + 120.0} | {days[3] + 60.0 * m for m in range(3)}
    assert done.windows == 12 - len(kept)
    assert {w.start for w in store.read_windows()} == kept


# ---- the spool ------------------------------------------------------------------------------


def test_spool_keeps_bucket_counts_and_reads_a_segment_of_an_earlier_kvscope() -> None:
    windows = _mixed()
    assert _decode(_encode("sqlite:///k.db", windows, []))[1] == windows
    plain = [w for w in windows if not w.bucket_counts]
    data = _encode("sqlite:///k.db", plain, [])
    assert b"bucket" not in data and b"[], []" not in data  # lines without the bucket fields
    assert _decode(data)[1] == plain


# ---- a real direct collection ---------------------------------------------------------------


def _steps(signal: str, labels: tuple[tuple[str, str], ...]) -> Body:
    """Scrape ``n`` of one family: bucket i has gained (i + 1) × n observations, so bucket i
    of any window is (i + 1) × the scrape pairs it covers (bucket 0's count)."""
    bounds = catalogue_bounds(signal)

    def body(n: int) -> bytes:
        cumulative = tuple(float(n * sum(range(1, i + 2))) for i in range(len(bounds) + 1))
        return render([Hist(signal, labels, bounds, cumulative, total=0.5 * n)]).encode()

    return body


def test_collect_direct_writes_bucket_counts_of_real_scrapes(tmp_path: Path) -> None:
    with Store(f"sqlite:///{tmp_path / 'k.db'}") as store, expo_server() as srv:
        store.migrate()
        engine = Target("e1", srv.add("/e1", _steps(GAP, ENGINE)), "vllm")
        server = Target("lmc", srv.add("/l", _steps(L1_FAMILY, POOL)), "lmcache")
        asyncio.run(
            collect_direct(
                TargetSet("c", (engine, server)),
                store,
                DirectConfig(
                    interval_s=0.2,
                    window_s=1.0,
                    timeout_s=5.0,
                    concurrency=4,
                    max_body_bytes=1 << 20,
                    max_ticks=12,
                ),
            )
        )
        got = store.read_buckets()
        assert [w for w in store.read_windows() if w.bucket_counts] == got
    assert {(w.source, w.signal) for w in got} == {("e1", GAP), ("lmc", L1_FAMILY)}
    assert len(got) >= 2
    for w in got:
        pairs = w.bucket_counts[0]
        assert pairs >= 1 and w.delta == sum(w.bucket_counts)
        assert w.bucket_counts == tuple(pairs * (i + 1) for i in range(len(w.bucket_counts)))
        assert w.bucket_bounds == catalogue_bounds(w.signal)


# ---- Prometheus mode ------------------------------------------------------------------------

PROM_CONFIG = """
global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: vllm
    metrics_path: /e1
    static_configs:
      - targets: ['{hostport}']
  - job_name: lmcache
    metrics_path: /l
    static_configs:
      - targets: ['{hostport}']
"""


def test_prometheus_query_asks_for_bucket_increases_of_flagged_histograms_only() -> None:
    def stats(signal: str) -> list[str]:
        return re.findall(r'"kvscope_stat", "([a-z0-9_]+)"', signal_query(signal, 60))

    assert "bucket" in stats(GAP) and "bucket" in stats(L1_FAMILY)
    assert "bucket" not in stats("ttft_seconds")
    assert len(stats(GAP)) == len(stats("ttft_seconds")) + 1


@pytest.mark.parametrize(
    ("cell", "want"),
    [({"le=0.1": 2.0, "le=inf": 5.0, "le=1.0": 4.0, "delta": 5.0}, ((0.1, 1.0), (2.0, 2.0, 1.0))),
     ({"le=0.1": 2.0, "le=1.0": 4.0}, ((), ())),  # no +Inf bucket: no counts
     ({"delta": 3.0}, ((), ()))],
)  # fmt: skip
def test_prometheus_cell_buckets_need_the_inf_bucket(
    cell: dict[str, float], want: tuple[tuple[float, ...], tuple[float, ...]]
) -> None:
    assert _buckets(cell) == want


@pytest.mark.prometheus
def test_prometheus_mode_reads_bucket_increases_per_le(tmp_path: Path) -> None:
    """A real Prometheus scrapes the two families every second; its windows carry bucket
    counts in the catalogue's layout, proportional to what the exporter added (each bucket's
    increase extrapolated by the same factor), summing to the count's increase; the store
    keeps them."""
    with expo_server() as srv:
        srv.add("/e1", _steps(GAP, ENGINE))
        srv.add("/l", _steps(L1_FAMILY, POOL))
        hostport = srv.base.removeprefix("http://")
        with services.prometheus(PROM_CONFIG.replace("{hostport}", hostport)) as url:
            t0 = time.time()
            while min(srv.route(p).hits for p in ("/e1", "/l")) < 7 and time.time() < t0 + 20:
                time.sleep(0.1)
            time.sleep(0.3)  # the last scrape ingested
            with PrometheusSource(url, source_from="job/instance") as prom:
                got = prom.windows(t0 - 10, time.time(), 2, signals=[GAP, L1_FAMILY])
    kept = [w for w in got if w.bucket_counts]
    jobs = {(w.source.split("/")[0], w.signal) for w in kept}
    assert jobs == {("vllm", GAP), ("lmcache", L1_FAMILY)}
    for w in kept:
        assert w.bucket_bounds == catalogue_bounds(w.signal)
        first = w.bucket_counts[0]
        assert first > 0
        assert w.bucket_counts == pytest.approx(
            [first * (i + 1) for i in range(len(w.bucket_counts))], rel=1e-9
        )
        assert sum(w.bucket_counts) == pytest.approx(w.delta, rel=1e-9)
    with Store(f"sqlite:///{tmp_path / 'k.db'}") as store:
        store.migrate()
        store.write_windows(got)
        assert store.read_buckets() == sorted(kept, key=lambda w: (w.source, w.signal, w.start))
