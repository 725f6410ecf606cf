"""The head rows a seal takes out, as columns: deleted and read back without a Python object
per value where the backend allows, sorted by series and start, cut into series-hours.

PostgreSQL sends each row's values packed in one bytea (float8send), read by numpy without
a Python object per value; SQLite's rows come as tuples. store/writes.py's WindowWriter
encodes the series-hours as chunks (chunks.encode_many) in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from core.errors import StoreError
from store import chunks

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

COLUMNS = ("series_id", *chunks.COLUMNS, "buckets")  # a head row as taken
_FLOATS = len(chunks.COLUMNS)
# PostgreSQL: a row's series id and values as one bytea of big-endian float8s (float8send),
# read by numpy without a Python object per value; then its buckets
_PACKED = " || ".join(["float8send(series_id::float8)"] + [
    f"float8send(coalesce({c}::float8, 'NaN'))" for c in chunks.COLUMNS]) + ", buckets"  # fmt: skip


@dataclass
class Taken:
    """Head rows taken out, in (series, start) order: ``values`` holds chunks.COLUMNS (NaN
    for NULL), ``blobs`` the buckets BLOB of each row that has one; ``offsets`` bound the
    series-hours, ``keys`` name them (series, hour)."""

    series: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    blobs: dict[int, bytes]
    offsets: npt.NDArray[np.int64] = field(init=False)
    keys: list[tuple[int, float]] = field(init=False)

    def __post_init__(self) -> None:
        import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

        order = np.lexsort((self.values[:, 0], self.series))
        self.series, self.values = self.series[order], self.values[order]
        if self.blobs:
            at = np.empty_like(order)
            at[order] = np.arange(order.size)
            self.blobs = {int(at[i]): b for i, b in self.blobs.items()}
        hours = chunks.hours_of(self.values[:, 0])
        cut = np.flatnonzero((self.series[1:] != self.series[:-1]) | (hours[1:] != hours[:-1]))
        self.offsets = np.concatenate(([0], cut + 1, [order.size])).astype(np.int64)
        firsts = self.offsets[:-1]
        self.keys = list(zip(self.series[firsts].tolist(), hours[firsts].tolist(), strict=True))

    def rows(self, i: int) -> list[chunks.Row]:
        """The rows of series-hour ``i`` as chunk rows (values, then the BLOB or None)."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        rows = self.values[lo:hi].tolist()
        return [(*r, self.blobs.get(lo + j)) for j, r in enumerate(rows)]


def take(conn: Connection, sources: list[str], below: float) -> Taken | None:
    """Delete the sources' head rows that start before ``below``; them as columns (None:
    there were none)."""
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

    pg = conn.dialect.name == "postgresql"
    mark = "%s" if pg else "?"
    of_sources = f"SELECT id FROM series WHERE source IN ({', '.join([mark] * len(sources))})"
    sql = f"DELETE FROM head WHERE start < {mark} AND series_id IN ({of_sources}) RETURNING "
    driver: Any = conn.connection.driver_connection
    cursor = driver.cursor(binary=True) if pg else driver.cursor()
    try:
        cursor.execute(sql + (_PACKED if pg else ", ".join(COLUMNS)), (below, *sources))
        gone = cursor.fetchall()
    finally:
        cursor.close()
    if not gone:
        return None
    blobs = {i: bytes(b) for i, b in enumerate(map(itemgetter(-1), gone)) if b}
    if pg:  # series id and values: float8 big-endian
        packed = b"".join(map(itemgetter(0), gone))
        if len(packed) != len(gone) * 8 * (1 + _FLOATS):
            raise StoreError(f"sealing: {len(gone)} head rows came back as {len(packed)} bytes")
        table = np.frombuffer(packed, dtype=">f8").reshape(len(gone), 1 + _FLOATS)
        series, values = table[:, 0].astype(np.int64), table[:, 1:].astype(np.float64)
    else:
        series = np.fromiter(map(itemgetter(0), gone), dtype=np.int64, count=len(gone))
        values = np.array([r[1 : 1 + _FLOATS] for r in gone], dtype=np.float64)
    return Taken(series, values.reshape(-1, _FLOATS), blobs)
