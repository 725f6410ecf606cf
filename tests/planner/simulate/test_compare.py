"""--compare / --sweep parsing, break-even interpolation and the `kvscope simulate` CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.errors import ConfigError
from planner.simulate.compare import (
    break_even,
    crossings,
    parse_modes,
    parse_sweep,
    render_table,
)

SMALL: dict[str, Any] = {
    "name": "cli-small",
    "cluster": {"nodes": 1, "gpus_per_node": 2, "model": "llama-3.1-8b", "num_gpu_blocks": 1500,
                "cpu_cache_gb": 20},
    "workload": {"kind": "shared_prefix", "groups": 30, "prompts_per_group": 4,
                 "system_prompt_tokens": 3000, "question_tokens": 100, "output_tokens": 100,
                 "concurrency": 16},
    "duration_s": 5000,
    "seed": 1,
}  # fmt: skip


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvscope.cli", "simulate", *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL), encoding="utf-8")
    return path


def test_parse_sweep_range_includes_stop_and_resolves_bare_key() -> None:
    sweep = parse_sweep("gpu_memory_utilization=0.3:0.9:0.05")
    assert sweep.key == "cluster.gpu_memory_utilization"
    assert len(sweep.values) == 13
    assert sweep.values[0] == 0.3 and sweep.values[-1] == 0.9
    ints = parse_sweep("workload.concurrency=8,16,32")
    assert ints.values == (8, 16, 32) and all(isinstance(v, int) for v in ints.values)


@pytest.mark.parametrize(
    "text", ["nokey", "=1:2:1", "x=a:b:c", "x=1:2", "x=2:1:0.5", "x=1:2:0", "x=0:1000000:1"]
)
def test_parse_sweep_bad_text_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="--sweep"):
        parse_sweep(text)


def test_parse_modes_adds_the_baseline_and_rejects_unknown() -> None:
    assert parse_modes("native,lmcache") == ("none", "native", "lmcache")
    assert parse_modes("lmcache,none") == ("lmcache", "none")
    with pytest.raises(ConfigError, match="unknown mode 'disk'"):
        parse_modes("none,disk")
    with pytest.raises(ConfigError, match="repeated"):
        parse_modes("native,native")


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        ([(0.3, 0.5), (0.5, 0.1), (0.7, -0.1), (0.9, -0.2)], 0.6),
        ([(0.3, -0.2), (0.6, 0.4)], 0.4),
        ([(1.0, 0.2), (2.0, 0.0), (3.0, -0.1)], 2.0),
        ([(1.0, 0.2), (2.0, 0.1)], None),
        ([(1.0, -0.2), (2.0, -0.1)], None),
    ],
)
def test_break_even_interpolates_the_zero_crossing(
    points: list[tuple[float, float]], expected: float | None
) -> None:
    got = break_even(points)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        # the shared_prefix sweep: a loss at 0.5, gains at 0.7 and 0.9 -> turns positive
        ([(0.5, -0.126), (0.7, 0.021), (0.9, 0.003)], [(0.6714, "positive", [0.5, 0.7])]),
        ([(0.3, 0.5), (0.5, 0.1), (0.7, -0.1), (0.9, -0.2)], [(0.6, "negative", [0.5, 0.7])]),
        ([(1.0, -0.1), (2.0, 0.1), (3.0, -0.1)],
         [(1.5, "positive", [1.0, 2.0]), (2.5, "negative", [2.0, 3.0])]),
        ([(1.0, 0.2), (2.0, 0.0), (3.0, -0.1)], [(2.0, "negative", [1.0, 3.0])]),
        ([(1.0, 0.2), (2.0, 0.0), (3.0, 0.1)], []),  # touches zero, keeps its sign
        ([(1.0, 0.0), (2.0, 0.1)], [(1.0, "positive", [1.0, 2.0])]),
        ([(1.0, -0.1), (2.0, 0.0)], [(2.0, "zero", [1.0, 2.0])]),
        ([(0.9, -0.2), (0.3, 0.5)], [(0.7286, "negative", [0.3, 0.9])]),  # sweep given unsorted
        ([(1.0, 0.2), (2.0, 0.1)], []),
    ],
)  # fmt: skip
def test_crossings_report_every_sign_change_with_its_direction(
    points: list[tuple[float, float]], expected: list[tuple[float, str, list[float]]]
) -> None:
    got = crossings(points)
    assert [(c["gain_turns"], c["between"]) for c in got] == [(d, b) for _, d, b in expected]
    for c, (value, _, _) in zip(got, expected, strict=True):
        assert c["value"] == pytest.approx(value, abs=1e-4)


def test_render_table_states_the_direction_of_each_crossing() -> None:
    def point(value: float, gain: float) -> dict[str, Any]:
        row = {"throughput_gain": gain, "total_tokens_per_s": 1.0}
        return {"value": value, "modes": {"none": dict(row, throughput_gain=0.0), "native": row}}

    doc = {
        "modes": ["none", "native"],
        "sweep_key": "cluster.gpu_memory_utilization",
        "points": [point(0.5, -0.1), point(0.7, 0.1), point(0.9, -0.1)],
        "break_even": {"native": 0.6},
        "break_even_crossings": {"native": crossings([(0.5, -0.1), (0.7, 0.1), (0.9, -0.1)])},
    }
    last = render_table(doc).splitlines()[-1]
    assert "gain turns positive above 0.6 (interpolated between 0.5 and 0.7)" in last
    assert "gain turns negative above 0.8 (interpolated between 0.7 and 0.9)" in last
    doc["points"] = [point(0.5, 0.1), point(0.9, 0.2)]
    doc["break_even_crossings"] = {"native": []}
    assert "gain positive throughout" in render_table(doc)


def test_cli_json_has_the_documented_fields(scenario_file: Path) -> None:
    proc = _cli(str(scenario_file), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    for key in ("total_tokens_per_s", "output_tokens_per_s", "ttft_mean_s", "ttft_p90_s",
                "e2e_mean_s", "e2e_p90_s", "completed_requests", "preemptions",
                "reprefill_tokens", "avoided_reprefill_tokens", "prefix_hit_rate",
                "external_hit_rate", "kv_usage_mean", "engines", "parameters"):  # fmt: skip
        assert key in doc, key
    assert doc["completed_requests"] == 120
    assert len(doc["engines"]) == 2
    sources = {p["key"]: p["source"] for p in doc["parameters"]}
    assert sources["cluster.num_gpu_blocks"] == "scenario"
    assert "vLLM" in sources["cluster.max_num_seqs"]
    assert "kvscope simulate" in proc.stderr  # progress on stderr


def test_cli_compare_sweep_json_and_table(scenario_file: Path) -> None:
    proc = _cli(str(scenario_file), "--compare", "native,lmcache", "--sweep",
                "cluster.num_gpu_blocks=1000,4000", "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["modes"] == ["none", "native", "lmcache"]
    assert [p["value"] for p in doc["points"]] == [1000, 4000]
    for point in doc["points"]:
        assert point["modes"]["none"]["throughput_gain"] == 0.0
        assert point["modes"]["native"]["avoided_reprefill_tokens"] > 0
    assert set(doc["break_even"]) == {"native", "lmcache"}
    assert set(doc["break_even_crossings"]) == {"native", "lmcache"}
    assert "gain_turns" in doc["break_even_note"]
    for mode, found in doc["break_even_crossings"].items():
        first = found[0]["value"] if found else None
        assert doc["break_even"][mode] == first  # `break_even` keeps the first crossing
    for key in ("preempted_after_load", "max_preemptions_per_request", "pcie_load_busy_max",
                "load_wait_mean_s", "async_loads"):  # fmt: skip
        assert key in doc["points"][0]["modes"]["native"], key
    assert doc["points"][0]["modes"]["native"]["async_loads"] > 0
    table = render_table(doc)
    assert "gain vs none" in table and "break-even cluster.num_gpu_blocks" in table
    text = _cli(str(scenario_file), "--compare", "none,native")
    assert text.returncode == 0 and "avoided re-prefill" in text.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "cluster.offload=floppy"], "cluster.offload"),
        (["--set", "nokey"], "--set"),
        (["--sweep", "cluster.nodes=1,2"], "--sweep needs --compare"),
        (["--compare", "none,tape"], "unknown mode"),
    ],
)
def test_cli_bad_arguments_exit_2_with_one_line(
    scenario_file: Path, args: list[str], message: str
) -> None:
    proc = _cli(str(scenario_file), *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_set_overrides_a_key(scenario_file: Path) -> None:
    proc = _cli(str(scenario_file), "--json", "--set", "workload.groups=5")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["completed_requests"] == 20


def test_cli_missing_scenario_is_a_clear_error(tmp_path: Path) -> None:
    proc = _cli(str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2 and "cannot read scenario" in proc.stderr
