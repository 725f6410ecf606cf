"""benchmarks/bench_store_size.py runs end to end, tiny (one engine, an hour), with both sides
this tree: every figure is there and the sizes of the two sides are the same bytes; and
benchmarks/gitrev.py leaves out a package a revision does not have."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import gitrev

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_store_size.py"


def _run(tmp_path: Path, *args: str) -> tuple[str, dict[str, Any]]:
    out = tmp_path / "figures.json"
    cmd = [sys.executable, str(SCRIPT), "--engines", "1", "--days", str(1 / 24), "--rounds", "1",
           "--json", str(out), *args]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


def _check(figures: dict[str, Any], backend: str) -> None:
    mixes = figures["backends"][backend]
    assert set(mixes) == {"plan", "full"}
    for fig in mixes.values():
        assert fig["windows"] > 0
        old, new = fig["old"], fig["new"]
        assert old["size"]["total"] > 0 and sum(new["size"]["tables"].values()) > 0
        assert fig["ratio"]["write_pack_cpu"] > 0
        assert set(fig["targets"]) == {"bytes_per_window_le_40", "write_cost_within_10pct"}
        assert old["store"] == new["store"]
        if backend == "sqlite":  # VACUUMed: the same workload by the same code, the same bytes
            assert old["size"]["tables"] == new["size"]["tables"]
            assert fig["ratio"]["bytes_per_window"] == 1.0


def test_sqlite_tiny_run_with_the_working_tree_on_both_sides(tmp_path: Path) -> None:
    stdout, figures = _run(tmp_path, "--baseline", "WORKTREE")
    _check(figures, "sqlite")
    assert "B/window: TOTAL" in stdout and "within ±10%" in stdout


def test_baseline_path(tmp_path: Path) -> None:
    _, figures = _run(tmp_path, "--baseline-path", str(ROOT), "--mix", "plan")
    assert set(figures["backends"]["sqlite"]) == {"plan"}


@pytest.mark.postgres
def test_postgres_tiny_run(tmp_path: Path) -> None:
    _, figures = _run(tmp_path, "--baseline", "WORKTREE", "--postgres", "--no-sqlite")
    _check(figures, "postgresql")


def test_revision_tree_leaves_out_a_package_the_revision_lacks() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    with gitrev.revision_tree("HEAD", ("collector", "no_such_package"), who="test") as tree:
        assert sorted(p.name for p in tree.iterdir()) == ["collector"]
    with (
        pytest.raises(SystemExit, match="none of the packages"),
        gitrev.revision_tree("HEAD", ("no_such_package",), who="test"),
    ):
        pass
