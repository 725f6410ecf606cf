"""`kvscope plan --save / --every` and `kvscope plans list|accuracy` on real stores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

from core.errors import ConfigError
from kvscope.cli import app
from store.store import Store
from store.tables import PlanRecord
from tests.clirun import assert_one_line_error, run_kvscope
from tests.planner.synthstore import fill_store, shifted_frame, sqlite_url

RUNNER = CliRunner()


def synth_store(url: str) -> str:
    fill_store(url, shifted_frame(3, 100, seed=11))
    return url


def test_plan_save_stores_the_plan_once_per_window(db_url: str) -> None:
    url = synth_store(db_url)
    args = ["plan", "--db", url, "--since", "all", "--horizon", "1h", "--forecast-seconds", "0.2"]
    r = RUNNER.invoke(app, [*args, "--save", "--json"])
    assert r.exit_code == 0, r.exception
    printed = json.loads(r.stdout)
    assert "saved 1 plan(s) of cluster synth" in r.stderr
    with Store(url) as store:
        (rec,) = store.plans()
    assert (rec.cluster, rec.group, rec.version) == ("synth", "", version("kvscope"))
    assert rec.document["decision"] == printed["decision"]
    assert rec.mode == printed["decision"]["mode"]
    assert rec.headline["score"] == pytest.approx(printed["decision"]["score"], abs=5e-4)
    assert (rec.window_from, rec.window_until) == (printed["window"]["first"],
                                                   printed["window"]["last"])  # fmt: skip
    assert rec.horizon_s == 3600 and abs(rec.created_at - time.time()) < 60
    r = RUNNER.invoke(app, [*args, "--save"])  # the same history again: replaced, not added
    assert r.exit_code == 0, r.exception
    with Store(url) as store:
        (again,) = store.plans()
    assert again.id == rec.id and again.created_at >= rec.created_at


def test_plan_save_several_clusters_without_cluster_asks_for_it(tmp_path: Path) -> None:
    url = synth_store(sqlite_url(tmp_path / "k.db"))
    with Store(url) as store:
        store.upsert_engine("other", "x-0", offload="none")
    r = RUNNER.invoke(app, ["plan", "--db", url, "--save"])
    assert isinstance(r.exception, ConfigError)
    assert "give --cluster NAME (the store holds 2 clusters (other, synth))" in str(r.exception)
    proc = run_kvscope("plan", "--db", url, "--save")
    assert_one_line_error(proc, "--save: which cluster? give --cluster NAME")
    with Store(url) as store:
        assert store.plans() == []


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--every", "soon"], "--every: 'soon' is not a duration"),
        (["--every", "0"], "--every: must be greater than 0"),
        (["--every", "1m", "--plots", "p"], "--plots cannot be used with --every"),
    ],
)
def test_plan_every_bad_arguments_refused(tmp_path: Path, args: list[str], match: str) -> None:
    url = sqlite_url(tmp_path / "k.db")
    Store(url).migrate()
    r = RUNNER.invoke(app, ["plan", "--db", url, *args])
    assert isinstance(r.exception, ConfigError) and match in str(r.exception)


@pytest.mark.slow  # ~9 s: two real rounds of plan --every, then SIGTERM
def test_plan_every_sigterm_stops_cleanly_after_two_saved_rounds(tmp_path: Path) -> None:
    url = synth_store(sqlite_url(tmp_path / "k.db"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvscope.cli", "plan", "--db", url, "--every", "1s", "--since",
         "all", "--horizon", "1h", "--forecast-seconds", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    saved: list[float] = []  # created_at of the stored plan, each time it changed
    try:
        with Store(url) as store:
            deadline = time.monotonic() + 40
            while len(saved) < 2 and time.monotonic() < deadline:
                assert proc.poll() is None, proc.communicate()
                plans = store.plans()
                if plans and (not saved or plans[0].created_at > saved[-1]):
                    saved.append(plans[0].created_at)
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert len(saved) == 2, err  # a second round re-saved the plan of the same history
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["mode"] == "every" and summary["every_s"] == 1.0
    assert summary["rounds"] >= 2 and summary["plans_saved"] >= 2
    assert summary["errors"] == {} and summary["rounds_failed"] == 0
    assert "round 2: 1 plan(s) of 1 cluster(s) saved" in err and "Traceback" not in err
    with Store(url) as store:
        (rec,) = store.plans()  # one history, one row: each round replaced it
    assert rec.created_at >= saved[-1]


# --------------------------------------------------------------------------- plans list


def record(cluster: str, created: float, start: float, **headline: float | None) -> PlanRecord:
    return PlanRecord(cluster, "", created, start, start + 3600, 86_400.0, "0.1.0", "native",
                      {"forecast": {}}, headline)  # fmt: skip


def test_plans_list_history_newest_first_text_and_json(db_url: str) -> None:
    now = time.time()
    with Store(db_url) as store:
        store.migrate()
        old = store.save_plan(record("east", now - 10 * 86400, now - 12 * 86400))
        new = store.save_plan(
            record("west", now - 60, now - 7200, score=0.55, capacity_native=1.25,
                   capacity_native_lo=1.1, capacity_native_hi=1.42, capacity_lmcache=1.3,
                   capacity_lmcache_lo=1.17, capacity_lmcache_hi=None, forecast_peak=9e5,
                   forecast_peak_lo=8e5, forecast_peak_hi=1e6, kv_capacity=1e6,
                   saturation_s=7200.0, saturation_lo_s=3600.0, saturation_hi_s=None,
                   p_saturation=0.4)
        )  # fmt: skip
    r = RUNNER.invoke(app, ["plans", "list", "--db", db_url])
    assert r.exit_code == 0, r.exception
    lines = r.stdout.splitlines()
    assert lines[0].split()[:4] == ["created", "(UTC)", "cluster", "group"]
    assert "west" in lines[1] and "east" in lines[2] and len(lines) == 3
    assert "1.25 [1.10, 1.42]" in lines[1] and "90% [80%, 100%] of HBM" in lines[1]
    assert "≥ 1.17" in lines[1]  # a lower bound: no upper end
    assert "2.0 h [1.0 h, n/a], P 40%" in lines[1] and "not within the horizon" in lines[2]
    r = RUNNER.invoke(app, ["plans", "list", "--db", db_url, "--json", "--since", "7d"])
    assert r.exit_code == 0, r.exception
    (only,) = json.loads(r.stdout)["plans"]
    assert only["id"] == new and only["headline"]["score"] == 0.55 and "document" not in only
    r = RUNNER.invoke(app, ["plans", "list", "--db", db_url, "--json", "--cluster", "east"])
    assert [p["id"] for p in json.loads(r.stdout)["plans"]] == [old]


def test_plans_list_empty_store_says_how_to_keep_plans(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "k.db")
    Store(url).migrate()
    r = RUNNER.invoke(app, ["plans", "list", "--db", url])
    assert r.exit_code == 0 and "no stored plans: `kvscope plan --save`" in r.stdout


# --------------------------------------------------------------------------- plans accuracy


def test_plans_accuracy_scores_due_plans_and_counts_pending(db_url: str) -> None:
    now = time.time()
    with Store(db_url) as store:
        store.migrate()
        due = store.save_plan(record("east", now - 3 * 86400, now - 3 * 86400))
        pending = store.save_plan(record("east", now - 60, now - 3600))
    r = RUNNER.invoke(app, ["plans", "accuracy", "--db", db_url, "--json"])
    assert r.exit_code == 0, r.exception
    d = json.loads(r.stdout)
    by_id = {o["plan_id"]: o for o in d["outcomes"]}
    assert by_id[due]["pending"] is False and by_id[due]["saturation"] == "unknown"
    assert by_id[pending]["pending"] is True
    assert (d["summary"]["scored"], d["summary"]["pending"]) == (1, 1)
    r = RUNNER.invoke(app, ["plans", "accuracy", "--db", db_url, "--cluster", "east"])
    assert r.exit_code == 0, r.exception
    assert "plans: 1 scored, 1 pending" in r.stdout and "pending" in r.stdout.splitlines()[1]
    assert "KV-demand coverage: nothing to compare yet" in r.stdout


@pytest.mark.parametrize("sub", ["list", "accuracy"])
def test_plans_help_has_examples(sub: str) -> None:
    r = RUNNER.invoke(app, ["plans", sub, "--help"])
    assert r.exit_code == 0 and f"Example: kvscope plans {sub}" in r.stdout


def test_plans_missing_sqlite_file_exits_2_without_traceback(tmp_path: Path) -> None:
    proc = run_kvscope("plans", "list", "--db", sqlite_url(tmp_path / "typo.db"))
    assert_one_line_error(proc, "no such SQLite file")
