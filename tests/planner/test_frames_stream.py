"""planner.frames.stream: the frame built one signal at a time equals engine_frame's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from core.records import Window, labels_of
from planner.frames.frames import engine_frame
from planner.frames.table import PLAN_COLUMNS
from planner.plan.needed import NEEDED_SIGNALS
from planner.plan.windows import finish_frame, read_windows
from store.store import Store

T0 = 1.8e9


def _win(source: str, signal: str, kind: str, i: int, labels: dict[str, str],
         *, length: float = 60.0, **kw: float) -> Window:  # fmt: skip
    return Window(source=source, signal=signal, labels=labels_of(labels), start=T0 + 60 * i,
                  length_s=length, kind=kind, samples=4, **kw)  # type: ignore[arg-type]  # fmt: skip


def _windows() -> list[Window]:
    eng = {"engine": "0", "model_name": "m"}
    out = []
    for i in range(30):
        for s in ("a", "b", "c"):
            out.append(_win(s, "kv_cache_usage_ratio", "gauge", i, eng, mean=0.1 * (i % 7),
                            max=0.9))  # fmt: skip
            out.append(_win(s, "request_success_total", "counter", i, eng, delta=3.0 + i))
        # a's LMCache series carry no engine label: they join a's only engine
        out.append(_win("a", "lmcache_hit_tokens_total", "counter", i, {"model_name": "m"},
                        delta=float(i)))  # fmt: skip
        # b has one signal both with and without an engine label: rebuilt by engine_frame
        out.append(_win("b", "request_success_total", "counter", i, {"model_name": "m"},
                        delta=0.1 * i))  # fmt: skip
        # c's windows differ in length within a row: rebuilt by engine_frame
        out.append(_win("c", "requests_running", "gauge", i, eng, length=59.9, mean=2.0))
    return out


def test_streamed_frame_is_engine_frame_bit_for_bit(tmp_path: Path) -> None:
    with Store(f"sqlite:///{tmp_path / 's.db'}") as store:
        store.migrate()
        store.write_windows(_windows())
        window, builder = read_windows(store, cluster=None, since=None, until=None)
        _, inexact = builder.finish({})
        assert inexact == {"b", "c"}
        window, builder = read_windows(store, cluster=None, since=None, until=None)
        got = finish_frame(builder, {}, store, cluster=None, since=None, until=None)
        table = store.read_frame(signals=sorted(NEEDED_SIGNALS), columns=PLAN_COLUMNS)
    want = engine_frame(table, {})
    assert len(window) == len(table)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    for col in want.columns:
        if want[col].dtype == np.float64:
            assert np.array_equal(got[col].to_numpy().view(np.int64),
                                  want[col].to_numpy().view(np.int64)), col  # fmt: skip
