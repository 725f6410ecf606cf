"""The chunk: the windows of one series that start in one UTC hour, stored as one value.

Layout: a 5-byte header (format, rows ``n``, a bitmask of the COLUMNS that hold a value in
some row) then, compressed, the present columns, each ``n`` little-endian float64 (NaN for
NULL) byte-shuffled (all first bytes, then all second bytes, …: the high bytes of nearby
values repeat), and when ``buckets`` is present ``n`` uint32 lengths and the rows' bucket
BLOBs (store/buckets.py; length 0 for NULL). Format 2 (written): one zstd frame, level 3,
with its checksum; format 1 (read only, stores written before): zlib level 1.
Rows are in start order, unique on start. :func:`decode_many` turns many chunks into columns
with one numpy pass per layout instead of one per chunk.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import zstandard

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

COLUMNS = ("start", "length_s", "samples", "delta", "rate", "resets", "mean", "min", "max",
           "last", "p50", "p90", "p99", "sum_delta")  # fmt: skip
BUCKETS_BIT = 1 << len(COLUMNS)
HOUR_S = 3_600.0
FORMAT = 2  # zstd; DESIGN.md#chunks has the measurements behind the codec
ZLIB_FORMAT = 1  # read only: the chunks of stores written before format 2
_ZSTD_LEVEL = 3
_HEADER = struct.Struct("<BHH")
_HEADER_DTYPE = [("format", "u1"), ("n", "<u2"), ("mask", "<u2")]
_BATCH = 4096  # chunks inflated at once
# One window as a chunk row: the COLUMNS' values (None or NaN: NULL), then its buckets BLOB.
Row = tuple[Any, ...]


def hour_of(start: float) -> float:
    """The UTC hour (epoch s) whose chunk holds a window starting at ``start``."""
    return math.floor(start / HOUR_S) * HOUR_S


def hours_of(starts: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """:func:`hour_of` of each start."""
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

    return np.floor(starts / HOUR_S) * HOUR_S


def encode(rows: Sequence[Row]) -> bytes:
    """One chunk of ``rows`` (each COLUMNS' values then the buckets BLOB or None), which
    the caller has put in start order, one row per start."""
    width = len(COLUMNS)
    blobs = {i: r[width] for i, r in enumerate(rows) if r[width]}
    return encode_many([r[:width] for r in rows], [0, len(rows)], blobs)[0]


def encode_many(
    values: npt.ArrayLike, offsets: npt.ArrayLike, blobs: Mapping[int, bytes]
) -> list[bytes]:
    """The chunks of consecutive rows of ``values`` (a row per window: COLUMNS' values, NaN
    or None for NULL): chunk i holds rows ``offsets[i]:offsets[i + 1]`` and the buckets
    BLOBs ``blobs`` has of them (by row). Each is :func:`encode`'s of its rows; the values
    are shuffled one numpy pass per layout (rows, columns present), not one per chunk."""
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

    width = len(COLUMNS)
    table = np.asarray(values, dtype=np.float64).reshape(-1, width)
    bounds = np.asarray(offsets, dtype=np.int64)
    sizes = np.diff(bounds)
    if ((sizes <= 0) | (sizes >= 65_536)).any():
        bad = sizes[(sizes <= 0) | (sizes >= 65_536)]
        raise ValueError(f"a chunk holds 1 to 65535 windows, got {int(bad[0])}")
    if not sizes.size:
        return []
    present = np.logical_or.reduceat(~np.isnan(table), bounds[:-1], axis=0)  # (chunks, width)
    masks = present.astype(np.int64) @ (1 << np.arange(width, dtype=np.int64))
    layouts = sizes << 16 | masks
    payloads: list[bytes] = [b""] * sizes.size
    for key in np.unique(layouts).tolist():
        n, cols = key >> 16, [j for j in range(width) if key >> j & 1]
        members = np.flatnonzero(layouts == key)
        cube = np.ascontiguousarray(table[:, cols][bounds[members][:, None] + np.arange(n)],
                                    dtype="<f8")  # (chunks, n, k) # fmt: skip
        planes = cube.view(np.uint8).reshape(members.size, n, len(cols), 8)
        raw = planes.transpose(0, 2, 3, 1).tobytes()  # per chunk: k columns' 8 byte planes
        size = len(cols) * 8 * n
        for i, c in enumerate(members.tolist()):
            payloads[c] = raw[i * size : (i + 1) * size]
    with_blobs = np.searchsorted(bounds, [r for r, b in blobs.items() if b], side="right") - 1
    for c in set(with_blobs.tolist()):
        got = [blobs.get(r) for r in range(int(bounds[c]), int(bounds[c + 1]))]
        lengths = struct.pack(f"<{len(got)}I", *(len(b) if b else 0 for b in got))
        payloads[c] += lengths + b"".join(bytes(b) for b in got if b)
        masks[c] |= BUCKETS_BIT
    layout = zip(sizes.tolist(), masks.tolist(), payloads, strict=True)
    compress = zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_checksum=True).compress
    return [_HEADER.pack(FORMAT, n, mask) + compress(p) for n, mask, p in layout]


def layout(chunk: bytes) -> tuple[int, int]:
    """The rows and the column bitmask of a chunk (ValueError: not one)."""
    if len(chunk) < _HEADER.size:
        raise ValueError(f"a chunk of {len(chunk)} bytes is shorter than its header")
    fmt, n, mask = _HEADER.unpack_from(chunk)
    if fmt not in (FORMAT, ZLIB_FORMAT) or n == 0 or mask >> (len(COLUMNS) + 1):
        known = f"{ZLIB_FORMAT} or {FORMAT}"
        raise ValueError(f"not a chunk of format {known} (format {fmt}, {n} rows, mask {mask})")
    return n, mask


def decode(chunk: bytes) -> list[Row]:
    """The rows of one chunk, floats as Python floats (NaN for NULL), buckets BLOB or None."""
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

    n, mask = layout(chunk)
    payload = _inflate(chunk)
    cols, rest = _columns(payload, n, mask)
    out = np.full((n, len(COLUMNS)), np.nan)
    out[:, [j for j in range(len(COLUMNS)) if mask >> j & 1]] = cols.T
    blobs = _blobs(rest, n) if mask & BUCKETS_BIT else [None] * n
    return [(*row, blob) for row, blob in zip(out.tolist(), blobs, strict=True)]


def decode_many(
    chunks: Sequence[bytes], wanted: Sequence[str], *, spare: int = 0
) -> tuple[npt.NDArray[np.int64], dict[str, npt.NDArray[np.float64]]]:
    """The rows of many chunks as columns: each row's chunk index and the ``wanted``
    COLUMNS (NaN where a chunk has no value), chunks in order, rows in chunk order; the
    columns have ``spare`` rows more at the end (NaN) for the caller to fill.

    Chunks of one layout (rows, columns) are inflated a batch at a time, only up to the
    last wanted column, and each wanted column is unshuffled straight into its place.
    """
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

    sizes, masks = layouts(chunks)
    keys = sizes << 16 | (masks & (BUCKETS_BIT - 1))  # buckets or not: one layout
    groups = np.unique(keys).tolist()
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    total = int(offsets[-1])
    index = {c: COLUMNS.index(c) for c in wanted}
    out: dict[str, npt.NDArray[Any]] = {}
    for name, j in index.items():
        if len(groups) == 1 and groups[0] >> j & 1:  # every chunk has the column
            out[name] = np.empty(total + spare, "<f8")
            out[name][total:] = np.nan
        else:
            out[name] = np.full(total + spare, np.nan, "<f8")
    for key in groups:
        n, mask = key >> 16, key & 0xFFFF
        present = [j for j in range(len(COLUMNS)) if mask >> j & 1]
        picked = {c: present.index(j) for c, j in index.items() if j in present}
        if not picked:
            continue
        k = 1 + max(picked.values())  # the columns inflated: up to the last one wanted
        members = np.arange(len(chunks)) if len(groups) == 1 else np.flatnonzero(keys == key)
        cut = k < len(present) or bool((masks[members] & BUCKETS_BIT).any())
        for lo in range(0, members.size, _BATCH):
            batch = members[lo : lo + _BATCH]
            cube = _inflate_many([chunks[i] for i in batch.tolist()], n, k, cut)
            first, m = int(batch[0]), batch.size
            for name, p in picked.items():
                if int(batch[-1]) - first == m - 1:  # consecutive chunks: consecutive rows
                    at = int(offsets[first])
                    values = out[name][at : at + m * n].view(np.uint8).reshape(m, n, 8)
                    for byte in range(8):  # the shuffled planes back into each value
                        values[:, :, byte] = cube[:, p, byte, :]
                else:
                    rows = (offsets[batch][:, None] + np.arange(n)[None, :]).ravel()
                    values = cube[:, p].transpose(0, 2, 1).copy()
                    out[name][rows] = values.view("<f8").ravel()
    chunk_of = np.repeat(np.arange(len(chunks), dtype=np.int64), sizes)
    return chunk_of, {c: v.astype(np.float64, copy=False) for c, v in out.items()}


def layouts(chunks: Sequence[bytes]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The rows and the column bitmask of each chunk (ValueError: one is not a chunk)."""
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

    heads = b"".join([c[: _HEADER.size] for c in chunks])
    if len(heads) != _HEADER.size * len(chunks):
        for c in chunks:
            layout(c)  # raises for the one shorter than its header
    head = np.frombuffer(heads, dtype=_HEADER_DTYPE)
    n, mask = head["n"].astype(np.int64), head["mask"].astype(np.int64)
    fmt = head["format"]
    bad = ((fmt != FORMAT) & (fmt != ZLIB_FORMAT)) | (n == 0) | (mask >> (len(COLUMNS) + 1) != 0)
    if bad.any():
        layout(chunks[int(np.flatnonzero(bad)[0])])  # raises
    return n, mask


def _inflate_many(chunks: Sequence[bytes], n: int, k: int, cut: bool) -> npt.NDArray[np.uint8]:
    """The first ``k`` shuffled columns of chunks of ``n`` rows, as (chunks, k, 8, n) bytes;
    ``cut``: the payloads hold more, inflate only that much."""
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

    size = k * n * 8
    start = _HEADER.size
    unzstd = zstandard.ZstdDecompressor().decompress
    try:
        parts = [unzstd(memoryview(c)[start:]) if c[0] == FORMAT
                 else zlib.decompressobj().decompress(c[start:], size) if cut
                 else zlib.decompress(c[start:]) for c in chunks]  # fmt: skip
    except (zstandard.ZstdError, zlib.error) as exc:
        raise ValueError(f"a chunk's data does not inflate: {exc}") from exc
    raw = b"".join(parts)
    if len(raw) != size * len(chunks):
        short = [len(p) for p in parts if len(p) < size]
        if short:
            raise ValueError(f"a chunk of {n} rows and {k} columns holds {short[0]} bytes")
        raw = b"".join([p[:size] for p in parts])
    return np.frombuffer(raw, dtype=np.uint8).reshape(len(chunks), k, 8, n)


def blobs_of(chunk: bytes) -> list[bytes | None]:
    """The rows' bucket BLOBs of a chunk (None for a row without)."""
    n, mask = layout(chunk)
    if not mask & BUCKETS_BIT:
        return [None] * n
    k = bin(mask & (BUCKETS_BIT - 1)).count("1")
    return _blobs(_inflate(chunk)[k * n * 8 :], n)


def _inflate(chunk: bytes) -> bytes:
    data = memoryview(chunk)[_HEADER.size :]
    try:
        if chunk[0] == FORMAT:
            return zstandard.ZstdDecompressor().decompress(data)
        return zlib.decompress(data)
    except (zstandard.ZstdError, zlib.error) as exc:
        raise ValueError(f"a chunk's data does not inflate: {exc}") from exc


def _columns(payload: bytes, n: int, mask: int) -> tuple[npt.NDArray[np.float64], bytes]:
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

    k = bin(mask & (BUCKETS_BIT - 1)).count("1")
    size = k * n * 8
    if len(payload) < size:
        raise ValueError(f"a chunk of {n} rows and {k} columns holds {len(payload)} bytes")
    cube = np.frombuffer(payload, dtype=np.uint8, count=size).reshape(k, 8, n)
    return cube.transpose(0, 2, 1).copy().view("<f8").reshape(k, n), payload[size:]


def _blobs(rest: bytes, n: int) -> list[bytes | None]:
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

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
