"""Debian's headless Chromium, driven over the DevTools protocol on a pipe (no port, no
websocket library): the browser reads commands on its fd 3 and answers on its fd 4, one JSON
message per NUL-terminated record (``--remote-debugging-pipe``).

Started with the flags this machine needs (/work/.library/env/machines/python.md): headless,
no sandbox (root), no GPU, no QUIC, and no background networking, component updates or sync
(the closed network refuses those connections), in a new empty profile. Only loopback pages
are loaded by the tests.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-pipe",
)


class DevToolsError(RuntimeError):
    """The browser answered a command with an error, closed the pipe, or did not answer."""


class DevTools:
    """Commands and events over the pipe; ``events`` keeps every event seen, in order."""

    def __init__(self, to_browser: int, from_browser: int) -> None:
        self._out = to_browser
        self._in: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self._seen = 0  # events before this index were handed out by wait_event
        self._reader = threading.Thread(target=self._read, args=(from_browser,), daemon=True)
        self._reader.start()

    def _read(self, fd: int) -> None:
        buf = b""
        while chunk := os.read(fd, 1 << 16):
            buf += chunk
            *records, buf = buf.split(b"\0")
            for rec in records:
                self._in.put(json.loads(rec))
        self._in.put(None)

    def _next(self, deadline: float, what: str) -> dict[str, Any]:
        try:
            msg = self._in.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise DevToolsError(f"no answer from chromium: {what}") from None
        if msg is None:
            self._in.put(None)
            raise DevToolsError(f"chromium closed the pipe: {what}")
        return msg

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        timeout: float = 20.0,
    ) -> dict[str, Any]:
        """Send a command; return its result (events that arrive meanwhile are kept)."""
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            data = data[os.write(self._out, data) :]
        deadline = time.monotonic() + timeout
        while True:
            got = self._next(deadline, method)
            if got.get("id") == self._next_id:
                if "error" in got:
                    raise DevToolsError(f"{method}: {got['error']}")
                result: dict[str, Any] = got.get("result", {})
                return result
            if "method" in got:
                self.events.append(got)

    def wait_event(
        self, method: str, *, session: str | None = None, timeout: float = 20.0
    ) -> dict[str, Any]:
        """The next event named ``method`` (of ``session``) not handed out before."""
        deadline = time.monotonic() + timeout
        while True:
            for i in range(self._seen, len(self.events)):
                ev = self.events[i]
                if ev["method"] == method and (session is None or ev.get("sessionId") == session):
                    self._seen = i + 1
                    return ev
            got = self._next(deadline, f"waiting for {method}")
            if "method" in got:
                self.events.append(got)


def _high_fd(fd: int) -> int:
    """A copy of ``fd`` numbered >= 10 (so it cannot clash with the browser's 3 and 4)."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


@contextmanager
def chromium(profile: Path, *extra: str) -> Iterator[DevTools]:
    """Start headless Chromium with a new empty profile directory; stop it at the end
    (Browser.close, then SIGKILL to its own process group if it lingers)."""
    profile.mkdir(parents=True, exist_ok=False)
    cmd_r, cmd_w = os.pipe()  # we write commands, the browser reads them on fd 3
    ans_r, ans_w = os.pipe()  # the browser writes answers on fd 4, we read them
    cmd_r, ans_w = _high_fd(cmd_r), _high_fd(ans_w)
    shell = f'exec "$0" "$@" 3<&{cmd_r} 4>&{ans_w} {cmd_r}<&- {ans_w}>&-'
    proc = subprocess.Popen(
        ["/bin/bash", "-c", shell, str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *extra],
        pass_fds=(cmd_r, ans_w),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    os.close(cmd_r)
    os.close(ans_w)
    tools = DevTools(cmd_w, ans_r)
    try:
        yield tools
    finally:
        with suppress(DevToolsError, OSError):
            tools.call("Browser.close", timeout=5)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        os.close(cmd_w)
        tools._reader.join(timeout=5)
        os.close(ans_r)
