"""planner.plan.fork: a stage run in a forked child returns what it would in this process
(values, exceptions, large results), and runs here where a fork is not safe."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from planner.plan.fork import JOBS_ENV, Forked, can_fork, free_bytes
from tests.planner.synthstore import fill_store, shifted_frame, sqlite_url

ROOT = Path(__file__).resolve().parents[2]


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
    # threads other tests of the session left running (servers, pools) would turn the fork
    # off: these tests count only their own (test_no_fork_…_other_threads_run)
    monkeypatch.setattr("planner.plan.fork._threads", lambda: 1)


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
    baseline = threading.active_count()  # the real count: this test's thread and others'
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        monkeypatch.setattr("planner.plan.fork._threads",
                            lambda: threading.active_count() - baseline + 1)  # fmt: skip
        assert not can_fork()  # one more thread than when the test began
        assert Forked(os.getpid).result() == os.getpid()
    finally:
        stop.set()
        other.join()
    assert can_fork()


_PLANS = """
import json, os, sys
import planner.plan.fork as fork
from planner.plan import build_plan
from store.store import Store
from tests.planner.synthstore import without_timings
forks = []
real = os.fork
def counted():
    pid = real()
    if pid:
        forks.append(pid)
    return pid
fork.os.fork = counted
out = []
for jobs in ("1", "2"):
    os.environ[fork.JOBS_ENV] = jobs
    with Store(sys.argv[1]) as store:
        plan = build_plan(store, cluster="c", forecast_seconds=60)
    out.append({"forks": len(forks), "plan": without_timings(plan.to_dict())})
print(json.dumps(out, sort_keys=True, default=str))
"""


def test_plan_is_the_same_with_and_without_the_fork(tmp_path: Path) -> None:
    # in a process of its own: no thread another test left running turns the fork off
    url = sqlite_url(tmp_path / "fork.db")
    fill_store(url, shifted_frame(6, 200, seed=3), cluster="c")
    env = {k: v for k, v in os.environ.items() if k != JOBS_ENV}
    proc = subprocess.run([sys.executable, "-c", _PLANS, url], capture_output=True, text=True,
                          timeout=300, env={**env, "PYTHONPATH": str(ROOT)},
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    serial, forked = json.loads(proc.stdout)
    assert (serial["forks"], forked["forks"]) == (0, 1)
    assert serial["plan"] == forked["plan"]


def test_no_fork_when_free_memory_is_below_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("planner.plan.fork.free_bytes", lambda: 1024.0)
    assert not can_fork()
    assert Forked(os.getpid).result() == os.getpid()


def test_free_bytes_reads_meminfo_and_is_positive() -> None:
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
