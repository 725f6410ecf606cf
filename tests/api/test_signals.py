"""The signals route's arithmetic on hand-made windows: each signal's latest window per
source, label sets combined (rates summed, gauges averaged, ratios and p90s count-weighted)."""

from __future__ import annotations

import pytest

from api.routes.signals import combine, latest_values
from core.records import Labels, Window

T0 = 1_764_000_000.0
A: Labels = (("engine", "0"),)
B: Labels = (("engine", "1"),)


def w(
    signal: str, start: float, labels: Labels = A, kind: str = "gauge", **values: float
) -> Window:
    return Window("e1", signal, labels, start, 60.0, kind, 4, **values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("stat", "windows", "expected"),
    [
        ("rate", [w("x", T0, kind="counter", rate=2.0), w("x", T0, B, "counter", rate=3.0)], 5.0),
        ("rate", [w("x", T0, kind="counter", delta=120.0)], 2.0),  # delta / length
        ("rate", [w("x", T0, kind="counter")], None),
        ("mean", [w("x", T0, mean=0.2), w("x", T0, B, mean=0.6)], 0.4),
        ("ratio", [w("r", T0, kind="ratio", mean=0.5, delta=100.0),
                   w("r", T0, B, "ratio", mean=1.0, delta=300.0)], 0.875),
        ("ratio", [w("r", T0, kind="ratio", mean=0.5, delta=0.0)], None),  # nothing queried
        ("p90", [w("h", T0, kind="histogram", p90=1.0, delta=1.0),
                 w("h", T0, B, "histogram", p90=2.0, delta=3.0)], 1.75),
        ("p90", [w("h", T0, kind="histogram", p90=1.0), w("h", T0, B, "histogram", p90=3.0)],
         2.0),  # no counts: the plain mean
    ],
)  # fmt: skip
def test_combine_label_sets_of_one_window(
    stat: str, windows: list[Window], expected: float | None
) -> None:
    got = combine(stat, windows)
    assert got == (None if expected is None else pytest.approx(expected))


def test_latest_values_takes_each_signals_latest_window() -> None:
    windows = [
        w("kv_cache_usage_ratio", T0, mean=0.1),
        w("kv_cache_usage_ratio", T0 + 60, mean=0.7),
        w("prompt_tokens_total", T0, kind="counter", rate=100.0),  # older than the KV window
        w("generation_tokens_total", T0, kind="counter", rate=20.0),
    ]
    (one,) = latest_values(windows, {"e1": "native"}, now=T0 + 300)
    assert one["signals"]["kv_cache_usage_ratio"]["value"] == pytest.approx(0.7)
    assert one["signals"]["kv_cache_usage_ratio"]["window_start"] == T0 + 60
    assert one["tokens_per_s"] == pytest.approx(120.0)
    assert one["offload"] == "native"
    assert one["window_start"] == T0 + 60 and one["age_s"] == pytest.approx(180.0)
