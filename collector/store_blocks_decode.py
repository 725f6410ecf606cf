"""The packed hours' blocks (collector/store_blocks.py) decoded into a frame's columns.

The columns are made once, for the rows the blocks hold (counted first, in the read's
snapshot) and the rows no pack covered (read before the blocks, put after them), NaN where a
block has no such column. :class:`Packs` then takes the blocks as they stream in, a batch
at a time: per column set (the ``columns`` bitmask) the batch's data joined and read with
``numpy.frombuffer`` as one 2-D array, its columns scattered into the frame's. No buffer of
all the blocks is ever made: on this project's VM a fresh page of memory costs more than the
work done in it, and a batch's temporaries reuse the memory of the batch before (the rows'
positions come from one in-place cumulative sum).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from collector.store_blocks import BLOCK_COLUMNS, Block, Frame
from collector.store_columns import Series, dtype_of
from core.errors import StoreError

if TYPE_CHECKING:
    import numpy.typing as npt

    from collector.store_columns import IntArray

BATCH = 4_096  # blocks decoded at a time


class Packs:
    """A frame's columns being filled: ``rows`` rows from blocks (in the order they come),
    then the rows of ``tail`` (read from ``windows``); ``byte_order`` is the data's
    (store_blocks.BYTE_ORDER)."""

    def __init__(self, numeric: Sequence[str], byte_order: str, rows: int, tail: Frame) -> None:
        import numpy as np

        self._tail = tail
        self._order = byte_order
        self._rows = rows
        total = rows + len(tail[1])
        self.nums: dict[str, npt.NDArray[Any]] = {
            name: np.zeros(total, np.int64)
            if dtype_of(name) is np.int64
            else np.full(total, np.nan)
            for name in numeric
        }
        for name, values in self.nums.items():
            values[rows:] = tail[2][name]
        self.sid: IntArray = np.empty(total, dtype=np.int64)  # each row's series code
        self.ids: dict[Series, int] = {}
        self.placed = 0  # rows of blocks in the columns so far
        self._batch: list[tuple[int, int, int, bytes]] = []  # first row, code, column set, data

    def add(self, blocks: Iterable[Block]) -> Packs:
        """Decode these blocks (an iterator is consumed as it goes); return self."""
        ids, batch = self.ids, self._batch
        at = self.placed
        for source, signal, kind, labels, n, mask, blob in blocks:
            key = (source, signal, kind, labels)
            code = ids.get(key)
            if code is None:
                code = ids[key] = len(ids)
            batch.append((at, code, mask, blob))
            at += n
            if at > self._rows:
                raise StoreError(f"packed blocks hold more than the {self._rows} rows counted")
            if len(batch) == BATCH:
                self._flush(at)
        self._flush(at)
        return self

    def _flush(self, at: int) -> None:
        """The batch's data scattered into the columns, a column set at a time."""
        import numpy as np

        batch = list(self._batch)
        self._batch.clear()  # (add appends to this list)
        self.placed = at
        if not batch:
            return
        firsts = np.asarray([b[0] for b in batch], dtype=np.int64)
        sizes = np.diff(firsts, append=at)
        codes = np.asarray([b[1] for b in batch], dtype=np.int64)
        self.sid[firsts[0] : at] = np.repeat(codes, sizes)  # the batch's rows are contiguous
        masks = np.asarray([b[2] for b in batch], dtype=np.int64)
        for mask in np.unique(masks).tolist():
            which = np.flatnonzero(masks == mask).tolist()
            present = [i for i in range(len(BLOCK_COLUMNS)) if mask >> i & 1]
            where = positions(firsts[which], sizes[which])
            data = b"".join([batch[i][3] for i in which])
            if len(data) != 8 * len(present) * where.size:
                raise StoreError(f"packed blocks of {len(data)} bytes hold {where.size} rows of "
                                 f"{len(present)} float64 by their counts")  # fmt: skip
            table = np.frombuffer(data, dtype=f"{self._order}f8").reshape(-1, len(present))
            for j, i in enumerate(present):
                values = self.nums.get(BLOCK_COLUMNS[i])
                if values is not None:
                    values[where] = table[:, j]  # to native order in the copy

    def frame(self, since: float | None, until: float | None) -> Frame:
        """Series, each row's series code, and the columns: the packed windows with since <=
        start < until, then the tail's rows."""
        import numpy as np

        if self.placed != self._rows:
            raise StoreError(f"packed blocks hold {self.placed} rows, {self._rows} counted")
        tail_series, tail_sid, _ = self._tail
        series = list(self.ids)
        ids = dict(self.ids)
        lut = np.empty(len(tail_series), dtype=np.int64)
        for j, s in enumerate(tail_series):
            code = ids.get(s)
            if code is None:
                code = ids[s] = len(series)
                series.append(s)
            lut[j] = code
        sid, nums = self.sid, self.nums
        sid[self._rows :] = lut[tail_sid]
        if since is not None or until is not None:
            lo = -math.inf if since is None else since
            hi = math.inf if until is None else until
            start = nums["start"]
            inside = (start >= lo) & (start < hi)
            if not inside.all():
                keep = np.flatnonzero(inside)
                sid = sid[keep]
                nums = {name: values[keep] for name, values in nums.items()}
        return series, sid, nums


def positions(firsts: IntArray, sizes: IntArray) -> IntArray:
    """The rows firsts[k], firsts[k] + 1, … (sizes[k] of them) of every block k in turn, in
    one array (a cumulative sum of steps in place: no other temporary of its size)."""
    import numpy as np

    keep = sizes > 0
    firsts, sizes = firsts[keep], sizes[keep]
    at = np.ones(int(sizes.sum()), dtype=np.int64)
    if at.size == 0:
        return at
    steps = firsts.copy()
    steps[1:] -= firsts[:-1] + sizes[:-1] - 1
    at[np.cumsum(sizes) - sizes] = steps
    out: IntArray = np.cumsum(at, out=at)
    return out
