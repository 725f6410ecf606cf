"""`kvscope demo --keep`: a short simulated run stored with the default keep set (the signals
kvscope reads back) plans exactly as with ``--keep all``, from fewer series."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from kvscope.demo import DemoOptions, run_demo
from store.store import Store
from tests.planner.synthstore import without_timings
from tests.test_demo import _env, _scenario


def _run(tmp: Path, keep: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The plan's JSON (without its timings, its db URL written DB), its window and the
    store's statistics of one demo run."""
    url = f"sqlite:///{tmp / keep}.db"
    opts = DemoOptions(db=url, out=tmp / f"out-{keep}", speed=400.0, sim_hours=0.5, seed=3,
                       scenario=_scenario(tmp), keep=keep)  # fmt: skip
    result = run_demo(opts, err=io.StringIO())
    with Store(url) as store:
        stats = store.stats()
        frame = store.read_frame(columns=["source", "signal", "labels"])
    stats["series_stored"] = len(frame.drop_duplicates())  # (source, signal, labels)
    plan = without_timings(result.plan.to_dict())
    return json.dumps(plan, sort_keys=True).replace(url, "DB"), plan["window"], stats


def test_demo_default_keep_plans_as_keep_all_from_fewer_series(tmp_path: Path) -> None:
    for _ in range(2):  # a second try when the two runs straddle an hour (epoch0 moved)
        (used, window, used_stats), (every, all_window, all_stats) = (
            _run(tmp_path, k) for k in ("used", "all")
        )
        if window == all_window:
            break
    assert used == every
    assert '"decision": {' in used  # a plan that fitted and decided
    assert used_stats["series_stored"] < all_stats["series_stored"]
    assert set(used_stats["signals"]) < set(all_stats["signals"])
    assert used_stats["windows"] < all_stats["windows"]


def test_demo_cli_bad_keep_exits_2_naming_it(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvscope.cli", "demo", "--keep", "most", "--out",
         str(tmp_path / "out"), "--db", f"sqlite:///{tmp_path}/d.db"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=_env(), check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "--keep must be one of used, all" in proc.stderr
    assert "[1/4 simulate]" not in proc.stderr and proc.stdout == ""
