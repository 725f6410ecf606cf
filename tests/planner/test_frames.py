"""planner.frames.frames: windows -> one row per (source, engine, window start)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from benchmarks.accuracy.fitsynth import frame_to_windows, synthetic_frame
from collector.scrape import EngineMeta
from core.records import Window, labels_of
from planner.frames.frames import COLUMNS, engine_frame
from store.tables import EngineChange, EngineRecord

NUMERIC = [c for c in COLUMNS if c not in ("source", "engine", "offload_mode", "group")]
T0 = 1.8e9


def win(
    signal: str,
    kind: str,
    *,
    start: float = T0,
    source: str = "a",
    engine: str | None = "0",
    length: float = 60.0,
    extra: dict[str, str] | None = None,
    **kw: float,
) -> Window:
    labels = {"model_name": "m", **(extra or {})}
    if engine is not None:
        labels["engine"] = engine
    return Window(source=source, signal=signal, labels=labels_of(labels), start=start,
                  length_s=length, kind=kind, samples=4, **kw)  # type: ignore[arg-type]  # fmt: skip


def as_table(windows: list[Window]) -> pd.DataFrame:
    """The columnar form a store can hand over instead of Window objects."""
    fields = ["source", "signal", "labels", "start", "length_s", "delta", "rate", "mean",
              "max", "p50", "p90", "p99", "sum_delta"]  # fmt: skip
    return pd.DataFrame([{f: getattr(w, f) for f in fields} for w in windows])


def test_engine_frame_synthetic_windows_roundtrip_recovers_every_column() -> None:
    truth = synthetic_frame(4, 30, seed=7)
    meta = {f"engine-{i:03d}": EngineMeta(offload=m)  # type: ignore[arg-type]
            for i, m in enumerate(["none", "native", "lmcache", "none"])}  # fmt: skip
    got = engine_frame(frame_to_windows(truth), meta)
    assert list(got.columns) == list(COLUMNS)
    assert len(got) == len(truth)
    for col in NUMERIC:
        np.testing.assert_allclose(
            got[col].to_numpy(float), truth[col].to_numpy(float), rtol=1e-9, equal_nan=True,
            err_msg=col,
        )  # fmt: skip
    assert got["offload_mode"].tolist() == truth["offload_mode"].tolist()


def test_engine_frame_dataframe_input_matches_window_input() -> None:
    windows = frame_to_windows(synthetic_frame(3, 10, seed=1))
    a = engine_frame(windows)
    b = engine_frame(as_table(windows))
    engines = pd.Series([dict(w.labels).get("engine") for w in windows], dtype=object)
    models = pd.Series([dict(w.labels).get("model_name") for w in windows], dtype=object)
    c = as_table(windows).assign(engine=engines, model_name=models)
    c = engine_frame(c.drop(columns="labels").astype({"source": "category", "signal": "category"}))
    pd.testing.assert_frame_equal(a, b)
    pd.testing.assert_frame_equal(a, c)


def test_engine_frame_empty_input_returns_typed_empty_frame() -> None:
    got = engine_frame([])
    assert list(got.columns) == list(COLUMNS) and len(got) == 0
    assert got["kv_util"].dtype == np.float64


def test_engine_frame_missing_signals_give_nan_columns() -> None:
    got = engine_frame([win("kv_cache_usage_ratio", "gauge", mean=0.5, max=0.7),
                        win("some_unknown_signal", "gauge", mean=3.0)])  # fmt: skip
    assert len(got) == 1
    row = got.iloc[0]
    assert row["kv_util"] == 0.5 and row["kv_util_max"] == 0.7
    for col in ("preemptions", "tokens_per_s", "ttft_mean_s", "prefix_hit_ratio", "requests"):
        assert math.isnan(row[col]), col
    assert row["offload_mode"] == "unknown"


def test_engine_frame_counter_series_are_summed_gauges_averaged() -> None:
    got = engine_frame([
        win("request_success_total", "counter", delta=3.0, extra={"finished_reason": "stop"}),
        win("request_success_total", "counter", delta=4.0, extra={"finished_reason": "length"}),
        win("requests_running", "gauge", mean=2.0, extra={"x": "1"}),
        win("requests_running", "gauge", mean=4.0, extra={"x": "2"}),
        win("kv_cache_usage_ratio", "gauge", max=0.6, extra={"x": "1"}),
        win("kv_cache_usage_ratio", "gauge", max=0.9, extra={"x": "2"}),
    ])  # fmt: skip
    row = got.iloc[0]
    assert (row["requests"], row["running"], row["kv_util_max"]) == (7.0, 3.0, 0.9)


def test_engine_frame_rate_missing_uses_delta_over_length() -> None:
    got = engine_frame([
        win("prompt_tokens_total", "counter", delta=600.0, length=30.0),
        win("generation_tokens_total", "counter", rate=5.0, length=30.0),
    ])  # fmt: skip
    assert got.iloc[0]["prompt_tokens_per_s"] == 20.0
    assert got.iloc[0]["tokens_per_s"] == 25.0
    assert got.iloc[0]["window_s"] == 30.0


def test_engine_frame_histogram_zero_count_gives_nan_mean() -> None:
    got = engine_frame([
        win("ttft_seconds", "histogram", delta=0.0, sum_delta=0.0),
        win("request_prompt_tokens", "histogram", delta=4.0, sum_delta=4000.0),
    ])  # fmt: skip
    assert math.isnan(got.iloc[0]["ttft_mean_s"])
    assert got.iloc[0]["prompt_tokens_mean"] == 1000.0


@pytest.mark.parametrize(
    ("windows", "expected"),
    [
        # the derived ratio, weighted by its denominator across series
        ([win("prefix_cache_hit_ratio", "ratio", mean=0.5, delta=100.0, extra={"x": "1"}),
          win("prefix_cache_hit_ratio", "ratio", mean=0.0, delta=300.0, extra={"x": "2"})],
         0.125),
        # no derived ratio: hits / queries counters
        ([win("prefix_cache_hits_total", "counter", delta=30.0),
          win("prefix_cache_queries_total", "counter", delta=120.0)], 0.25),
        # zero queries: unknown, not 0/0
        ([win("prefix_cache_hits_total", "counter", delta=0.0),
          win("prefix_cache_queries_total", "counter", delta=0.0)], math.nan),
    ],
)  # fmt: skip
def test_engine_frame_hit_ratio_sources_combine(windows: list[Window], expected: float) -> None:
    got = engine_frame(windows).iloc[0]["prefix_hit_ratio"]
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected)


def test_engine_frame_engineless_series_join_the_sources_only_engine() -> None:
    got = engine_frame([
        win("kv_cache_usage_ratio", "gauge", mean=0.4),
        win("lmcache_l1_usage_bytes", "gauge", engine=None, mean=5e9, extra={"worker_id": "0"}),
        win("lmcache_hit_ratio", "ratio", engine=None, mean=0.3, delta=1e4),
    ])  # fmt: skip
    assert len(got) == 1
    row = got.iloc[0]
    assert (row["engine"], row["l1_usage_bytes"], row["lmcache_hit_ratio"]) == ("0", 5e9, 0.3)
    assert row["lmcache_requested_tokens"] == 1e4


def test_engine_frame_engineless_series_with_two_engines_get_their_own_row() -> None:
    got = engine_frame([
        win("kv_cache_usage_ratio", "gauge", engine="0", mean=0.4),
        win("kv_cache_usage_ratio", "gauge", engine="1", mean=0.6),
        win("lmcache_l1_usage_bytes", "gauge", engine=None, mean=5e9),
    ])  # fmt: skip
    assert got["engine"].tolist() == ["", "0", "1"]
    assert got.set_index("engine").loc["", "l1_usage_bytes"] == 5e9


def test_engine_frame_offload_mode_from_meta_by_source_or_engine_key() -> None:
    windows = [win("kv_cache_usage_ratio", "gauge", source=s, engine=e, mean=0.5)
               for s, e in (("a", "0"), ("a", "1"), ("b", "0"), ("c", "0"))]  # fmt: skip
    meta: dict[str, object] = {"a": EngineMeta(offload="native"), "a/1": {"offload": "lmcache"},
                               "b": "none"}  # fmt: skip
    got = engine_frame(windows, meta)
    assert got["offload_mode"].tolist() == ["native", "lmcache", "none", "unknown"]


def test_engine_frame_offload_mode_follows_recorded_changes_per_window() -> None:
    """An engine restarted with offload on: its windows before the switch count as none,
    from the switch on as native (store.tables.EngineChange); one regime: one mode throughout."""
    windows = [win("kv_cache_usage_ratio", "gauge", start=T0 + 60 * k, source=s, mean=0.5)
               for k in range(5) for s in ("a", "b")]  # fmt: skip
    switched = EngineRecord("c", "a", "m", None, None, 1, "native", changes=(
        EngineChange(T0 + 30, "none"), EngineChange(T0 + 100, "none"),  # same mode: no split
        EngineChange(T0 + 120, "native")))  # fmt: skip
    steady = EngineRecord("c", "b", "m", None, None, 1, "lmcache",
                          changes=(EngineChange(T0 + 200, "lmcache"),))  # fmt: skip
    got = engine_frame(windows, {"a": switched, "b": steady})
    by = got.groupby("source")["offload_mode"].apply(list).to_dict()
    assert by == {"a": ["none", "none", "native", "native", "native"], "b": ["lmcache"] * 5}


def test_engine_frame_rows_sorted_by_engine_then_start() -> None:
    windows = [win("preemptions_total", "counter", start=T0 + 60 * k, source=s, delta=float(k))
               for k in (2, 0, 1) for s in ("b", "a")]  # fmt: skip
    got = engine_frame(windows)
    assert got["source"].tolist() == ["a"] * 3 + ["b"] * 3
    assert got["start"].tolist() == [T0, T0 + 60, T0 + 120] * 2
    assert got["preemptions"].tolist() == [0.0, 1.0, 2.0] * 2


def test_engine_frame_source_and_engine_are_categoricals_of_the_names_held_sorted() -> None:
    windows = [win("kv_cache_usage_ratio", "gauge", source=s, engine=e, mean=0.5)
               for s, e in (("b", "1"), ("a", "0"), ("b", "0"))]  # fmt: skip
    windows.append(win("lmcache_l1_usage_bytes", "gauge", source="c", engine=None, mean=5e9))
    got = engine_frame(windows)
    for col, names in (("source", ["a", "b", "c"]), ("engine", ["", "0", "1"])):
        assert isinstance(got[col].dtype, pd.CategoricalDtype)
        assert list(got[col].cat.categories) == names  # only the names held, sorted
    assert got["source"].astype(str).tolist() == ["a", "b", "b", "c"]
    assert got["engine"].astype(str).tolist() == ["0", "0", "1", ""]
    codes, uniques = pd.factorize(got["source"])  # as the strings factorize
    assert codes.tolist() == [0, 1, 1, 2] and list(uniques) == ["a", "b", "c"]
