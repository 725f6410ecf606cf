"""The windows a plan reads, as one columnar table with the per-signal selections it needs.

`kvscope plan` reads its windows with ``Store.read_frame`` (store/frame.py): one
pandas DataFrame with categorical source/signal/labels/engine/kind columns and float64 value
columns (NaN = unknown), in read_windows' row order. :class:`WindowTable` wraps it with the
signal and source codes computed once, so each statistic selects its rows with an integer
comparison instead of a pass over Window objects. Window records are accepted too: they are
turned into the same frame first (``store.frame.windows_frame``), so both inputs
give the same numbers.

Sums that must equal a loop over Window records (``total += w.delta`` in row order) use
:func:`seq_sum`: numpy's ``sum`` adds pairwise and would differ in the last bits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from core.records import Window
from store.frame import windows_frame

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pandas as pd

    FloatArray = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]

# The frame columns the plan uses (Store.read_frame(columns=PLAN_COLUMNS)); model_name
# gives each engine its model group (planner/frames/groups.py).
PLAN_COLUMNS = ("source", "signal", "labels", "engine", "model_name", "kind", "start",
                "length_s", "delta", "rate", "mean", "max", "last", "p50", "p90", "p99",
                "sum_delta")  # fmt: skip


def seq_sum(values: FloatArray) -> float:
    """``0.0 + v[0] + v[1] + …`` left to right, as a Python loop adds (not pairwise)."""
    import numpy as np

    if values.size == 0:
        return 0.0
    return float(np.cumsum(np.concatenate(([0.0], values)))[-1])


def names(column: pd.Series) -> set[str]:
    """The distinct values of a frame column as strings (one hash pass, no Python loop)."""
    return {str(v) for v in column.unique()}


def weighted_median_array(v: FloatArray, w: FloatArray) -> float | None:
    """plan_observe.weighted_median of arrays: the same pairs, order and running sum as its
    loop (finite values with weight > 0, sorted by value then weight), vectorized."""
    import numpy as np

    keep = np.isfinite(v) & (w > 0)
    v, w = v[keep], w[keep]
    order = np.lexsort((w, v))  # as sorting (value, weight) pairs
    v, w = v[order], w[order]
    run = np.cumsum(w)  # left to right, as the loop adds
    if v.size == 0 or not run[-1] > 0:
        return None
    at = np.flatnonzero(run >= run[-1] / 2)
    return float(v[at[0]] if at.size else v[-1])


class WindowTable:
    """A read_frame-shaped DataFrame plus its source/signal codes (module docstring)."""

    def __init__(self, frame: pd.DataFrame) -> None:
        import numpy as np
        import pandas as pd

        for name in ("source", "signal", "labels", "kind"):
            if name in frame.columns and not isinstance(frame[name].dtype, pd.CategoricalDtype):
                frame = frame.assign(**{name: frame[name].astype("category")})
        self.frame = frame
        # int64: pandas picks int8/int16 codes for few categories, and products overflow.
        self._codes: dict[str, IntArray] = {
            name: frame[name].cat.codes.to_numpy().astype(np.int64)
            for name in ("source", "signal", "labels")
            if name in frame.columns
        }
        self._index = {
            name: {str(c): i for i, c in enumerate(frame[name].cat.categories)}
            for name in ("source", "signal")
        }
        self.sources: list[str] = [str(c) for c in frame["source"].cat.categories]
        self.signals: list[str] = [str(c) for c in frame["signal"].cat.categories]

    @classmethod
    def of(cls, windows: Sequence[Window] | pd.DataFrame | WindowTable) -> WindowTable:
        """The table of a frame, of Window records (converted), or the table itself."""
        import pandas as pd

        if isinstance(windows, WindowTable):
            return windows
        if isinstance(windows, pd.DataFrame):
            return cls(windows)
        return cls(windows_frame(windows, PLAN_COLUMNS))

    def __len__(self) -> int:
        return len(self.frame)

    def codes(self, name: str) -> IntArray:
        """Category codes of ``source``, ``signal`` or ``labels`` (-1 = missing)."""
        out: IntArray = self._codes[name]
        return out

    def code(self, name: str, value: str) -> int:
        """The code of a source or signal name (-2 when absent: matches no row)."""
        return self._index[name].get(value, -2)

    def rows(self, signals: Iterable[str], sources: Iterable[str] | None = None) -> IntArray:
        """Positions (ascending) of the rows of these signals (and sources)."""
        import numpy as np

        mask = self._mask("signal", signals)
        if sources is not None:
            mask &= self._mask("source", sources)
        out: IntArray = np.flatnonzero(mask)
        return out

    def _mask(self, name: str, values: Iterable[str]) -> npt.NDArray[np.bool_]:
        import numpy as np

        index = self._index[name]
        wanted = [index[v] for v in values if v in index]
        codes = self._codes[name]
        if not wanted:
            return np.zeros(codes.size, dtype=bool)
        if len(wanted) == 1:
            one: npt.NDArray[np.bool_] = codes == wanted[0]
            return one
        lut = np.zeros(len(index) + 1, dtype=bool)
        lut[wanted] = True
        many: npt.NDArray[np.bool_] = lut[codes]
        return many

    def values(self, column: str, rows: IntArray) -> FloatArray:
        """A float column at these rows (NaN where unknown)."""
        import numpy as np

        out: FloatArray = self.frame[column].to_numpy(dtype=np.float64, na_value=np.nan)[rows]
        return out

    def names(self, name: str, rows: IntArray) -> list[str]:
        """``source`` / ``signal`` names at these rows."""
        cats = self.sources if name == "source" else self.signals
        return [cats[c] for c in self._codes[name][rows].tolist()]
