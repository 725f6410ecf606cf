"""planner.frames.residency: bucket counts summed per engine / LMCache pool, against a brute-force
sum of the raw scraped bucket values (real expositions read, rolled up and stored, both
backends), layouts, selectors, bad input."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from itertools import pairwise

import pytest

from collector.parse import read_exposition
from collector.rollup import Rollup
from core.errors import ConfigError
from core.records import BucketSum, Labels, Window
from planner.frames.residency import (
    RESIDENCY_SIGNALS,
    BucketCounts,
    combine,
    key_of,
    residency_histograms,
)
from store.store import Store
from tests.collector.bucketexpo import (
    L1_FAMILY,
    VLLM_FAMILIES,
    Hist,
    catalogue_bounds,
    random_walk,
    render,
)

T0 = 1_764_000_000.0 - 1_764_000_000.0 % 3_600  # a whole hour
GAP = "kv_block_reuse_gap_seconds"


def _engine(engine: str) -> Labels:
    return (("engine", engine), ("model_name", "m"))


# source -> the series it exposes: (signal, labels); the LMCache server "lmc" two L1 tags
SERIES: dict[str, list[tuple[str, Labels]]] = {
    "e1": [(s, _engine(e)) for s in VLLM_FAMILIES for e in ("0", "1")],
    "e2": [(GAP, _engine("0"))],
    "lmc": [(L1_FAMILY, (("l1_tag", "_default"),)), (L1_FAMILY, (("l1_tag", "hot"),))],
}
KEYS = {"e1": ("e1/0", "e1/1"), "e2": ("e2/0",), "lmc": ("lmc",)}

# one series' scrapes: (timestamp, cumulative counts with the +Inf one last)
Scrapes = list[tuple[float, tuple[float, ...]]]


def _scrape(seed: int, steps: int = 90) -> dict[tuple[str, str, Labels], Scrapes]:
    """Random cumulative counts of every series, with restarts, at irregular times."""
    rng = random.Random(seed)
    out: dict[tuple[str, str, Labels], Scrapes] = {}
    for source, series in SERIES.items():
        times = [T0 + 5.0]
        for _ in range(steps - 1):
            times.append(times[-1] + rng.choice((10.0, 15.0, 15.0, 40.0, 90.0)))
        for signal, labels in series:
            walk = random_walk(rng, catalogue_bounds(signal), steps, reset_p=0.04)
            out[(source, signal, labels)] = list(zip(times, walk, strict=True))
    return out


def _collect(store: Store, scraped: dict[tuple[str, str, Labels], Scrapes]) -> None:
    """Each source's scrapes rendered as its exposition, read, rolled up, written."""
    for source in SERIES:
        mine = {k: v for k, v in scraped.items() if k[0] == source}
        times = [t for t, _ in next(iter(mine.values()))]
        rollup = Rollup(source)
        windows: list[Window] = []
        for i, ts in enumerate(times):
            hists = [Hist(signal, labels, catalogue_bounds(signal), scrapes[i][1])
                     for (_, signal, labels), scrapes in mine.items()]  # fmt: skip
            windows += rollup.add(read_exposition(render(hists), source, ts))
        store.write_windows(windows + rollup.flush())


def _brute(
    scraped: dict[tuple[str, str, Labels], Scrapes], since: float, until: float
) -> dict[str, dict[str, tuple[float, ...]]]:
    """key -> signal -> per-bucket observations of every pair of consecutive scrapes whose
    later one falls in [since, until): the increase of each bucket, or the later scrape's own
    counts after a restart (a count that fell)."""
    out: dict[str, dict[str, list[float]]] = {}
    for (source, signal, labels), scrapes in scraped.items():
        engine = dict(labels).get("engine")
        key = f"{source}/{engine}" if engine else source
        for (_, c0), (t1, c1) in pairwise(scrapes):
            if not since <= t1 < until:
                continue
            per0 = [c0[0]] + [b - a for a, b in pairwise(c0)]
            per1 = [c1[0]] + [b - a for a, b in pairwise(c1)]
            restart = any(y < x for x, y in zip(c0, c1, strict=True))
            gained = per1 if restart else [y - x for x, y in zip(per0, per1, strict=True)]
            acc = out.setdefault(key, {}).setdefault(signal, [0.0] * len(gained))
            acc[:] = [a + g for a, g in zip(acc, gained, strict=True)]
    return {k: {s: tuple(v) for s, v in by.items()} for k, by in out.items()}


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    with Store(db_url) as s:
        s.migrate()
        yield s


@pytest.mark.parametrize("seed", [0, 1])
def test_sums_equal_brute_force_of_raw_scraped_buckets(store: Store, seed: int) -> None:
    scraped = _scrape(seed)
    _collect(store, scraped)
    end = max(t for s in scraped.values() for t, _ in s) + 60.0
    for since, until in ((T0, end), (T0 + 1_200.0, T0 + 3_000.0)):  # whole windows
        got = residency_histograms(store, since=since, until=until)
        want = _brute(scraped, since, until)
        assert set(got) == set(want) == {k for ks in KEYS.values() for k in ks}
        for key, by in want.items():
            assert set(got[key]) == set(by)
            for signal, counts in by.items():
                h = got[key][signal]
                assert (h.bounds, h.counts, h.dropped) == (catalogue_bounds(signal), counts, 0)
                assert h.total() == sum(counts) and h.windows > 0


def test_selectors_are_the_plans_cluster_sources_and_signals(store: Store) -> None:
    _collect(store, _scrape(3, steps=30))
    store.upsert_target("e2", "http://e2/metrics", kind="vllm", cluster="west")
    store.upsert_target("lmc", "http://lmc/metrics", kind="lmcache", cluster="west")
    assert set(residency_histograms(store, cluster="west")) == {"e2/0", "lmc"}
    assert set(residency_histograms(store, sources=["e1"])) == {"e1/0", "e1/1"}
    only = residency_histograms(store, signals=[L1_FAMILY])
    assert set(only) == {"lmc"} and set(only["lmc"]) == {L1_FAMILY}
    assert residency_histograms(store, cluster="nowhere") == {}
    # a flagged family no window has is absent, never an error
    assert set(residency_histograms(store, sources=["e2"])["e2/0"]) == {GAP}


def test_signal_whose_buckets_are_never_kept_is_a_config_error(store: Store) -> None:
    with pytest.raises(ConfigError, match="no bucket counts are kept for ttft_seconds"):
        residency_histograms(store, signals=["ttft_seconds", GAP])
    assert set(RESIDENCY_SIGNALS) == {*VLLM_FAMILIES, L1_FAMILY}


def _w(start: float, bounds: tuple[float, ...], counts: tuple[float, ...],
       labels: Labels = (("engine", "0"),), source: str = "e1") -> Window:  # fmt: skip
    return Window(source, GAP, labels, start, 60.0, "histogram", 4, delta=sum(counts),
                  bucket_bounds=bounds, bucket_counts=counts)  # fmt: skip


def test_only_the_latest_layout_is_summed_and_the_others_counted(store: Store) -> None:
    old, new = (0.1, 1.0), (0.1, 0.5, 1.0)
    windows = [
        _w(T0, old, (1.0, 2.0, 3.0)),
        _w(T0 + 60.0, old, (1.0, 1.0, 1.0)),
        Window("e1", GAP, (("engine", "0"),), T0 + 120.0, 60.0, "histogram", 4, delta=9.0),
        _w(T0 + 180.0, new, (1.0, 0.0, 2.0, 5.0)),
        _w(T0 + 240.0, new, (0.0, 1.0, 0.0, 1.0)),
        _w(T0, old, (4.0, 0.0, 0.0), labels=(("engine", "1"),)),  # another engine: its own
    ]
    store.write_windows(windows)
    got = residency_histograms(store)
    # the window whose layout changed inside it has no counts: neither summed nor dropped
    assert got["e1/0"][GAP] == BucketCounts(new, (1.0, 1.0, 2.0, 6.0), windows=2, dropped=2)
    assert got["e1/1"][GAP] == BucketCounts(old, (4.0, 0.0, 0.0), windows=1, dropped=0)
    # back to the old layout at the end: the old one is the latest, with all its windows
    store.write_windows([_w(T0 + 300.0, old, (0.0, 0.0, 1.0))])
    back = residency_histograms(store, sources=["e1"])["e1/0"][GAP]
    assert back == BucketCounts(old, (2.0, 3.0, 5.0), windows=3, dropped=2)
    since = residency_histograms(store, since=T0 + 150.0)["e1/0"][GAP]
    assert since == BucketCounts(old, (0.0, 0.0, 1.0), windows=1, dropped=2)


def test_store_sums_per_series_and_layout_equal_the_windows_summed(store: Store) -> None:
    """Store.sum_buckets against a loop over read_buckets' Window records, counts of every
    BLOB type (zero, 8/16/32-bit, float64) mixed in one series."""
    rng = random.Random(5)
    bounds = catalogue_bounds(GAP)
    windows = []
    for i in range(300):
        top = rng.choice((0.0, 3.0, 300.0, 70_000.0, 2.0**33, 0.375))
        counts = tuple(rng.choice((0.0, 1.0, top)) for _ in range(len(bounds) + 1))
        windows.append(_w(T0 + 60.0 * i, bounds, counts, labels=(("engine", str(i % 3)),)))
    store.write_windows(windows)
    loop: dict[tuple[str, Labels], list[float]] = {}
    for w in store.read_buckets():
        acc = loop.setdefault((w.source, w.labels), [0.0] * len(w.bucket_counts))
        acc[:] = [a + c for a, c in zip(acc, w.bucket_counts, strict=True)]
    sums = store.sum_buckets()
    assert {(b.source, b.labels): list(b.counts) for b in sums} == loop
    assert [(b.windows, b.first, b.last) for b in sums] == [
        (100, T0 + 60.0 * e, T0 + 60.0 * (297 + e)) for e in range(3)
    ]


def test_pool_key_sums_the_servers_tags_and_engine_key_follows_engine_keys() -> None:
    tags = [BucketSum("lmc", L1_FAMILY, (("l1_tag", t),), (1.0,), (1.0, 2.0), 1, 0.0, 0.0)
            for t in ("_default", "hot")]  # fmt: skip
    assert combine(tags) == {
        "lmc": {L1_FAMILY: BucketCounts((1.0,), (2.0, 4.0), windows=2, dropped=0)}
    }
    assert key_of("e1", (("engine", ""),)) == "e1"
    assert key_of("e1", ()) == "e1"
    assert key_of("e1", (("engine", "3"), ("model_name", "m"))) == "e1/3"


@pytest.mark.parametrize(
    ("bounds", "counts"), [((0.1,), (1.0,)), ((0.1,), (1.0, 2.0, 3.0)), ((), ())]
)
def test_bucket_counts_need_one_count_more_than_bounds(
    bounds: tuple[float, ...], counts: tuple[float, ...]
) -> None:
    with pytest.raises(ValueError, match=f"{len(counts)} counts for {len(bounds)} finite"):
        BucketCounts(bounds, counts)
    assert BucketCounts((0.5,), (1.0, 2.5)).total() == 3.5
    assert math.isclose(BucketCounts((), (7.0,)).total(), 7.0)
