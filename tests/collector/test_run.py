"""collector.run: the collect loop against real HTTP targets and a real SQLite store."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import Counter
from collections.abc import Coroutine, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from collector.promsource import PrometheusSource
from collector.run import CollectStats, collect_direct, engine_facts, next_tick
from collector.run_config import DirectConfig, PrometheusConfig
from collector.run_prometheus import collect_prometheus
from collector.scrape import EngineMeta, Target, TargetSet
from core.errors import ScrapeError
from core.records import ScrapeOutcome, Snapshot, Window
from store.store import Store
from tests.collector.conftest import LiveProm
from tests.collector.exposerver import ExpoServer, bumping, expo_server
from tests.services import free_port

METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
STEP = 5.0
FIXTURES = {
    "v033": "vllm-0.33.0-metrics-default.txt",
    "v011": "vllm-0.11.0-metrics-default.txt",
    "full": "vllm-0.33.0-metrics-full.txt",
}
BAD = {"slow": "timeout", "err500": "http_status", "big": "too_large", "garbled": "parse"}
GPU = EngineMeta(model="llama-3.1-8b", gpu="h100-80gb", tensor_parallel=1, offload="none")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(f"sqlite:///{tmp_path / 'kvscope.db'}") as s:
        s.migrate()
        yield s


def _cluster(srv: ExpoServer) -> TargetSet:
    targets = [
        Target(
            name=name,
            url=srv.add(
                f"/{name}", bumping((METRICS / f).read_text(), "preemptions_total", 0, STEP)
            ),
            kind="vllm",
            engine=GPU if name == "v033" else None,
        )
        for name, f in FIXTURES.items()
    ]
    targets += [
        Target("slow", srv.add("/slow", b"x 1\n", delay_s=2.0), "vllm"),
        Target("err500", srv.add("/500", b"no\n", status=500), "vllm"),
        Target("big", srv.add("/big", b"y 1\n" * 100_000, chunks=50), "vllm"),
        Target("garbled", srv.add("/garbled", b'vllm_x{engine="0" 1\n'), "vllm"),
    ]
    return TargetSet(cluster="test-cluster", targets=tuple(targets))


T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_collect_direct_good_targets_collected_despite_bad_ones(store: Store) -> None:
    with expo_server() as srv:
        cluster = _cluster(srv)
        stats: CollectStats = _run(
            collect_direct(
                cluster,
                store,
                DirectConfig(
                    interval_s=0.2,
                    window_s=1.0,
                    timeout_s=5.0,  # clamped to 90 % of the interval
                    concurrency=8,
                    max_body_bytes=256 * 1024,
                    max_ticks=12,
                ),
            )
        )
        hits = {name: srv.route(f"/{name}").hits for name in FIXTURES}

    # The per-target timeout is 0.18 s (90 % of the interval): on a loaded machine a scrape
    # can miss it now and then. Such a miss must show as "timeout", never as anything else.
    n = len(cluster)
    assert stats.ticks == 12 and stats.scrapes == 12 * n
    assert stats.targets_up + stats.targets_down == n
    assert stats.windows_written > 0 and stats.outcomes_written == 12 * n

    outcomes = store.outcomes()
    by_target: dict[str, list[ScrapeOutcome]] = {}
    for o in outcomes:
        by_target.setdefault(o.target, []).append(o)
    assert {t: len(v) for t, v in by_target.items()} == {t.name: 12 for t in cluster}
    for name, kind in BAD.items():
        kinds = Counter(o.error_kind for o in by_target[name])
        assert kinds[kind] >= 9 and set(kinds) <= {kind, "timeout"}, (name, kinds)
        assert not any(o.up for o in by_target[name])
    up = {name: sum(o.up for o in by_target[name]) for name in FIXTURES}
    for name in FIXTURES:
        assert up[name] >= 10, (name, Counter(o.error_kind for o in by_target[name]))
        assert all(o.series > 0 for o in by_target[name] if o.up)
        # every answered scrape reached the server; a timed-out one may not have got there
        assert up[name] <= hits[name] <= 12, (name, hits[name])
    assert sum(stats.failures.values()) == 12 * n - sum(up.values())
    # Ticks never overlap: each target's scrapes start in distinct, increasing intervals.
    for name in FIXTURES:
        ticks = [math.floor(o.started / 0.2) for o in by_target[name]]
        assert ticks == sorted(set(ticks))

    windows = store.read_windows()
    assert {w.source for w in windows} == set(FIXTURES)  # nothing from the failed targets
    for name in FIXTURES:
        series: dict[object, list[Window]] = {}
        for w in windows:
            if w.source == name and w.signal == "preemptions_total":
                series.setdefault(w.labels, []).append(w)
        assert len(series) == (2 if name == "full" else 1)  # one per data-parallel engine
        for pre in series.values():
            pre.sort(key=lambda w: w.start)
            assert len(pre) >= 2
            assert sum(w.samples for w in pre) == up[name]
            assert all(w.start % 1.0 == 0 and w.length_s == 1.0 and w.resets == 0 for w in pre)
            # +STEP per hit; a series' first window lacks the step into its first sample.
            first = pre[0]
            if up[name] == 12:  # every scrape landed: exact
                assert first.delta == (STEP * (first.samples - 1) if first.samples > 1 else None)
                assert all(w.delta == STEP * w.samples for w in pre[1:])
                assert pre[-1].last == STEP * 11
            else:  # a missed scrape's step shows up in the next sample's delta
                assert all(w.delta is not None and w.delta >= STEP * w.samples for w in pre[1:])
                assert all(w.delta is None or w.delta % STEP == 0 for w in pre)
        kv = [w for w in windows if w.source == name and w.signal == "kv_cache_usage_ratio"]
        assert kv and all(w.kind == "gauge" and w.mean is not None for w in kv)

    engines = {e.source: e for e in store.engines(cluster="test-cluster")}
    assert set(engines) == set(FIXTURES)
    assert engines["v033"].gpu == "h100-80gb" and engines["v033"].model == "llama-3.1-8b"
    assert engines["v033"].facts["num_gpu_blocks"] == 1024
    assert engines["v033"].facts["block_size"] == 16
    assert engines["v011"].model == "tiny-llama"  # from the samples' model_name label
    assert engines["full"].facts["dp_engines"] == 2
    assert {t.name for t in store.targets(cluster="test-cluster")} == {t.name for t in cluster}


def test_collect_direct_slow_round_skips_ticks_never_overlaps(store: Store) -> None:
    # One slot, three targets of 0.15 s each: a round takes ~0.45 s > the 0.2 s interval.
    with expo_server() as srv:
        body = (METRICS / FIXTURES["v033"]).read_bytes()
        targets = TargetSet(
            "c",
            tuple(Target(f"e{i}", srv.add(f"/e{i}", body, delay_s=0.15), "vllm") for i in range(3)),
        )
        stats = _run(
            collect_direct(
                targets,
                store,
                DirectConfig(
                    interval_s=0.2,
                    window_s=1.0,
                    timeout_s=1.0,
                    concurrency=1,
                    max_body_bytes=1 << 20,
                    max_ticks=4,
                ),
            )
        )
        peak = srv.max_inflight
    assert stats.ticks == 4 and stats.skipped_ticks >= 3
    assert peak == 1  # no round ever started while another was running
    starts = sorted(o.started for o in store.outcomes(targets=["e0"]))
    assert all(b - a >= 0.4 for a, b in itertools.pairwise(starts))
    assert stats.max_lag_s < 0.2  # each round starts on its tick, not late


def test_collect_direct_stop_flushes_open_windows(store: Store) -> None:
    async def scenario(srv: ExpoServer) -> CollectStats:
        stop = asyncio.Event()
        targets = TargetSet(
            "c", (Target("e0", srv.add("/m", (METRICS / FIXTURES["v033"]).read_bytes()), "vllm"),)
        )
        task = asyncio.create_task(
            collect_direct(
                targets,
                store,
                DirectConfig(
                    interval_s=30.0,
                    window_s=60.0,
                    timeout_s=5.0,
                    concurrency=4,
                    max_body_bytes=1 << 20,
                ),
                stop=stop,
            )
        )
        await asyncio.sleep(0.5)  # first scrape done, now sleeping towards the next tick
        stop.set()
        return await asyncio.wait_for(task, timeout=5)

    with expo_server() as srv:
        # ticks fall on multiples of 30 s of the wall clock: start clear of one, or the
        # second tick can come due inside the 0.5 s before the stop (a CI failure)
        while 30.0 - time.time() % 30.0 < 1.5:
            time.sleep(0.1)
        t0 = time.monotonic()
        stats = _run(scenario(srv))
        assert time.monotonic() - t0 < 3  # did not wait for the 30 s tick
    assert stats.ticks == 1 and stats.scrapes == 1
    windows = store.read_windows(sources=["e0"])
    assert stats.windows_written == len(windows) > 0
    gauges = [w for w in windows if w.signal == "kv_cache_usage_ratio"]
    assert gauges and gauges[0].samples == 1 and gauges[0].start % 60 == 0
    counters = [w for w in windows if w.signal == "preemptions_total"]
    assert counters and counters[0].delta is None  # one sample: no delta yet


def test_collect_direct_once_writes_outcomes_and_gauges(store: Store) -> None:
    with expo_server() as srv:
        targets = TargetSet(
            "c",
            (
                Target("e0", srv.add("/m", (METRICS / FIXTURES["v011"]).read_bytes()), "vllm"),
                Target("down", f"http://127.0.0.1:{free_port()}/metrics", "vllm"),
            ),
        )
        stats = _run(
            collect_direct(
                targets,
                store,
                DirectConfig(
                    interval_s=60.0,
                    window_s=60.0,
                    timeout_s=2.0,
                    concurrency=4,
                    max_body_bytes=1 << 20,
                    once=True,
                ),
            )
        )
    assert stats.ticks == 1 and stats.failures == Counter({"connect": 1})
    assert stats.summary()["errors"] == {"connect": 1}
    assert [(o.target, o.up) for o in store.outcomes()] == [("down", False), ("e0", True)]
    assert stats.windows_written > 0
    assert {w.source for w in store.read_windows()} == {"e0"}


def test_next_tick_is_aligned_and_strictly_later() -> None:
    assert next_tick(100.0, 15.0) == 105.0
    assert next_tick(105.0, 15.0) == 120.0
    assert next_tick(119.99, 0.2) == pytest.approx(120.0)


def test_engine_facts_reads_cache_config() -> None:
    snap = Snapshot(
        "e",
        0.0,
        (),
        facts={"cache_config": ({"block_size": "16", "num_gpu_blocks": "2048", "x": "None"},)},
    )
    facts = engine_facts(snap)
    assert facts["block_size"] == 16 and facts["num_gpu_blocks"] == 2048
    assert facts["dp_engines"] == 1 and "num_cpu_blocks" not in facts
    assert facts["cache_config"] == [{"block_size": "16", "num_gpu_blocks": "2048", "x": "None"}]


# --------------------------------------------------------------------------- Prometheus mode


@pytest.mark.prometheus
def test_collect_prometheus_backfill_then_poll_writes_idempotently(
    store: Store, live_prometheus: LiveProm
) -> None:
    with PrometheusSource(live_prometheus.url) as source:
        first = _run(
            collect_prometheus(
                source,
                store,
                PrometheusConfig(
                    cluster="prom", window_s=2, since_s=60, interval_s=0.5, settle_s=0, once=True
                ),
            )
        )
        rows = store.read_windows(cluster="prom")
        again = _run(
            collect_prometheus(
                source,
                store,
                PrometheusConfig(
                    cluster="prom", window_s=2, since_s=60, interval_s=0.5, settle_s=0, max_polls=2
                ),
            )
        )
    assert first.windows_written == len(rows) > 0
    assert {w.source for w in rows} == {live_prometheus.hostport}
    assert again.windows_written >= first.windows_written  # re-read the same range
    assert again.ticks == 2 and not again.failures
    after = store.read_windows(cluster="prom")
    keys = [(w.source, w.signal, w.labels, w.start) for w in after]
    assert len(keys) == len(set(keys))  # upserts, no duplicates
    assert {(w.source, w.signal, w.labels, w.start) for w in rows} <= set(keys)
    pre = [w for w in after if w.signal == "preemptions_total" and w.delta is not None]
    assert pre and all(isinstance(w, Window) and w.delta is not None and w.delta > 0 for w in pre)
    assert {t.kind for t in store.targets(cluster="prom")} == {"prometheus", "vllm"}
    assert [e.source for e in store.engines(cluster="prom")] == [live_prometheus.hostport]


class _RecordingSource(PrometheusSource):
    """The collector's source, remembering the range of each windows() read."""

    reads: list[tuple[float, float]]

    def windows(
        self, start: float, end: float, window_s: float, signals: Iterable[str] | None = None
    ) -> list[Window]:
        self.reads.append((start, end))
        return super().windows(start, end, window_s, signals)


@pytest.mark.prometheus
def test_collect_prometheus_backfill_read_in_chunks_same_windows(
    tmp_path: Path, live_prometheus: LiveProm
) -> None:
    """A back-fill longer than chunk_s is read (and written) chunk by chunk, contiguous and
    each at most chunk_s long, and stores what one read of the whole range stores."""
    got: dict[str, tuple[list[Window], list[tuple[float, float]]]] = {}
    for name, chunk_s in (("whole", 3600.0), ("chunked", 5.0)):
        source = _RecordingSource(live_prometheus.url)
        source.reads = []
        with Store(f"sqlite:///{tmp_path / name}.db") as st, source:
            st.migrate()
            stats = _run(
                collect_prometheus(
                    source,
                    st,
                    PrometheusConfig(
                        cluster="prom",
                        window_s=2,
                        since_s=30,
                        interval_s=0.5,
                        settle_s=1.5,
                        once=True,
                        chunk_s=chunk_s,
                    ),
                )
            )
            assert stats.windows_written > 0 and not stats.failures
            got[name] = (st.read_windows(cluster="prom"), source.reads)
            engines = [e.source for e in st.engines(cluster="prom")]
            assert engines == [live_prometheus.hostport]
    (whole, [(w0, w1)]), (chunked, reads) = got["whole"], got["chunked"]
    assert len(reads) >= 3  # 30 s in 4 s chunks (5 s rounded down to whole windows)
    assert all(b - a <= 4 for a, b in reads)
    assert all(a1 == b0 for (_, a1), (b0, _) in itertools.pairwise(reads))  # no gap, no overlap
    lo, hi = max(w0, reads[0][0]), min(w1, reads[-1][1])  # the range both read
    assert hi - lo >= 20

    def common(ws: list[Window]) -> dict[tuple[str, str, Any, float], Window]:
        return {(w.source, w.signal, w.labels, w.start): w for w in ws if lo <= w.start < hi - 2}

    a, b = common(whole), common(chunked)
    assert a and a == b


def test_collect_prometheus_unreachable_fails_at_start(store: Store) -> None:
    with (
        PrometheusSource(f"http://127.0.0.1:{free_port()}", timeout_s=1) as source,
        pytest.raises(ScrapeError, match="connect"),
    ):
        _run(
            collect_prometheus(
                source,
                store,
                PrometheusConfig(cluster="c", window_s=60, since_s=3600, interval_s=15, once=True),
            )
        )
