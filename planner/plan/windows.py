"""The windows of `kvscope plan`, read one signal at a time with only the columns it needs.

Each signal of NEEDED_SIGNALS is read on its own (``Store.read_frame(signals=[s],
columns=…)``): the frame's signals are folded into the analysis frame at once
(planner/frames/stream.py), and of each signal the table (planner/frames/table.py) keeps
only the columns later statistics read (observe, KV capacity, the demand forecasts), so the
memory held is one signal's windows plus the frame, not every column of every window.
Sources the streamed frame cannot join exactly are re-read and framed by engine_frame.
Reading (:func:`signal_parts`) and folding (:func:`fold`) are apart so that the reads can
run in another process (planner/plan/readahead.py) and the folds here, in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pandas as pd

from core.catalog import DERIVED_RATIOS
from planner.frames.frames import SIGNALS as FRAME_SIGNALS
from planner.frames.frames import coded_text, engine_frame
from planner.frames.stream import FrameBuilder, fields_of
from planner.frames.table import WindowTable
from planner.plan.needed import (
    KV_SIGNAL,
    LMCACHE_HEALTHY,
    NEEDED_SIGNALS,
    PROMPT_HIST,
    PROMPT_TOKENS,
    RATE_SIGNAL,
    RECOMPUTED,
    RUNNING_SIGNAL,
)

if TYPE_CHECKING:
    from store.store import Store

# What the statistics after the frame read of each signal (besides its sources).
_KEEP: dict[str, tuple[str, ...]] = {
    RECOMPUTED: ("delta", "rate", "length_s"),  # reprefill_share; PROMPT_TOKENS too if any
    LMCACHE_HEALTHY: ("labels", "start", "last", "mean"),  # lmcache_health
    PROMPT_HIST: ("delta", "sum_delta", "p90", "p99"),  # prompt_lengths
}
for _ratio, _num, _den in DERIVED_RATIOS:  # pooled_ratio
    _KEEP[_ratio] = ("delta", "mean")
    _KEEP[_num] = _KEEP[_den] = ("delta",)
_DEMAND = (KV_SIGNAL, RATE_SIGNAL, RUNNING_SIGNAL)  # demand_series_from_frame, kv_capacity
_FRAME_READ = ("source", "signal", "engine", "model_name", "start", "length_s", "delta", "rate",
               "mean", "max", "p50", "p90", "p99", "sum_delta")  # fmt: skip


def _demand_columns(kinds: set[str]) -> set[str]:
    """The value columns demand_series_from_frame reads of series of these kinds."""
    out = {"labels", "kind", "start"}
    for kind in kinds:
        if kind in ("gauge", "ratio"):
            out.add("mean")
        elif kind == "counter":
            out.add("rate")
        else:  # a histogram: observations per second
            out |= {"delta", "length_s"}
    return out


class SignalPart(NamedTuple):
    """One needed signal's windows as read (``Store.read_frame``) and the columns of them
    the plan's table keeps (empty: the signal is only counted)."""

    signal: str
    part: pd.DataFrame
    keep: frozenset[str]


def signal_parts(
    store: Store, *, cluster: str | None, since: float | None, until: float | None
) -> Iterator[SignalPart]:
    """Every needed signal read once, in the order :func:`fold` takes them: with only the
    columns the frame and the table need of it (some depend on the signals before)."""
    # The frame's signals in name order (the order engine_frame adds their lengths in);
    # the re-prefill counter first, to know whether the prompt-token counter is kept.
    order = sorted(NEEDED_SIGNALS - FRAME_SIGNALS) + sorted(FRAME_SIGNALS)
    recomputed = False  # the re-prefill counter has windows
    for signal in order:
        keep = set(_KEEP.get(signal, ()))
        if signal == PROMPT_TOKENS and recomputed:
            keep |= set(_KEEP[RECOMPUTED])
        if signal in _DEMAND:
            keep |= _demand_columns({"gauge", "ratio", "counter", "histogram"})
        columns = {"source", "start", "length_s", *keep}
        if signal in FRAME_SIGNALS:
            columns |= {"engine", "model_name", *fields_of(signal)}
        part = store.read_frame(signals=[signal], cluster=cluster, since=since, until=until,
                                columns=columns)  # fmt: skip
        if signal == RECOMPUTED:
            recomputed = len(part) > 0
        if signal in _DEMAND and len(part):
            kinds = {str(k) for k in part["kind"].unique()}
            keep = keep - _demand_columns({"gauge", "ratio", "counter", "histogram"})
            keep |= _demand_columns(kinds)
        yield SignalPart(signal, part, frozenset({"source", *keep}) if keep else frozenset())
        del part


def fold(parts: Iterable[SignalPart]) -> tuple[WindowTable, FrameBuilder]:
    """The kept table and the frame's accumulators of the parts, taken one at a time."""
    table, builder = WindowTable(), FrameBuilder()
    for signal, part, keep in parts:
        if signal in FRAME_SIGNALS:
            builder.add(signal, part)
        table.add(signal, part, keep=keep)
        del part
    return table, builder


def read_windows(
    store: Store, *, cluster: str | None, since: float | None, until: float | None
) -> tuple[WindowTable, FrameBuilder]:
    """Every needed signal read once: the kept table and the frame's accumulators."""
    return fold(signal_parts(store, cluster=cluster, since=since, until=until))


def finish_frame(
    builder: FrameBuilder,
    meta: Mapping[str, object],
    store: Store,
    *,
    cluster: str | None,
    since: float | None,
    until: float | None,
) -> pd.DataFrame:
    """The analysis frame of the read windows; the rows of sources the accumulators could
    not join exactly are rebuilt by engine_frame from those sources' windows."""
    frame, inexact = builder.finish(meta)
    if not inexact:
        return frame
    again = store.read_frame(
        signals=sorted(FRAME_SIGNALS), sources=sorted(inexact), cluster=cluster, since=since,
        until=until, columns=_FRAME_READ,
    )  # fmt: skip
    exact = engine_frame(again, meta)
    keep = frame[~frame["source"].isin(inexact).to_numpy(dtype=bool)]

    out = pd.concat([keep, exact], ignore_index=True)
    for column in ("source", "engine"):  # the parts' categories differ: one sorted set again
        codes, names = pd.factorize(out[column].astype(str))
        out[column] = coded_text(np.asarray(names, dtype=object), codes)
    return out.sort_values(["source", "engine", "start"], kind="stable", ignore_index=True)
