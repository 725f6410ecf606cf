"""Heavy work (advise simulations, the HTML report) on a bounded pool of threads.

At most ``workers`` jobs run and ``queue`` more wait; a job beyond that is refused at once
(:class:`Busy`, answered 429 with Retry-After) instead of queueing without limit. Jobs are
submitted from the event loop and awaited there (``asyncio.wrap_future``): no event-loop
thread is blocked, and the futures are the thread-safe ``concurrent.futures`` kind, so the
cache (api/cache.py) can share one between requests.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class Busy(Exception):
    """The pool is full; ``retry_after_s`` is when a slot is likely free."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"busy: retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


class HeavyPool:
    """``workers`` threads, ``queue`` waiting places, refusal beyond (module docstring)."""

    def __init__(self, workers: int, queue: int, *, retry_floor_s: int = 1) -> None:
        self.workers = workers
        self.capacity = workers + queue
        self.retry_floor_s = retry_floor_s
        self._executor: ThreadPoolExecutor | None = None  # started by the first job
        self._lock = threading.Lock()
        self._pending = 0
        self._durations: deque[float] = deque(maxlen=32)

    @property
    def pending(self) -> int:
        """Jobs running or waiting."""
        return self._pending

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: mean job time × waves of jobs ahead."""
        mean = sum(self._durations) / len(self._durations) if self._durations else 1.0
        waves = math.ceil(max(self._pending, 1) / self.workers)
        return int(min(3600, max(self.retry_floor_s, math.ceil(mean * waves))))

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Start ``fn`` on the pool, or raise Busy when ``workers + queue`` jobs are pending."""
        with self._lock:
            if self._pending >= self.capacity:
                raise Busy(self.retry_after())
            self._pending += 1
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self.workers, thread_name_prefix="kvscope-heavy"
                )
            executor = self._executor
        try:
            future = executor.submit(self._timed, fn)
        except BaseException:
            self._done()
            raise
        future.add_done_callback(lambda _f: self._done())
        return future

    def _timed(self, fn: Callable[[], T]) -> T:
        start = time.monotonic()
        try:
            return fn()
        finally:
            self._durations.append(time.monotonic() - start)

    def _done(self) -> None:
        with self._lock:
            self._pending -= 1

    def shutdown(self) -> None:
        """Cancel queued jobs and let running ones finish; a later job starts new threads
        (an app's lifespan may run again, e.g. one test client after another)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
