"""The spool: windows and scrape outcomes the store refused, kept on local disk until it takes them.

Following PostgreSQL's WAL and Prometheus' WAL segments: a refused batch becomes fsync'd,
checksummed segment files (memory only when the disk refuses), bounded by ``max_bytes``
(oldest dropped first, counted); every write first replays the spool oldest first, deleting
a segment only once the store took all of it (the store's upserts make a replay harmless).
A segment refused for its content is set aside as ``NAME.bad`` after MAX_REJECTIONS.

Design: collector/DESIGN.md#spool
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from core.errors import ConfigError, KvscopeError
from core.records import ScrapeOutcome, Window

log = logging.getLogger(__name__)

FORMAT = 1
SEGMENT_SUFFIX = ".seg"
DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB: ~3.5 M windows (~300 bytes each as JSON)
DEFAULT_MEMORY_RECORDS = 100_000
DEFAULT_SEGMENT_RECORDS = 50_000
MAX_REJECTIONS = 3
TMP_MAX_AGE_S = 60.0
# <time ns>-<pid>-<seq>-<store tag>-w<windows>-o<outcomes>.seg: sorted by name = by time.
_NAME = re.compile(r"^\d{20}-\d+-\d{6}-([0-9a-f]{12})-w(\d+)-o(\d+)\.seg$")
_WINDOW_FIELDS = tuple(f.name for f in fields(Window))
# A window without bucket counts is written without its last two fields (bucket_bounds,
# bucket_counts): the lines of the windows of nearly every signal keep the shorter field
# list, and segments written with it are read as they are.
_BUCKET_FIELDS = ("bucket_bounds", "bucket_counts")
_PLAIN_FIELDS = tuple(f for f in _WINDOW_FIELDS if f not in _BUCKET_FIELDS)
_OUTCOME_FIELDS = tuple(f.name for f in fields(ScrapeOutcome))
_TRANSIENT = ("OperationalError", "InterfaceError", "DisconnectionError", "TimeoutError")


class Sink(Protocol):
    """Where spooled records go (store.store.Store satisfies it)."""

    def write_windows(self, windows: Sequence[Window]) -> int: ...
    def write_outcomes(self, outcomes: Sequence[ScrapeOutcome]) -> int: ...


@dataclass
class SpoolCounts:
    """What the spool did since the collector started (CollectStats.spool, the summary)."""

    spooled_windows: int = 0  # refused by the store, put in the spool
    replayed_windows: int = 0  # written from the spool (leftovers of an earlier run included)
    dropped_windows: int = 0  # lost: past a bound, or a segment set aside as bad
    recovered_windows: int = 0  # found in the spool directory at start
    pending_windows: int = 0  # in the spool now
    spooled_outcomes: int = 0
    replayed_outcomes: int = 0
    dropped_outcomes: int = 0
    pending_outcomes: int = 0
    pending_bytes: int = 0  # on disk

    def summary(self) -> dict[str, int]:
        return {
            "spooled_windows": self.spooled_windows,
            "replayed_windows": self.replayed_windows,
            "dropped_windows": self.dropped_windows,
            "recovered_windows": self.recovered_windows,
            "pending_windows": self.pending_windows,
            "dropped_outcomes": self.dropped_outcomes,
            "pending_outcomes": self.pending_outcomes,
            "pending_bytes": self.pending_bytes,
        }


@dataclass(frozen=True, slots=True)
class Written:
    """One :meth:`Spool.write`: records the store took (replayed ones included) and, when it
    refused something, its error (what it refused is in the spool)."""

    windows: int = 0
    outcomes: int = 0
    replayed_windows: int = 0
    error: KvscopeError | None = None


@dataclass(slots=True)
class _Drain:
    """One pass over the spool: what the store took, its last error, whether the pass went
    through (not stopped by the store's unavailability or the time budget), and the segments
    it refused for their content (with why)."""

    windows: int = 0
    outcomes: int = 0
    error: KvscopeError | None = None
    through: bool = True
    refused: list[tuple[_Segment, str]] = field(default_factory=list)


@dataclass(slots=True)
class _Segment:
    name: str
    windows: int
    outcomes: int
    path: Path | None = None  # on disk; None: in memory
    size: int = 0
    held: tuple[list[Window], list[ScrapeOutcome]] | None = None  # in memory


def is_transient(exc: BaseException) -> bool:
    """A store error of availability (connection refused or lost, database locked, timeout,
    an OS error) rather than of content: anything in its cause chain of such a class."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) or any(c.__name__ in _TRANSIENT for c in type(seen).__mro__):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class Spool:
    """Records the store refused, kept until it takes them (DESIGN.md#spool).

    ``directory`` None keeps them in memory only (bounded by ``memory_records``).
    ``store_id`` names the store the segments are for (the redacted URL).
    """

    def __init__(
        self,
        directory: Path | None,
        *,
        store_id: str,
        max_bytes: int = DEFAULT_MAX_BYTES,
        memory_records: int = DEFAULT_MEMORY_RECORDS,
        segment_records: int = DEFAULT_SEGMENT_RECORDS,
        counts: SpoolCounts | None = None,
    ) -> None:
        if max_bytes < 0 or memory_records < 0 or segment_records < 1:
            raise ConfigError(
                f"spool bounds must be >= 0 (segments >= 1): max_bytes={max_bytes}, "
                f"memory_records={memory_records}, segment_records={segment_records}"
            )
        self.directory = directory
        self.store_id = store_id
        self.max_bytes = max_bytes
        self.memory_records = memory_records
        self.segment_records = segment_records
        self.counts = counts if counts is not None else SpoolCounts()
        self._memory: list[_Segment] = []
        self._seq = itertools.count()
        self._rejections: dict[str, int] = {}
        self._tag = hashlib.sha256(store_id.encode()).hexdigest()[:12]
        if directory is not None:
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"spool directory {directory}: {exc.strerror or exc}") from exc
            self._refresh()
            found = self.counts.pending_windows
            self.counts.recovered_windows = found
            if found or self.counts.pending_outcomes:
                log.warning(
                    "spool: %d windows and %d outcomes of an earlier run found in %s: "
                    "writing them first",
                    found, self.counts.pending_outcomes, directory,
                )  # fmt: skip

    # -- the write path ---------------------------------------------------------------------

    def write(
        self,
        sink: Sink,
        windows: Sequence[Window] = (),
        outcomes: Sequence[ScrapeOutcome] = (),
        *,
        budget_s: float | None = None,
    ) -> Written:
        """Drain the spool (oldest first, for at most ``budget_s``), then write ``windows`` and
        ``outcomes`` if it is empty; whatever the store refused is spooled. Never raises a
        KvscopeError (it is in the result)."""
        drain = self._drain(sink, budget_s)
        error, accepted = drain.error, drain.windows + drain.outcomes > 0
        windows, outcomes = list(windows), list(outcomes)
        written_w = written_o = 0
        if drain.through:
            try:
                written_o = sink.write_outcomes(outcomes) if outcomes else 0
                outcomes = []
                written_w = sink.write_windows(windows) if windows else 0
                windows = []
                accepted = True
            except KvscopeError as exc:
                error = exc
        if accepted:  # the store takes writes: what it refused, it refused for its content
            for seg, why in drain.refused:
                self._rejected(seg, why)
        if windows or outcomes:
            self.add(windows, outcomes)
        self._refresh()
        return Written(
            windows=drain.windows + written_w,
            outcomes=drain.outcomes + written_o,
            replayed_windows=drain.windows,
            error=error,
        )

    def add(self, windows: Sequence[Window], outcomes: Sequence[ScrapeOutcome] = ()) -> None:
        """Keep ``windows`` and ``outcomes`` for a later write: on disk, else in memory."""
        self.counts.spooled_windows += len(windows)
        self.counts.spooled_outcomes += len(outcomes)
        records: list[Window | ScrapeOutcome] = [*outcomes, *windows]
        for i in range(0, len(records), self.segment_records):
            chunk = records[i : i + self.segment_records]
            ws = [r for r in chunk if isinstance(r, Window)]
            os_ = [r for r in chunk if isinstance(r, ScrapeOutcome)]
            name = self._name(len(ws), len(os_))
            if self.directory is not None:
                try:
                    self._write_segment(name, ws, os_)
                    continue
                except OSError as exc:
                    log.error(
                        "spool: cannot write %s in %s (%s): keeping %d records in memory",
                        name, self.directory, exc.strerror or exc, len(chunk),
                    )  # fmt: skip
            self._memory.append(_Segment(name, len(ws), len(os_), held=(ws, os_)))
        self._bound()
        self._refresh()

    # -- draining ---------------------------------------------------------------------------

    def _drain(self, sink: Sink, budget_s: float | None) -> _Drain:
        """Write the spooled segments oldest first, for at most ``budget_s``; stop at the
        first error of the store's availability. A segment refused for another reason is
        passed over (the ones behind it still go) and listed in ``refused``."""
        started = time.monotonic()
        drain = _Drain()
        for seg in self._segments():
            if budget_s is not None and time.monotonic() - started > budget_s:
                drain.through = False
                break
            try:
                loaded = self._load(seg)
            except FileNotFoundError:
                continue  # another collector of this store replayed it meanwhile
            except OSError as exc:  # unreadable now: retried (set aside after a few tries)
                log.error("spool: cannot read %s: %s", seg.path, exc.strerror or exc)
                drain.refused.append((seg, f"unreadable: {exc.strerror or exc}"))
                continue
            if loaded is None:
                continue  # set aside as bad
            ws, os_ = loaded
            try:
                if os_:
                    sink.write_outcomes(os_)
                if ws:
                    sink.write_windows(ws)
            except KvscopeError as exc:
                drain.error = exc
                if is_transient(exc):
                    drain.through = False
                    break
                drain.refused.append((seg, str(exc)))
                continue
            self._remove(seg)
            self._rejections.pop(seg.name, None)
            drain.windows += len(ws)
            drain.outcomes += len(os_)
            self.counts.replayed_windows += len(ws)
            self.counts.replayed_outcomes += len(os_)
        if drain.windows or drain.outcomes:
            self._refresh()
            log.warning(
                "spool: the store took %d spooled windows and %d outcomes back (%d windows "
                "still spooled)", drain.windows, drain.outcomes, self.counts.pending_windows,
            )  # fmt: skip
        return drain

    def _rejected(self, seg: _Segment, why: str) -> None:
        """The store refused this segment while it took other writes: set it aside after
        MAX_REJECTIONS such tries (a store that refuses everything, a dropped table say,
        sets nothing aside: all of it waits for the operator)."""
        tries = self._rejections.get(seg.name, 0) + 1
        self._rejections[seg.name] = tries
        if tries >= MAX_REJECTIONS:
            self._rejections.pop(seg.name, None)
            self._set_aside(seg, f"refused {tries} times: {why}")

    def _segments(self) -> list[_Segment]:
        """Every pending segment, oldest first: this store's in the directory, and memory's."""
        on_disk = self._scan() if self.directory is not None else []
        return sorted([*on_disk, *self._memory], key=lambda s: s.name)

    def _scan(self) -> list[_Segment]:
        assert self.directory is not None
        found: list[_Segment] = []
        try:
            entries = list(os.scandir(self.directory))
        except OSError as exc:
            log.error("spool: cannot list %s: %s", self.directory, exc.strerror or exc)
            return []
        now = time.time()
        for entry in entries:
            if entry.name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    if now - entry.stat().st_mtime > TMP_MAX_AGE_S:
                        os.unlink(entry.path)  # a crash mid-write: never a whole segment
                continue
            m = _NAME.match(entry.name)
            if m is None or m.group(1) != self._tag:
                continue  # not a segment, or another store's
            try:
                size = entry.stat().st_size
            except FileNotFoundError:
                continue
            found.append(
                _Segment(entry.name, int(m.group(2)), int(m.group(3)), Path(entry.path), size)
            )
        return sorted(found, key=lambda s: s.name)

    def _load(self, seg: _Segment) -> tuple[list[Window], list[ScrapeOutcome]] | None:
        """The segment's records (None: it was set aside as bad)."""
        if seg.held is not None:
            return seg.held
        assert seg.path is not None
        data = seg.path.read_bytes()
        try:
            store, ws, os_ = _decode(data)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            self._set_aside(seg, f"unreadable: {exc}")
            return None
        if store != self.store_id:  # a store tag collision (or a renamed file)
            self._set_aside(seg, f"it is for another store ({store})")
            return None
        return ws, os_

    # -- disk -------------------------------------------------------------------------------

    def _name(self, windows: int, outcomes: int) -> str:
        seq = next(self._seq) % 1_000_000
        stamp = f"{time.time_ns():020d}-{os.getpid()}-{seq:06d}-{self._tag}"
        return f"{stamp}-w{windows}-o{outcomes}{SEGMENT_SUFFIX}"

    def _write_segment(self, name: str, ws: list[Window], os_: list[ScrapeOutcome]) -> None:
        assert self.directory is not None
        final = self.directory / name
        tmp = final.with_suffix(".tmp")
        data = _encode(self.store_id, ws, os_)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        _fsync_dir(self.directory)

    def _remove(self, seg: _Segment) -> None:
        if seg.path is None:
            self._memory.remove(seg)
            return
        with contextlib.suppress(FileNotFoundError):
            seg.path.unlink()
        assert self.directory is not None
        _fsync_dir(self.directory)

    def _set_aside(self, seg: _Segment, why: str) -> None:
        self._drop(seg, f"set aside ({why})")
        if seg.path is None:
            return
        bad = seg.path.with_suffix(".bad")
        try:
            os.replace(seg.path, bad)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.error("spool: cannot rename %s: %s", seg.path, exc.strerror or exc)
            return
        log.error("spool: %s kept as %s for inspection", seg.path.name, bad)

    def _drop(self, seg: _Segment, why: str) -> None:
        self.counts.dropped_windows += seg.windows
        self.counts.dropped_outcomes += seg.outcomes
        log.error(
            "spool: DROPPED %d windows and %d outcomes: %s (%d windows dropped so far)",
            seg.windows, seg.outcomes, why, self.counts.dropped_windows,
        )  # fmt: skip
        if seg.path is None:
            with contextlib.suppress(ValueError):
                self._memory.remove(seg)

    def _bound(self) -> None:
        """Drop the oldest past the bounds: memory's records, then the directory's bytes."""
        held = sum(s.windows + s.outcomes for s in self._memory)
        for seg in list(self._memory):
            if held <= self.memory_records:
                break
            held -= seg.windows + seg.outcomes
            self._drop(seg, f"over the in-memory bound of {self.memory_records} records")
        if self.directory is None:
            return
        on_disk = self._scan()
        total = sum(s.size for s in on_disk)
        for seg in on_disk[:-1]:  # sorted by name: oldest first; the newest batch stays
            if total <= self.max_bytes:
                break
            assert seg.path is not None
            total -= seg.size
            with contextlib.suppress(FileNotFoundError):
                seg.path.unlink()
                self._drop(seg, f"the spool is over its bound of {self.max_bytes} bytes")
        _fsync_dir(self.directory)

    def _refresh(self) -> None:
        segments = self._segments()
        self.counts.pending_windows = sum(s.windows for s in segments)
        self.counts.pending_outcomes = sum(s.outcomes for s in segments)
        self.counts.pending_bytes = sum(s.size for s in segments)

    @property
    def empty(self) -> bool:
        return not self._segments()


# --------------------------------------------------------------------------- the format


def _encode(store: str, windows: Sequence[Window], outcomes: Sequence[ScrapeOutcome]) -> bytes:
    head = {"kvscope_spool": FORMAT, "store": store, "windows": len(windows),
            "outcomes": len(outcomes), "created": time.time()}  # fmt: skip
    lines = [json.dumps(head)]
    lines += (json.dumps(["o", *(getattr(o, f) for f in _OUTCOME_FIELDS)]) for o in outcomes)
    lines += (
        json.dumps(["w", *(getattr(w, f) for f in (_WINDOW_FIELDS if w.bucket_counts
                                                     else _PLAIN_FIELDS))])
        for w in windows
    )  # fmt: skip
    body = ("\n".join(lines) + "\n").encode()
    trailer = {"end": len(windows) + len(outcomes), "sha256": hashlib.sha256(body).hexdigest()}
    return body + json.dumps(trailer).encode() + b"\n"


def _decode(data: bytes) -> tuple[str, list[Window], list[ScrapeOutcome]]:
    """(store, windows, outcomes) of a segment; ValueError when it is not whole."""
    body, sep, last = data.rstrip(b"\n").rpartition(b"\n")
    if not sep:
        raise ValueError("no trailer")
    trailer = json.loads(last)
    body += b"\n"
    if trailer.get("sha256") != hashlib.sha256(body).hexdigest():
        raise ValueError("checksum mismatch (torn or altered)")
    head, *rows = body.decode().splitlines()
    header = json.loads(head)
    if header.get("kvscope_spool") != FORMAT:
        raise ValueError(f"unknown spool format {header.get('kvscope_spool')!r}")
    if trailer["end"] != len(rows) or header["windows"] + header["outcomes"] != len(rows):
        raise ValueError(f"{len(rows)} records where {trailer['end']} were written")
    windows: list[Window] = []
    outcomes: list[ScrapeOutcome] = []
    for row in map(json.loads, rows):
        tag, *values = row
        if tag == "w":
            names = _PLAIN_FIELDS if len(values) == len(_PLAIN_FIELDS) else _WINDOW_FIELDS
            w: dict[str, Any] = dict(zip(names, values, strict=True))
            w["labels"] = tuple((str(k), str(v)) for k, v in w["labels"])
            for name in _BUCKET_FIELDS:
                w[name] = tuple(map(float, w.get(name, ())))
            windows.append(Window(**w))
        elif tag == "o":
            outcomes.append(ScrapeOutcome(**dict(zip(_OUTCOME_FIELDS, values, strict=True))))
        else:
            raise ValueError(f"unknown record tag {tag!r}")
    return str(header["store"]), windows, outcomes


def _fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in ``directory`` durable (POSIX: fsync the directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
