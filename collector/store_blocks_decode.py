"""The packed hours' blocks (collector/store_blocks.py) gathered into a frame's columns.

:class:`Packs` takes the blocks as they stream in, appending each one's data to one buffer
per column set (the ``columns`` bitmask): the driver's objects are let go as they come, and
no second copy of ~0.5 GB of blocks is ever joined together. :meth:`Packs.frame` reads each
buffer with ``numpy.frombuffer`` as one 2-D array and scatters its columns into the frame's
(preallocated, NaN where a block has no such column), the rows no pack covered after them.
On this project's VM a fresh page of memory costs more than the work done in it, so large
temporaries are avoided (the rows' positions come from one in-place cumulative sum).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from collector.errors import StoreError
from collector.store_blocks import BLOCK_COLUMNS, Block, Frame
from collector.store_columns import Series, dtype_of

if TYPE_CHECKING:
    import numpy.typing as npt

    from collector.store_columns import IntArray


class Packs:
    """The blocks added so far: per block its series code, rows and column set; the data of
    each column set appended into one buffer (rows of the blocks in the order they came)."""

    def __init__(self) -> None:
        self.ids: dict[Series, int] = {}
        self.codes: list[int] = []
        self.counts: list[int] = []
        self.masks: list[int] = []
        self.rows = 0
        self._data: dict[int, bytearray] = {}

    def add(self, blocks: Iterable[Block]) -> Packs:
        """Take these blocks (an iterator is consumed as it goes); return self."""
        ids, data = self.ids, self._data
        for source, signal, kind, labels, n, mask, blob in blocks:
            key = (source, signal, kind, labels)
            code = ids.get(key)
            if code is None:
                code = ids[key] = len(ids)
            self.codes.append(code)
            self.counts.append(n)
            self.masks.append(mask)
            self.rows += n
            buffer = data.get(mask)
            if buffer is None:
                buffer = data[mask] = bytearray()
            buffer += blob
        return self

    def frame(
        self,
        byte_order: str,
        *,
        numeric: Sequence[str],
        since: float | None,
        until: float | None,
        tail: Frame,
    ) -> Frame:
        """The packed windows with since <= start < until (``byte_order``: of the data,
        store_blocks.BYTE_ORDER), then the rows of ``tail`` (read from ``windows``): series,
        each row's series code, and the ``numeric`` columns. The buffers are let go."""
        import numpy as np

        tail_series, tail_sid, tail_nums = tail
        n_blocks = np.asarray(self.counts, dtype=np.int64)
        packed = int(n_blocks.sum())
        total = packed + len(tail_sid)
        nums: dict[str, npt.NDArray[Any]] = {
            name: np.full(total, np.nan)
            if dtype_of(name) is np.float64
            else np.zeros(total, np.int64)
            for name in numeric
        }
        offsets = np.cumsum(n_blocks) - n_blocks  # each block's first row
        by_mask = np.asarray(self.masks, dtype=np.int64)
        for mask in sorted(self._data):
            which = np.flatnonzero(by_mask == mask)
            present = [i for i in range(len(BLOCK_COLUMNS)) if mask >> i & 1]
            data = self._data.pop(mask)
            at = positions(offsets[which], n_blocks[which])
            if len(data) != 8 * len(present) * at.size:
                raise StoreError(f"packed blocks of {len(data)} bytes hold {at.size} rows of "
                                 f"{len(present)} float64 by their counts")  # fmt: skip
            table = np.frombuffer(data, dtype=f"{byte_order}f8").reshape(-1, len(present))
            for j, i in enumerate(present):
                name = BLOCK_COLUMNS[i]
                if name in nums:
                    nums[name][at] = table[:, j]  # to native order in the copy
            del table, data, at
        series = list(self.ids)
        ids = dict(self.ids)
        lut = np.empty(len(tail_series), dtype=np.int64)
        for j, s in enumerate(tail_series):
            code = ids.get(s)
            if code is None:
                code = ids[s] = len(series)
                series.append(s)
            lut[j] = code
        codes = np.asarray(self.codes, dtype=np.int64)
        sid = np.concatenate([np.repeat(codes, n_blocks), lut[tail_sid]])
        for name in numeric:
            nums[name][packed:] = tail_nums[name]
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
