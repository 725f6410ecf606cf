"""dashboards.promql and the catalogue's PromQL helpers: guarded ratios, quantiles, scopes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core import catalog
from core.errors import ConfigError
from dashboards import promql as q
from dashboards.config import DEFAULT
from dashboards.recording_rules import RECORDS, find
from dashboards.rule_files import alert_rules

SCOPE = q.Scope("5m", 'job="vllm"', 'job="lmcache"', 'job="kvscope-collector"')


def test_divide_denominator_zero_gives_no_point_not_nan() -> None:
    assert q.divide("a", "b or c") == "(a) / ((b or c) > 0)"


def test_rate_of_a_gauge_is_refused() -> None:
    with pytest.raises(ConfigError, match="requests_running"):
        q.rate("requests_running", SCOPE)


def test_quantile_of_a_counter_is_refused() -> None:
    with pytest.raises(ConfigError, match="not a histogram"):
        q.quantile(0.99, "preemptions_total", SCOPE, ("model_name",))


def test_quantile_sums_buckets_by_le_and_the_labels() -> None:
    expr = q.quantile(0.99, "ttft_seconds", SCOPE, ("model_name",))
    assert expr.startswith("histogram_quantile(0.99, sum by (le, model_name) (rate(")


def test_scope_picks_matchers_by_signal_source() -> None:
    assert 'job="vllm"' in q.gauge("kv_cache_usage_ratio", SCOPE)
    server, in_process = q.rate("lmcache_hit_tokens_total", SCOPE).split(") or (")
    # the LMCache server's own names get its selector; in-process names live on vLLM's job
    assert 'job="lmcache"' in server and 'job="vllm"' not in server
    assert 'job="vllm"' in in_process and 'job="lmcache"' not in in_process


def test_colon_and_underscore_spellings_are_separate_selectors() -> None:
    expr = q.rate("preemptions_total", SCOPE)
    assert expr.count("rate(") == 2 and " or " in expr


def test_engine_gauges_shared_with_the_router_exclude_router_samples() -> None:
    assert 'server=""' in q.gauge("requests_running", SCOPE)


def test_fact_selector_unknown_family_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="cache_config"):
        catalog.fact_selector("nope")


def test_record_names_follow_level_metric_operations() -> None:
    names = [r.name(DEFAULT) for r in RECORDS]
    for name in names:
        level, metric, op = name.split(":")
        assert level and metric and (op == "" or op.endswith("5m") or op in ("avg", "max", "sum"))
    quantiles = {(r.name(DEFAULT), r.labels.get("quantile")) for r in RECORDS}
    assert len(quantiles) == len(RECORDS)  # a name repeats only with another quantile label


def test_record_find_unknown_names_it() -> None:
    with pytest.raises(ConfigError, match="engine:nope:rate"):
        find("nope", "rate")


def test_alerts_without_lmcache_leave_out_only_the_lmcache_alerts() -> None:
    def names(cfg: object) -> set[str]:
        return {r["alert"] for r in alert_rules(cfg)["groups"][0]["rules"]}  # type: ignore[arg-type]

    every = names(DEFAULT)
    without = names(replace(DEFAULT, lmcache_deployed=False))
    assert every - without == {n for n in every if n.startswith("KvscopeLmcache")} != set()
