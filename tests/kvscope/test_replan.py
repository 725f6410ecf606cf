"""kvscope.replan: the re-plan loop on a real store; failing rounds are counted, not fatal."""

from __future__ import annotations

import logging
import os
import signal
import weakref
from pathlib import Path

import pytest

from core.errors import ConfigError, StoreError
from kvscope.replan import ReplanConfig, _Interrupted, _Stopper, resolve_cluster, run_every
from planner.plan import NoData, Plan, build_plan
from store.store import Store
from tests.planner.synthstore import fill_store, shifted_frame, sqlite_url


def test_run_every_failing_rounds_logged_and_counted_then_saves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = sqlite_url(tmp_path / "k.db")
    fill_store(url, shifted_frame(3, 100, seed=11))
    calls: list[float | None] = []

    def make_plan(store: Store, cluster: str, since: float | None) -> Plan:
        calls.append(since)
        if len(calls) == 1:
            raise NoData("no windows of cluster 'synth' yet")
        if len(calls) == 2:
            raise StoreError("reading windows failed on sqlite:///k.db: database is locked")
        if len(calls) == 4:  # a stop while a plan is being made abandons it
            os.kill(os.getpid(), signal.SIGTERM)
        return build_plan(store, cluster=cluster, since=since, horizon_s=3600,
                          forecast_seconds=0.2)  # fmt: skip

    before = signal.getsignal(signal.SIGTERM)
    with caplog.at_level(logging.WARNING, logger="kvscope.replan"), Store(url) as store:
        stats = run_every(store, ReplanConfig(every_s=0.01), make_plan)
        (saved,) = store.plans()
    assert signal.getsignal(signal.SIGTERM) == before  # the handlers are given back
    assert (stats.rounds, stats.rounds_failed, stats.plans_saved) == (4, 2, 1)
    assert dict(stats.failures) == {"no_data": 1, "store": 1} and stats.interrupted
    assert stats.last_error == (
        "cluster synth: reading windows failed on sqlite:///k.db: database is locked"
    )
    logged = [r.getMessage() for r in caplog.records]
    assert logged == [
        "plan round 1: cluster synth: no windows of cluster 'synth' yet",
        "plan round 2: cluster synth: reading windows failed on sqlite:///k.db: database is locked",
    ]
    assert saved.cluster == "synth" and calls == [None] * 4
    assert stats.summary()["errors"] == {"no_data": 1, "store": 1}


def test_run_every_since_is_relative_to_each_round(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "k.db")
    seen: list[float | None] = []

    def make_plan(store: Store, cluster: str, since: float | None) -> Plan:
        seen.append(since)
        if len(seen) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        raise NoData("nothing")

    with Store(url) as store:
        store.migrate()
        store.upsert_engine("c", "e0", offload="none")
        stats = run_every(store, ReplanConfig(every_s=0.01, cluster="c", since_s=3600.0), make_plan)
    assert len(seen) == 2 and seen[0] is not None and seen[1] is not None
    assert 0 < seen[1] - seen[0] < 60 and stats.failures["no_data"] == 1


def test_resolve_cluster_none_or_several_asks_for_cluster(tmp_path: Path) -> None:
    with Store(sqlite_url(tmp_path / "k.db")) as store:
        store.migrate()
        with pytest.raises(ConfigError, match="give --cluster NAME \\(the store holds no cluster"):
            resolve_cluster(store, None)
        store.upsert_engine("only", "e0", offload="none")
        assert resolve_cluster(store, None) == "only"
        assert resolve_cluster(store, "other") == "other"


def test_stopper_interrupt_swallowed_by_a_gc_callback_is_raised_at_block_end(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SIGTERM's exception raised inside a weakref callback is lost there (Python prints
    "Exception ignored in …"); the stopper drops that message and raises at the end of the
    planning block instead, so the plan is still abandoned and stderr stays clean."""

    class Thing:
        pass

    stopper = _Stopper()
    reached_end = False
    with stopper.installed(), pytest.raises(_Interrupted), stopper.interruptible():
        thing = Thing()
        ref = weakref.ref(thing, lambda _r: stopper(signal.SIGTERM, None))
        del thing  # the callback runs now and its exception is swallowed by Python
        reached_end = True
    assert ref() is None and reached_end and stopper.stop.is_set()
    assert "Exception ignored" not in capsys.readouterr().err
