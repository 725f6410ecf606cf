"""Engine sizing from the plan's forecasts: the KV-demand forecast, or the KV the request-rate
forecast implies (Little's law) when that is wholly higher; the sizing says which and why.

End to end from Window records: planner.plan.forecast (capacity, both forecasts, the
reconciliation, the evidence) -> planner.decide.evidence.Evidence -> planner.deploy.sizing.size.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from core.records import Window, labels_of
from planner.decide.decision import Decision
from planner.decide.evidence import Evidence
from planner.deploy.sizing import size
from planner.plan.forecast import ForecastRun, kv_capacity, run_forecasts

T0 = 1_699_920_000.0
HOUR = 3600.0
BLOCKS, BLOCK_SIZE = 200, 16  # 3,200 KV tokens per engine (num_gpu_blocks × block_size)
SOURCES = ("a:8000", "b:8000")
FACTS = {s: {"num_gpu_blocks": BLOCKS, "block_size": BLOCK_SIZE} for s in SOURCES}
W_S, K_TOKENS = 2.0, 400.0  # seconds a request runs, KV tokens it holds


def windows(hours: float, rate_slope: float, kv_follows_rate: bool) -> list[Window]:
    """Per engine, 1-minute windows: finished requests rising from 2 req/s by ``rate_slope``
    per hour, running = rate × W, KV usage = running × K / capacity (or flat at its start)."""
    rng = np.random.default_rng(7)
    lbl = labels_of({"engine": "0"})
    out: list[Window] = []
    cap = BLOCKS * BLOCK_SIZE
    for i in range(int(hours * 60)):
        start = T0 + 60.0 * i
        for src in SOURCES:
            rate = max(0.1, 2.0 + rate_slope * i / 60 + rng.normal(0.0, 0.05))
            running = rate * W_S * (1 + rng.normal(0.0, 0.02))
            held = running if kv_follows_rate else 2.0 * W_S
            usage = min(1.0, held * K_TOKENS / cap * (1 + rng.normal(0.0, 0.02)))
            out += [
                Window(src, "request_success_total", lbl, start, 60.0, "counter", 4,
                       delta=rate * 60.0, rate=rate),
                Window(src, "requests_running", lbl, start, 60.0, "gauge", 4, mean=running),
                Window(src, "kv_cache_usage_ratio", lbl, start, 60.0, "gauge", 4, mean=usage),
            ]  # fmt: skip
    return out


def plan_forecasts(ws: list[Window]) -> ForecastRun:
    cap = kv_capacity(ws, FACTS, None)
    assert cap is not None and cap.unit == "KV tokens" and cap.total == 2 * BLOCKS * BLOCK_SIZE
    return run_forecasts(ws, cap, horizon_s=6 * HOUR, seed=1, max_seconds=60.0)


def evidence_of(run: ForecastRun) -> Evidence:
    return run.evidence.apply(Evidence(engines=len(SOURCES)))


NONE = Decision("none", 0.8, "high", (), (), (), (), True, None)


@pytest.fixture(scope="module")
def rate_driven() -> ForecastRun:
    return plan_forecasts(windows(4, 1.0, kv_follows_rate=False))  # 2 -> 6 req/s per engine


def test_size_engines_rate_path_more_demanding_sizes_for_implied_kv(
    rate_driven: ForecastRun,
) -> None:
    rec = rate_driven.section["reconciled"]
    assert rec["can_tell"] is True and rec["driver"] == "request_rate"
    ev = evidence_of(rate_driven)
    s = size(ev, NONE, headroom=0.2)
    e = s.engines
    assert e is not None and e.capacity_per_engine == BLOCKS * BLOCK_SIZE
    peak = rec["peak"]
    assert (e.peak, e.peak_lo, e.peak_hi) == (peak["estimate"], peak["lo"], peak["hi"])
    assert e.needed == math.ceil(peak["estimate"] * 1.2 / (BLOCKS * BLOCK_SIZE) - 1e-9)
    # the KV forecast alone would have asked for fewer engines
    kv_top = max(p[1] for p in rate_driven.section["kv_demand"]["points"])
    assert e.needed > math.ceil(kv_top * 1.2 / (BLOCKS * BLOCK_SIZE) - 1e-9)
    assert e.demand_basis.startswith("request-rate forecast × Little's-law KV per request")
    assert "wholly above" in e.demand_basis
    assert s.to_dict()["engines"]["demand_basis"] == e.demand_basis


def test_size_engines_rate_path_saturation_time_follows_implied_kv(
    rate_driven: ForecastRun,
) -> None:
    rec = rate_driven.section["reconciled"]
    ttl = evidence_of(rate_driven).time_to_saturation_s
    assert ttl is not None and ttl.estimate == rec["implied_time_to_saturation_s"]
    assert rate_driven.kv is not None and rate_driven.kv.time_to_saturation_s is None


def test_size_engines_forecasts_agree_kv_forecast_drives() -> None:
    run = plan_forecasts(windows(4, 0.25, kv_follows_rate=True))
    rec = run.section["reconciled"]
    assert rec["can_tell"] is True and rec["agree"] is True and rec["driver"] == "kv_demand"
    e = size(evidence_of(run), NONE).engines
    assert e is not None and e.demand_basis.startswith("KV-demand forecast (")
    assert "overlap" in e.demand_basis
    kv_top = max(run.section["kv_demand"]["points"], key=lambda p: (p[1], p[0]))
    assert e.peak == kv_top[1]


def test_size_engines_without_rate_windows_kv_forecast_and_why() -> None:
    ws = [w for w in windows(4, 0.25, kv_follows_rate=True) if w.signal != "request_success_total"]
    run = plan_forecasts(ws)
    rec = run.section["reconciled"]
    assert rec == {"can_tell": False, "why": "needs both the KV-demand and request-rate forecasts"}
    e = size(evidence_of(run), NONE).engines
    assert e is not None and e.demand_basis.startswith("KV-demand forecast (")
