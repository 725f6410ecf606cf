"""The chunk format (store/chunks.py): format 2 (zstd) round-trips; format 1 (zlib, what
stores written before hold) decodes to the same rows, alone and mixed with format 2 in one
read; a damaged or foreign chunk is a ValueError that says what is wrong."""

from __future__ import annotations

import math
import random
import struct
import zlib

import numpy as np
import pytest
import zstandard

from store import chunks

WIDTH = len(chunks.COLUMNS)


def _rows(rng: random.Random, n: int, *, blobs: bool) -> list[chunks.Row]:
    """``n`` windows in start order: some columns empty, NaN/None in others, BLOBs or not."""
    rows: list[chunks.Row] = []
    for i in range(n):
        values: list[float | None] = [1_800_000_000.0 + 60 * i, 60.0]
        values += [rng.choice([None, math.nan, rng.random() * 1e6]) for _ in range(WIDTH - 4)]
        values += [None, None]  # p99 and sum_delta never hold a value: not in the mask
        blob = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))) if blobs else None
        rows.append((*values, blob if blobs and rng.random() < 0.7 else None))
    return rows


def _as_zlib(chunk: bytes) -> bytes:
    """The format-1 chunk of the same rows: the same header and payload, zlib level 1."""
    payload = zstandard.ZstdDecompressor().decompress(chunk[5:])
    return bytes([chunks.ZLIB_FORMAT]) + chunk[1:5] + zlib.compress(payload, 1)


def _same(a: list[chunks.Row], b: list[chunks.Row]) -> bool:
    def key(row: chunks.Row) -> tuple[object, ...]:
        return tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in row)

    return [key(r) for r in a] == [key(r) for r in b]


@pytest.mark.parametrize("blobs", [False, True])
def test_round_trip_and_format_1_reads_the_same(blobs: bool) -> None:
    rng = random.Random(7)
    rows = _rows(rng, 60, blobs=blobs)
    chunk = chunks.encode(rows)
    assert chunk[0] == chunks.FORMAT == 2
    expected = [(*(math.nan if v is None else v for v in r[:WIDTH]), r[WIDTH])
                for r in rows]  # fmt: skip
    assert _same(chunks.decode(chunk), expected)
    old = _as_zlib(chunk)
    assert _same(chunks.decode(old), expected)
    assert chunks.blobs_of(old) == chunks.blobs_of(chunk) == [r[WIDTH] for r in rows]


def test_decode_many_reads_both_formats_in_one_pass() -> None:
    rng = random.Random(11)
    made = [chunks.encode(_rows(rng, n, blobs=rng.random() < 0.5)) for n in (60, 60, 7, 60)]
    mixed = [made[0], _as_zlib(made[1]), made[2], _as_zlib(made[3])]
    wanted = ["start", "mean", "p90", "sum_delta"]
    chunk_of, cols = chunks.decode_many(mixed, wanted)
    ref_of, ref = chunks.decode_many(made, wanted)
    assert chunk_of.tolist() == ref_of.tolist()
    for name in wanted:
        np.testing.assert_array_equal(cols[name], ref[name])
    # against decode, one chunk at a time
    flat = [row for c in made for row in chunks.decode(c)]
    for name in wanted:
        j = chunks.COLUMNS.index(name)
        np.testing.assert_array_equal(cols[name], np.array([r[j] for r in flat], dtype=float))


def _flip(chunk: bytes, at: int) -> bytes:
    return chunk[:at] + bytes([chunk[at] ^ 0x55]) + chunk[at + 1 :]


def test_damaged_or_foreign_chunks_are_errors() -> None:
    chunk = chunks.encode(_rows(random.Random(3), 60, blobs=False))
    bad = {
        "shorter than its header": chunk[:3],
        "format 9": bytes([9]) + chunk[1:],
        "does not inflate": _flip(chunk, len(chunk) - 2),  # the frame's checksum catches it
        "holds": chunk[:1] + struct.pack("<H", 600) + chunk[3:],  # more rows than it holds
    }
    for words, data in bad.items():
        with pytest.raises(ValueError, match=words.strip()):
            chunks.decode_many([data], ["start", "mean"])
        with pytest.raises(ValueError, match=words.strip()):
            chunks.decode(data)
    old = _as_zlib(chunk)
    with pytest.raises(ValueError, match="does not inflate"):  # its adler32, read in full
        chunks.decode(_flip(old, len(old) - 2))
