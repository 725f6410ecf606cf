"""A signal's frame columns from its windows, and the frame's columns from both spaces.

:func:`signal_columns` does for one signal's windows what engine_frame does for all of them
(the same sums, means, maxima and weighted means, in the same order; NaN where a row has no
window), and folds a signal's own sum and count into their mean at once. :func:`final_columns`
joins the two spaces of planner/frames/space.py and adds the columns built of several signals
(the hit ratios' counter fallback and weights, the token rate).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from planner.frames.frames import _RATIO_WEIGHT, _RATIOS, _SIMPLE, COLUMNS

if TYPE_CHECKING:
    import numpy.typing as npt

    from planner.frames.space import Space

    FloatArray = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]

# (mean column, sum column, count column): a signal's own sum over its count
DERIVED = (("ttft_mean_s", "_ttft_sum", "ttft_count"),
           ("prompt_tokens_mean", "_prompt_sum", "_prompt_count"),
           ("e2e_mean_s", "_e2e_sum", "_e2e_count"))  # fmt: skip


def _roles(signal: str) -> list[tuple[str, str, str]]:
    """(column, field, how) of the frame's columns this signal's windows make."""
    out = [(col, field, how) for col, sig, field, how in _SIMPLE if sig == signal]
    for col, ratio, numer, denom in _RATIOS:
        if signal == ratio:
            out += [(f"{col}:w", "delta", "sum"), (f"{col}:r", "mean", "wmean")]
        if signal == numer:
            out.append((f"{col}:num", "delta", "sum"))
        if signal == denom:
            out.append((f"{col}:den", "delta", "sum"))
    return out


def fields_of(signal: str) -> set[str]:
    """The read_frame value columns the frame reads of this signal."""
    out = {"start", "length_s"}
    for _, field, how in _roles(signal):
        out |= {"rate", "delta"} if field == "rate" else {field}
        if how == "wmean":
            out.add("delta")
    return out


def signal_columns(
    signal: str, row: IntArray, n: int, fields: dict[str, FloatArray]
) -> dict[str, FloatArray]:
    """The columns one signal's windows make over ``n`` rows (``row``: each window's)."""
    if row.size == n and np.array_equal(row, np.arange(n)):
        out = _own_rows(signal, fields)
    else:
        out = _summed(signal, row, n, fields)
    for mean, total, count in DERIVED:
        if total in out and count in out:
            c = out[count]
            with np.errstate(invalid="ignore", divide="ignore"):
                out[mean] = np.where(c > 0, out.pop(total) / c, np.nan)
            if count not in COLUMNS:
                del out[count]
    return out


def _value(field: str, fields: dict[str, FloatArray]) -> FloatArray:
    """A window's value of ``field``; ``rate``: a counter without a rate has delta / length."""
    if field != "rate":
        return fields[field]
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = fields["rate"]
        out: FloatArray = np.where(np.isnan(rate), fields["delta"] / fields["length_s"], rate)
    return out


def _summed(
    signal: str, row: IntArray, n: int, fields: dict[str, FloatArray]
) -> dict[str, FloatArray]:
    """signal_columns' columns, the windows of a row added (bincount) or their maximum."""
    out: dict[str, FloatArray] = {}
    for name, field, how in _roles(signal):
        v = _value(field, fields)
        keep = ~np.isnan(v)
        idx = row[keep]
        if how == "wmean":  # weighted by the denominators (a missing one counts 1)
            wt = np.where(np.isnan(fields["delta"]), 1.0, fields["delta"])[keep]
            top = np.bincount(idx, weights=v[keep] * wt, minlength=n)
            bottom = np.bincount(idx, weights=wt, minlength=n)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[name] = np.where(bottom > 0, top / bottom, np.nan)
            continue
        cnt = np.bincount(idx, minlength=n)
        if how == "max":
            res = np.full(n, -np.inf)
            np.maximum.at(res, idx, v[keep])
        else:
            res = np.bincount(idx, weights=v[keep], minlength=n)
            if how == "mean":
                res = res / np.maximum(cnt, 1)
        out[name] = np.where(cnt > 0, res, np.nan)
    return out


def _own_rows(signal: str, fields: dict[str, FloatArray]) -> dict[str, FloatArray]:
    """signal_columns' columns when window i is row i: each sum, mean or maximum of one
    value (0.0 + v, as bincount adds it; NaN where v is NaN)."""
    out: dict[str, FloatArray] = {}
    for name, field, how in _roles(signal):
        v = _value(field, fields)
        if how == "wmean":
            wt = np.where(np.isnan(fields["delta"]), 1.0, fields["delta"])
            bottom = np.where(np.isnan(v), 0.0, wt + 0.0)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[name] = np.where(bottom > 0, (v * wt + 0.0) / bottom, np.nan)
        elif how == "max":
            out[name] = v.copy()
        else:
            out[name] = v + 0.0
    return out


def final_columns(
    lab: Space, unl: Space, into: IntArray, n: int, order: IntArray
) -> dict[str, FloatArray]:
    """The frame's value columns in frame order: ``lab``'s rows, then ``unl``'s new ones
    (``into``: each ``unl`` row's frame row; its value where it has one)."""

    def column(name: str) -> FloatArray:
        out = np.full(n, np.nan)
        a = lab.column(name)
        if a is not None:
            out[: a.size] = a
        b = unl.column(name)
        if b is not None:
            has = ~np.isnan(b)
            out[into[has]] = b[has]
        return out

    got: dict[str, FloatArray] = {}
    for col, _, _, _ in _RATIOS:
        r, w = column(f"{col}:r"), column(f"{col}:w")
        d_num, d_den = column(f"{col}:num"), column(f"{col}:den")
        with np.errstate(invalid="ignore", divide="ignore"):
            fallback = np.where(d_den > 0, d_num / d_den, np.nan)
        got[col] = np.where(np.isnan(r), fallback, r)[order]
        if col in _RATIO_WEIGHT:
            got[_RATIO_WEIGHT[col]] = np.where(np.isnan(w), d_den, w)[order]
    skip = {"source", "engine", "start", "window_s", "offload_mode", "group", "tokens_per_s"}
    for col in COLUMNS:
        if col not in skip and col not in got:
            got[col] = column(col)[order]
    got["tokens_per_s"] = got["prompt_tokens_per_s"] + got["output_tokens_per_s"]
    return got
