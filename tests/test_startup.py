"""The start-up policy (docs/architecture.md, Conventions): a path that does not need a heavy
library does not load it. Each check imports in a fresh interpreter and reads sys.modules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from store.store import Store
from store.tables import PlanRecord
from tests.clirun import run_kvscope
from tests.planner.synthstore import sqlite_url

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


@pytest.mark.parametrize("flags", [(), ("--json",)])
def test_startup_plans_list_leaves_numpy_and_pandas_unloaded(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    # `kvscope plans list` reads stored headlines: no plan is built, no frame is read
    url = sqlite_url(tmp_path / "plans.db")
    headline = {"saturation_s": 7200.0, "saturation_lo_s": 3600.0, "p_saturation": 0.4}
    with Store(url) as store:
        store.migrate()
        store.save_plan(PlanRecord("c", "", 1e9, 1e9 - 3600, 1e9, 86_400.0, "0", "native",
                                   {"forecast": {}}, headline))  # fmt: skip
    argv = ["kvscope", "plans", "list", "--db", url, *flags]
    code = (
        f"from kvscope.cli import main\nsys.argv = {argv!r}\ntry:\n    main()\n"
        "except SystemExit as exc:\n    assert not exc.code, exc.code"
    )
    assert _loaded(code, ("numpy", "pandas")) == []


def test_startup_python_dash_m_kvscope_runs_the_cli() -> None:
    proc = subprocess.run([sys.executable, "-m", "kvscope", "version"], check=False,
                          capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads(run_kvscope("version").stdout)


@pytest.mark.parametrize("argv", [["kvscope", "version"], ["kvscope", "plan", "--db", ""]])
def test_startup_main_freezes_what_is_alive_on_the_way_out(argv: list[str]) -> None:
    # the interpreter's last collection skips frozen objects (kvscope/cli.py main), on a
    # normal exit and on an error's exit status alike
    code = (
        f"import gc, sys\nfrom kvscope.cli import main\nsys.argv = {argv!r}\n"
        "assert gc.get_freeze_count() == 0\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(gc.get_freeze_count())"
    )
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                          text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.split()[-1]) > 0
