"""Roll-up checkpoints: the state a restarted direct collector resumes from (kill -9 included).

Every target's roll-up state is written atomically to ``rollup-<pid>-<start>.ckpt`` (MAGIC +
marshal, format 4; format 1 JSON files are read too) after every tick that closes windows,
at least every ``checkpoint_s`` and before a clean stop's flush, under an flock. At start
:class:`Checkpoints` claims the states of collectors that are gone; a resumable state
completes its open window, so a kill -9 loses only the samples since the last save, never a
counter increase. The state directory must be writable by the collector only.

Design: collector/DESIGN.md#checkpoint
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import marshal
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from collector.rollup import Rollup
from core.errors import ConfigError
from core.records import Saved as Saved  # noqa: PLC0414 - its readers import it here
from core.records import Window

log = logging.getLogger(__name__)
FORMAT = 2  # MAGIC + marshal (DESIGN.md#checkpoint)
JSON_FORMAT = 1  # read only: kvscope's JSON checkpoints before format 2
MAGIC = b"kvscope-checkpoint\n"
SUFFIX = ".ckpt"


def resumable(saved: Saved, *, url: str, now: float, window_s: float, stale_windows: int) -> bool:
    """Whether the roll-up of a target now at ``url`` may carry on from ``saved`` at ``now``
    (DESIGN.md#checkpoint; a target whose URL changed is another engine: it starts afresh)."""
    try:
        same = float(saved.state["window_s"]) == window_s and saved.url == url
    except (KeyError, TypeError, ValueError):
        return False
    return same and saved.last_ts <= now <= saved.last_ts + stale_windows * window_s


def newest(a: Saved | None, b: Saved | None) -> tuple[Saved | None, Saved | None]:
    """(newer, older) of two states of one target, by their last sample (``a`` on a tie)."""
    if a is None or b is None:
        return (a if b is None else b), None
    return (a, b) if a.last_ts >= b.last_ts else (b, a)


def resume(
    saved: Saved | None, name: str, url: str, window_s: float, now: float
) -> tuple[Rollup, list[Window]]:
    """The roll-up of target ``name`` at ``url`` after a restart at ``now``: carrying on from
    ``saved`` when it is :func:`resumable`, else a fresh one and the windows ``saved`` left
    open (to be written: a kill -9 never wrote them)."""
    rollup = Rollup(name, window_s)
    if saved is None:
        return rollup, []
    if resumable(saved, url=url, now=now, window_s=window_s, stale_windows=rollup.stale_windows):
        try:
            rollup.restore_state(saved.state)
        except (ConfigError, KeyError, TypeError, ValueError) as exc:
            log.error("target %s: its checkpointed roll-up is unusable: %s", name, exc)
            return Rollup(name, window_s), []
        log.warning("target %s: resuming its roll-up (last sample %.1f s ago)",
                    name, now - saved.last_ts)  # fmt: skip
        return rollup, []
    return rollup, open_windows(saved, now=now)


def open_windows(saved: Saved, *, now: float) -> list[Window]:
    """The windows a checkpointed state left open, closed as they were (a clean stop had
    written the same ones: writing them again is idempotent)."""
    try:
        old = Rollup(saved.name, float(saved.state["window_s"]))
        old.restore_state(saved.state)
    except (ConfigError, KeyError, TypeError, ValueError) as exc:
        log.error("target %s: its checkpointed roll-up is unusable: %s", saved.name, exc)
        return []
    windows = old.flush()
    if windows:
        log.warning(
            "target %s: not resuming its roll-up (last sample %.0f s ago, or its URL or window "
            "changed): writing the %d windows it left open",
            saved.name, now - saved.last_ts, len(windows),
        )  # fmt: skip
    return windows


class Checkpoints:
    """The checkpoint files of one state directory (DESIGN.md#checkpoint)."""

    def __init__(self, directory: Path, *, store_id: str) -> None:
        self.directory = directory
        self.store_id = store_id
        directory.mkdir(parents=True, exist_ok=True)
        stem = f"rollup-{os.getpid()}-{time.time_ns()}"
        self.path = directory / f"{stem}{SUFFIX}"
        self._lock = _locked(directory / f"{stem}.lock", wait=True)
        # Lock-free files of gone collectors: held locked until the first save, with the
        # names of their states not claimed yet.
        self._orphans: dict[Path, tuple[IO[bytes], set[str]]] = {}
        self.saved: dict[str, Saved] = {}  # name -> the newest unclaimed state of it
        self.errors = 0
        self._load()

    def _load(self) -> None:
        for lock_path in sorted(self.directory.glob("rollup-*.lock")):
            if lock_path.stem == self.path.stem:
                continue
            lock = _locked(lock_path, wait=False)
            if lock is None:
                continue  # its collector is running
            states = self._read(_file_of(lock_path))
            self._orphans[lock_path] = (lock, set(states))
            for name, saved in states.items():
                best = self.saved.get(name)
                if best is None or saved.written > best.written:
                    self.saved[name] = saved
        if self.saved:
            log.warning(
                "checkpoint: the roll-up state of %d target(s) found in %s: resuming them",
                len(self.saved), self.directory,
            )  # fmt: skip

    def _read(self, path: Path) -> dict[str, Saved]:
        try:
            raw = path.read_bytes()
            if raw.startswith(MAGIC):
                data = marshal.loads(raw[len(MAGIC) :])
                fmt = FORMAT
            else:
                data, fmt = json.loads(raw), JSON_FORMAT
            if not isinstance(data, dict):
                raise ValueError(f"not a checkpoint ({type(data).__name__})")
            if data.get("kvscope_checkpoint") != fmt or data.get("store") != self.store_id:
                return {}
            written = float(data["written"])
            return {
                str(name): Saved(str(name), str(t["url"]), written, dict(t["state"]))
                for name, t in data["targets"].items()
            }
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError) as exc:
            log.error("checkpoint: %s is unreadable (%s): not resumed from", path, exc)
            return {}

    def claim(self, name: str) -> Saved | None:
        """The newest state saved for target ``name`` (None: none), once."""
        saved = self.saved.pop(name, None)
        if saved is None:
            return None
        self._claim_everywhere(name)
        return saved

    def _claim_everywhere(self, name: str) -> None:
        for _lock, names in self._orphans.values():
            names.discard(name)

    def stale(self, *, now: float, stale_windows: int = 5) -> list[Saved]:
        """Unclaimed states past their horizon: their open windows are to be written now (a
        kill -9 never wrote them); claimed by this call."""
        out = []
        for name, saved in list(self.saved.items()):
            window_s = float(saved.state.get("window_s") or 0.0)
            if now > saved.last_ts + stale_windows * window_s:
                out.append(saved)
                del self.saved[name]
                self._claim_everywhere(name)
        return out

    def save(self, targets: Mapping[str, tuple[str, dict[str, Any]]]) -> bool:
        """Write this collector's checkpoint: target name -> (URL, roll-up state). The first
        one written also deletes the orphan files every state of which was claimed and lets go
        of the others (another collector may resume those). False (logged): not written."""
        data = {
            "kvscope_checkpoint": FORMAT,
            "store": self.store_id,
            "written": time.time(),
            "targets": {
                name: {"url": url, "state": state} for name, (url, state) in targets.items()
            },
        }
        tmp = self.path.with_suffix(".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(MAGIC + marshal.dumps(data, 4))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            _fsync_dir(self.directory)
        except OSError as exc:
            self.errors += 1
            log.error("checkpoint: cannot write %s: %s", self.path, exc.strerror or exc)
            return False
        self._forget_orphans()
        return True

    def _forget_orphans(self) -> None:
        for lock_path, (lock, unclaimed) in self._orphans.items():
            if not unclaimed:  # every state in it now lives in this collector's file
                for path in (*(lock_path.with_suffix(x) for x in (SUFFIX, ".json")), lock_path):
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
            lock.close()
        self._orphans.clear()

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self, *, remove: bool = False) -> None:
        """Release the locks (``remove``: delete this collector's files too)."""
        for lock, _states in self._orphans.values():
            lock.close()
        self._orphans.clear()
        if remove:
            for path in (self.path, self.path.with_suffix(".lock")):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _file_of(lock_path: Path) -> Path:
    """A lock's checkpoint file: this format's, else a format-1 JSON one."""
    current = lock_path.with_suffix(SUFFIX)
    legacy = lock_path.with_suffix(".json")
    return legacy if not current.exists() and legacy.exists() else current


def _locked(path: Path, *, wait: bool) -> IO[bytes] | None:
    """``path`` opened and flock'ed exclusively (None: another process holds it)."""
    f = open(path, "ab")  # noqa: SIM115 - held open for as long as the lock is
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        f.close()
        return None
    return f


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def state_dir_for(url: str, env: Mapping[str, str]) -> Path | None:
    """The collector's default state directory (spool + checkpoints) for the store at ``url``:

    * a SQLite file ``DIR/NAME.db``: ``DIR/NAME.db-state`` beside it (as SQLite keeps its own
      ``-wal`` and ``-shm`` files), so the state goes wherever the database goes;
    * any other store: ``$XDG_STATE_HOME/kvscope/<dialect>-<host>-<port>-<database>-<hash>``
      (``$HOME/.local/state`` when XDG_STATE_HOME is unset, as the XDG Base Directory spec says),
      one per store: spooled windows are only ever written to the store they were meant for;
    * an in-memory SQLite database: None (nothing outlives the process anyway).
    """
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return None
    database = parsed.database or ""
    if parsed.get_backend_name() == "sqlite":
        if database in ("", ":memory:") or "mode=memory" in database:
            return None
        if not database.startswith("file:"):
            db = Path(database).expanduser()
            return db.with_name(db.name + "-state")
    base = Path(env.get("XDG_STATE_HOME") or Path(env.get("HOME", "~")) / ".local" / "state")
    redacted = parsed.render_as_string(hide_password=True)
    parts = [parsed.get_backend_name(), parsed.host or "local", str(parsed.port or ""), database]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(p for p in parts if p))[:80]
    digest = hashlib.sha256(redacted.encode()).hexdigest()[:8]
    return base.expanduser() / "kvscope" / f"{name}-{digest}"
