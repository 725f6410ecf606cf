"""Heavy work is bounded (429 with Retry-After when the pool is full, never an unbounded
queue) and identical what-if requests are answered from one simulation (cached or in
flight)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient

import api.routes.advise as advise_route
from api.cache import TTLCache
from api.pool import Busy, HeavyPool
from planner.advise import advise as real_advise
from tests.api.conftest import CHEAP_WHATIF, assert_error


@pytest.fixture
def blocked_advise(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, list[Any]]]:
    """advise replaced by one that records its question and waits for the event."""
    release = threading.Event()
    calls: list[Any] = []

    def fake(whatif: Any) -> dict[str, Any]:
        calls.append(whatif)
        assert release.wait(30), "never released"
        return {"inputs": {"seed": whatif.seed}, "decision": {}, "simulated": {},
                "cost_model": {}, "sizing": {}, "configs": {}, "evidence": {}, "scenario": {},
                "notes": []}  # fmt: skip

    monkeypatch.setattr(advise_route, "run_advise", fake)
    yield release, calls
    release.set()


def _wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


def test_advise_pool_full_429_with_retry_after(
    sqlite_url: str,
    make_client: Callable[..., TestClient],
    blocked_advise: tuple[threading.Event, list[Any]],
) -> None:
    release, calls = blocked_advise
    c = make_client(sqlite_url, advise_workers=1, advise_queue=1, retry_after_s=2)
    pool = c.app.state.kvscope.pool  # type: ignore[attr-defined]
    with ThreadPoolExecutor(2) as ex:
        running = ex.submit(c.post, "/v1/advise", json={**CHEAP_WHATIF, "seed": 1})
        queued = ex.submit(c.post, "/v1/advise", json={**CHEAP_WHATIF, "seed": 2})
        _wait_for(lambda: pool.pending == 2 and len(calls) == 1)
        started = time.monotonic()
        refused = c.post("/v1/advise", json={**CHEAP_WHATIF, "seed": 3})
        assert time.monotonic() - started < 2, "a full pool must answer at once"
        assert_error(refused, 429, None)
        assert int(refused.headers["Retry-After"]) >= 2
        release.set()
        assert running.result(10).status_code == 200
        assert queued.result(10).status_code == 200
    assert sorted(w.seed for w in calls) == [1, 2]  # the refused one (seed 3) never ran
    assert pool.pending == 0
    assert c.post("/v1/advise", json={**CHEAP_WHATIF, "seed": 3}).status_code == 200


def test_advise_identical_request_cached_no_second_simulation(
    sqlite_url: str, make_client: Callable[..., TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[Any] = []

    def counting(whatif: Any) -> Any:
        runs.append(whatif)
        return real_advise(whatif)

    monkeypatch.setattr(advise_route, "advise", counting)
    c = make_client(sqlite_url)
    first = c.post("/v1/advise", json=CHEAP_WHATIF)
    again = c.post("/v1/advise", json=dict(reversed(list(CHEAP_WHATIF.items()))))
    assert first.status_code == again.status_code == 200
    assert (first.headers["X-Kvscope-Cache"], again.headers["X-Kvscope-Cache"]) == ("miss", "hit")
    assert again.json() == first.json()
    assert len(runs) == 1
    other = c.post("/v1/advise", json={**CHEAP_WHATIF, "seed": 5})
    assert other.headers["X-Kvscope-Cache"] == "miss" and len(runs) == 2


def test_advise_identical_requests_in_flight_share_one_simulation(
    sqlite_url: str,
    make_client: Callable[..., TestClient],
    blocked_advise: tuple[threading.Event, list[Any]],
) -> None:
    release, calls = blocked_advise
    c = make_client(sqlite_url, advise_workers=1, advise_queue=0)
    with ThreadPoolExecutor(3) as ex:
        futures = [ex.submit(c.post, "/v1/advise", json=CHEAP_WHATIF) for _ in range(3)]
        _wait_for(lambda: len(calls) == 1)
        time.sleep(0.2)  # let the other two arrive: they join, they are not refused
        release.set()
        answers = [f.result(10) for f in futures]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert sorted(a.headers["X-Kvscope-Cache"] for a in answers) == ["hit", "hit", "miss"]
    assert len(calls) == 1


def test_pool_capacity_workers_plus_queue_then_busy() -> None:
    pool = HeavyPool(1, 1, retry_floor_s=3)
    gate = threading.Event()
    try:
        a = pool.submit(gate.wait)
        b = pool.submit(gate.wait)
        with pytest.raises(Busy) as busy:
            pool.submit(gate.wait)
        assert busy.value.retry_after_s >= 3
        gate.set()
        assert a.result(5) and b.result(5)
        _wait_for(lambda: pool.pending == 0)
        assert pool.submit(lambda: 7).result(5) == 7
    finally:
        gate.set()
        pool.shutdown()


def test_cache_expires_after_ttl_and_drops_failures() -> None:
    now = [100.0]
    cache: TTLCache[int] = TTLCache(60.0, 8, clock=lambda: now[0])
    computed: list[int] = []

    def submit(value: int) -> Callable[[], Future[int]]:
        def run() -> Future[int]:
            computed.append(value)
            f: Future[int] = Future()
            f.set_result(value)
            return f

        return run

    assert cache.get_or_submit("k", submit(1))[0].result() == 1
    future, hit = cache.get_or_submit("k", submit(2))
    assert (future.result(), hit) == (1, True)
    now[0] += 61
    future, hit = cache.get_or_submit("k", submit(3))
    assert (future.result(), hit) == (3, False)

    def failing() -> Future[int]:
        f: Future[int] = Future()
        f.set_exception(RuntimeError("no"))
        return f

    cache.get_or_submit("bad", failing)
    assert cache.get_or_submit("bad", submit(4))[1] is False  # the failure was not kept
    assert computed == [1, 3, 4]


def test_cache_bounded_oldest_evicted() -> None:
    cache: TTLCache[int] = TTLCache(60.0, 2)
    for i in range(3):
        f: Future[int] = Future()
        f.set_result(i)
        cache.get_or_submit(str(i), lambda f=f: f)  # type: ignore[misc]
    assert len(cache) == 2
    f0: Future[int] = Future()
    f0.set_result(9)
    assert cache.get_or_submit("0", lambda: f0) == (f0, False)
