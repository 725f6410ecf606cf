"""Run part of a plan in a forked child while this process does something else.

``Forked(fn)``: ``fn`` in a child, its value (or exception) through a pipe; run here instead
by default (``KVSCOPE_PLAN_JOBS=2`` asks for the fork: ~1 s less, ~470 MB more) and where a
fork is unsafe (other threads) or unaffordable (free memory below this process's).
``Streamed(produce, meanwhile=fn)``: ``produce()``'s items made in a child and yielded here as
they come, each array in a memory file mapped here, the child at most ``ahead_bytes`` ahead,
while ``fn`` runs here in a thread; on by default with two CPUs (``KVSCOPE_PLAN_JOBS=1``: no).

Design: planner/plan/METHODS.md#reading-ahead
"""

from __future__ import annotations

import contextlib
import logging
import math
import mmap
import os
import pickle
import signal
import socket
import struct
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
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
            payload = pickle.dumps((False, _portable(exc, "forked plan stage")))
        with os.fdopen(fd, "wb") as pipe:
            pipe.write(payload)
    finally:
        os._exit(code)


def _portable(exc: BaseException, where: str) -> BaseException:
    """``exc`` if it survives a pickle round trip (one that does not, e.g. holding a lock or
    with an ``__init__`` its args do not fit, would fail in the parent instead), else a
    RuntimeError holding its traceback's text."""
    try:
        pickle.loads(pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:
        text = "".join(traceback.format_exception(exc))
        return RuntimeError(f"{where}: {text}")
    return exc


# --------------------------------------------------------------------------- streamed items

_HEAD = struct.Struct("<cI")  # kind (I item, E exception, D done), memory files that follow
_ITEM, _ERROR, _DONE = b"I", b"E", b"D"
_MAX_FDS = 253  # file descriptors one message may carry (Linux's SCM_MAX_FD)
_ACK = struct.Struct("<Q")  # this process to the child: bytes of an item it is done with
AHEAD_BYTES = 256 << 20  # items sent and not yet done with, beyond the first (module doc)


def can_stream() -> bool:
    """Whether ``Streamed`` forks here (module docstring)."""
    if not (hasattr(os, "fork") and hasattr(os, "memfd_create") and hasattr(socket, "send_fds")):
        return False
    if _threads() != 1 or os.environ.get(JOBS_ENV, "").strip() == "1":
        return False
    return _cpus() >= 2


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class StreamLost(Exception):
    """The streaming child ended before it said it was done."""


class Streamed(Generic[T]):
    """The items of ``produce()``, made in a forked child when :func:`can_stream` (module
    docstring), while ``meanwhile()`` runs here in a thread; iterate once. The iteration's
    end (or ``close()``) ends the child and joins the thread, raising what it raised."""

    def __init__(
        self,
        produce: Callable[[], Iterable[T]],
        *,
        meanwhile: Callable[[], object] | None = None,
        ahead_bytes: int = AHEAD_BYTES,
    ) -> None:
        self.produce = produce
        self.meanwhile = meanwhile
        self.pid = 0
        self.taken = 0  # items yielded
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._failed: list[BaseException] = []
        if not can_stream():
            return
        try:
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError as exc:  # no such socket here (a sandbox): the items are made here
            log.warning("plan: no socket for a reading child (%s); reading here", exc)
            return
        try:
            pid = os.fork()
        except OSError as exc:  # EAGAIN / ENOMEM: no process to spare
            log.warning("plan: cannot fork a reading child (%s); reading here", exc)
            mine.close()
            theirs.close()
            return
        if pid == 0:  # the child: never returns
            mine.close()
            _stream_child(produce, theirs, ahead_bytes)
        theirs.close()
        self.pid, self._sock = pid, mine
        if meanwhile is not None:
            self._thread = threading.Thread(
                target=self._run_meanwhile, name="kvscope-meanwhile", daemon=True
            )
            self._thread.start()

    @property
    def forked(self) -> bool:
        """Whether the items come from a child."""
        return self._sock is not None

    def _run_meanwhile(self) -> None:
        try:
            assert self.meanwhile is not None
            self.meanwhile()
        except BaseException as exc:  # raised by close() in the iterating thread
            self._failed.append(exc)

    def __iter__(self) -> Iterator[T]:
        try:
            if self._sock is None:
                if self.meanwhile is not None:
                    self.meanwhile()
                yield from self._rest()
                return
            while True:
                try:
                    kind, value, size = _receive(self._sock)
                except StreamLost as exc:
                    log.warning("plan: %s after %d item(s); reading the rest in this "
                                "process", exc, self.taken)  # fmt: skip
                    self._end_child()
                    yield from self._rest()
                    return
                if kind == _DONE:
                    return
                if kind == _ERROR:
                    raise value  # type: ignore[misc]
                self.taken += 1
                yield value  # type: ignore[misc]
                del value
                with contextlib.suppress(OSError):  # a dead child: the next receive says so
                    self._sock.send(_ACK.pack(size))
        finally:
            self.close()

    def _rest(self) -> Iterator[T]:
        """produce() here, past the items already taken."""
        for n, item in enumerate(self.produce()):
            if n >= self.taken:
                self.taken += 1
                yield item

    def _end_child(self) -> None:
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = 0

    def close(self) -> None:
        """End the child (killed if still running) and join the thread; raise what
        ``meanwhile`` raised."""
        self._end_child()
        if self._sock is not None:
            self._sock.close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._failed:
            raise self._failed.pop()


def _receive(sock: socket.socket) -> tuple[bytes, object, int]:
    """The next message: (kind, its value, its bytes); StreamLost at the stream's end."""
    try:
        head, fds, flags, _ = socket.recv_fds(sock, 4096, _MAX_FDS)
    except OSError as exc:
        raise StreamLost(f"the plan's reading child's socket failed: {exc}") from exc
    try:
        if not head:
            raise StreamLost("the plan's reading child ended early")
        kind, count = _HEAD.unpack_from(head)
        sizes = struct.unpack_from(f"<{count}Q", head, _HEAD.size)
        if len(fds) != count or flags & socket.MSG_CTRUNC:
            raise StreamLost(f"a message of {len(fds)} file(s) for {count}")
        try:
            files = [_mapped(fd, n) for fd, n in zip(fds, sizes, strict=True)]
        except OSError as exc:  # ENOMEM mapping an item: the rest is read here, or fails here
            raise StreamLost(f"cannot map an item of the plan's reading child: {exc}") from exc
    finally:
        for fd in fds:
            os.close(fd)
    return kind, pickle.loads(files[0], buffers=files[1:]), sum(sizes)


def _mapped(fd: int, size: int) -> mmap.mmap | bytearray:
    """The memory file's ``size`` bytes, mapped (an array on them is not copied)."""
    return mmap.mmap(fd, size) if size else bytearray()


def _stream_child(
    produce: Callable[[], Iterable[object]], sock: socket.socket, ahead_bytes: int
) -> None:
    """Send every item of ``produce()`` down ``sock``, then done or the exception raised;
    exit at once (no atexit handlers, no flush of buffers the parent also holds)."""
    code = 0
    sender = _Sender(sock, ahead_bytes)
    try:
        try:
            for item in produce():
                sender.send(_ITEM, item)
                del item
            sender.send(_DONE, None)
        except (BrokenPipeError, ConnectionResetError):  # the parent stopped listening
            code = 1
        except BaseException as exc:  # sent back, raised in the parent
            code = 1
            sender.send(_ERROR, _portable(exc, "plan's reading child"))
    except BaseException:  # the socket broke: the parent sees its end
        code = 1
    finally:
        os._exit(code)


class _Sender:
    """The child's end: each message's pickle and out-of-band buffers in memory files of
    their own, passed with the message (written once here, mapped there); an item waits
    while the items the parent is not done with would exceed ``ahead_bytes`` with it."""

    def __init__(self, sock: socket.socket, ahead_bytes: int) -> None:
        self.sock, self.ahead_bytes, self.pending = sock, ahead_bytes, 0

    def send(self, kind: bytes, value: object) -> None:
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
        parts: list[bytes | memoryview] = [data, *(b.raw() for b in buffers)]
        if len(parts) > _MAX_FDS:  # too many arrays for one message: all in the pickle
            parts = [pickle.dumps(value, protocol=5)]
        sizes = [memoryview(part).nbytes for part in parts]
        if kind == _ITEM:
            while self.pending and self.pending + sum(sizes) > self.ahead_bytes:
                ack = self.sock.recv(_ACK.size)
                if len(ack) != _ACK.size:
                    raise BrokenPipeError("the plan's process closed the stream")
                self.pending -= _ACK.unpack(ack)[0]
            self.pending += sum(sizes)
        fds = [_memory_file(part) for part in parts]
        try:
            head = _HEAD.pack(kind, len(fds)) + struct.pack(f"<{len(sizes)}Q", *sizes)
            socket.send_fds(self.sock, [head], fds)
        finally:
            for fd in fds:
                os.close(fd)


def _memory_file(data: bytes | memoryview) -> int:
    """A memory file (memfd_create(2)) holding ``data``."""
    fd = os.memfd_create("kvscope-plan-item", os.MFD_CLOEXEC)
    view, done = memoryview(data).cast("B"), 0
    while done < len(view):
        done += os.write(fd, view[done:])
    return fd
