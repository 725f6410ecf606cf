"""planner.plan.fork: a stage run in a forked child returns what it would in this process
(values, exceptions, large results), and runs here where a fork is not safe."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import numpy as np
import pytest

from planner.plan import build_plan
from planner.plan.fork import JOBS_ENV, Forked, can_fork
from store.store import Store
from tests.planner.synthstore import fill_store, shifted_frame, sqlite_url, without_timings


class _Odd(Exception):
    """An exception that cannot be pickled (it holds a lock)."""

    def __init__(self) -> None:
        super().__init__("odd")
        self.lock = threading.Lock()


def _boom() -> None:
    raise ValueError("bad input: field 'x'")


def _odd() -> None:
    raise _Odd()


@pytest.fixture(autouse=True)
def _two_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JOBS_ENV, "2")  # the fork is opt-in


def test_forked_value_is_computed_in_a_child_and_returned() -> None:
    assert can_fork()
    job = Forked(lambda: (os.getpid(), np.arange(3_000_000, dtype=np.float64)))  # 24 MB
    pid, arr = job.result()
    assert pid != os.getpid()
    assert np.array_equal(arr, np.arange(3_000_000, dtype=np.float64))


def test_forked_exception_is_raised_in_the_parent() -> None:
    with pytest.raises(ValueError, match="bad input: field 'x'"):
        Forked(_boom).result()


def test_forked_unpicklable_exception_becomes_runtime_error_with_its_traceback() -> None:
    with pytest.raises(RuntimeError, match=r"(?s)forked plan stage:.*_Odd: odd"):
        Forked(_odd).result()


def test_forked_child_killed_runs_the_stage_here() -> None:
    parent = os.getpid()

    def stage() -> int:
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return os.getpid()

    assert Forked(stage).result() == parent


def test_no_fork_by_default_when_disabled_or_other_threads_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for value in ("1", None):
        if value is None:
            monkeypatch.delenv(JOBS_ENV)
        else:
            monkeypatch.setenv(JOBS_ENV, value)
        assert not can_fork()
        assert Forked(os.getpid).result() == os.getpid()
    monkeypatch.setenv(JOBS_ENV, "2")
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not can_fork()
        assert Forked(os.getpid).result() == os.getpid()
    finally:
        stop.set()
        other.join()
    assert can_fork()


def test_plan_is_the_same_with_and_without_the_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = sqlite_url(tmp_path / "fork.db")
    fill_store(url, shifted_frame(6, 200, seed=3), cluster="c")
    forks = []
    real_fork = os.fork

    def counted_fork() -> int:
        pid = real_fork()
        if pid:
            forks.append(pid)
        return pid

    monkeypatch.setattr("planner.plan.fork.os.fork", counted_fork)
    plans = []
    for jobs in ("1", "2"):
        monkeypatch.setenv(JOBS_ENV, jobs)
        with Store(url) as store:
            plans.append(build_plan(store, cluster="c", forecast_seconds=60))
        assert len(forks) == (0 if jobs == "1" else 1)
    a, b = (json.dumps(without_timings(p.to_dict()), sort_keys=True) for p in plans)
    assert a == b


def test_no_fork_when_free_memory_is_below_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("planner.plan.fork.free_bytes", lambda: 1024.0)
    assert not can_fork()
    assert Forked(os.getpid).result() == os.getpid()


def test_free_bytes_reads_meminfo_and_is_positive() -> None:
    from planner.plan.fork import free_bytes

    assert 0 < free_bytes() < float("inf")


def test_without_a_fork_the_stage_runs_at_once_and_its_error_waits_for_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(JOBS_ENV, "1")
    ran: list[int] = []

    def stage() -> int:
        ran.append(1)
        return 7

    job = Forked(stage)
    assert ran == [1] and not job.forked  # before result(): what it read can be freed
    assert job.result() == 7
    failing = Forked(_boom)
    with pytest.raises(ValueError, match="bad input"):
        failing.result()
