"""PostgreSQL half of Store.read_frame: one COPY BINARY, parsed by numpy (no object per row).

Per block of rows the server sends one tuple whose fields are whole columns: for each
column, the binary values of the block's rows concatenated into one bytea
(``string_agg(float8send(…))``). A row's series is its source's 64-bit hash (names from a
loose index scan of the distinct sources, checked for collisions), the 16 bytes of its series
key and its kind; the signal and labels come from one look-up per distinct series.

The server's work per value sent is most of the read (100 engines × 7 days, 12.75 M windows
of the plan's columns: ~19 s of the server's CPU when every NULL went as a NaN), so a NULL is
not sent: a nullable column's field holds its non-NULL values only (``string_agg`` skips a
NULL), and one 2-byte code per row carries a bit per nullable column (set: the row has a
value there) and, above them, the row's kind (:func:`code_sql`); the client puts NaN where a
bit is clear. Columns that cannot be NULL go whole.

Identities are checked exactly: each block's rows are grouped by a 64-bit mix of (source hash,
series key, kind) and every row is compared with its group's first; a mix that merged two
series falls back to a sort of the full tuples. Blocks are ranges of table ids (the table in
its physical order) when most rows match, else groups of the rows the indexes find (the
planner's estimate decides).

From schema 7 this reads only the rows no pack covers (collector/store_blocks.py: ~212 k
blobs hold the rest, ~1 µs of the server's CPU a row saved): the estimate leaves out the rows
the blocks hold, the indexes are sought per source over the ranges outside its packed hours
(:func:`_unpacked`), and a scan of the table leaves out the rows of packed hours.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Connection, and_

from collector.models import WindowRow
from collector.pg_copy import copy_streams
from collector.store_blocks import BLOCK_S, uncovered
from collector.store_blocks_pg import SOURCES
from collector.store_columns import INT_COLUMNS, compiled_sql, dtype_of
from collector.store_frame_pg_blocks import KIND_SHIFT, KINDS, Blocks
from core.errors import StoreError

if TYPE_CHECKING:
    import numpy.typing as npt

    from collector.store_columns import IntArray, RankFn, Series

_BLOCK = 65_536  # table ids per COPY row
_STREAMS = 2  # COPYs at once when the table is scanned (collector/pg_copy.py: one snapshot)
_SKIP_SCAN = SOURCES + "SELECT x, hashtextextended(x, %(seed)s) FROM s WHERE x IS NOT NULL"
# the packed hours by source, the read's since and until, the windows the packs held
Packed = tuple[dict[str, list[float]], float | None, float | None, int]
# The nullable columns: sent without their NULLs, a bit each in the row's code.
NULLABLE = tuple(c.name for c in WindowRow.__table__.columns if c.nullable)


def code_sql(sparse: Sequence[str]) -> str:
    """The row's 2-byte code: its kind's index in KINDS (len(KINDS): another kind) shifted
    by KIND_SHIFT, plus bit i when the i-th of ``sparse`` is not NULL."""
    if len(sparse) > KIND_SHIFT:  # pragma: no cover - the schema has 10 nullable columns
        raise StoreError(f"{len(sparse)} nullable columns: the row code holds {KIND_SHIFT}")
    whens = " ".join(f"WHEN '{k}' THEN {i << KIND_SHIFT}" for i, k in enumerate(KINDS))
    terms = [f"CASE windows.kind {whens} ELSE {len(KINDS) << KIND_SHIFT} END"]
    terms += [
        f"CASE WHEN windows.{c} IS NULL THEN 0 ELSE {1 << i} END" for i, c in enumerate(sparse)
    ]
    return f"int2send(({' + '.join(terms)})::int2)"


def read_postgres(
    conn: Connection,
    conds: list[ColumnElement[bool]],
    numeric: Sequence[str],
    *,
    packed: Packed | None = None,
) -> tuple[list[Series], IntArray, dict[str, npt.NDArray[Any]]]:
    """One COPY BINARY of one bytea per column per block of table ids (module docstring),
    read by numpy.frombuffer. ``packed``: the rows in the packed hours are left out
    (:func:`_unpacked`)."""
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
    sparse = [c for c in numeric if c in NULLABLE]
    fields = [
        f"int8send(hashtextextended(windows.source, {seed}))",
        "decode(windows.series_key, 'hex')",
        code_sql(sparse),
        *(
            f"int8send(windows.{c}::int8)" if c in INT_COLUMNS else f"float8send(windows.{c})"
            for c in numeric
        ),
    ]
    aggs = ", ".join(f"string_agg({expr}, NULL)" for expr in fields)
    total = int(bounds[1]) - int(bounds[0]) + 1  # at least the rows: ids are unique
    estimate = _estimate(conn, where, params)
    few = f"SELECT {aggs} FROM windows WHERE {where} GROUP BY windows.id / {_BLOCK}"
    if packed is not None and packed[0]:
        estimate = max(estimate - packed[3], 0.0)  # the rows the blocks held are not read
        few, outside, ranges = _unpacked(list(names.values()), packed, aggs, where)
        where, params = f"({where}) AND {outside}", {**params, **ranges}
    if estimate * 6 < total:  # few rows: let the indexes find them
        bodies = [few]
    else:  # most rows: the table in blocks of ids, in its physical order, by _STREAMS at once
        bodies = [
            f"SELECT x.* FROM generate_series({int(bounds[0]) + k * _BLOCK}, {int(bounds[1])}, "
            f"{_STREAMS * _BLOCK}) AS b(lo), LATERAL (SELECT {aggs} FROM windows WHERE "
            f"windows.id >= b.lo AND windows.id < b.lo + {_BLOCK} AND ({where})) AS x"
            for k in range(_STREAMS)
        ]
    # room for twice the planner's estimate (its selectivity of an IN list can be a third
    # short), at most one row per id: untouched room costs address space, not memory
    blocks = Blocks(numeric, sparse, capacity=min(total, int(2 * estimate) + _BLOCK))
    statements = [f"COPY ({body}) TO STDOUT (FORMAT BINARY)" for body in bodies]
    copy_streams(conn, statements, params, len(fields), blocks.add)
    if not blocks.heads:
        return empty
    sid, nums = blocks.columns()
    heads = blocks.heads
    keys = [f"{hi:016x}{lo:016x}" for (_, hi, lo, _), _ in heads]
    sources = [names[src] for (src, _, _, _), _ in heads]
    found = conn.exec_driver_sql(
        "SELECT u.i, w.signal, w.labels, w.kind FROM unnest(%(s)s::text[], %(t)s::float8[], "
        "%(k)s::text[]) WITH ORDINALITY AS u(source, start, series_key, i) JOIN windows AS w "
        "ON w.source = u.source AND w.start = u.start AND w.series_key = u.series_key",
        {"s": sources, "t": [start for _, start in heads], "k": keys},
    ).all()
    looked = {int(r[0]) - 1: (str(r[1]), str(r[2]), str(r[3])) for r in found}
    if len(looked) != len(keys):  # pragma: no cover - rows read in this same snapshot
        raise StoreError("a series vanished while reading windows")
    series = [
        (src, looked[i][0], KINDS[k] if k < len(KINDS) else looked[i][2], looked[i][1])
        for i, (src, ((_, _, _, k), _)) in enumerate(zip(sources, heads, strict=True))
    ]
    return series, sid, nums


def _unpacked(
    sources: Sequence[str], packed: Packed, aggs: str, where: str
) -> tuple[str, str, dict[str, Any]]:
    """What keeps a read to the rows no pack covers: for a read through the indexes, the
    query of each source's ranges outside its packed hours (store_blocks.uncovered), one
    index scan each (``OFFSET 0``: never flattened into a join the planner could hash over
    the whole table); for a read of the whole table, a condition (no ``packed_hours`` row for
    the row's hour) and not the ranges, which each block would seek again. The same rows."""
    cover, since, until, _ = packed
    ranges = [(s, a, b) for s in sources for a, b in uncovered(cover.get(s, []), since, until)]
    few = (
        f"SELECT {aggs} FROM unnest(%(kvs_src)s::text[], %(kvs_lo)s::float8[], "
        "%(kvs_hi)s::float8[]) AS u(source, lo, hi), LATERAL (SELECT * FROM windows WHERE "
        f"windows.source = u.source AND windows.start >= u.lo AND windows.start < u.hi AND "
        f"({where}) OFFSET 0) AS windows GROUP BY windows.id / {_BLOCK}"
    )
    hour = f"floor(windows.start / {BLOCK_S:.0f}) * {BLOCK_S:.0f}"  # store_blocks.hour_of
    outside = (
        "NOT EXISTS (SELECT 1 FROM packed_hours AS p WHERE p.source = windows.source "
        f"AND p.hour = {hour})"
    )
    params = {"kvs_src": [r[0] for r in ranges], "kvs_lo": [r[1] for r in ranges],
              "kvs_hi": [r[2] for r in ranges]}  # fmt: skip
    return few, outside, params


def _estimate(conn: Connection, where: str, params: Any) -> float:
    """The planner's estimate of the rows matching ``where`` (its statistics: no scan)."""
    plan = conn.exec_driver_sql(
        f"EXPLAIN (FORMAT JSON) SELECT 1 FROM windows WHERE {where}", params or None
    ).scalar()
    return float(plan[0]["Plan"]["Plan Rows"])  # type: ignore[index]


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
