"""promtool unit tests of every generated alert (``promtool test rules``, Debian's 2.42).

The rule files are dashboards.generate's output for DEFAULT, written into a temporary
directory; the promtool test files are built here from the case table below
(``yaml.safe_dump``), so no metric name is spelled in this file: vendor names come from
core.catalog (each case runs with every spelling its inputs may have: the exported
one, Prometheus' colon→underscore rewrite under OpenMetrics negotiation, and the
catalogue's older spelling), kvscope's own from core.kvscope_metrics.

Every alert has cases that (a) fire with their labels and rendered annotations (promtool
compares ``exp_annotations`` exactly, an omitted one as empty), (b) stay quiet, (c) for the
counter-based ones, survive a counter reset both ways, and (d) stay quiet without their
inputs, or fire on them for the absent() guards. A case that documents a bug in an alert is
``xfail(strict=True)`` with the reason.

Runtime: promtool evaluates every loaded rule at every 1-minute step (~0.3 ms a rule), so
an alert's cases load only that alert and the recording rules it reads (copied from the
generated files; one test checks both whole files load and evaluate). The cases of one
alert in one spelling are the test groups of one promtool file, the files run in parallel
once per module; only when a file fails does a case run alone, so its assertion shows its
own promtool output. Other spellings run only for cases that fire: a quiet case in a
spelling no rule matched would pass anyway.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

from core import catalog
from core.kvscope_metrics import (
    ALL_METRICS,
    COLLECTOR_LAST_SUCCESSFUL_TICK,
    COLLECTOR_SCRAPES,
    PLAN_AGE,
    PLAN_CAPACITY_RATIO,
    PLAN_DEPLOYED_MODE,
    PLAN_FORECAST_HORIZON,
    PLAN_MODES,
    PLAN_SATURATION_PROBABILITY,
    PLAN_TIME_TO_SATURATION,
)
from dashboards.alerts import ALERTS, Alert
from dashboards.config import DEFAULT
from dashboards.generate import RULES_DIR, artifacts

pytestmark = pytest.mark.prometheus

ALERT = {a.name: a for a in ALERTS}
GUARDS = ("KvscopeLmcacheTargetsMissing", "KvscopeCollectorDown", "KvscopePlanAbsent")
UP = "up"  # Prometheus' own scrape-health series


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True, slots=True)
class Mode:
    """How the vendor series of a case are spelled: the catalogue's first (exported) or its
    next spelling, with Prometheus' colon→underscore rewrite or not."""

    name: str
    older: bool
    underscore: bool


MODES = (
    Mode("exported", older=False, underscore=False),
    Mode("underscore", older=False, underscore=True),
    Mode("older", older=True, underscore=False),
    Mode("older_underscore", older=True, underscore=True),
)


@dataclass(frozen=True, slots=True)
class Series:
    """One input series: ``metric`` is a catalogue signal (spelled per mode), ``up`` or one of
    kvscope's metrics; ``labels`` are canonical (``direction`` included). ``older`` and
    ``underscore`` pin that part of the spelling regardless of the mode."""

    metric: str
    labels: Mapping[str, str]
    values: str
    older: bool | None = None
    underscore: bool | None = None

    @property
    def vendor(self) -> bool:
        return self.metric in catalog.SIGNALS


@dataclass(frozen=True, slots=True)
class Fired:
    """An alert expected at an eval time: its identifying labels (severity is added), the
    ``$value`` its annotations render, and annotations written out literally (they override
    the ones rendered from the alert's templates)."""

    labels: Mapping[str, str]
    value: float | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)


Check = tuple[str, tuple[Fired, ...]]  # (eval_time, the alerts firing then)
# what a case is about: (a) fires, (b) quiet, (c) a counter reset, (d) absent inputs, or how
# the inputs are spelled
Kind = Literal["fires", "quiet", "reset", "absent", "spelling"]


@dataclass(frozen=True, slots=True)
class Case:
    """One scenario of one alert: input series and what fires at each eval time."""

    alert: str
    condition: str
    kind: Kind
    series: tuple[Series, ...]
    checks: tuple[Check, ...]
    xfail: str = ""

    def __post_init__(self) -> None:
        if self.alert not in ALERT:
            raise ValueError(f"no alert {self.alert}")

    @property
    def outcome(self) -> str:
        return "fires" if any(fired for _, fired in self.checks) else "quiet"

    @property
    def id(self) -> str:
        return f"{self.alert}-{self.condition}-{self.outcome}"


def quiet(*times: str) -> tuple[Check, ...]:
    return tuple((t, ()) for t in times)


def firing(at: str, *fired: Fired) -> Check:
    return (at, fired)


# --------------------------------------------------------------------------- values


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def ramp(*parts: tuple[int, float], start: float = 0.0) -> str:
    """A counter in promtool's expanding notation: ``parts`` of (samples, increase per
    sample), one sample a minute. Join two ramps with a space for a reset to 0."""
    out, value = [], start
    for i, (samples, step) in enumerate(parts):
        first = value if i == 0 else value + step
        out.append(f"{_num(first)}+{_num(step)}x{samples - 1}")
        value = first + step * (samples - 1)
    return " ".join(out)


def flat(value: float, samples: int) -> str:
    return f"{_num(value)}x{samples - 1}"


def gap(samples: int) -> str:
    return f"_x{samples}"


def _target(selector: str, example: str = "") -> dict[str, str]:
    """The labels of a target the config's one-matcher selector picks."""
    found = re.fullmatch(r'(\w+)(=~|=)"([^"]*)"', selector)
    assert found, f"expected one matcher, got {selector!r}"
    label, op, value = found.groups()
    if op == "=":
        return {label: value}
    assert re.fullmatch(value, example), (example, selector)
    return {label: example}


ENGINE = {"job": "vllm", "instance": "10.0.0.1:8000", "engine": "0", "model_name": "llama"}
FINISHED = {**ENGINE, "finished_reason": "stop"}
STORE, LOAD = {**ENGINE, "direction": "store"}, {**ENGINE, "direction": "load"}
LMCACHE = {**_target(DEFAULT.lmcache_selector, "lmcache"), "instance": "10.0.0.9:8080"}
LOOKUP = {**LMCACHE, "model_name": "llama"}
IN_PROCESS = {"job": "vllm", "instance": "10.0.0.1:8000", "model_name": "llama",
              "role": "worker", "served_model_name": "llama", "worker_id": "0"}  # fmt: skip
HEALTH = {**IN_PROCESS, **LMCACHE}  # the internal API server, scraped as an LMCache target
COLLECTOR = {**_target(DEFAULT.collector_selector), "instance": "10.0.0.7:9464"}
SCRAPED = {**COLLECTOR, "target": "engine-0"}
API = {**_target(DEFAULT.planner_selector), "instance": "10.0.0.8:8000"}
PLAN = {**API, "cluster": "prod", "group": "llama"}
OTHER = {"job": "node", "instance": "10.0.0.5:9100"}
FLEET = {"model_name": "llama"}


def S(metric: object, labels: Mapping[str, str], values: str, **pin: bool) -> Series:  # noqa: N802
    return Series(str(metric), labels, values, **pin)


# --------------------------------------------------------------------------- the cases

PREEMPT, FIN = "preemptions_total", "request_success_total"
KV, WAITING = "kv_cache_usage_ratio", "requests_waiting"
REQUESTED, HIT = "lmcache_requested_tokens_total", "lmcache_hit_tokens_total"
OFFLOAD, HEALTHY = "offload_bytes_total", "lmcache_healthy"


def _storm(pre: str, fin: str, **pin: bool) -> tuple[Series, ...]:
    return S(PREEMPT, ENGINE, pre, **pin), S(FIN, FINISHED, fin, **pin)


_RESTART = gap(1)  # the scrape missed while the engine restarts
STORM_CASES = (
    Case("KvscopeVllmPreemptionStorm", "a_quarter_preempted_under_traffic", "fires",
         _storm(ramp((61, 30)), ramp((61, 120))),
         (("5m", ()), firing("20m", Fired(ENGINE, 0.25, {
             "runbook_url": "docs/runbooks.md#kvscopevllmpreemptionstorm"})))),
    Case("KvscopeVllmPreemptionStorm", "below_threshold", "quiet",
         _storm(ramp((61, 6)), ramp((61, 120))), quiet("20m", "40m")),
    Case("KvscopeVllmPreemptionStorm", "under_traffic_floor", "quiet",
         _storm(ramp((61, 1)), ramp((61, 2))), quiet("20m", "40m")),
    Case("KvscopeVllmPreemptionStorm", "nothing_finishes", "quiet",
         _storm(ramp((61, 30)), ramp((61, 0))), quiet("20m", "40m")),
    Case("KvscopeVllmPreemptionStorm", "engine_restart_below_threshold", "reset",
         _storm(f"{ramp((31, 6))} {_RESTART} {ramp((29, 6))}",
                f"{ramp((31, 120))} {_RESTART} {ramp((29, 120))}"),
         quiet("25m", "31m", "32m", "33m", "40m", "55m")),
    Case("KvscopeVllmPreemptionStorm", "engine_restart_during_storm", "reset",
         _storm(f"{ramp((31, 30))} {_RESTART} {ramp((29, 30))}",
                f"{ramp((31, 120))} {_RESTART} {ramp((29, 120))}"),
         tuple(firing(t, Fired(ENGINE, 0.25)) for t in ("20m", "32m", "35m", "45m"))),
    Case("KvscopeVllmPreemptionStorm", "no_series", "absent", (), quiet("20m")),
    Case("KvscopeVllmPreemptionStorm", "no_finished_counter", "absent",
         (S(PREEMPT, ENGINE, ramp((61, 30))),), quiet("20m")),
    Case("KvscopeVllmPreemptionStorm", "exporter_restarts_with_underscore_names", "spelling",
         _storm(ramp((31, 30)), ramp((31, 120)), underscore=False)
         + _storm(f"{gap(31)} {ramp((30, 30))}", f"{gap(31)} {ramp((30, 120))}",
                  underscore=True),
         tuple(firing(t, Fired(ENGINE, 0.25)) for t in ("20m", "33m", "45m"))),
)  # fmt: skip

KV_CASES = (
    Case("KvscopeVllmKvCacheSaturated", "full_with_requests_waiting", "fires",
         (S(KV, ENGINE, flat(0.98, 41)), S(WAITING, ENGINE, flat(3, 41))),
         (("10m", ()), firing("25m", Fired(ENGINE, 0.98)))),
    Case("KvscopeVllmKvCacheSaturated", "full_nothing_waiting", "quiet",
         (S(KV, ENGINE, flat(0.98, 41)), S(WAITING, ENGINE, flat(0, 41))),
         quiet("25m", "40m")),
    Case("KvscopeVllmKvCacheSaturated", "queue_below_full", "quiet",
         (S(KV, ENGINE, flat(0.9, 41)), S(WAITING, ENGINE, flat(5, 41))), quiet("25m", "40m")),
    Case("KvscopeVllmKvCacheSaturated", "queue_burst_shorter_than_for", "quiet",
         (S(KV, ENGINE, flat(0.98, 42)),
          S(WAITING, ENGINE, f"{flat(0, 11)} {flat(5, 6)} {flat(0, 25)}")),
         quiet("15m", "25m", "35m")),
    Case("KvscopeVllmKvCacheSaturated", "both_spellings_exposed_current_one_counts", "spelling",
         (S(KV, ENGINE, flat(0.5, 41), older=False), S(KV, ENGINE, flat(0.99, 41), older=True),
          S(WAITING, ENGINE, flat(3, 41))),
         quiet("25m", "40m")),
    Case("KvscopeVllmKvCacheSaturated", "no_series", "absent", (), quiet("25m")),
    Case("KvscopeVllmKvCacheSaturated", "no_waiting_gauge", "absent",
         (S(KV, ENGINE, flat(0.98, 41)),), quiet("25m")),
)  # fmt: skip

RUNNING, BY_REASON = "requests_running", "requests_waiting_by_reason"
DEFERRED, CAPACITY = {**ENGINE, "reason": "deferred"}, {**ENGINE, "reason": "capacity"}


def _queue(deferred: str, finished: str, running: str, capacity: str | None = None,
           **pin: bool) -> tuple[Series, ...]:  # fmt: skip
    """An engine's scheduler queue: deferred (and capacity) waiting requests, the running
    gauge (which the alert does not read: a stuck engine may still show some) and the
    finished counter."""
    out = (S(BY_REASON, DEFERRED, deferred, **pin), S(RUNNING, ENGINE, running, **pin),
           S(FIN, FINISHED, finished, **pin))  # fmt: skip
    return out if capacity is None else (*out, S(BY_REASON, CAPACITY, capacity, **pin))


# vllm-project/vllm#53130's engine: 2 requests/s finish with a few deferred, then at minute
# 11 completions stop, the deferred queue climbs by 5 a minute from 227 and 4 requests stay
# "running"
_COLLAPSE_AT = 11
_WEDGED = _queue(
    f"{flat(2, _COLLAPSE_AT)} 227+5x{60 - _COLLAPSE_AT}",
    ramp((_COLLAPSE_AT, 120), (61 - _COLLAPSE_AT, 0)),
    f"{flat(29, _COLLAPSE_AT)} {flat(4, 61 - _COLLAPSE_AT)}",
    flat(19, 61),
)
_SERVING = ramp((61, 120))  # 2 requests/s finish
STUCK_CASES = (
    # the finished rate is 0 from minute 15 (its 5-minute window all after the collapse);
    # `for: 10m` fires at 25; $value is the least deferred count in [25m, 30m]
    Case("KvscopeVllmSchedulerStuck", "issue_53130_deferred_climb_nothing_finishes", "fires",
         _WEDGED, (("10m", ()), ("22m", ()),
                   firing("30m", Fired(DEFERRED, 227 + 5 * (25 - _COLLAPSE_AT), {
                       "runbook_url": "docs/runbooks.md#kvscopevllmschedulerstuck"})))),
    Case("KvscopeVllmSchedulerStuck", "deferred_held_nothing_running_nothing_finishes", "fires",
         _queue(flat(5, 41), flat(0, 41), flat(0, 41)),
         (("5m", ()), firing("15m", Fired(DEFERRED, 5)), firing("40m", Fired(DEFERRED, 5)))),
    Case("KvscopeVllmSchedulerStuck", "burst_defers_requests_while_others_finish", "quiet",
         _queue(f"{flat(0, 6)} 10+10x4 {flat(50, 10)} 40-10x4 {flat(0, 35)}", _SERVING,
                f"{flat(8, 6)} {flat(64, 19)} {flat(8, 36)}", flat(0, 61)),
         quiet("15m", "23m", "30m", "45m")),
    Case("KvscopeVllmSchedulerStuck", "deferred_for_an_hour_while_requests_finish", "quiet",
         _queue(flat(12, 61), _SERVING, flat(64, 61)), quiet("20m", "40m", "60m")),
    # completions pause from minute 10 to 23: the rate reads 0 at minutes 15-22, 8 minutes
    # of pending, short of `for: 10m`
    Case("KvscopeVllmSchedulerStuck", "completions_pause_for_twelve_minutes", "quiet",
         _queue(flat(3, 61), ramp((11, 120), (12, 0), (38, 120)), flat(64, 61)),
         quiet("20m", "23m", "26m", "40m")),
    Case("KvscopeVllmSchedulerStuck", "idle_nothing_waiting", "quiet",
         _queue(flat(0, 41), flat(500, 41), flat(0, 41), flat(0, 41)), quiet("20m", "40m")),
    Case("KvscopeVllmSchedulerStuck", "capacity_queue_only", "quiet",
         _queue(flat(0, 41), _SERVING, flat(64, 41), flat(30, 41)), quiet("20m", "40m")),
    # the restart: one missed scrape at minute 31, then the counters start again from 0 and
    # the queue is empty; the alert resolves at the first empty read
    Case("KvscopeVllmSchedulerStuck", "restart_clears_the_wedged_engine", "reset",
         _queue(f"{flat(300, 31)} {_RESTART} {flat(0, 29)}",
                f"{flat(1200, 31)} {_RESTART} {ramp((29, 120))}",
                f"{flat(4, 31)} {_RESTART} {flat(8, 29)}"),
         (firing("20m", Fired(DEFERRED, 300)), firing("30m", Fired(DEFERRED, 300)),
          *quiet("32m", "35m", "45m", "55m"))),
    Case("KvscopeVllmSchedulerStuck", "restart_under_traffic_with_deferred_requests", "reset",
         _queue(f"{flat(3, 31)} {_RESTART} {flat(3, 29)}",
                f"{ramp((31, 120))} {_RESTART} {ramp((29, 120))}",
                f"{flat(64, 31)} {_RESTART} {flat(64, 29)}"),
         quiet("25m", "32m", "33m", "35m", "45m", "55m")),
    Case("KvscopeVllmSchedulerStuck", "no_series", "absent", (), quiet("20m")),
    # vLLM before 0.20: the same stuck engine without the by-reason gauge
    Case("KvscopeVllmSchedulerStuck", "vllm_before_0_20_no_by_reason_gauge", "absent",
         (S(WAITING, ENGINE, flat(300, 41)), S(RUNNING, ENGINE, flat(0, 41)),
          S(FIN, FINISHED, flat(1200, 41))), quiet("20m", "40m")),
    Case("KvscopeVllmSchedulerStuck", "no_finished_counter", "absent",
         (S(BY_REASON, DEFERRED, flat(300, 41)),), quiet("20m", "40m")),
)  # fmt: skip

LMCACHE_DOWN_CASES = (
    Case("KvscopeLmcacheDown", "target_down", "fires",
         (S(UP, LMCACHE, flat(0, 21)),), (("1m", ()), firing("5m", Fired(LMCACHE)))),
    Case("KvscopeLmcacheDown", "reports_unhealthy", "fires",
         (S(UP, LMCACHE, flat(1, 21)), S(HEALTHY, HEALTH, flat(0, 21))),
         (("1m", ()), firing("5m", Fired(HEALTH)))),
    Case("KvscopeLmcacheDown", "up_and_healthy", "quiet",
         (S(UP, LMCACHE, flat(1, 21)), S(HEALTHY, HEALTH, flat(1, 21))), quiet("5m", "15m")),
    Case("KvscopeLmcacheDown", "one_failed_scrape", "quiet",
         (S(UP, LMCACHE, f"{flat(1, 6)} 0 {flat(1, 15)}"),), quiet("6m", "10m")),
    Case("KvscopeLmcacheDown", "other_job_down", "quiet",
         (S(UP, OTHER, flat(0, 21)), S(UP, LMCACHE, flat(1, 21))), quiet("5m", "15m")),
    Case("KvscopeLmcacheDown", "no_series", "absent", (), quiet("5m")),
)  # fmt: skip

TARGETS_CASES = (
    Case("KvscopeLmcacheTargetsMissing", "no_lmcache_target", "absent",
         (S(UP, OTHER, flat(1, 21)),), (("5m", ()), firing("15m", Fired({})))),
    Case("KvscopeLmcacheTargetsMissing", "targets_vanish", "absent",
         (S(UP, LMCACHE, flat(1, 11)),), (("14m", ()), firing("30m", Fired({})))),
    Case("KvscopeLmcacheTargetsMissing", "target_up", "quiet",
         (S(UP, LMCACHE, flat(1, 21)),), quiet("15m")),
    Case("KvscopeLmcacheTargetsMissing", "target_down_but_scraped", "quiet",
         (S(UP, LMCACHE, flat(0, 21)),), quiet("15m")),
)  # fmt: skip


def _lookups(requested: str, hit: str, labels: Mapping[str, str] = LOOKUP,
             **pin: bool) -> tuple[Series, ...]:  # fmt: skip
    return S(REQUESTED, labels, requested, **pin), S(HIT, labels, hit, **pin)


_TOKENS = ramp((76, 60000))  # 1000 tokens/s looked up
_COLLAPSE = ramp((31, 36000), (45, 6000))  # hit ratio 0.6 for half an hour, then 0.1
_HIT_CHECKS = (("45m", ()), firing("55m", Fired(FLEET, 0.1)))
HIT_CASES = (
    Case("KvscopeLmcacheHitRateCollapsed", "hit_ratio_falls_to_a_sixth", "fires",
         _lookups(_TOKENS, _COLLAPSE), _HIT_CHECKS),
    Case("KvscopeLmcacheHitRateCollapsed", "mild_drop", "quiet",
         _lookups(_TOKENS, ramp((31, 36000), (45, 24000))), quiet("55m", "75m")),
    Case("KvscopeLmcacheHitRateCollapsed", "baseline_too_low", "quiet",
         _lookups(_TOKENS, ramp((31, 9000), (45, 3000))), quiet("55m", "75m")),
    Case("KvscopeLmcacheHitRateCollapsed", "under_traffic_floor", "quiet",
         _lookups(ramp((76, 3000)), ramp((31, 1800), (45, 300))), quiet("55m", "75m")),
    Case("KvscopeLmcacheHitRateCollapsed", "traffic_stops", "quiet",
         _lookups(ramp((31, 60000), (45, 0)), ramp((31, 36000), (45, 0))), quiet("55m", "75m")),
    Case("KvscopeLmcacheHitRateCollapsed", "lmcache_restart_same_hit_ratio", "reset",
         _lookups(f"{ramp((31, 60000))} {ramp((45, 60000))}",
                  f"{ramp((31, 36000))} {ramp((45, 36000))}"),
         quiet("31m", "33m", "35m", "55m")),
    Case("KvscopeLmcacheHitRateCollapsed", "lmcache_restart_during_collapse", "reset",
         _lookups(f"{ramp((56, 60000))} {ramp((20, 60000))}",
                  f"{ramp((31, 36000), (25, 6000))} {ramp((20, 6000))}"),
         tuple(firing(t, Fired(FLEET, 0.1)) for t in ("55m", "57m", "60m", "70m"))),
    Case("KvscopeLmcacheHitRateCollapsed", "no_series", "absent", (), quiet("55m")),
    Case("KvscopeLmcacheHitRateCollapsed", "no_hit_counter", "absent",
         (S(REQUESTED, LOOKUP, _TOKENS),), quiet("55m")),
    Case("KvscopeLmcacheHitRateCollapsed", "in_process_lmcache_on_vllm_metrics", "spelling",
         _lookups(_TOKENS, _COLLAPSE, IN_PROCESS, older=True), _HIT_CHECKS),
)  # fmt: skip


def _offload(store: str, load: str | None) -> tuple[Series, ...]:
    out = (S(OFFLOAD, STORE, store),)
    return out if load is None else (*out, S(OFFLOAD, LOAD, load))


def _store_mean(t: int, reset: int | None = None) -> float:
    """avg_over_time(store rate[1h]) at minute ``t`` for _STORES (2 MB/s): the recorded
    5-minute rate is 0.4·p MB/s at minutes p = 1..4 (a counter starting at 0: rate() does
    not extrapolate below zero), 1.6 MB/s in the 5 windows that span a reset to 0 (the
    increase into the 0 sample is lost), else 2 MB/s."""

    def rate(p: int) -> float:
        if p <= 4:
            return 0.4e6 * p
        return 1.6e6 if reset is not None and reset <= p < reset + 5 else 2e6

    points = range(max(1, t - 60), t + 1)
    return sum(rate(p) for p in points) / len(points)


_STORES = ramp((61, 120e6))  # 2 MB/s to the CPU tier
_STORING = (("20m", ()), firing("40m", Fired(STORE, _store_mean(40))))
OFFLOAD_CASES = (
    Case("KvscopeOffloadStoresWithoutLoads", "stores_never_loaded", "fires",
         _offload(_STORES, ramp((61, 0))), _STORING),
    Case("KvscopeOffloadStoresWithoutLoads", "load_counter_never_created", "fires",
         _offload(_STORES, None), _STORING),
    Case("KvscopeOffloadStoresWithoutLoads", "stores_with_loads", "quiet",
         _offload(_STORES, ramp((61, 12e6))), quiet("40m", "60m")),
    Case("KvscopeOffloadStoresWithoutLoads", "a_load_within_the_hour", "quiet",
         _offload(_STORES, f"{flat(0, 11)} {flat(1e6, 50)}"), quiet("40m", "60m")),
    Case("KvscopeOffloadStoresWithoutLoads", "stores_below_floor", "quiet",
         _offload(ramp((61, 30e6)), ramp((61, 0))), quiet("40m", "60m")),
    Case("KvscopeOffloadStoresWithoutLoads", "engine_restart_with_loads", "reset",
         _offload(f"{ramp((41, 120e6))} {ramp((20, 120e6))}",
                  f"{ramp((41, 12e6))} {ramp((20, 12e6))}"),
         quiet("40m", "41m", "43m", "50m")),
    Case("KvscopeOffloadStoresWithoutLoads", "engine_restart_without_loads", "reset",
         _offload(f"{ramp((41, 120e6))} {ramp((20, 120e6))}",
                  f"{ramp((41, 0))} {ramp((20, 0))}"),
         tuple(firing(f"{t}m", Fired(STORE, _store_mean(t, reset=41))) for t in (40, 43, 50))),
    Case("KvscopeOffloadStoresWithoutLoads", "no_series", "absent", (), quiet("40m")),
)  # fmt: skip


def _plan(metric: object, value: float, samples: int = 61, **labels: str) -> Series:
    return S(metric, {**PLAN, **labels}, flat(value, samples))


def _ratio(mode: str, estimate: float, lower: float, upper: float | None) -> tuple[Series, ...]:
    """The capacity ratio's series; upper None: a lower bound (no upper series)."""
    figures = {"estimate": estimate, "lower": lower, "upper": upper}
    return tuple(
        _plan(PLAN_CAPACITY_RATIO, v, mode=mode, bound=b)
        for b, v in figures.items()
        if v is not None
    )


def _deployed(mode: str) -> tuple[Series, ...]:
    return tuple(_plan(PLAN_DEPLOYED_MODE, float(m == mode), mode=m) for m in PLAN_MODES)


_NATIVE_LOSES = _ratio("native", 0.9, 0.85, 0.95) + _ratio("lmcache", 1.1, 1.05, 1.2)
_NATIVE_LOSING = Fired({**PLAN, "mode": "native", "bound": "upper"}, 0.95)
PAYOFF_CASES = (
    Case("KvscopeOffloadNotPayingOff", "deployed_mode_upper_ratio_below_one", "fires",
         _NATIVE_LOSES + _deployed("native"), (("20m", ()), firing("40m", _NATIVE_LOSING))),
    Case("KvscopeOffloadNotPayingOff", "upper_ratio_above_one", "quiet",
         _ratio("native", 0.97, 0.9, 1.02) + _deployed("native"), quiet("40m")),
    Case("KvscopeOffloadNotPayingOff", "lower_bound_only", "quiet",
         _ratio("native", 0.8, 0.7, None) + _deployed("native"), quiet("40m")),
    Case("KvscopeOffloadNotPayingOff", "losing_mode_not_deployed", "quiet",
         _NATIVE_LOSES + _deployed("lmcache"), quiet("40m")),
    Case("KvscopeOffloadNotPayingOff", "nothing_deployed", "quiet",
         _NATIVE_LOSES + _deployed("none"), quiet("40m")),
    Case("KvscopeOffloadNotPayingOff", "deployed_mode_unknown", "absent", _NATIVE_LOSES,
         quiet("40m")),
    Case("KvscopeOffloadNotPayingOff", "no_series", "absent", (), quiet("40m")),
    Case("KvscopeOffloadNotPayingOff", "both_deployed_native_upper_ratio_below_one", "fires",
         _NATIVE_LOSES + _deployed("both"), (firing("40m", _NATIVE_LOSING),)),
)  # fmt: skip


def _capacity(tts: float | None, horizon: float, p: float) -> tuple[Series, ...]:
    out = (_plan(PLAN_FORECAST_HORIZON, horizon), _plan(PLAN_SATURATION_PROBABILITY, p))
    if tts is None:
        return out
    bounds = {"estimate": tts, "lower": tts / 2, "upper": tts * 2}
    return out + tuple(_plan(PLAN_TIME_TO_SATURATION, v, bound=b) for b, v in bounds.items())


_DAY = 86400.0
# `tts <= on (cluster, group) horizon` keeps only the matching labels
_GROUP = {k: PLAN[k] for k in ("cluster", "group")}
CAPACITY_CASES = (
    Case("KvscopeKvCapacityExhaustedWithinHorizon", "saturates_within_horizon", "fires",
         _capacity(3600, _DAY, 0.8), (("3m", ()), firing("10m", Fired(_GROUP, 3600)))),
    Case("KvscopeKvCapacityExhaustedWithinHorizon", "saturates_at_the_horizon", "fires",
         _capacity(_DAY, _DAY, 0.8), (firing("10m", Fired(_GROUP, _DAY)),)),
    Case("KvscopeKvCapacityExhaustedWithinHorizon", "saturates_beyond_horizon", "quiet",
         _capacity(2 * _DAY, _DAY, 0.8), quiet("10m", "40m")),
    Case("KvscopeKvCapacityExhaustedWithinHorizon", "saturation_unlikely", "quiet",
         _capacity(3600, _DAY, 0.3), quiet("10m", "40m")),
    Case("KvscopeKvCapacityExhaustedWithinHorizon", "no_saturation_forecast", "absent",
         _capacity(None, _DAY, 0.8), quiet("10m")),
    Case("KvscopeKvCapacityExhaustedWithinHorizon", "no_series", "absent", (), quiet("10m")),
    Case("KvscopeKvCapacityExhaustedWithinHorizon", "two_api_replicas", "fires",
         _capacity(3600, _DAY, 0.8) + tuple(
             S(s.metric, {**s.labels, "instance": "10.0.0.18:8000"}, s.values)
             for s in _capacity(3600, _DAY, 0.8)),
         (firing("10m", Fired(_GROUP, 3600)),)),
)  # fmt: skip


def _scrapes(up: str, failed: str | None) -> tuple[Series, ...]:
    out = (S(COLLECTOR_SCRAPES, {**SCRAPED, "outcome": "up"}, up),)
    if failed is None:
        return out
    return (*out, S(COLLECTOR_SCRAPES, {**SCRAPED, "outcome": "timeout"}, failed))


_THIRD = 1 / 3
SCRAPE_CASES = (
    Case("KvscopeCollectorScrapesFailing", "a_third_failing", "fires",
         _scrapes(ramp((61, 6)), ramp((61, 3))),
         (("10m", ()), firing("25m", Fired(SCRAPED, _THIRD)))),
    Case("KvscopeCollectorScrapesFailing", "a_ninth_failing", "quiet",
         _scrapes(ramp((61, 8)), ramp((61, 1))), quiet("25m", "40m")),
    Case("KvscopeCollectorScrapesFailing", "no_failures", "quiet",
         _scrapes(ramp((61, 6)), None), quiet("25m", "40m")),
    Case("KvscopeCollectorScrapesFailing", "target_starts_failing_new_outcome_series", "fires",
         _scrapes(ramp((31, 6), (30, 0)), f"{gap(31)} {ramp((30, 6), start=1)}"),
         (("40m", ()), firing("55m", Fired(SCRAPED, 1.0)))),
    Case("KvscopeCollectorScrapesFailing", "collector_restart_few_failing", "reset",
         _scrapes(f"{ramp((31, 8))} {ramp((30, 8))}", f"{ramp((31, 1))} {ramp((30, 1))}"),
         quiet("31m", "33m", "40m", "50m")),
    Case("KvscopeCollectorScrapesFailing", "collector_restart_while_failing", "reset",
         _scrapes(f"{ramp((31, 6))} {ramp((30, 6))}", f"{ramp((31, 3))} {ramp((30, 3))}"),
         tuple(firing(t, Fired(SCRAPED, _THIRD)) for t in ("25m", "31m", "35m", "45m"))),
    Case("KvscopeCollectorScrapesFailing", "no_series", "absent", (), quiet("25m")),
)  # fmt: skip

_TICK = COLLECTOR_LAST_SUCCESSFUL_TICK
STALL_CASES = (
    Case("KvscopeCollectorStalled", "ticks_stop", "fires",
         (S(_TICK, COLLECTOR, f"{ramp((11, 60))} {flat(600, 31)}"),),
         (("18m", ()), firing("25m", Fired(COLLECTOR, 900)))),
    Case("KvscopeCollectorStalled", "ticking", "quiet",
         (S(_TICK, COLLECTOR, ramp((41, 60))),), quiet("25m", "40m")),
    Case("KvscopeCollectorStalled", "a_tick_every_four_minutes", "quiet",
         (S(_TICK, COLLECTOR, " ".join(_num(240 * (i // 4)) for i in range(41))),),
         quiet("25m", "40m")),
    Case("KvscopeCollectorStalled", "restart_before_first_tick", "quiet",
         (S(_TICK, COLLECTOR, f"{ramp((11, 60))} 0 0 {ramp((28, 60), start=780)}"),),
         quiet("15m", "25m", "38m")),
    Case("KvscopeCollectorStalled", "no_series", "absent", (), quiet("25m")),
)  # fmt: skip

_COLLECTOR_JOB = _target(DEFAULT.collector_selector)
DOWN_CASES = (
    Case("KvscopeCollectorDown", "target_down", "fires",
         (S(UP, COLLECTOR, flat(0, 31)),), (("5m", ()), firing("15m", Fired(COLLECTOR)))),
    Case("KvscopeCollectorDown", "not_scraped", "absent",
         (S(UP, OTHER, flat(1, 31)),), (("5m", ()), firing("15m", Fired(_COLLECTOR_JOB)))),
    Case("KvscopeCollectorDown", "target_up", "quiet",
         (S(UP, COLLECTOR, flat(1, 31)),), quiet("15m", "30m")),
    Case("KvscopeCollectorDown", "outage_shorter_than_for", "quiet",
         (S(UP, COLLECTOR, f"{flat(1, 6)} {flat(0, 6)} {flat(1, 21)}"),), quiet("12m", "20m")),
    Case("KvscopeCollectorDown", "other_job_down", "quiet",
         (S(UP, OTHER, flat(0, 31)), S(UP, COLLECTOR, flat(1, 31))), quiet("15m")),
)  # fmt: skip

_API_JOB = _target(DEFAULT.planner_selector)
PLAN_CASES = (
    Case("KvscopePlanStale", "no_new_plan_for_hours", "fires",
         (S(PLAN_AGE, PLAN, ramp((41, 60), start=10000)),),
         (("20m", ()), firing("30m", Fired(PLAN, 11800)))),
    Case("KvscopePlanStale", "hourly_plans", "quiet",
         (S(PLAN_AGE, PLAN, f"{ramp((60, 60))} {ramp((21, 60))}"),), quiet("30m", "59m", "75m")),
    Case("KvscopePlanStale", "no_series", "absent", (), quiet("30m")),
    Case("KvscopePlanAbsent", "api_scraped_without_plans", "absent",
         (S(UP, API, flat(1, 81)),), (("30m", ()), firing("70m", Fired(_API_JOB)))),
    Case("KvscopePlanAbsent", "plans_under_another_job", "absent",
         (S(PLAN_AGE, {**PLAN, "job": "planner"}, ramp((81, 60))),),
         (firing("70m", Fired(_API_JOB)),)),
    Case("KvscopePlanAbsent", "plans_vanish", "absent",
         (S(PLAN_AGE, PLAN, ramp((11, 60))),), (("70m", ()), firing("80m", Fired(_API_JOB)))),
    Case("KvscopePlanAbsent", "plan_present", "quiet",
         (S(PLAN_AGE, PLAN, ramp((81, 60))),), quiet("30m", "70m")),
)  # fmt: skip

CASES: tuple[Case, ...] = (
    STORM_CASES + KV_CASES + STUCK_CASES + LMCACHE_DOWN_CASES + TARGETS_CASES + HIT_CASES
    + OFFLOAD_CASES + PAYOFF_CASES + CAPACITY_CASES + SCRAPE_CASES + STALL_CASES + DOWN_CASES
    + PLAN_CASES
)  # fmt: skip


# --------------------------------------------------------------------------- rendering


def _vendor_name(s: Series, mode: Mode) -> tuple[str, dict[str, str]]:
    """The sample name and labels of a vendor series in ``mode`` (from the catalogue)."""
    sig = catalog.SIGNALS[s.metric]
    labels = dict(s.labels)
    older = mode.older if s.older is None else s.older
    exported = catalog.export_spelling(s.metric, labels)
    candidates = [
        sp for sp in sig.spellings[1:]
        if sp.family != exported.family
        and all(labels.get(k, v) == v for k, v in sp.const_labels)
    ] if older else []  # fmt: skip
    if candidates:
        spelling = candidates[0]
        name = catalog.spelling_sample_name(sig.kind, spelling.family)
    else:
        spelling, name = exported, catalog.export_sample_name(s.metric, labels)
    for key, _ in spelling.const_labels:  # implied by the family
        labels.pop(key, None)
    for src, dst in spelling.rename:  # e.g. direction="store" -> transfer_type="GPU_to_CPU"
        back = {new: old for old, new in spelling.values}
        value = labels.pop(dst)
        labels[src] = back.get(value, value)
    underscore = mode.underscore if s.underscore is None else s.underscore
    return (name.replace(":", "_") if underscore else name), labels


def _series(s: Series, mode: Mode) -> dict[str, str]:
    name, labels = _vendor_name(s, mode) if s.vendor else (s.metric, dict(s.labels))
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{name}{{{inner}}}" if inner else name, "values": s.values}


def _go_g(v: float) -> str:
    return f"{v:.4g}"


def _humanize(v: float) -> str:
    """Prometheus' humanize (SI prefixes), finite values."""
    prefix = ""
    if abs(v) >= 1:
        for p in "kMGTPEZY":
            if abs(v) < 1000:
                break
            prefix, v = p, v / 1000
    elif v != 0:
        for p in "munpfazy":
            if abs(v) >= 1:
                break
            prefix, v = p, v * 1000
    return f"{_go_g(v)}{prefix}"


def _humanize_percentage(v: float) -> str:
    return f"{_go_g(v * 100)}%"


def _humanize_duration(v: float) -> str:
    """Prometheus' humanizeDuration (template/template.go), finite values."""
    if v == 0:
        return f"{_go_g(v)}s"
    if abs(v) >= 1:
        sign, d = ("-" if v < 0 else ""), int(abs(v))
        days, hours, minutes, seconds = d // 86400, d // 3600 % 24, d // 60 % 60, d % 60
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{_go_g(abs(v))}s"
    prefix = ""
    for p in "munpfazy":
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return f"{_go_g(v)}{prefix}s"


def _humanize_1024(v: float) -> str:
    if abs(v) <= 1:
        return _go_g(v)
    prefix = ""
    for p in ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"):
        if abs(v) < 1024:
            break
        prefix, v = p, v / 1024
    return f"{_go_g(v)}{prefix}"


HUMANIZE: Mapping[str, Callable[[float], str]] = {
    "humanize": _humanize,
    "humanizePercentage": _humanize_percentage,
    "humanizeDuration": _humanize_duration,
    "humanize1024": _humanize_1024,
}
_LABEL = re.compile(r"\{\{ \$labels\.(\w+) \}\}")
_VALUE = re.compile(r"\{\{ \$value \| (\w+) \}\}")


def _render(template: str, labels: Mapping[str, str], value: float | None) -> str:
    """An annotation as Prometheus renders it, for the few template forms ALERTS use."""

    def humanize(m: re.Match[str]) -> str:
        assert value is not None and math.isfinite(value), f"no $value for {template!r}"
        return HUMANIZE[m[1]](value)

    text = _VALUE.sub(humanize, _LABEL.sub(lambda m: labels[m[1]], template))
    assert "{{" not in text, f"template form not rendered here: {template!r}"
    return text


def _expected(alert: Alert, fired: Fired) -> dict[str, Any]:
    rendered = {
        "summary": _render(alert.summary, fired.labels, fired.value),
        "description": _render(alert.description, fired.labels, fired.value),
        "runbook_url": DEFAULT.runbook_url(alert.name),
    }
    return {
        "exp_labels": {"severity": alert.severity, **fired.labels},
        "exp_annotations": {**rendered, **fired.annotations},
    }


def _group(case: Case, mode: Mode) -> dict[str, Any]:
    """The promtool test group of one case in one spelling."""
    alert = ALERT[case.alert]
    return {
        "name": f"{case.id}-{mode.name}",
        "interval": "1m",
        "input_series": [_series(s, mode) for s in case.series],
        "alert_rule_test": [
            {"eval_time": at, "alertname": alert.name,
             "exp_alerts": [_expected(alert, f) for f in fired]}
            for at, fired in case.checks
        ],
    }  # fmt: skip


def _modes(case: Case) -> list[Mode]:
    """The modes that spell the case's inputs differently (the first of each kind). A case
    that stays quiet runs in the exported spelling only: quiet in a spelling no rule matches
    would prove nothing."""
    seen: dict[tuple[tuple[str, ...], ...], Mode] = {}
    for mode in MODES if case.outcome == "fires" else MODES[:1]:
        key = tuple(tuple(_series(s, mode).values()) for s in case.series)
        seen.setdefault(key, mode)
    return list(seen.values())


def _mode_id(case: Case, mode: Mode) -> str:
    return mode.name if any(s.vendor for s in case.series) else "any"


RUNS: tuple[tuple[Case, Mode], ...] = tuple((c, m) for c in CASES for m in _modes(c))


# --------------------------------------------------------------------------- promtool


def _names(expr: str, record: str) -> bool:
    return re.search(rf"(?<![\w:]){re.escape(record)}(?![\w:])", expr) is not None


def _alert_rules(records: dict[str, Any], alerts: dict[str, Any], name: str) -> dict[str, Any]:
    """A rules document of one generated alert and the generated recording rules it reads
    (rules copied as they are; groups keep their names and order)."""
    rule = next(r for g in alerts["groups"] for r in g["rules"] if r["alert"] == name)
    exprs: list[str] = [rule["expr"]]
    needed: set[str] = set()
    while True:  # recording rules that read recording rules, to a fixpoint
        more = {r["record"] for g in records["groups"] for r in g["rules"]
                if any(_names(e, r["record"]) for e in exprs)} - needed  # fmt: skip
        if not more:
            break
        needed |= more
        exprs = [r["expr"] for g in records["groups"] for r in g["rules"] if r["record"] in more]
    groups = [{"name": g["name"], "rules": [r for r in g["rules"] if r["record"] in needed]}
              for g in records["groups"]]  # fmt: skip
    groups = [g for g in groups if g["rules"]]
    return {"groups": [*groups, {"name": alerts["groups"][0]["name"], "rules": [rule]}]}


class Promtool:
    """The generated rule files in one directory, and cached promtool runs over them.

    The unit tests of an alert load that alert and the recording rules it reads, copied
    from the generated files: promtool evaluates every loaded rule at every step, ~0.3 ms
    each, so all 61 rules would make the table take minutes. Recording groups are evaluated
    before the alert's (``group_eval_order``), so an alert sees the rules' fresh samples.
    """

    def __init__(self, root: Path) -> None:
        binary = shutil.which("promtool")
        if binary is None:
            raise RuntimeError("promtool is not installed: run `make test` (installs it)")
        self.binary, self.root = binary, root
        self.rule_files: list[str] = []
        docs: list[dict[str, Any]] = []
        for rel, text in artifacts(DEFAULT).items():
            if rel.parent == RULES_DIR:
                (root / rel.name).write_text(text, encoding="utf-8")
                self.rule_files.append(rel.name)
                docs.append(yaml.safe_load(text))
        records, alerts = sorted(docs, key=lambda d: "alert" in d["groups"][0]["rules"][0])
        self.order = [g["name"] for d in (records, alerts) for g in d["groups"]]
        for a in ALERTS:
            doc = _alert_rules(records, alerts, a.name)
            (root / f"rules-{a.name}.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
        self._runs: dict[str, str | None] = {}

    def command(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, *args], cwd=self.root, capture_output=True, text=True, timeout=240,
            check=False,
        )  # fmt: skip

    def _write(self, key: str, groups: list[dict[str, Any]], rule_files: list[str]) -> str:
        doc = {"rule_files": rule_files, "evaluation_interval": "1m",
               "group_eval_order": self.order, "tests": groups}  # fmt: skip
        name = f"test-{key}.yml"
        (self.root / name).write_text(yaml.safe_dump(doc, sort_keys=False, width=1 << 16))
        return name

    def test(self, key: str, groups: list[dict[str, Any]], full: bool = False) -> str | None:
        """``promtool test rules`` over these groups of one alert (``full``: with both
        generated files): None when they pass, else promtool's output."""
        if key not in self._runs:
            alerts = {g["alert_rule_test"][0]["alertname"] for g in groups}
            assert len(alerts) == 1, alerts
            files = self.rule_files if full else [f"rules-{alerts.pop()}.yml"]
            proc = self.command("test", "rules", self._write(key, groups, files))
            self._runs[key] = None if proc.returncode == 0 else proc.stdout + proc.stderr
        return self._runs[key]

    def batches(self) -> dict[str, list[dict[str, Any]]]:
        """One promtool file per (alert, spelling), every non-xfail case of it; one per
        xfail case."""
        out: dict[str, list[dict[str, Any]]] = {}
        for case, mode in RUNS:
            key = _key(case, mode) if case.xfail else f"{case.alert}-{mode.name}"
            out.setdefault(key, []).append(_group(case, mode))
        return out

    def prefetch(self) -> None:
        """Run every batch, as many at once as there are CPUs."""
        batches = self.batches()
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            list(pool.map(lambda key: self.test(key, batches[key]), batches))

    def verdict(self, case: Case, mode: Mode) -> str | None:
        """The case's result: its batch's when that passed, else its own run's."""
        if case.xfail:
            return self.test(_key(case, mode), [_group(case, mode)])
        batch = [_group(c, m) for c, m in RUNS if c.alert == case.alert and m == mode
                 and not c.xfail]  # fmt: skip
        if self.test(f"{case.alert}-{mode.name}", batch) is None:
            return None
        return self.test(f"alone-{_key(case, mode)}", [_group(case, mode)])


def _key(case: Case, mode: Mode) -> str:
    return f"{case.id}-{mode.name}"


@pytest.fixture(scope="module")
def promtool(tmp_path_factory: pytest.TempPathFactory) -> Promtool:
    runner = Promtool(tmp_path_factory.mktemp("promtool"))
    runner.prefetch()
    return runner


# --------------------------------------------------------------------------- the tests


def test_rule_files_promtool_lint_all_passes(promtool: Promtool) -> None:
    proc = promtool.command("check", "rules", "--lint=all", "--lint-fatal", *promtool.rule_files)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(promtool.rule_files) == 2, promtool.rule_files


def test_rule_files_full_both_files_evaluate_a_firing_case(promtool: Promtool) -> None:
    case = STORM_CASES[0]
    output = promtool.test("full-files", [_group(case, MODES[0])], full=True)
    assert output is None, output


def _params() -> list[Any]:
    return [
        pytest.param(
            case, mode, id=f"{case.id}-{_mode_id(case, mode)}",
            marks=[pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else [],
        )
        for case, mode in RUNS
    ]  # fmt: skip


@pytest.mark.parametrize(("case", "mode"), _params())
def test_alert_case_promtool_gives_expected_alerts(
    promtool: Promtool, case: Case, mode: Mode
) -> None:
    output = promtool.verdict(case, mode)
    assert output is None, f"promtool test rules failed for {case.id} ({mode.name}):\n{output}"


def _reads_counters(alert: str) -> bool:
    kinds = {m.name: m.type for m in ALL_METRICS}
    for case in CASES:
        for s in case.series:
            kind = catalog.SIGNALS[s.metric].kind if s.vendor else kinds.get(s.metric)
            if case.alert == alert and kind == "counter":
                return True
    return False


def test_case_table_every_alert_fires_stays_quiet_and_meets_absent_inputs() -> None:
    missing = []
    for alert in ALERTS:
        cases = [c for c in CASES if c.alert == alert.name and not c.xfail]
        if not any(c.outcome == "fires" for c in cases):
            missing.append(f"{alert.name}: no case that fires")
        if not any(c.outcome == "quiet" for c in cases):
            missing.append(f"{alert.name}: no case that stays quiet")
        absent = {c.outcome for c in cases if c.kind == "absent"}
        wanted = "fires" if alert.name in GUARDS else "quiet"
        if wanted not in absent or len(absent) > 1:
            missing.append(f"{alert.name}: absent inputs should only give {wanted}: {absent}")
    assert not missing, "\n".join(missing)


def test_case_table_counter_alerts_have_reset_cases_both_ways() -> None:
    counters = [a.name for a in ALERTS if _reads_counters(a.name)]
    assert counters == [
        "KvscopeVllmPreemptionStorm", "KvscopeVllmSchedulerStuck",
        "KvscopeLmcacheHitRateCollapsed",
        "KvscopeOffloadStoresWithoutLoads", "KvscopeCollectorScrapesFailing",
    ]  # fmt: skip
    for name in counters:
        resets = {c.outcome for c in CASES if c.alert == name and c.kind == "reset"}
        assert resets == {"fires", "quiet"}, name


def test_case_table_vendor_alerts_fire_in_every_spelling() -> None:
    """The colon trap and the older spellings: every firing case over vendor series also
    runs underscored (where a name has a colon) and in the older spelling (where the
    catalogue has one)."""
    checked = set()
    for case in {c.id: c for c, _ in RUNS if c.outcome == "fires" and not c.xfail}.values():
        reads = {s.metric for s in case.series if s.vendor}
        if not reads or any(s.older is not None or s.underscore is not None for s in case.series):
            continue
        names = {m.name for c, m in RUNS if c.id == case.id}
        assert "exported" in names, case.id
        if any(":" in catalog.export_sample_name(s) for s in reads):
            assert "underscore" in names, case.id
        if any(len(catalog.SIGNALS[s].spellings) > 1 for s in reads):
            assert "older" in names, case.id
        checked.add(case.alert)
    vendor = {c.alert for c in CASES if any(s.vendor for s in c.series)}
    assert checked == vendor, vendor - checked


def test_humanize_known_values_give_prometheus_text() -> None:
    assert _humanize_percentage(0.25) == "25%"
    assert _humanize_percentage(1 / 3) == "33.33%"
    assert _humanize_duration(900) == "15m 0s"
    assert _humanize_duration(11800) == "3h 16m 40s"
    assert _humanize_duration(_DAY) == "1d 0h 0m 0s"
    assert _humanize_duration(0.5) == "500ms"
    assert _humanize_1024(2e6) == "1.907Mi"
    assert (_humanize(0.25), _humanize(2500), _humanize(3)) == ("250m", "2.5k", "3")
