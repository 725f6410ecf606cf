"""A small TTL cache of heavy answers keyed by their request, sharing in-flight work.

An identical request while the first is still computing joins its future; one that comes
within ``ttl_s`` of the answer gets the answer; either way no second computation runs. A
failed computation is not kept. The oldest entries go first beyond ``max_entries``.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class _Entry(Generic[T]):
    future: Future[T]
    expires: float  # monotonic seconds; inf while the computation runs


class TTLCache(Generic[T]):
    """See the module docstring; ``clock`` is monotonic seconds (tests pass their own)."""

    def __init__(
        self, ttl_s: float, max_entries: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._entries: OrderedDict[str, _Entry[T]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get_or_submit(self, key: str, submit: Callable[[], Future[T]]) -> tuple[Future[T], bool]:
        """(the future of ``key``'s answer, True when it was cached or in flight). ``submit``
        starts the computation (it may raise, e.g. pool.Busy: nothing is cached then)."""
        with self._lock:
            now = self.clock()
            entry = self._entries.get(key)
            if entry is not None and entry.expires > now:
                self._entries.move_to_end(key)
                return entry.future, True
            future = submit()
            self._entries[key] = _Entry(future, math.inf)
            self._entries.move_to_end(key)
            self._evict()
        future.add_done_callback(lambda f: self._settle(key, f))
        return future, False

    def _settle(self, key: str, future: Future[T]) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.future is not future:
                return
            if future.cancelled() or future.exception() is not None or self.ttl_s <= 0:
                del self._entries[key]
            else:
                entry.expires = self.clock() + self.ttl_s

    def _evict(self) -> None:
        now = self.clock()
        for key in [k for k, e in self._entries.items() if e.expires <= now]:
            del self._entries[key]
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
