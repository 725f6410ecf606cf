"""What store/frame.py (SQLite) and store/frame_pg.py (PostgreSQL) share
when they read windows as columns: the integer columns, the series key, compiled SQL, and the
array helpers. Both readers import it; it imports neither.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    IntArray = npt.NDArray[np.int64]
RankFn = Callable[[str, Sequence[str]], Sequence[int]]

INT_COLUMNS = ("samples", "resets")
# One series: (source, signal, kind, labels JSON).
Series = tuple[str, str, str, str]


def compiled_sql(conn: Connection, clause: Any) -> tuple[str, Any]:
    """SQL text and driver parameters of a Core clause (IN lists rendered out)."""
    compiled = clause.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    if compiled.positiontup is not None:
        return str(compiled), tuple(compiled.params[k] for k in compiled.positiontup)
    return str(compiled), dict(compiled.params)


def first_positions(codes: IntArray) -> IntArray:
    """Index of the first row of each code, for codes numbered in order of appearance."""
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

    if codes.size == 0:
        return np.zeros(0, dtype=np.int64)
    running = np.maximum.accumulate(codes)
    new: IntArray = np.flatnonzero(np.diff(running, prepend=-1) > 0)
    return new


def dtype_of(column: str) -> Any:
    import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

    return np.int64 if column in INT_COLUMNS else np.float64
