"""planner.report.plan_text forecast lines: which forecast drove sizing (with the KV the request
rate
implies and its interval), and P(saturation) with its Monte Carlo error or, at exactly 0 or 1,
its rule-of-three bound. The plan is a real one (a SQLite store of synthetic engines)."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from planner.forecast.saturation import rule_of_three
from planner.plan import build_plan
from planner.report.plan_text import summary_text
from store.store import Store
from tests.planner.synthstore import fill_store, shifted_frame, sqlite_url


@pytest.fixture(scope="module")
def plan_dict(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    url = sqlite_url(tmp_path_factory.mktemp("plantext") / "synth.db")
    # 20 h of history: the horizon is capped at the history's length, and over 20 h this
    # cluster's simulated paths reach capacity with a probability strictly inside (0, 1)
    fill_store(url, shifted_frame(n_windows=1200))
    with Store(url) as store:  # an ample budget: the crossing probability is simulated
        return build_plan(store, cluster="synth", forecast_seconds=60).to_dict()


def _human(x: float) -> str:
    """3 significant digits with a G / M / k suffix, as people read token counts."""
    for div, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def test_plan_text_forecast_names_the_driver_and_the_implied_peak(
    plan_dict: dict[str, Any],
) -> None:
    rec = plan_dict["forecast"]["reconciled"]
    assert rec["can_tell"] is True
    text = summary_text(plan_dict)
    forecast = text[text.index("Forecast (") : text.index("Sizing")]
    driver = {"kv_demand": "the KV-demand forecast", "request_rate": "the KV implied by"}
    (line,) = [x for x in forecast.splitlines() if x.startswith("  sizing follows ")]
    assert line.startswith(f"  sizing follows {driver[rec['driver']]}")
    _, mean, lo, hi = rec["implied_peak"]
    assert f"KV peak of {_human(mean)} [{_human(min(lo, mean))}, " in line
    assert f"{_human(max(hi, mean))}] KV tokens ({rec['level']:.0%} interval" in line
    assert f"  why: {rec['why']}" in forecast.splitlines()


def test_plan_text_saturation_probability_shows_its_monte_carlo_error(
    plan_dict: dict[str, Any],
) -> None:
    kv = plan_dict["forecast"]["kv_demand"]
    p, se, paths = (
        kv["saturation_probability"],
        kv["saturation_probability_se"],
        kv["saturation_paths"],
    )
    assert 0.0 < p < 1.0 and paths >= 200 and kv["saturation_probability_bound"] is None
    assert se == pytest.approx(math.sqrt(p * (1 - p) / paths))
    expected = f"{round(100 * p)} % ± {100 * se:.1f} (Monte Carlo SE, {paths} simulated paths)"
    assert expected in summary_text(plan_dict)


@pytest.mark.parametrize(("p", "sign", "paths"), [(0.0, "<", 1000), (1.0, ">", 1000),
                                                  (0.0, "<", 200), (1.0, ">", 200)])  # fmt: skip
def test_plan_text_probability_zero_or_one_shows_the_rule_of_three_bound(
    plan_dict: dict[str, Any], p: float, sign: str, paths: int
) -> None:
    d = copy.deepcopy(plan_dict)
    kv = d["forecast"]["kv_demand"]
    bound = rule_of_three(p, paths)
    kv |= {"saturation_probability": p, "saturation_probability_se": 0.0,
           "saturation_paths": paths, "saturation_probability_bound": bound}  # fmt: skip
    text = summary_text(d)
    edge = 3 / paths if p == 0.0 else 1 - 3 / paths
    (line,) = [x for x in text.splitlines() if x.startswith("  P(saturation within")]
    assert f") {sign} {100 * edge:.1f} % (95 % bound, rule of three: " in line
    assert f"{'none' if p == 0.0 else 'all'} of {paths} simulated paths" in line
    assert "±" not in line


def test_plan_text_reconciled_cannot_tell_says_why(plan_dict: dict[str, Any]) -> None:
    d = copy.deepcopy(plan_dict)
    d["forecast"]["reconciled"] = {"can_tell": False, "why": "needs both forecasts"}
    text = summary_text(d)
    assert "request-rate cross-check (Little's law): cannot tell: needs both forecasts" in text
    assert "sizing follows" not in text


def test_plan_text_hitrate_line_gives_size_and_interval_in_one_unit(
    plan_dict: dict[str, Any],
) -> None:
    d = copy.deepcopy(plan_dict)
    d["fits"]["lmcache_hitrate"] |= {
        "estimate": 48.5e9,
        "interval": {"lo": 25.8e9, "hi": 90.9e9, "level": 0.95},
        "n": 233,
        "can_tell": True,
        "hit_at_largest_l1": {
            "estimate": 0.963,
            "interval": {"lo": 0.927, "hi": 0.982},
            "unit": None,
        },
    }
    (line,) = [x for x in summary_text(d).splitlines() if x.startswith("  lmcache_hitrate")]
    assert "of the hit at the largest L1 seen 48.5 GB [25.8 GB, 90.9 GB] (n=233)" in line
    assert line.split()[1:5] == ["L1", "for", "90", "%"]
    assert "hit at the largest L1 seen 96.3 % [92.7%, 98.2%]" in line
