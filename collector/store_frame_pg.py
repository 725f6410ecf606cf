"""PostgreSQL half of Store.read_frame: one COPY BINARY, parsed by numpy (no object per row).

Per block of rows the server sends one tuple whose fields are whole columns: for each
column, the fixed-width binary values of the block's rows concatenated into one bytea
(``string_agg(float8send(…))``; NULL sent as NaN). A row's series is its source's 64-bit
hash (names from a loose index scan of the distinct sources, checked for collisions), the
16 bytes of its series key and a kind code; the signal and labels come from one look-up per
distinct series. Identities are checked exactly: a 64-bit mix that merged two series falls
back to a sort of the full tuples. Blocks are ranges of table ids (the table in its physical
order) when most rows match, else groups of the rows the indexes find (the planner's
estimate decides).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Connection, and_

from collector.errors import StoreError
from collector.store_columns import INT_COLUMNS, compiled_sql, dtype_of, first_positions

if TYPE_CHECKING:
    import numpy.typing as npt

    from collector.store_columns import IntArray, RankFn, Series

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
    fields = [
        ("src", ">i8", f"int8send(hashtextextended(windows.source, {seed}))"),
        ("key", ">u8", "decode(windows.series_key, 'hex')"),
        ("kind", ">i2", f"int2send((CASE windows.kind {kind} ELSE {len(_KINDS)} END)::int2)"),
        *(
            (c, ">i8", f"int8send(windows.{c}::int8)") if c in INT_COLUMNS
            else (c, ">f8", f"float8send(coalesce(windows.{c}, 'NaN'::float8))")
            for c in numeric
        ),
    ]  # fmt: skip
    aggs = ", ".join(f"string_agg({expr}, NULL)" for _, _, expr in fields)
    total = int(bounds[1]) - int(bounds[0]) + 1
    if _estimate(conn, where, params) * 6 < total:  # few rows: let the indexes find them
        body = f"SELECT {aggs} FROM windows WHERE {where} GROUP BY windows.id / {_BLOCK}"
    else:  # most rows: read the table in blocks of ids, in its physical order
        body = (
            f"SELECT x.* FROM generate_series({int(bounds[0])}, {int(bounds[1])}, {_BLOCK}) "
            f"AS b(lo), LATERAL (SELECT {aggs} FROM windows WHERE windows.id >= b.lo AND "
            f"windows.id < b.lo + {_BLOCK} AND ({where})) AS x"
        )
    parts: dict[str, list[npt.NDArray[Any]]] = {name: [] for name, _, _ in fields}
    raw = conn.connection.driver_connection
    sql = f"COPY ({body}) TO STDOUT (FORMAT BINARY)"
    try:
        with raw.cursor() as cursor, cursor.copy(sql, params or None) as copy:  # type: ignore[union-attr]
            for block in _copy_tuples(copy, len(fields)):
                for (name, dtype, _), data in zip(fields, block, strict=True):
                    parts[name].append(np.frombuffer(data, dtype=dtype).astype(dtype[1:]))
    except Exception:
        # A COPY cut short (the server gone mid-stream) leaves the driver inside the command:
        # the pool's rollback on return would fail and log a traceback. Drop the connection.
        conn.invalidate()
        raise
    if not parts["src"]:
        return empty
    col = {name: np.concatenate(chunks) for name, chunks in parts.items()}
    key = col["key"].reshape(-1, 2)
    sid, first = _series_codes(col["src"], key[:, 0], key[:, 1], col["kind"])
    heads = {name: col[name][first] for name in ("src", "kind", "start")}
    heads["hi"], heads["lo"] = key[first, 0], key[first, 1]
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
    nums = {c: col[c].astype(dtype_of(c), copy=False) for c in numeric}
    return series, sid, nums


def _estimate(conn: Connection, where: str, params: Any) -> float:
    """The planner's estimate of the rows matching ``where`` (its statistics: no scan)."""
    plan = conn.exec_driver_sql(
        f"EXPLAIN (FORMAT JSON) SELECT 1 FROM windows WHERE {where}", params or None
    ).scalar()
    return float(plan[0]["Plan"]["Plan Rows"])  # type: ignore[index]


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


def _copy_tuples(chunks: Iterable[Any], n_fields: int) -> Iterator[list[memoryview]]:
    """The fields of each tuple of a binary COPY stream whose fields are all non-NULL
    (a tuple of NULLs, an empty block, is skipped)."""
    pending = b""
    header = False
    for chunk in chunks:
        data = memoryview(pending + bytes(chunk) if pending else chunk).cast("B")
        pos = 0
        if not header:
            if len(data) < 19:
                pending = bytes(data)
                continue
            if bytes(data[:11]) != _PGCOPY:
                raise StoreError("COPY BINARY: unexpected header")
            pos = 19 + struct.unpack_from(">i", data, 15)[0]
            header = True
        while True:
            parsed = _copy_tuple(data, pos, n_fields)
            if parsed is None:
                break
            fields, pos = parsed
            if fields:
                yield fields
        pending = bytes(data[pos:])


def _copy_tuple(data: memoryview, pos: int, n_fields: int) -> tuple[list[memoryview], int] | None:
    """The fields of the tuple at ``pos`` and the position after it; None when incomplete;
    no fields for the trailer or a tuple with a NULL."""
    if len(data) - pos < 2:
        return None
    (count,) = struct.unpack_from(">h", data, pos)
    if count == -1:  # trailer
        return [], len(data)
    if count != n_fields:
        raise StoreError(f"COPY BINARY: {count} fields, expected {n_fields}")
    p, fields, null = pos + 2, [], False
    for _ in range(n_fields):
        if len(data) - p < 4:
            return None
        (size,) = struct.unpack_from(">i", data, p)
        p += 4
        if size == -1:
            null = True
            continue
        if len(data) - p < size:
            return None
        fields.append(data[p : p + size])
        p += size
    return ([] if null else fields), p


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
