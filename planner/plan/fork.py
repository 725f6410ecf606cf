"""Run one stage of a plan in a forked child while this process runs another.

``Forked(fn)`` starts ``fn`` in a child made by ``os.fork`` (it reads this process's frame
without a copy) and ``result()`` returns fn's value, pickled through a pipe, or raises fn's
exception. Otherwise ``fn`` runs here, at once: by default, and where a fork is unsafe (no
``os.fork``; other threads running, whose locks would stay held in the child) or
unaffordable (less free memory, machine or cgroup, than this process holds).
``KVSCOPE_PLAN_JOBS=2`` asks for the fork: on 100 engines × 7 days it takes ~1 s off 10.8 s
but adds ~470 MB (docs/scale.md), so one process is the default. The value is the same.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import threading
import traceback
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
JOBS_ENV = "KVSCOPE_PLAN_JOBS"


def can_fork() -> bool:
    """Whether a stage may run in a forked child here (module docstring)."""
    if not hasattr(os, "fork") or _threads() != 1:
        return False
    if os.environ.get(JOBS_ENV, "1").strip() != "2":
        return False
    return free_bytes() >= _rss_bytes()


def _threads() -> int:
    """The threads of this process that Python runs."""
    return threading.active_count()


def free_bytes() -> float:
    """Memory free for a child: the machine's MemAvailable, or less where this process's
    cgroup (v2 or v1) has a limit below it (inf where neither can be read)."""
    free = _meminfo("MemAvailable")
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):  # fmt: skip
        try:
            with open(limit) as fh:
                cap = fh.read().strip()
            with open(usage) as fh:
                used = float(fh.read().strip())
        except (OSError, ValueError):
            continue
        if cap.isdigit():
            free = min(free, float(cap) - used)
    return free


def _meminfo(field: str) -> float:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return math.inf


def _rss_bytes() -> float:
    try:
        with open("/proc/self/statm") as fh:
            return float(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0.0


class Forked(Generic[T]):
    """``fn()`` in a forked child when :func:`can_fork`, else in this process at once;
    :meth:`result` gives its value or raises its exception."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn = fn
        self.pid = 0
        self.fd = -1
        self.done: tuple[bool, T | BaseException] | None = None
        if can_fork():
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: never returns
                os.close(read)
                _child(fn, write)
            os.close(write)
            self.pid, self.fd = pid, read
            return
        try:
            self.done = (True, fn())
        except Exception as exc:  # raised by result(), as a child's would be
            self.done = (False, exc)

    @property
    def forked(self) -> bool:
        """Whether ``fn`` runs in a child not yet waited for."""
        return self.pid != 0

    def result(self) -> T:
        """fn's value, or fn's exception raised here."""
        if self.done is not None:
            ok, value = self.done
            if not ok:
                assert isinstance(value, BaseException)
                raise value
            return value  # type: ignore[return-value]
        chunks = []
        with os.fdopen(self.fd, "rb") as pipe:
            while block := pipe.read(1 << 20):
                chunks.append(block)
        _, status = os.waitpid(self.pid, 0)
        self.pid = 0
        if not chunks:  # killed before it answered (the OOM killer, a signal)
            log.warning("plan: the forked stage ended without a result (wait status %d); "
                        "running it in this process", status)  # fmt: skip
            return self.fn()
        ok, value = pickle.loads(b"".join(chunks))
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]


def _child(fn: Callable[[], object], fd: int) -> None:
    """Run ``fn``, write (ok, value or exception) pickled to ``fd`` and exit at once (no
    atexit handlers, no flush of buffers the parent also holds)."""
    code = 0
    try:
        try:
            payload = pickle.dumps((True, fn()), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as exc:  # sent back, raised in the parent
            code = 1
            try:
                payload = pickle.dumps((False, exc), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # an exception that does not pickle
                text = "".join(traceback.format_exception(exc))
                payload = pickle.dumps((False, RuntimeError(f"forked plan stage: {text}")))
        with os.fdopen(fd, "wb") as pipe:
            pipe.write(payload)
    finally:
        os._exit(code)
