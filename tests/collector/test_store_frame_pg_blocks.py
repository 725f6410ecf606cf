"""The COPY blocks of the PostgreSQL frame read gathered into columns
(collector/store_frame_pg_blocks.py), on made-up blocks; the read itself on a real
PostgreSQL is tested with the store (tests/collector/test_store.py)."""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import pytest

from collector import store_frame_pg_blocks
from collector.store_frame_pg_blocks import KIND_SHIFT, Blocks
from core.errors import StoreError

NUMERIC = ("start", "length_s", "samples", "delta", "mean")
SPARSE = ("delta", "mean")
Row = tuple[int, int, int, int, dict[str, float | None]]  # src, key hi, key lo, kind, values


def block(rows: list[Row]) -> list[memoryview | None]:
    """The fields the server sends for these rows (NULLs left out, their bits clear)."""

    def field(fmt: str, values: list[Any]) -> memoryview | None:
        return memoryview(struct.pack(f">{len(values)}{fmt}", *values)) if values else None

    codes = [
        (kind << KIND_SHIFT) + sum(1 << i for i, c in enumerate(SPARSE) if v.get(c) is not None)
        for _, _, _, kind, v in rows
    ]
    keys = [half for _, hi, lo, _, _ in rows for half in (hi, lo)]
    out = [field("q", [r[0] for r in rows]), field("Q", keys), field("h", codes)]
    for c in NUMERIC:
        if c in SPARSE:
            out.append(field("d", [v[c] for *_, v in rows if v.get(c) is not None]))
        else:
            out.append(field("q" if c == "samples" else "d", [v[c] for *_, v in rows]))
    return out


def row(src: int, start: float, kind: int = 0, key: int = 7, **values: float | None) -> Row:
    return (src, key, ~key & (2**64 - 1), kind, {"start": start, "length_s": 60.0,
                                                 "samples": 4, **values})  # fmt: skip


def test_rows_numbered_by_series_across_blocks_values_spread() -> None:
    blocks = Blocks(NUMERIC, SPARSE, capacity=1)  # grown as the rows come
    blocks.add(block([row(-5, 60.0, delta=1.0), row(9, 60.0, kind=1, mean=0.5),
                      row(-5, 120.0, delta=2.0)]))  # fmt: skip
    blocks.add(block([]))  # no rows: every field NULL
    blocks.add(block([row(9, 120.0, kind=1), row(-5, 180.0, kind=2, delta=3.0, mean=4.0)]))
    sid, nums = blocks.columns()
    assert blocks.rows == 5
    assert sid.tolist() == [0, 1, 0, 1, 2]
    assert [h for h, _ in blocks.heads] == [(-5, 7, ~7 & (2**64 - 1), 0),
                                            (9, 7, ~7 & (2**64 - 1), 1),
                                            (-5, 7, ~7 & (2**64 - 1), 2)]  # fmt: skip
    assert [start for _, start in blocks.heads] == [60.0, 60.0, 180.0]
    assert nums["start"].tolist() == [60.0, 60.0, 120.0, 120.0, 180.0]
    assert nums["samples"].dtype == np.int64 and nums["samples"].tolist() == [4] * 5
    assert _nan(nums["delta"]) == [1.0, None, 2.0, None, 3.0]
    assert _nan(nums["mean"]) == [None, 0.5, None, None, 4.0]


def _nan(values: np.ndarray[Any, Any]) -> list[float | None]:
    return [None if math.isnan(v) else v for v in values.tolist()]


def test_identities_merged_by_the_mix_are_told_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    def collide(cols: Any) -> np.ndarray[Any, Any]:
        return np.zeros(cols[0].size, np.uint64)

    monkeypatch.setattr(store_frame_pg_blocks, "mix", collide)
    blocks = Blocks(NUMERIC, SPARSE, capacity=10)
    rows = [[row(1, 60.0), row(2, 60.0), row(1, 60.0, key=8), row(1, 120.0)],
            [row(2, 120.0), row(1, 180.0, key=8)]]  # fmt: skip
    for rs in rows:
        blocks.add(block(rs))
    sid, _ = blocks.columns()
    assert [blocks.heads[i][0][:2] for i in sid] == [(r[0], r[1]) for rs in rows for r in rs]
    assert sorted(h[:2] for h, _ in blocks.heads) == [(1, 7), (1, 8), (2, 7)]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f[:-1], "a block of 7 fields"),
        (lambda f: [*f[:3], memoryview(bytes(8)), *f[4:]], r"1 start values for 2 rows"),
        (lambda f: [*f[:7], memoryview(bytes(16))], r"2 values for 1 rows with one"),
        (lambda f: [*f[:3], memoryview(bytes(15)), *f[4:]], "15 bytes is not of >f8"),
        (lambda f: [f[0], memoryview(bytes(16)), *f[2:]], r"identities 2, 1 for 2 rows"),
    ],
)
def test_malformed_block_refused(change: Any, message: str) -> None:
    fields = block([row(1, 60.0, mean=1.0), row(1, 120.0)])
    with pytest.raises(StoreError, match=message):
        Blocks(NUMERIC, SPARSE, capacity=4).add(change(fields))


@pytest.mark.parametrize(
    ("numeric", "sparse"),
    [(("delta",), ("delta",)), (NUMERIC, ("samples",)), (NUMERIC, ("p90",))],
)
def test_columns_that_cannot_be_read_refused(numeric: tuple[str], sparse: tuple[str]) -> None:
    with pytest.raises(StoreError, match="cannot read columns"):
        Blocks(numeric, sparse, capacity=1)


def test_no_blocks_no_rows() -> None:
    blocks = Blocks(NUMERIC, SPARSE, capacity=0)
    sid, nums = blocks.columns()
    assert sid.size == 0 and blocks.heads == []
    assert {c: (a.size, a.dtype.kind) for c, a in nums.items()} == {
        "start": (0, "f"), "length_s": (0, "f"), "samples": (0, "i"), "delta": (0, "f"),
        "mean": (0, "f"),
    }  # fmt: skip
