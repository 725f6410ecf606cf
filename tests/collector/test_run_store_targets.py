"""collector.run with ``store_targets``: the targets table re-read every tick, each URL guarded.

Real HTTP targets on 127.0.0.1 and a real SQLite store; targets are registered, moved and
deleted from the loop's progress hook, so "the next tick" is counted in ticks, not seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from collector.run import CollectStats, DirectParts, StoreTargets, collect_direct
from collector.run_config import DirectConfig
from collector.scrape import Target, TargetSet
from collector.urlguard import URLPolicy
from store.store import Store
from tests.collector.exposerver import ExpoServer, bumping, expo_server

METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
V033 = (METRICS / "vllm-0.33.0-metrics-default.txt").read_text()
LOOPBACK_OK = URLPolicy(allow=("127.0.0.1/32",))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(f"sqlite:///{tmp_path / 'kvscope.db'}") as s:
        s.migrate()
        yield s


def _collect(
    store: Store,
    targets: TargetSet,
    source: StoreTargets,
    at_tick: dict[int, Callable[[], object]],
    ticks: int,
) -> CollectStats:
    """Run ``ticks`` ticks of 0.2 s (a scrape timeout of 0.18 s: room on a loaded machine);
    after tick N (1-based), run ``at_tick[N]``."""
    done: set[int] = set()

    def progress(stats: CollectStats) -> None:
        if stats.ticks in at_tick and stats.ticks not in done:
            done.add(stats.ticks)
            at_tick[stats.ticks]()

    return asyncio.run(
        collect_direct(
            targets,
            store,
            DirectConfig(
                interval_s=0.2,
                window_s=60.0,
                timeout_s=1.0,
                concurrency=4,
                max_body_bytes=1 << 20,
                max_ticks=ticks,
            ),
            DirectParts(progress=progress, store_targets=source),
        )
    )


def _hits(srv: ExpoServer, path: str) -> int:
    return srv.route(path).hits


def test_collect_direct_store_target_registered_scraped_next_tick_deleted_stops(
    store: Store,
) -> None:
    with expo_server() as srv:
        own = TargetSet("c", (Target("file-0", srv.add("/file", V033), "vllm"),))
        first = srv.add("/reg", bumping(V033, "preemptions_total", 0, 1))
        moved = srv.add("/reg2", bumping(V033, "preemptions_total", 100, 1))
        prom = srv.add("/prom", "")
        store.upsert_target("prom-0", prom, kind="prometheus", cluster="c2")  # not scraped
        stats = _collect(
            store,
            own,
            StoreTargets(LOOPBACK_OK),
            {
                2: lambda: store.upsert_target("reg-0", first, cluster="c2"),
                4: lambda: store.upsert_target("reg-0", moved, cluster="c2"),  # a new URL
                6: lambda: store.delete_target("reg-0"),
            },
            ticks=9,
        )
        hits = {p: _hits(srv, p) for p in ("/file", "/reg", "/reg2", "/prom")}
    assert stats.ticks == 9 and stats.failures == Counter()
    # Registered after tick 2: scraped at ticks 3 and 4; moved after 4: 5 and 6; deleted
    # after 6: never again (ticks 7-9).
    assert hits == {"/file": 9, "/reg": 2, "/reg2": 2, "/prom": 0}
    assert len(store.outcomes(targets=["reg-0"])) == 4
    assert len(store.outcomes(targets=["file-0"])) == 9
    # The deleted target's open 60 s windows were written when it went, not lost.
    pre = [w for w in store.read_windows(sources=["reg-0"]) if w.signal == "preemptions_total"]
    assert sum(w.samples for w in pre) == 4
    assert [e.source for e in store.engines(cluster="c2")] == ["reg-0"]  # its own cluster


def test_collect_direct_store_target_unsafe_refused_counted_logged_not_fatal(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    with expo_server() as srv:
        url = srv.add("/reg", V033)
        store.upsert_target("loop-0", url, cluster="c2")
        store.upsert_target("meta-0", "http://169.254.169.254/latest/meta-data/", cluster="c2")
        with caplog.at_level(logging.WARNING, logger="collector.run"):
            stats = _collect(
                store, TargetSet("none", ()), StoreTargets(URLPolicy()), {}, ticks=3
            )  # no allowlist, no targets file
        hits = _hits(srv, "/reg")
    assert stats.ticks == 3 and stats.targets_up == 0 and stats.targets_down == 2
    assert stats.failures == Counter({"refused": 6})
    assert hits == 0  # never connected
    outcomes = store.outcomes(targets=["loop-0"])
    assert [o.error_kind for o in outcomes] == ["refused"] * 3
    assert "loopback address 127.0.0.1 not allowed" in (outcomes[0].error or "")
    logged = [r.getMessage() for r in caplog.records if "is down: refused" in r.getMessage()]
    assert len(logged) == 2  # once per target, at its transition, not every tick
    assert any("cloud-metadata address 169.254.169.254 is never allowed" in m for m in logged)


def test_collect_direct_store_targets_of_other_cluster_ignored(store: Store) -> None:
    with expo_server() as srv:
        store.upsert_target("mine", srv.add("/mine", V033), cluster="east")
        store.upsert_target("theirs", srv.add("/theirs", V033), cluster="west")
        stats = _collect(
            store, TargetSet("east", ()), StoreTargets(LOOPBACK_OK, cluster="east"), {}, ticks=2
        )
        hits = (_hits(srv, "/mine"), _hits(srv, "/theirs"))
    assert stats.targets_up == 1 and hits == (2, 0)
