"""planner.fit.registry and the one orchestrator (planner.fit.orchestrate.fit_all) over it: each fit
has one name everywhere, a failing fit does not stop the others, unknown names are refused."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, get_args

import pandas as pd
import pytest

from benchmarks.accuracy.fitsynth import synthetic_frame
from core.errors import ConfigError
from planner.fit import registry
from planner.fit.common import FitResult
from planner.fit.orchestrate import fit_all, not_fitted
from planner.fit.registry import (
    EQUAL_KV,
    FIT_NAMES,
    FITS,
    FitInputs,
    Need,
    arguments,
    fit_specs,
)
from planner.plan.fits import fit_runs


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return synthetic_frame(3, 150, seed=4)


def test_fit_registry_each_name_once_with_a_description_and_known_inputs() -> None:
    assert len(set(FIT_NAMES)) == len(FIT_NAMES) == len(FITS) == 5
    assert FIT_NAMES == ("preemption_knee", "equal_kv_native", "equal_kv_lmcache",
                         "prefill_mfu", "lmcache_hitrate")  # fmt: skip
    for spec in FITS:
        assert spec.what and callable(spec.fn)
        assert set(spec.needs) <= set(get_args(Need)), spec.name
        assert ("offload" in spec.needs) == (spec.offload is not None), spec.name
        if spec.offload is not None:
            assert spec.name == EQUAL_KV + spec.offload


def test_fit_all_names_the_same_in_fits_skipped_seconds_json_and_plan(
    frame: pd.DataFrame,
) -> None:
    report = fit_all(frame)  # no cost model: the MFU fit is skipped
    assert [o.name for o in report.fits] == list(FIT_NAMES)
    assert [o.name for o in report.skipped] == ["prefill_mfu"]
    assert [name for name, _ in report.seconds] == [n for n in FIT_NAMES if n != "prefill_mfu"]
    d = json.loads(json.dumps(report.as_dict(), allow_nan=False))
    assert list(d["fits"]) == list(FIT_NAMES)
    assert [s["name"] for s in d["skipped"]] == ["prefill_mfu"]
    runs = fit_runs(report)
    assert list(runs) == list(FIT_NAMES)
    assert all(run.name == name for name, run in runs.items())
    assert runs["prefill_mfu"].entry["what"] == "prefill MFU"
    assert runs["prefill_mfu"].entry["can_tell"] is False


def _failing(name: str, exc: Exception, monkeypatch: pytest.MonkeyPatch) -> None:
    """Register ``name`` with a function that raises ``exc``."""

    def fail(frame: pd.DataFrame, **_: Any) -> FitResult:
        raise exc

    fits = tuple(dataclasses.replace(s, fn=fail) if s.name == name else s for s in registry.FITS)
    monkeypatch.setattr(registry, "FITS", fits)


@pytest.mark.parametrize(
    ("exc", "why"),
    [
        (RuntimeError("boom"), "fit failed: RuntimeError: boom"),
        (ConfigError("bad knee"), "fit refused: bad knee"),
    ],
)
def test_fit_all_a_failing_fit_does_not_stop_the_others(
    frame: pd.DataFrame, monkeypatch: pytest.MonkeyPatch, exc: Exception, why: str
) -> None:
    _failing("preemption_knee", exc, monkeypatch)  # the first fit in the registry
    report = fit_all(frame)
    knee = report.fits[0]
    assert (knee.name, knee.result, knee.why) == ("preemption_knee", None, why)
    assert knee.seconds is not None  # it ran, and is timed
    for name in ("equal_kv_native", "equal_kv_lmcache", "lmcache_hitrate"):
        assert report.result(name) is not None, name
    runs = fit_runs(report)
    assert runs["preemption_knee"].entry["can_tell"] is False
    assert runs["preemption_knee"].entry["why"] == why
    assert runs["preemption_knee"].entry["what"] == "preemption knee"


def test_fit_all_unknown_fit_name_is_a_config_error_naming_the_fits(
    frame: pd.DataFrame,
) -> None:
    with pytest.raises(ConfigError, match=r"unknown fit\(s\) 'preemption'; the fits are "
                                          r"preemption_knee, equal_kv_native"):  # fmt: skip
        fit_all(frame, fits=["preemption", "lmcache_hitrate"])
    with pytest.raises(ConfigError, match=r"unknown fit\(s\) 'gain/native'"):
        not_fitted("x").result("gain/native")


def test_fit_all_runs_only_the_named_fits_in_registry_order(frame: pd.DataFrame) -> None:
    report = fit_all(frame, fits=["lmcache_hitrate", "preemption_knee"])
    assert [o.name for o in report.fits] == ["preemption_knee", "lmcache_hitrate"]
    assert report.result("lmcache_hitrate") is not None
    with pytest.raises(ConfigError, match="'prefill_mfu' was not run"):
        report.result("prefill_mfu")
    assert fit_specs() == FITS
    assert [s.name for s in fit_specs("prefill_mfu")] == ["prefill_mfu"]  # a name, not letters


def test_fit_all_bad_level_is_refused_before_any_fit(frame: pd.DataFrame) -> None:
    with pytest.raises(ConfigError, match="confidence level"):
        fit_all(frame, level=1.5)


def test_fit_arguments_are_the_declared_inputs_or_why_not() -> None:
    frame = pd.DataFrame({"offload_mode": ["none", "native"]})
    flops = float
    inputs = FitInputs(frame, level=0.9, seed=7, prefill_flops=flops, peak_flops=1e15)
    spec = {s.name: s for s in FITS}
    assert arguments(spec["preemption_knee"], inputs) == {"util": "kv_util", "level": 0.9}
    assert arguments(spec["equal_kv_native"], inputs) == {
        "offload": "native", "util": "kv_util", "level": 0.9, "seed": 7}  # fmt: skip
    assert arguments(spec["equal_kv_lmcache"], inputs) == "no engine ran lmcache offload"
    assert arguments(spec["prefill_mfu"], inputs) == {
        "prefill_flops": flops, "peak_flops": 1e15, "level": 0.9}  # fmt: skip
    no_cost = dataclasses.replace(inputs, peak_flops=None, no_cost="no hardware")
    assert arguments(spec["prefill_mfu"], no_cost) == "no hardware"
    assert arguments(spec["lmcache_hitrate"], inputs) == {"level": 0.9, "target_fraction": 0.9}
