"""PostgreSQL's binary COPY stream, read (collector/pg_copy.py): the parser on made-up streams
split anywhere; copy_streams on a real PostgreSQL is in tests/collector/test_store.py."""

from __future__ import annotations

import struct

import pytest

from collector.pg_copy import SIGNATURE, copy_tuples
from core.errors import StoreError

Tuple = list[bytes | None]


def stream(tuples: list[Tuple], extension: bytes = b"") -> bytes:
    """A binary COPY stream of these tuples (None: a NULL field)."""
    out = SIGNATURE + struct.pack(">ii", 0, len(extension)) + extension
    for fields in tuples:
        out += struct.pack(">h", len(fields))
        for f in fields:
            out += struct.pack(">i", -1) if f is None else struct.pack(">i", len(f)) + f
    return out + struct.pack(">h", -1)


TUPLES: list[Tuple] = [
    [b"\x00" * 8, b"abc", None],
    [b"", b"x" * 300, b"\x01\x02"],
    [None, None, None],
]


def read(chunks: list[bytes], n_fields: int = 3) -> list[Tuple]:
    return [[None if f is None else bytes(f) for f in t] for t in copy_tuples(chunks, n_fields)]


@pytest.mark.parametrize("extension", [b"", b"ext!"])
def test_every_split_reads_the_same_tuples(extension: bytes) -> None:
    data = stream(TUPLES, extension)
    assert read([data]) == TUPLES
    for size in (1, 2, 3, 5, 7, 19, 64):
        assert read([data[i : i + size] for i in range(0, len(data), size)]) == TUPLES
    for cut in range(len(data) + 1):
        assert read([data[:cut], data[cut:]]) == TUPLES


def test_chunks_after_the_trailer_are_read_and_ignored() -> None:
    data = stream(TUPLES[:1])
    seen = []

    def chunks() -> list[bytes]:
        seen.append(1)
        return [data, b"junk after the end"]

    assert read(chunks()) == TUPLES[:1]
    assert seen == [1]


def test_not_binary_copy_refused() -> None:
    with pytest.raises(StoreError, match="unexpected header"):
        read([b"id,name\n1,a\n" + b" " * 20])


def test_tuple_of_another_width_refused() -> None:
    with pytest.raises(StoreError, match="2 fields, expected 3"):
        read([stream([[b"a", b"b"]])])


def test_no_tuples() -> None:
    assert read([stream([])]) == []
    assert read([]) == []
