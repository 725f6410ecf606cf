"""`kvscope plan` on a store of two models: groups in JSON and text, --group, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from core.errors import ConfigError
from kvscope.cli import app
from kvscope.commands.plan import group_dir
from tests.planner.groupstore import BIG, SMALL, fill_two_models
from tests.planner.synthstore import sqlite_url

RUNNER = CliRunner()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = sqlite_url(tmp_path_factory.mktemp("plangroups") / "two.db")
    fill_two_models(url, 150, engines=(3, 2))
    return url


def plan(*args: str) -> tuple[int, str, BaseException | None]:
    r = RUNNER.invoke(app, ["plan", "--since", "all", *args, "--forecast-seconds", "1"])
    return r.exit_code, r.stdout, r.exception


def test_plan_cli_two_models_json_has_a_plan_per_group_and_plots_per_group(
    db: str, tmp_path: Path
) -> None:
    code, stdout, exc = plan("--db", db, "--json", "--plots", str(tmp_path))
    assert code == 0, exc
    d = json.loads(stdout)
    groups = {g["name"]: g for g in d["groups"]}
    assert set(groups) == {SMALL.group, BIG.group}
    assert len(groups[SMALL.group]["engines"]) == 3 and len(groups[BIG.group]["engines"]) == 2
    assert all(g["plan"]["group"] == name for name, g in groups.items())
    for name in groups:
        assert (tmp_path / group_dir(name)).is_dir()
        assert any((tmp_path / group_dir(name)).glob("*.png"))


def test_plan_cli_group_option_and_text(db: str) -> None:
    code, stdout, exc = plan("--db", db, "--json", "--group", SMALL.group)
    assert code == 0, exc
    d = json.loads(stdout)
    assert d["group"] == SMALL.group and "groups" not in d
    assert d["window"]["engines"] == 3
    code, text, exc = plan("--db", db)
    assert code == 0, exc
    assert "Model groups: 2" in text and f"━━ group {BIG.group} ━━" in text


def test_plan_cli_unknown_group_raises_configerror_naming_the_groups(db: str) -> None:
    code, _, exc = plan("--db", db, "--group", "llama")
    assert code != 0 and isinstance(exc, ConfigError)
    assert "'llama'" in str(exc) and SMALL.group in str(exc) and BIG.group in str(exc)


def test_plan_cli_unknown_group_exits_2_without_traceback(db: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    proc = subprocess.run(
        [sys.executable, "-m", "kvscope.cli", "plan", "--db", db, "--since", "all",
         "--group", "nope"],
        check=False, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "no such model group" in proc.stderr and BIG.group in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize(
    ("name", "expected"),
    [("llama-8b@h100-80gb:tp1", "group-llama-8b_h100-80gb_tp1"),
     ("org/Model 7B", "group-org_Model_7B"), ("..", "group-unnamed")],
)  # fmt: skip
def test_group_dir_safe_folder_names(name: str, expected: str) -> None:
    assert group_dir(name) == expected
