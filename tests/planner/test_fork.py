"""planner.plan.fork: a stage run in a forked child returns what it would in this process
(values, exceptions, large results), and runs here where a fork is not safe; items streamed
from a child are the items produce() makes (frames, exceptions, a child killed midway)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from planner.plan import fork as fork_module
from planner.plan.fork import JOBS_ENV, Forked, Streamed, can_fork, can_stream, free_bytes
from tests.planner.synthstore import fill_store, shifted_frame, sqlite_url

ROOT = Path(__file__).resolve().parents[2]


class _Odd(Exception):
    """An exception that cannot be pickled (it holds a lock)."""

    def __init__(self) -> None:
        super().__init__("odd")
        self.lock = threading.Lock()


class _TwoArgs(Exception):
    """An exception that pickles but does not unpickle (its __init__ takes two arguments)."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what}: {why}")


def _boom() -> None:
    raise ValueError("bad input: field 'x'")


def _two_args() -> None:
    raise _TwoArgs("signal", "bad chunk")


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


def test_forked_exception_that_does_not_unpickle_becomes_runtime_error() -> None:
    with pytest.raises(RuntimeError, match=r"(?s)forked plan stage:.*_TwoArgs: signal: bad chunk"):
        Forked(_two_args).result()


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


# --------------------------------------------------------------------------- Streamed


def _frames(n: int) -> list[pd.DataFrame]:
    """Frames like a signal's part: floats, a categorical, strings, a missing value."""
    rng = np.random.default_rng(n)
    out = []
    for i in range(n):
        rows = 50_000 + i
        out.append(pd.DataFrame({
            "source": pd.Categorical(rng.choice(["a:8000", "b:8000", "c:8000"], rows)),
            "labels": np.array([f'{{"le": "{k}"}}' for k in range(rows)], dtype=object),
            "start": np.arange(rows, dtype=np.float64) * 60.0,
            "mean": np.where(np.arange(rows) % 7 == 0, np.nan, rng.random(rows)),
            "count": rng.integers(0, 1 << 40, rows),
        }))  # fmt: skip
    return out


def _make(n: int) -> Callable[[], Iterator[pd.DataFrame]]:
    def produce() -> Iterator[pd.DataFrame]:
        yield from _frames(n)

    return produce


@pytest.fixture
def _stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(JOBS_ENV, raising=False)  # streaming is on by default
    monkeypatch.setattr("planner.plan.fork._cpus", lambda: 2)


@pytest.mark.usefixtures("_stream")
def test_streamed_items_come_from_a_child_equal_and_writable() -> None:
    assert can_stream()
    parent, seen = os.getpid(), []
    ran_in: list[int] = []
    stream = Streamed(_make(4), meanwhile=lambda: ran_in.append(threading.get_ident()))
    assert stream.forked and stream.pid != parent
    for got, want in zip(stream, _frames(4), strict=True):
        pd.testing.assert_frame_equal(got, want)
        seen.append(got)
    assert len(seen) == 4 and stream.taken == 4 and stream.pid == 0  # the child was reaped
    assert ran_in and ran_in[0] != threading.get_ident()  # meanwhile ran in a thread
    assert all(t.name != "kvscope-meanwhile" for t in threading.enumerate())  # joined
    (array,) = list(Streamed(lambda: iter([np.arange(1_000_000, dtype=np.float64)])))
    array[:3] = -1.0  # mapped from the child's memory file, writable as a read one is
    assert array[:4].tolist() == [-1.0, -1.0, -1.0, 3.0]


@pytest.mark.usefixtures("_stream")
def test_streamed_child_exception_is_raised_after_the_items_before_it() -> None:
    def produce() -> Iterator[int]:
        yield 1
        _boom()

    got = []
    with pytest.raises(ValueError, match="bad input: field 'x'"):
        for item in Streamed(produce):
            got.append(item)
    assert got == [1]


@pytest.mark.usefixtures("_stream")
@pytest.mark.parametrize(
    ("fail", "text"),
    [(_odd, "_Odd: odd"), (_two_args, "signal: bad chunk")],  # does not pickle / unpickle
)
def test_streamed_exception_that_cannot_cross_becomes_runtime_error_with_its_traceback(
    fail: Callable[[], None], text: str
) -> None:
    def produce() -> Iterator[int]:
        yield 1
        fail()

    with pytest.raises(RuntimeError, match=rf"(?s)plan's reading child:.*{text}"):
        list(Streamed(produce))


@pytest.mark.usefixtures("_stream")
def test_streamed_child_killed_midway_leaves_the_rest_to_this_process(
    caplog: pytest.LogCaptureFixture,
) -> None:
    parent = os.getpid()

    def produce() -> Iterator[tuple[int, int]]:
        for i in range(5):
            if i == 3 and os.getpid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)
            yield i, os.getpid()

    stream = Streamed(produce)
    got = list(stream)
    assert [i for i, _ in got] == [0, 1, 2, 3, 4]
    assert {pid for i, pid in got if i < 3} == {got[0][1]} != {parent}
    assert {pid for i, pid in got if i >= 3} == {parent}
    assert "after 3 item(s); reading the rest in this process" in caplog.text


@pytest.mark.usefixtures("_stream")
def test_streamed_meanwhile_exception_is_raised_when_the_items_end() -> None:
    stream = Streamed(_make(1), meanwhile=_boom)
    with pytest.raises(ValueError, match="bad input"):
        list(stream)


@pytest.mark.usefixtures("_stream")
def test_streamed_stopped_early_kills_and_reaps_the_child() -> None:
    def produce() -> Iterator[int]:
        i = 0
        while True:  # would never end
            yield i
            i += 1

    stream = Streamed(produce)
    pid = stream.pid
    for item in stream:
        if item == 2:
            break
    del item
    stream.close()
    assert stream.pid == 0
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped: no zombie left


@pytest.mark.usefixtures("_stream")
def test_streamed_item_with_more_arrays_than_a_message_carries_goes_in_band() -> None:
    many = [np.full(10, float(i)) for i in range(300)]  # > 253 out-of-band buffers
    (got,) = list(Streamed(lambda: iter([many])))
    assert all(np.array_equal(a, b) for a, b in zip(got, many, strict=True))


def test_no_stream_with_one_cpu_one_process_asked_or_other_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(JOBS_ENV, raising=False)
    monkeypatch.setattr("planner.plan.fork._cpus", lambda: 2)
    assert can_stream()
    monkeypatch.setattr("planner.plan.fork._cpus", lambda: 1)
    assert not can_stream()
    monkeypatch.setattr("planner.plan.fork._cpus", lambda: 2)
    monkeypatch.setenv(JOBS_ENV, "1")
    assert not can_stream()
    ran: list[bool] = []
    stream = Streamed(lambda: iter([os.getpid()]), meanwhile=lambda: ran.append(True))
    assert not stream.forked and list(stream) == [os.getpid()] and ran == [True]
    monkeypatch.delenv(JOBS_ENV)
    monkeypatch.setattr("planner.plan.fork._threads", lambda: 2)
    assert not can_stream()


@pytest.mark.usefixtures("_stream")
def test_streamed_child_waits_while_the_items_not_done_with_exceed_its_budget(
    tmp_path: Path,
) -> None:
    log = tmp_path / "made"

    def produce() -> Iterator[int]:
        for i in range(6):
            with log.open("a") as fh:
                fh.write(f"{i}\n")
            yield i

    def made() -> int:
        return max(int(x) for x in log.read_text().split())

    stream = Streamed(produce, ahead_bytes=1)  # every item is over it: one at a time
    for i in stream:
        time.sleep(0.3)  # the child would make them all meanwhile, were it not waiting
        assert made() <= i + 1  # the one taken here, and at most the next one, made
    log.unlink()
    for i in Streamed(produce):  # the default budget: the child runs ahead
        if i == 0:
            time.sleep(0.5)
            assert made() == 5


@pytest.mark.usefixtures("_stream")
@pytest.mark.parametrize("fails", ["socket.socketpair", "os.fork"])
def test_streamed_without_a_socket_or_a_fork_makes_the_items_here(
    fails: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refused(*_args: object) -> None:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(fails, refused)
    stream = Streamed(lambda: iter([os.getpid(), 2]))
    assert not stream.forked and list(stream) == [os.getpid(), 2]
    assert "reading here" in caplog.text


@pytest.mark.usefixtures("_stream")
def test_streamed_item_that_cannot_be_mapped_leaves_the_rest_to_this_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    parent = os.getpid()

    def produce() -> Iterator[tuple[int, int]]:
        for i in range(4):
            yield i, os.getpid()

    calls = {"n": 0}
    real = fork_module._mapped

    def mapped(fd: int, size: int) -> object:
        calls["n"] += 1
        if calls["n"] == 2:  # the second item (a tuple of ints: its pickle, one file)
            raise OSError(12, "Cannot allocate memory")
        return real(fd, size)

    monkeypatch.setattr(fork_module, "_mapped", mapped)
    got = list(Streamed(produce))
    assert [i for i, _ in got] == [0, 1, 2, 3]
    assert got[0][1] != parent and {pid for _, pid in got[1:]} == {parent}
    assert "cannot map an item" in caplog.text and "after 1 item(s)" in caplog.text
