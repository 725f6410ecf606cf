"""planner.fit.run.fit_all: every fit the data supports, refusals collected instead of raised."""

from __future__ import annotations

import json
import warnings

import pytest

from benchmarks.accuracy.fitsynth import H100_BF16_FLOPS, llama8b_prefill_flops, synthetic_frame
from planner.fit.common import Interval, recorded_warnings
from planner.fit.run import FitReport, fit_all
from planner.model.values import json_ready


def test_fit_all_synthetic_cluster_runs_every_fit() -> None:
    report = fit_all(synthetic_frame(12, 720, seed=3), prefill_flops=llama8b_prefill_flops,
                     peak_flops=H100_BF16_FLOPS, level=0.9)  # fmt: skip
    assert report.skipped == ()
    assert report.preemption is not None and report.preemption.interval.covers(0.85)
    assert [g.offload for g in report.gains] == ["lmcache", "native"]
    assert report.mfu is not None and report.mfu.interval.covers(0.35)
    assert report.hitrate is not None and report.hitrate.can_tell
    assert [w for w, _ in report.seconds] == [
        "preemption", "gain/lmcache", "gain/native", "mfu", "hitrate"]  # fmt: skip
    for fit in (report.preemption, *report.gains, report.mfu, report.hitrate):
        assert fit.interval.level == 0.9 and fit.method and fit.assumptions and fit.basis


def test_fit_all_short_history_collects_refusals_with_counts() -> None:
    report = fit_all(synthetic_frame(3, 10, seed=0))
    by = {s.what: s for s in report.skipped}
    assert set(by) == {"preemption", "gain/lmcache", "gain/native", "mfu", "hitrate"}
    assert (by["preemption"].required, by["preemption"].available) == (120, 30)
    assert "no cost model" in by["mfu"].reason
    assert report.preemption is None and report.gains == () and report.hitrate is None


def test_fit_all_without_offload_engines_skips_the_gain() -> None:
    report = fit_all(synthetic_frame(4, 200, seed=0, modes=("none",)))
    assert report.gains == ()
    assert any(s.what == "gain" and "no windows from engines with offload" in s.reason
               for s in report.skipped)  # fmt: skip


def test_fit_report_as_dict_is_strict_json() -> None:
    report = fit_all(synthetic_frame(6, 300, seed=2))
    text = json.dumps(report.as_dict(), allow_nan=False)
    back = json.loads(text)
    assert set(back) == {"preemption", "gains", "mfu", "hitrate", "skipped", "seconds"}
    assert isinstance(report, FitReport)


def test_jsonable_turns_non_finite_numbers_into_null() -> None:
    assert json_ready(Interval(float("nan"), float("inf"), 0.9)) == {
        "lo": None, "hi": None, "level": 0.9}  # fmt: skip


def test_recorded_warnings_captures_without_leaking_or_changing_filters() -> None:
    before = list(warnings.filters)
    with recorded_warnings() as caught:
        warnings.warn("advisory", RuntimeWarning, stacklevel=1)
        warnings.warn("advisory", RuntimeWarning, stacklevel=1)
    assert caught == ["RuntimeWarning: advisory"]
    assert warnings.filters == before
    with pytest.raises(RuntimeWarning):  # pytest's filterwarnings=error is back in force
        warnings.warn("outside", RuntimeWarning, stacklevel=1)
