"""The rows of a streamed frame (planner/frames/stream.py) of one kind of engine key.

A :class:`Space` numbers its rows as their keys first arrive and keeps per row how many
windows it has and their least and greatest length, plus the signals' columns (NaN: no
window), each as long as the rows were when its signal was added: rows made later have no
window of that signal. :func:`mean_lengths` gives the frame's ``window_s`` of both spaces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]


class Space:
    """Rows by key, their window counts and lengths, and the signals' columns."""

    def __init__(self) -> None:
        self.keys: pd.Index = pd.Index(np.zeros(0, dtype=np.int64))
        self.windows = np.zeros(0, dtype=np.int64)
        self.lo, self.hi = np.zeros(0), np.zeros(0)
        self.values: dict[str, FloatArray] = {}

    def rows(self, key: IntArray, length: FloatArray) -> IntArray:
        """The row of each window (rows made for new keys), its count and lengths noted."""
        if not len(self.keys) and key.size and pd.unique(key).size == key.size:
            self.keys = pd.Index(key.copy())  # a first signal with one window per key
            self.windows = np.zeros(key.size, dtype=np.int64)
            self.lo, self.hi = np.full(key.size, np.inf), np.full(key.size, -np.inf)
        if key.size and key.size == len(self.keys) and np.array_equal(key, self.keys.to_numpy()):
            # each row's key once, in row order: window i is row i
            self.windows += 1
            np.minimum(self.lo, length, out=self.lo)
            np.maximum(self.hi, length, out=self.hi)
            return np.arange(key.size, dtype=np.int64)
        row = self.keys.get_indexer(pd.Index(key))
        if (row < 0).any():
            self.keys = self.keys.append(pd.Index(pd.unique(key[row < 0])))
            row = self.keys.get_indexer(pd.Index(key))
            more = len(self.keys) - self.windows.size
            self.windows = np.concatenate([self.windows, np.zeros(more, dtype=np.int64)])
            self.lo = np.concatenate([self.lo, np.full(more, np.inf)])
            self.hi = np.concatenate([self.hi, np.full(more, -np.inf)])
        out = row.astype(np.int64)
        self.windows += np.bincount(out, minlength=len(self.keys))
        np.minimum.at(self.lo, out, length)
        np.maximum.at(self.hi, out, length)
        return out

    def column(self, name: str) -> FloatArray | None:
        """A signal's column over every row (NaN past the rows it was made for)."""
        v = self.values.pop(name, None)
        if v is None or v.size == len(self.keys):
            return v
        return np.concatenate([v, np.full(len(self.keys) - v.size, np.nan)])


def present(keys: IntArray) -> tuple[IntArray, IntArray]:
    """The distinct non-negative keys and how often each occurs (a bincount when dense)."""
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    top = int(keys.max()) + 1
    if top <= 4 * keys.size + 1_000_000:
        counts = np.bincount(keys, minlength=top)
        at = np.flatnonzero(counts)
        return at.astype(np.int64), counts[at].astype(np.int64)
    uniq, cnt = np.unique(keys, return_counts=True)
    return uniq.astype(np.int64), cnt.astype(np.int64)


def mean_lengths(
    lab: Space, unl: Space, into: IntArray, n: int
) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """(``window_s`` per frame row, rows whose windows differ in length).

    The frame's rows are ``lab``'s, then the new ones of ``unl`` (``into``: the frame row of
    each of its rows). A row of k windows all of length L has L + L + … (k times, left to
    right, as engine_frame's bincount adds them) / k; rows of unequal lengths are marked.
    """
    k = np.zeros(n, dtype=np.int64)
    lo, hi = np.full(n, np.inf), np.full(n, -np.inf)
    k[: lab.windows.size] = lab.windows
    lo[: lab.lo.size], hi[: lab.hi.size] = lab.lo, lab.hi
    np.add.at(k, into, unl.windows)
    np.minimum.at(lo, into, unl.lo)
    np.maximum.at(hi, into, unl.hi)
    uneven = ~(lo == hi)
    by_k = np.argsort(k, kind="stable")
    ks, lo_k = k[by_k], lo[by_k]  # rows by window count: "at least j windows" is a tail
    sums = np.zeros(n)
    for j in range(1, int(ks[-1]) + 1 if n else 1):
        at = int(np.searchsorted(ks, j))  # the rows of at least j windows
        sums[at:] += lo_k[at:]
    total = np.empty(n)
    total[by_k] = sums
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / k, uneven
