"""The start-up policy (docs/architecture.md, Conventions): a path that does not need a heavy
library does not load it. Each check imports in a fresh interpreter and reads sys.modules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clirun import run_kvscope

ROOT = Path(__file__).resolve().parents[1]
SCIENCE = ("numpy", "pandas", "scipy", "statsmodels", "matplotlib")


def _loaded(code: str, names: tuple[str, ...]) -> list[str]:
    """Which of ``names`` are in sys.modules after running ``code`` in a fresh interpreter."""
    probe = (
        f"import json, sys\n{code}\nprint(json.dumps([n for n in {names!r} if n in sys.modules]))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                          text=True, cwd=ROOT, timeout=120)  # fmt: skip
    return list(json.loads(proc.stdout.splitlines()[-1]))


@pytest.mark.parametrize(
    ("code", "unloaded"),
    [
        # `kvscope --help` builds every command: their subsystems load when a command runs
        ("import kvscope.cli; kvscope.cli.build_app()", (*SCIENCE, "sqlalchemy", "fastapi")),
        # the API's start-up: the planner's numbers load on the first request that needs them
        ("import api.app", SCIENCE),
        # `kvscope plans`, `db migrate`: the store's chunks need numpy only when they are read
        ("import store.store", SCIENCE),
        # the fits' libraries load when a fit runs, a plot's when one is drawn
        ("import planner.plan, planner.report", ("scipy", "statsmodels", "matplotlib")),
    ],
)
def test_startup_path_leaves_heavy_libraries_unloaded(code: str, unloaded: tuple[str, ...]) -> None:
    assert _loaded(code, unloaded) == []


def test_startup_python_dash_m_kvscope_runs_the_cli() -> None:
    proc = subprocess.run([sys.executable, "-m", "kvscope", "version"], check=False,
                          capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads(run_kvscope("version").stdout)
