"""planner.fit.units.engine_codes: cached per frame, recomputed when the frame's source or
engine column is replaced, and equal to a fresh computation each time."""

from __future__ import annotations

import gc

import numpy as np
import pandas as pd

from planner.fit.units import _CODES, _UNIT_CODES, engine_codes, engine_keys, unit_codes


def _frame() -> pd.DataFrame:
    return pd.DataFrame(
        {"source": ["b", "a", "b", "c"], "engine": ["0", "0", "1", ""], "x": [1.0, 2, 3, 4]}
    )


def _fresh(frame: pd.DataFrame, short: bool) -> list[str]:
    codes, names = engine_codes(frame.copy(), short=short)
    return [names[c] for c in codes]


def test_codes_name_each_rows_key_and_are_cached() -> None:
    f = _frame()
    codes, names = engine_codes(f)
    assert [names[c] for c in codes] == ["b/0", "a/0", "b/1", "c/"]
    short_codes, short_names = engine_codes(f, short=True)
    assert [short_names[c] for c in short_codes] == list(engine_keys(f))
    assert id(f) in _CODES
    codes[:] = 0  # a copy: the cache is not changed through it
    again, _ = engine_codes(f)
    assert [names[c] for c in again] == ["b/0", "a/0", "b/1", "c/"]


def test_replaced_column_is_coded_again() -> None:
    f = _frame()
    engine_codes(f)
    f["source"] = ["z", "z", "y", "y"]
    codes, names = engine_codes(f)
    assert [names[c] for c in codes] == ["z/0", "z/0", "y/1", "y/"]
    assert [names[c] for c in codes] == _fresh(f, short=False)
    f["engine"] = pd.Series(["0", "0", "0", "0"])
    codes, names = engine_codes(f, short=True)
    assert [names[c] for c in codes] == _fresh(f, short=True)


def test_a_dead_frame_leaves_the_cache() -> None:
    f = _frame()
    engine_codes(f)
    key = id(f)
    del f
    gc.collect()
    assert key not in _CODES
    g = pd.DataFrame({"source": np.array(["q"], dtype=object), "engine": ["1"]})
    codes, names = engine_codes(g)
    assert [names[c] for c in codes] == ["q/1"]


def _categorical_frame() -> pd.DataFrame:
    f = _frame()
    for col in ("source", "engine"):
        f[col] = pd.Categorical(f[col], categories=sorted(set(f[col])))
    return f


def test_categorical_columns_are_cached_by_their_codes() -> None:
    f = _categorical_frame()
    codes, names = engine_codes(f)
    assert [names[c] for c in codes] == ["b/0", "a/0", "b/1", "c/"]
    assert [names[c] for c in codes] == _fresh(_frame(), short=False)  # as the strings give

    def root() -> object:
        where = _CODES[id(f)][1][0]
        assert isinstance(where, tuple)
        return where[0]

    first = root()
    engine_codes(f)
    assert root() is first  # a hit: no object array made per call
    # new names for the same codes: not the cached keys
    f["source"] = f["source"].cat.rename_categories({"a": "x", "b": "y", "c": "z"})
    codes, names = engine_codes(f)
    assert [names[c] for c in codes] == ["y/0", "x/0", "y/1", "z/"]


def test_unit_codes_are_factorize_hashed_once_per_array() -> None:
    units = np.asarray(["pool:p", "b/0", "pool:p", "c"], dtype=object)
    codes, values = unit_codes(units)
    want_codes, want_values = pd.factorize(units, use_na_sentinel=False)
    assert codes.tolist() == want_codes.tolist() and values == list(want_values)
    codes[:] = 9  # a copy: the cache is not changed through it
    assert unit_codes(units)[0].tolist() == want_codes.tolist()
    assert id(units) in _UNIT_CODES
    other = units.copy()  # equal values, another array: its own entry
    assert unit_codes(other)[0].tolist() == want_codes.tolist()
    key = id(units)
    del units
    gc.collect()
    assert key not in _UNIT_CODES
