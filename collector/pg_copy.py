"""PostgreSQL's binary COPY format, read: the fields of each tuple of a ``COPY … TO STDOUT
(FORMAT BINARY)`` stream, as memoryviews into the chunks the driver hands over (no copy of
a field that arrives in one chunk).

The format (PostgreSQL docs, "COPY", Binary Format): an 11-byte signature, a 4-byte flags
field, a 4-byte header-extension length and the extension; then per tuple a 16-bit field
count and per field a 32-bit length (-1: NULL) and that many bytes; a field count of -1 ends
the stream. Numbers are big-endian.

:func:`copy_streams` runs several such COPYs at once, each on its own connection, all in one
snapshot (``pg_export_snapshot``): the server's work, most of a big read, then runs on as
many backends, while the client takes their tuples one at a time.
"""

from __future__ import annotations

import re
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from core.errors import StoreError

SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_HEADER = 19  # signature, flags, extension length
Fields = list[memoryview | None]  # one tuple's fields; None for a NULL
Chunk = bytes | bytearray | memoryview


def copy_tuples(chunks: Iterable[Chunk], n_fields: int) -> Iterator[Fields]:
    """The fields of each tuple of the stream, in order (chunks split anywhere); a StoreError
    for a stream that is not binary COPY or has tuples of another width."""
    pending = b""
    header = ended = False
    for chunk in chunks:  # read to the end, past the trailer: the driver ends the COPY
        if ended:
            continue
        data = memoryview(pending + bytes(chunk) if pending else chunk).cast("B")
        pos = 0
        if not header:
            if len(data) < _HEADER:
                pending = bytes(data)
                continue
            if bytes(data[: len(SIGNATURE)]) != SIGNATURE:
                raise StoreError("COPY BINARY: unexpected header")
            if len(data) < _HEADER + struct.unpack_from(">i", data, 15)[0]:
                pending = bytes(data)
                continue
            pos = _HEADER + struct.unpack_from(">i", data, 15)[0]
            header = True
        while (parsed := _copy_tuple(data, pos, n_fields)) is not None:
            fields, pos = parsed
            if fields is None:  # the trailer
                ended = True
                break
            yield fields
        pending = bytes(data[pos:])


def _copy_tuple(data: memoryview, pos: int, n_fields: int) -> tuple[Fields | None, int] | None:
    """The fields of the tuple at ``pos`` and the position after it (fields None: the
    trailer); None when the tuple is not all in ``data`` yet."""
    if len(data) - pos < 2:
        return None
    (count,) = struct.unpack_from(">h", data, pos)
    if count == -1:
        return None, len(data)
    if count != n_fields:
        raise StoreError(f"COPY BINARY: {count} fields, expected {n_fields}")
    p = pos + 2
    fields: Fields = []
    for _ in range(n_fields):
        if len(data) - p < 4:
            return None
        (size,) = struct.unpack_from(">i", data, p)
        p += 4
        if size == -1:
            fields.append(None)
            continue
        if len(data) - p < size:
            return None
        fields.append(data[p : p + size])
        p += size
    return fields, p


_SNAPSHOT = re.compile(r"[0-9A-Fa-f]+(-[0-9A-Fa-f]+)+")  # what pg_export_snapshot returns


class _Stopped(StoreError):
    """A stream stopped because another failed (that one's error is the one raised)."""


def copy_streams(
    conn: Connection,
    statements: Sequence[str],
    params: Any,
    n_fields: int,
    sink: Callable[[Fields], None],
) -> None:
    """Run the ``COPY … TO STDOUT (FORMAT BINARY)`` statements at once and hand every tuple
    to ``sink`` (one call at a time, in no fixed order across statements). The first runs on
    ``conn``, which must be in a REPEATABLE READ transaction; each other on a connection of
    its pool in the same snapshot (when the pool or the server has none to give, they all run
    on ``conn``, one after the other). A stream that fails stops the others at their next
    tuple; a connection left inside a COPY is invalidated (its rollback would fail)."""
    others: list[Connection] = []
    try:
        if len(statements) > 1:
            others = _in_snapshot(conn, len(statements) - 1)
        if not others:
            for sql in statements:
                _drain(conn, sql, params, n_fields, sink, threading.Event())
            return
        lock, failed = threading.Lock(), threading.Event()

        def locked(fields: Fields) -> None:
            with lock:
                sink(fields)

        with ThreadPoolExecutor(max_workers=len(others)) as pool:
            futures = [
                pool.submit(_drain, c, sql, params, n_fields, locked, failed)
                for c, sql in zip(others, statements[1:], strict=True)
            ]
            errors: list[BaseException] = []
            try:
                _drain(conn, statements[0], params, n_fields, locked, failed)
            except BaseException as exc:
                errors.append(exc)
            errors += [e for f in futures if (e := f.exception()) is not None]
        if errors:  # the first failure, not a stream it stopped
            raise min(errors, key=lambda e: isinstance(e, _Stopped))
    finally:
        for other in others:
            other.close()


def _in_snapshot(conn: Connection, n: int) -> list[Connection]:
    """``n`` more connections of ``conn``'s pool in its transaction's snapshot; none when
    one cannot be had (the server's max_connections reached, say)."""
    snapshot = str(conn.exec_driver_sql("SELECT pg_export_snapshot()").scalar())
    if not _SNAPSHOT.fullmatch(snapshot):  # pragma: no cover - PostgreSQL's own format
        raise StoreError(f"unexpected snapshot id {snapshot!r}")
    out: list[Connection] = []
    try:
        for _ in range(n):
            other = conn.engine.connect()
            out.append(other)
            other.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            other.exec_driver_sql(f"SET TRANSACTION SNAPSHOT '{snapshot}'")
    except (SQLAlchemyError, OSError):
        for other in out:
            other.close()
        return []
    return out


def _drain(  # noqa: PLR0917 - one stream's part of copy_streams
    conn: Connection,
    sql: str,
    params: Any,
    n_fields: int,
    sink: Callable[[Fields], None],
    failed: threading.Event,
) -> None:
    """One COPY's tuples into ``sink``; on any failure ``failed`` is set and the connection
    dropped."""
    raw = conn.connection.driver_connection
    try:
        with raw.cursor() as cursor, cursor.copy(sql, params or None) as copy:  # type: ignore[union-attr]
            for fields in copy_tuples(copy, n_fields):
                if failed.is_set():
                    raise _Stopped("another COPY stream failed")
                sink(fields)
    except BaseException:
        failed.set()
        conn.invalidate()
        raise
