"""planner.fit.orchestrate.fit_all: every registered fit the data supports, refusals collected."""

from __future__ import annotations

import json
import warnings

import pytest

from benchmarks.accuracy.fitsynth import H100_BF16_FLOPS, llama8b_prefill_flops, synthetic_frame
from planner.domain.values import json_ready
from planner.fit.common import Interval, recorded_warnings
from planner.fit.orchestrate import FitReport, fit_all
from planner.fit.registry import EQUAL_KV, FIT_NAMES


def test_fit_all_synthetic_cluster_runs_every_fit() -> None:
    report = fit_all(synthetic_frame(12, 720, seed=3), prefill_flops=llama8b_prefill_flops,
                     peak_flops=H100_BF16_FLOPS, level=0.9)  # fmt: skip
    assert report.skipped == ()
    preemption, mfu, hitrate = (report.result(n) for n in
                                ("preemption_knee", "prefill_mfu", "lmcache_hitrate"))  # fmt: skip
    assert preemption is not None and preemption.interval.covers(0.85)
    gains = [report.result(n) for n in ("equal_kv_native", "equal_kv_lmcache")]
    assert [getattr(g, "offload", None) for g in gains] == ["native", "lmcache"]
    assert mfu is not None and mfu.interval.covers(0.35)
    assert hitrate is not None and hitrate.can_tell
    assert [w for w, _ in report.seconds] == list(FIT_NAMES)
    for o in report.fits:
        assert o.result is not None and o.result.interval.level == 0.9
        assert o.result.method and o.result.assumptions and o.result.basis


def test_fit_all_short_history_collects_refusals_with_counts() -> None:
    report = fit_all(synthetic_frame(3, 10, seed=0))
    by = {s.name: s for s in report.skipped}
    assert set(by) == set(FIT_NAMES)
    assert (by["preemption_knee"].required, by["preemption_knee"].available) == (120, 30)
    assert by["prefill_mfu"].why is not None and "no cost model" in by["prefill_mfu"].why
    assert by["prefill_mfu"].seconds is None  # not run: no cost model
    assert by["preemption_knee"].seconds is not None  # ran, and lacked history
    assert all(o.result is None for o in report.fits)


def test_fit_all_without_offload_engines_skips_each_gain() -> None:
    report = fit_all(synthetic_frame(4, 200, seed=0, modes=("none",)))
    for mode in ("native", "lmcache"):
        out = next(o for o in report.fits if o.name == EQUAL_KV + mode)
        assert out.result is None and out.why == f"no engine ran {mode} offload"
        assert out.seconds is None
    assert report.result("preemption_knee") is not None


def test_fit_report_as_dict_is_strict_json() -> None:
    report = fit_all(synthetic_frame(6, 300, seed=2))
    text = json.dumps(report.as_dict(), allow_nan=False)
    back = json.loads(text)
    assert set(back) == {"fits", "skipped", "seconds"}
    assert list(back["fits"]) == list(FIT_NAMES)
    assert [s["name"] for s in back["skipped"]] == ["prefill_mfu"]
    assert set(back["seconds"]) == set(FIT_NAMES) - {"prefill_mfu"}
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
