"""The chunk: the windows of one series that start in one UTC hour, stored as one value.

Layout: a 5-byte header (format, rows ``n``, a bitmask of the COLUMNS that hold a value in
some row) then zlib (level 1) of the present columns, each ``n`` little-endian float64
(NaN for NULL) byte-shuffled (all first bytes, then all second bytes, …: the high bytes of
nearby values repeat, which is what deflate finds); then, when ``buckets`` is present, ``n``
uint32 lengths and the rows' bucket BLOBs (store/buckets.py; length 0 for NULL).
Rows are in start order, unique on start. :func:`decode_many` turns many chunks into columns
with one numpy pass per layout instead of one per chunk.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

COLUMNS = ("start", "length_s", "samples", "delta", "rate", "resets", "mean", "min", "max",
           "last", "p50", "p90", "p99", "sum_delta")  # fmt: skip
BUCKETS_BIT = 1 << len(COLUMNS)
HOUR_S = 3_600.0
FORMAT = 1
_HEADER = struct.Struct("<BHH")
# One window as a chunk row: the COLUMNS' values (None or NaN: NULL), then its buckets BLOB.
Row = tuple[Any, ...]


def hour_of(start: float) -> float:
    """The UTC hour (epoch s) whose chunk holds a window starting at ``start``."""
    return math.floor(start / HOUR_S) * HOUR_S


def encode(rows: Sequence[Row]) -> bytes:
    """One chunk of ``rows`` (each COLUMNS' values then the buckets BLOB or None), which
    the caller has put in start order, one row per start."""
    import numpy as np

    n = len(rows)
    if not 0 < n < 65_536:
        raise ValueError(f"a chunk holds 1 to 65535 windows, got {n}")
    width = len(COLUMNS)
    values = np.array([r[:width] for r in rows], dtype=np.float64).reshape(n, width)
    present = ~np.isnan(values).all(axis=0)
    mask = int(np.dot(present, 1 << np.arange(width)))
    cols = np.ascontiguousarray(values[:, present].T)  # (k, n)
    payload = cols.astype("<f8").view(np.uint8).reshape(-1, n, 8).transpose(0, 2, 1).tobytes()
    blobs = [r[width] for r in rows]
    if any(blobs):
        mask |= BUCKETS_BIT
        lengths = np.array([len(b) if b else 0 for b in blobs], dtype="<u4")
        payload += lengths.tobytes() + b"".join(bytes(b) for b in blobs if b)
    return _HEADER.pack(FORMAT, n, mask) + zlib.compress(payload, 1)


def layout(chunk: bytes) -> tuple[int, int]:
    """The rows and the column bitmask of a chunk (ValueError: not one)."""
    if len(chunk) < _HEADER.size:
        raise ValueError(f"a chunk of {len(chunk)} bytes is shorter than its header")
    fmt, n, mask = _HEADER.unpack_from(chunk)
    if fmt != FORMAT or n == 0 or mask >> (len(COLUMNS) + 1):
        raise ValueError(f"not a chunk of format {FORMAT} (format {fmt}, {n} rows, mask {mask})")
    return n, mask


def decode(chunk: bytes) -> list[Row]:
    """The rows of one chunk, floats as Python floats (NaN for NULL), buckets BLOB or None."""
    import numpy as np

    n, mask = layout(chunk)
    payload = _inflate(chunk)
    cols, rest = _columns(payload, n, mask)
    out = np.full((n, len(COLUMNS)), np.nan)
    out[:, [j for j in range(len(COLUMNS)) if mask >> j & 1]] = cols.T
    blobs = _blobs(rest, n) if mask & BUCKETS_BIT else [None] * n
    return [(*row, blob) for row, blob in zip(out.tolist(), blobs, strict=True)]


def decode_many(
    chunks: Sequence[bytes], wanted: Sequence[str]
) -> tuple[npt.NDArray[np.int64], dict[str, npt.NDArray[np.float64]]]:
    """The rows of many chunks as columns: each row's chunk index and the ``wanted``
    COLUMNS (NaN where a chunk has no value), chunks in order, rows in chunk order."""
    import numpy as np

    layouts = [layout(c) for c in chunks]
    sizes = np.fromiter((n for n, _ in layouts), dtype=np.int64, count=len(layouts))
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    total = int(offsets[-1])
    out = {c: np.full(total, np.nan) for c in wanted}
    index = {c: COLUMNS.index(c) for c in wanted}
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (n, mask) in enumerate(layouts):
        groups.setdefault((n, mask & (BUCKETS_BIT - 1)), []).append(i)
    for (n, mask), members in groups.items():
        present = [j for j in range(len(COLUMNS)) if mask >> j & 1]
        k = len(present)
        raw = b"".join(_inflate(chunks[i])[: k * n * 8] for i in members)
        cube = np.frombuffer(raw, dtype=np.uint8).reshape(len(members), k, 8, n)
        values = cube.transpose(0, 1, 3, 2).copy().view("<f8").reshape(len(members), k, n)
        rows = (offsets[members][:, None] + np.arange(n)[None, :]).ravel()
        for name, j in index.items():
            if j in present:
                out[name][rows] = values[:, present.index(j), :].ravel()
    chunk_of = np.repeat(np.arange(len(chunks), dtype=np.int64), sizes)
    return chunk_of, out


def blobs_of(chunk: bytes) -> list[bytes | None]:
    """The rows' bucket BLOBs of a chunk (None for a row without)."""
    n, mask = layout(chunk)
    if not mask & BUCKETS_BIT:
        return [None] * n
    k = bin(mask & (BUCKETS_BIT - 1)).count("1")
    return _blobs(_inflate(chunk)[k * n * 8 :], n)


def _inflate(chunk: bytes) -> bytes:
    try:
        return zlib.decompress(memoryview(chunk)[_HEADER.size :])
    except zlib.error as exc:
        raise ValueError(f"a chunk's data does not inflate: {exc}") from exc


def _columns(payload: bytes, n: int, mask: int) -> tuple[npt.NDArray[np.float64], bytes]:
    import numpy as np

    k = bin(mask & (BUCKETS_BIT - 1)).count("1")
    size = k * n * 8
    if len(payload) < size:
        raise ValueError(f"a chunk of {n} rows and {k} columns holds {len(payload)} bytes")
    cube = np.frombuffer(payload, dtype=np.uint8, count=size).reshape(k, 8, n)
    return cube.transpose(0, 2, 1).copy().view("<f8").reshape(k, n), payload[size:]


def _blobs(rest: bytes, n: int) -> list[bytes | None]:
    import numpy as np

    if len(rest) < 4 * n:
        raise ValueError("a chunk's bucket lengths are cut short")
    lengths = np.frombuffer(rest, dtype="<u4", count=n).tolist()
    if 4 * n + sum(lengths) != len(rest):
        raise ValueError("a chunk's bucket data does not match its lengths")
    out: list[bytes | None] = []
    pos = 4 * n
    for size in lengths:
        out.append(rest[pos : pos + size] if size else None)
        pos += size
    return out
