"""`kvscope advise`: --explain, JSON shape, readable answer, and clear errors (exit 2)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from core.errors import ConfigError
from kvscope.cli import app
from planner.decide.decision import RULE_IDS
from tests.clirun import assert_one_line_error, run_kvscope

RUNNER = CliRunner()
SMALL = [
    "--model",
    "llama-3.1-8b",
    "--gpu",
    "h100",
    "--tp",
    "1",
    "--prompt-tokens",
    "3000",
    "--output-tokens",
    "128",
    "--qps",
    "4",
    "--prefix-share",
    "0.5",
    "--engines",
    "2",
    "--duration",
    "60",
]


def test_advise_cli_explain_prints_every_rule_id_without_other_args() -> None:
    r = RUNNER.invoke(app, ["advise", "--explain"])
    assert r.exit_code == 0, r.exception
    assert r.stdout.startswith("# How kvscope decides")
    for rule in RULE_IDS:
        assert f"## {rule}" in r.stdout, rule


def test_advise_cli_json_shape() -> None:
    r = RUNNER.invoke(
        app, ["advise", *SMALL, "--json", "--cpu-gb", "200", "--vllm-version", "0.13.0"]
    )
    assert r.exit_code == 0, r.exception
    d = json.loads(r.stdout)
    assert set(d) >= {
        "inputs",
        "decision",
        "simulated",
        "cost_model",
        "sizing",
        "configs",
        "evidence",
        "scenario",
        "notes",
    }
    assert d["inputs"]["vllm_version"] == "0.13.0" and d["inputs"]["cpu_gb"] == 200
    assert set(d["simulated"]["modes"]) == {"none", "native", "lmcache"}
    for row in d["simulated"]["modes"].values():
        assert {"total_tokens_per_s", "throughput_gain", "ttft_mean_s", "kv_util_p95"} <= set(row)
    assert d["decision"]["reasons"] and d["decision"]["rests_on"]
    assert "offload=lmcache" in r.stderr  # progress on stderr, JSON alone on stdout
    # the router it assumed (the default here) and the headline under every router
    assert d["router"]["assumed"] == "round_robin" and d["router"]["default"] is True
    rows = d["router"]["rows"]
    assert [row["router"] for row in rows] == [
        "round_robin",
        "least_loaded",
        "prefix_affinity",
        "scorer",
    ]
    assert rows[0]["recommended"] == d["decision"]["mode"]
    assert (
        rows[0]["lmcache_prefill_compute_saved"]
        == (d["simulated"]["modes"]["lmcache"]["prefill_compute_saved"])
    )


def test_advise_cli_scorer_router_text_matches_json() -> None:
    args = [*SMALL, "--router", "scorer", "--scorer-weights", "prefix=2,kv=1,queue=1"]
    text = RUNNER.invoke(app, ["advise", *args])
    js = RUNNER.invoke(app, ["advise", *args, "--json"])
    assert text.exit_code == 0 and js.exit_code == 0, (text.exception, js.exception)
    d = json.loads(js.stdout)
    assert d["router"]["assumed"] == "scorer" and d["router"]["default"] is False
    weights = {"prefix": 2.0, "kv": 1.0, "queue": 1.0, "no_hit_lru": 2.0, "cpu_prefix": 0.0}
    assert d["router"]["scorer_weights"] == weights
    assert d["scenario"]["cluster"]["scorer"] == weights
    assert (
        "Router assumed: scorer (--router; weights prefix=2, kv=1, queue=1, no_hit_lru=2, "
        "cpu_prefix=0)" in text.stdout
    )
    lines = text.stdout.splitlines()
    for row in d["router"]["rows"]:
        mark = " *" if row["router"] == "scorer" else ""
        line = next(x for x in lines if x.startswith(f"  {row['router'] + mark:17}"))
        assert row["recommended"] in line
        saved = row["lmcache_prefill_compute_saved"]
        assert (f"{saved:.1%}" if saved is not None else "-") in line
    alone = RUNNER.invoke(app, ["advise", *args, "--json", "--no-compare-routers"])
    assert [r["router"] for r in json.loads(alone.stdout)["router"]["rows"]] == ["scorer"]


def test_advise_cli_text_answer() -> None:
    r = RUNNER.invoke(app, ["advise", *SMALL])
    assert r.exit_code == 0, r.exception
    for part in (
        "Decision:",
        "Simulated (seed 0",
        "gain vs none",
        "Cost model",
        "B* ",
        "reading beats re-prefill",
        "Sizing",
        "Notes",
        "Router assumed: round_robin (the default: --router not given)",
        "prefix_affinity",
    ):
        assert part in r.stdout, part


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--model", "llama-3.1-8b"], "missing --gpu, --tp, --prompt-tokens"),
        ([*SMALL[:-2], "--duration", "0"], "--duration must be a number > 0"),
        ([*SMALL, "--prefix-share", "1.5"], "--prefix-share must be in [0, 1]"),
        ([*SMALL, "--model", "gpt-5"], "unknown model 'gpt-5'"),
        ([*SMALL, "--vllm-version", "0.40.0"], "outside the supported range"),
        ([*SMALL, "--router", "random"], "--router must be one of"),
        ([*SMALL, "--scorer-weights", "prefix=-1"], "--scorer-weights: prefix must be"),
        ([*SMALL, "--scorer-weights", "hops=1"], "--scorer-weights: hops: unknown key"),
    ],
)
def test_advise_cli_bad_arguments_raise_configerror(args: list[str], match: str) -> None:
    r = RUNNER.invoke(app, ["advise", *args])
    assert isinstance(r.exception, ConfigError), r.exception
    assert match in str(r.exception)


def test_advise_cli_bad_arguments_exit_2_with_one_line() -> None:
    for args, message in (
        ([*SMALL, "--qps", "-2"], "kvscope: error: --qps must be a number > 0"),
        ([*SMALL, "--tp", "many"], "Invalid value for '--tp'"),  # typer's usage error
    ):
        assert_one_line_error(run_kvscope("advise", *args), message)
