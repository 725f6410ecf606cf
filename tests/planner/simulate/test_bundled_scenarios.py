"""Bundled scenarios (planner/simulate/scenarios/, package data): a scenario argument is a
file path or a bundled name, with or without .yaml; anything else is a one-line error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import ConfigError
from planner.simulate.scenario import load_scenario
from planner.simulate.scenarios import bundled_directory, bundled_name, bundled_names, scenario_file
from tests.clirun import assert_one_line_error

EXPECTED = {
    "canary_switchback",
    "cpu_tier",
    "demo",
    "diurnal_mixed_offload",
    "multi_turn",
    "rag_bursty",
    "saturated_16x_h100",
    "shared_prefix",
    "trace_replay",
}


def test_bundled_names_are_the_yaml_files_not_the_trace() -> None:
    assert set(bundled_names()) == EXPECTED
    assert list(bundled_names()) == sorted(EXPECTED)
    with bundled_directory() as directory:
        assert (directory / "trace.jsonl").is_file()  # trace_replay.yaml's relative path


@pytest.mark.parametrize("arg", ["shared_prefix", "shared_prefix.yaml"])
def test_bundled_name_with_or_without_suffix(arg: str) -> None:
    assert bundled_name(arg) == "shared_prefix"
    with scenario_file(arg) as path:
        assert path.name == "shared_prefix.yaml" and path.is_file()


@pytest.mark.parametrize("arg", ["", "nosuch", "dir/shared_prefix", "shared_prefix.yml", "trace"])
def test_not_a_bundled_name(arg: str) -> None:
    assert bundled_name(arg) is None


def test_unknown_name_error_lists_the_bundled_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info, scenario_file("nosuch"):
        pass
    message = str(info.value)
    assert message.startswith("nosuch: no such scenario file nor bundled scenario (bundled: ")
    assert all(name in message for name in EXPECTED) and "\n" not in message


def test_missing_path_is_yielded_for_the_reader_to_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with scenario_file("old/shared_prefix.yaml") as path:
        assert path == Path("old/shared_prefix.yaml") and not path.exists()


def test_existing_file_wins_over_a_bundled_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("demo").write_text("name: mine\n", encoding="utf-8")
    with scenario_file("demo") as path:
        assert path == Path("demo")
    with scenario_file(tmp_path / "demo") as path:
        assert path == tmp_path / "demo"


def test_trace_replay_reads_its_trace_from_another_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with scenario_file("trace_replay") as path:
        sc = load_scenario(path)
    assert sc.workload.kind == "trace" and len(sc.workload.trace) > 0


def _kvscope(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    return subprocess.run(
        [sys.executable, "-m", "kvscope.cli", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd, env=env, check=False,
    )  # fmt: skip


def test_cli_simulate_list_prints_every_bundled_scenario(tmp_path: Path) -> None:
    proc = _kvscope(tmp_path, "simulate", "--list")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert [r[0] for r in rows] == sorted(EXPECTED)
    assert all(Path(r[1]).is_file() and Path(r[1]).name == f"{r[0]}.yaml" for r in rows)


def test_cli_simulate_bundled_name_from_another_directory(tmp_path: Path) -> None:
    proc = _kvscope(tmp_path, "simulate", "trace_replay", "--json", "--set", "duration_s=30")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["scenario"] == "trace-replay"


def test_cli_simulate_compare_re_reads_the_bundled_trace(tmp_path: Path) -> None:
    proc = _kvscope(tmp_path, "simulate", "trace_replay.yaml", "--compare", "none,native",
                    "--set", "duration_s=30", "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["simulate", "nosuch"], "kvscope: error: nosuch: no such scenario file nor bundled"),
        (
            ["simulate"],
            "kvscope: error: missing SCENARIO: a scenario YAML file or one of canary_switchback, "
            "cpu_tier, demo,",
        ),
    ],
)
def test_cli_simulate_bad_scenario_one_line_exit_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    proc = _kvscope(tmp_path, *args)
    assert_one_line_error(proc, message)
    assert len(proc.stderr.strip().splitlines()) == 1
