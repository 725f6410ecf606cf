"""PostgreSQL half of Store.read_frame: one COPY BINARY, parsed by numpy (no object per row).

The server packs each window into a fixed-width record (source hash, the 16 bytes of the
series key, a kind code, then every asked value: NULL as NaN) and concatenates the records
of each block of table ids into one bytea; numpy.frombuffer reads a block at once. The
series are then named by one look-up per distinct series (signal, labels; a kind outside
the four known ones), the source hashes by a loose index scan of the distinct sources.
Row identities are checked exactly: a 64-bit mix that merged two series falls back to a
sort of the full tuples.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Connection, and_

from collector.errors import StoreError
from collector.store_frame import INT_COLUMNS, compiled_sql, dtype_of, first_positions

if TYPE_CHECKING:
    import numpy.typing as npt

    from collector.store_frame import IntArray, RankFn, Series

_BLOCK = 65_536  # table ids per COPY row
_PGCOPY = b"PGCOPY\n\xff\r\n\x00"
_KINDS = ("counter", "gauge", "histogram", "ratio")  # kind codes 0-3; 4: another (looked up)
_SKIP_SCAN = (  # every distinct source by index seeks (a loose index scan)
    "WITH RECURSIVE s(x) AS (SELECT min(source) FROM windows UNION ALL "
    "SELECT (SELECT min(source) FROM windows WHERE source > s.x) FROM s WHERE s.x IS NOT NULL) "
    "SELECT x, hashtextextended(x, %(seed)s) FROM s WHERE x IS NOT NULL"
)


def read_postgres(
    conn: Connection, conds: list[ColumnElement[bool]], numeric: Sequence[str]
) -> tuple[list[Series], IntArray, dict[str, npt.NDArray[Any]]]:
    """One COPY BINARY of one bytea per block of table ids: fixed-width records (source
    hash, series key, kind code, values) packed by the server, read by numpy.frombuffer."""
    import numpy as np

    empty: tuple[list[Series], IntArray, dict[str, npt.NDArray[Any]]] = (
        [],
        np.zeros(0, dtype=np.int64),
        {c: np.zeros(0, dtype=dtype_of(c)) for c in numeric},
    )
    bounds = conn.exec_driver_sql("SELECT min(id), max(id) FROM windows").one()
    if bounds[0] is None:
        return empty
    for seed in range(4):  # a seed under which every source has its own 64-bit hash
        listed = conn.exec_driver_sql(_SKIP_SCAN, {"seed": seed}).all()
        names = {int(h): str(x) for x, h in listed}
        if len(names) == len(listed):
            break
    else:  # pragma: no cover - four 64-bit collisions
        raise StoreError("source names collide under every hash seed (hashtextextended)")
    where, params = compiled_sql(conn, and_(*conds)) if conds else ("TRUE", {})
    kind = " ".join(f"WHEN '{k}' THEN {i}" for i, k in enumerate(_KINDS))
    parts = [
        f"int8send(hashtextextended(windows.source, {seed}))",
        "decode(windows.series_key, 'hex')",
        f"int2send((CASE windows.kind {kind} ELSE {len(_KINDS)} END)::int2)",
        *(
            f"int8send(windows.{c}::int8)" if c in INT_COLUMNS
            else f"float8send(coalesce(windows.{c}, 'NaN'::float8))"
            for c in numeric
        ),
    ]  # fmt: skip
    sql = (
        f"COPY (SELECT x.r FROM generate_series({int(bounds[0])}, {int(bounds[1])}, {_BLOCK}) "
        f"AS b(lo), LATERAL (SELECT string_agg({' || '.join(parts)}, ''::bytea) AS r FROM "
        f"windows WHERE windows.id >= b.lo AND windows.id < b.lo + {_BLOCK} AND ({where})) "
        "AS x) TO STDOUT (FORMAT BINARY)"
    )
    record = np.dtype(
        [("src", ">i8"), ("hi", ">u8"), ("lo", ">u8"), ("kind", ">i2")]
        + [(c, ">i8" if c in INT_COLUMNS else ">f8") for c in numeric]
    )
    raw = conn.connection.driver_connection
    with raw.cursor() as cursor, cursor.copy(sql, params or None) as copy:  # type: ignore[union-attr]
        blocks = [np.frombuffer(field, dtype=record) for field in _copy_fields(copy)]
    if not blocks:
        return empty
    rec = np.concatenate(blocks)
    sid, first = _series_codes(rec["src"], rec["hi"], rec["lo"], rec["kind"])
    heads = rec[first]
    keys = [f"{int(h):016x}{int(lo):016x}" for h, lo in zip(heads["hi"], heads["lo"], strict=True)]
    sources = [names[int(h)] for h in heads["src"]]
    found = conn.exec_driver_sql(
        "SELECT u.i, w.signal, w.labels, w.kind FROM unnest(%(s)s::text[], %(t)s::float8[], "
        "%(k)s::text[]) WITH ORDINALITY AS u(source, start, series_key, i) JOIN windows AS w "
        "ON w.source = u.source AND w.start = u.start AND w.series_key = u.series_key",
        {"s": sources, "t": heads["start"].astype(float).tolist(), "k": keys},
    ).all()
    looked = {int(r[0]) - 1: (str(r[1]), str(r[2]), str(r[3])) for r in found}
    if len(looked) != len(keys):  # pragma: no cover - rows read in this same snapshot
        raise StoreError("a series vanished while reading windows")
    series = [
        (src, looked[i][0], _KINDS[k] if k < len(_KINDS) else looked[i][2], looked[i][1])
        for i, (src, k) in enumerate(zip(sources, heads["kind"].tolist(), strict=True))
    ]
    nums = {c: rec[c].astype(dtype_of(c)) for c in numeric}
    return series, sid, nums


def _series_codes(*columns: npt.NDArray[Any]) -> tuple[IntArray, IntArray]:
    """(code per row, first row of each code) of the rows' tuples of integer columns."""
    import numpy as np
    import pandas as pd

    mix = np.zeros(columns[0].size, dtype=np.uint64)
    for i, col in enumerate(columns):  # a 64-bit mix, checked exactly below
        mix = (mix ^ col.astype(np.uint64)) * np.uint64(0x9E3779B97F4A7C15 + 2 * i)
    codes, _ = pd.factorize(mix.view(np.int64))
    first = first_positions(codes)
    if all(np.array_equal(col, col[first][codes]) for col in columns):
        return codes.astype(np.int64, copy=False), first
    both = np.rec.fromarrays([c.astype(np.int64) for c in columns])  # pragma: no cover
    _, first, inverse = np.unique(both, return_index=True, return_inverse=True)  # pragma: no cover
    return inverse.reshape(-1).astype(np.int64), first  # pragma: no cover


def _copy_fields(chunks: Iterable[Any]) -> Iterator[bytes]:
    """The non-NULL field of each one-field tuple of a binary COPY stream."""
    pending = b""
    header = False
    for chunk in chunks:
        data = pending + bytes(chunk) if pending else bytes(chunk)
        pos = 0
        if not header:
            if len(data) < 19:
                pending = data
                continue
            if data[:11] != _PGCOPY:
                raise StoreError("COPY BINARY: unexpected header")
            pos = 19 + struct.unpack_from(">i", data, 15)[0]
            header = True
        while len(data) - pos >= 2:
            (count,) = struct.unpack_from(">h", data, pos)
            if count == -1:  # trailer
                pos = len(data)
                break
            if count != 1:
                raise StoreError(f"COPY BINARY: {count} fields, expected 1")
            if len(data) - pos < 6:
                break
            (size,) = struct.unpack_from(">i", data, pos + 2)
            if size == -1:  # an empty block
                pos += 6
                continue
            if len(data) - pos - 6 < size:
                break
            yield data[pos + 6 : pos + 6 + size]
            pos += 6 + size
        pending = data[pos:]


def pg_ranks(conn: Connection) -> RankFn:
    """Dense ranks by the database's own text order (the collation read_windows sorts by)."""

    def ranks(_what: str, values: Sequence[str]) -> list[int]:
        distinct = sorted(set(values))
        rows = conn.exec_driver_sql(
            "SELECT v FROM unnest(%(v)s::text[]) AS u(v) ORDER BY v", {"v": distinct}
        ).all()
        order = {str(r[0]): i for i, r in enumerate(rows)}
        return [order[v] for v in values]

    return ranks
