"""The blocks of collector/store_frame_pg.py's COPY read, gathered into a frame's columns.

A block is one COPY tuple whose fields are whole columns of its rows, big-endian: the rows'
source hashes (8 bytes), series keys (16), 2-byte codes (kind << KIND_SHIFT | a bit per
nullable column holding a value), then each numeric column asked for: whole (8 bytes a row)
when it cannot be NULL, else only the values of the rows whose bit is set. A NULL field is
an empty one (``string_agg`` of no value). Each block is turned into native arrays when it
arrives (the server meanwhile prepares the next), its rows numbered by series: the number of
an identity (source hash, key, kind) is kept across blocks with the first row's start, which
the series' look-up needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from collector.store_columns import INT_COLUMNS, dtype_of, first_positions
from core.errors import StoreError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from collector.pg_copy import Fields
    from collector.store_columns import IntArray

KINDS = ("counter", "gauge", "histogram", "ratio")  # kind codes 0-3; 4: another (looked up)
KIND_SHIFT = 10  # the kind's bits in a row code; below them a bit per nullable column
Identity = tuple[int, int, int, int]  # source hash, series key's two halves, kind code


class Blocks:
    """The rows of the blocks added so far: their series numbers and numeric columns, written
    into arrays of ``capacity`` rows (grown when more come) as each block arrives."""

    def __init__(self, numeric: Sequence[str], sparse: Sequence[str], capacity: int) -> None:
        import numpy as np

        if "start" not in numeric or set(sparse) - set(numeric) or set(sparse) & set(INT_COLUMNS):
            raise StoreError(f"cannot read columns {list(numeric)} with {list(sparse)} sparse")
        self._numeric = tuple(numeric)
        self._bits = {c: i for i, c in enumerate(sparse)}
        self._codes: dict[Identity, int] = {}
        self.heads: list[tuple[Identity, float]] = []  # per series: identity, first start
        self.rows = 0
        size = max(capacity, 1)
        self._sid: IntArray = np.empty(size, dtype=np.int64)
        self._cols = {c: np.empty(size, dtype=dtype_of(c)) for c in numeric}

    def add(self, fields: Fields) -> None:
        """One block: the three identity fields, then the numeric columns in order."""
        import numpy as np

        if len(fields) != 3 + len(self._numeric):
            raise StoreError(f"COPY BINARY: a block of {len(fields)} fields")
        if fields[0] is None:  # a block without rows
            return
        src = _array(fields[0], ">i8").astype(np.int64)
        key = _array(fields[1], ">u8").astype(np.uint64).reshape(-1, 2)
        code = _array(fields[2], ">i2").astype(np.int64)
        n = code.size
        if src.size != n or key.shape[0] != n:
            raise StoreError(f"COPY BINARY: identities {src.size}, {key.shape[0]} for {n} rows")
        self._reserve(self.rows + n)
        at = slice(self.rows, self.rows + n)
        for name, data in zip(self._numeric, fields[3:], strict=True):
            out = self._cols[name][at]
            bit = self._bits.get(name)
            if bit is None:
                values = _array(data, ">i8" if name in INT_COLUMNS else ">f8")
                if values.size != n:
                    raise StoreError(f"COPY BINARY: {values.size} {name} values for {n} rows")
                out[:] = values  # big-endian to native in the copy
            else:
                _spread(_array(data, ">f8"), (code >> bit) & 1 == 1, out)
        ident = (src, key[:, 0], key[:, 1], code >> KIND_SHIFT)
        self._sid[at] = self._series(ident, self._cols["start"][at])
        self.rows += n

    def columns(self) -> tuple[IntArray, dict[str, npt.NDArray[Any]]]:
        """Every row's series number and the numeric columns (views of the rows written)."""
        n = self.rows
        return self._sid[:n], {name: col[:n] for name, col in self._cols.items()}

    def _reserve(self, rows: int) -> None:
        """Room for ``rows`` rows (the arrays doubled, their rows copied, when short)."""
        if rows > self._sid.size:
            size = max(rows, 2 * self._sid.size)
            self._sid = _grown(self._sid, self.rows, size)
            self._cols = {name: _grown(col, self.rows, size) for name, col in self._cols.items()}

    def _series(self, ident: tuple[npt.NDArray[Any], ...], start: npt.NDArray[Any]) -> IntArray:
        """The series number of each row of a block (new identities numbered on)."""
        import numpy as np
        import pandas as pd

        local, _ = pd.factorize(mix(ident).view(np.int64))
        first = first_positions(local)
        if not all(np.array_equal(c, c[first][local]) for c in ident):  # two merged by the mix
            both = np.rec.fromarrays(ident)
            _, first, inverse = np.unique(both, return_index=True, return_inverse=True)
            local = inverse.reshape(-1)
        lut = np.empty(first.size, dtype=np.int64)
        heads = zip(*(c[first].tolist() for c in ident), start[first].tolist(), strict=True)
        for j, (src, hi, lo, kind, at) in enumerate(heads):
            number = self._codes.get((src, hi, lo, kind))
            if number is None:
                number = self._codes[src, hi, lo, kind] = len(self.heads)
                self.heads.append(((src, hi, lo, kind), at))
            lut[j] = number
        out: IntArray = lut[local]
        return out


def mix(columns: Sequence[npt.NDArray[Any]]) -> npt.NDArray[np.uint64]:
    """A 64-bit mix of the rows' integer columns (equal rows, equal mixes; checked exactly)."""
    import numpy as np

    out = np.zeros(columns[0].size, dtype=np.uint64)
    for i, col in enumerate(columns):
        out = (out ^ col.astype(np.uint64)) * np.uint64(0x9E3779B97F4A7C15 + 2 * i)
    return out


def _array(data: memoryview | None, dtype: str) -> npt.NDArray[Any]:
    """A field's values (big-endian ``dtype``, a view on the driver's buffer); none if NULL."""
    import numpy as np

    if data is None:
        return np.zeros(0, dtype=dtype)
    if len(data) % np.dtype(dtype).itemsize:
        raise StoreError(f"COPY BINARY: a field of {len(data)} bytes is not of {dtype} values")
    return np.frombuffer(data, dtype=dtype)


def _spread(
    values: npt.NDArray[Any], present: npt.NDArray[np.bool_], out: npt.NDArray[np.float64]
) -> None:
    """A nullable column's values put in ``out``'s rows that have one, NaN in the others."""
    import numpy as np

    if values.size != np.count_nonzero(present):
        raise StoreError(f"COPY BINARY: {values.size} values for {present.sum()} rows with one")
    out.fill(np.nan)
    out[present] = values


def _grown(old: npt.NDArray[Any], rows: int, size: int) -> npt.NDArray[Any]:
    import numpy as np

    new = np.empty(size, dtype=old.dtype)
    new[:rows] = old[:rows]
    return new
