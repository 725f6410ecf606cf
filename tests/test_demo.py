"""`kvscope demo`: a short run end to end (simulated cluster on 127.0.0.1 -> collector ->
SQLite -> planner -> summary and PNGs), its clean-up, its reproducibility and its CLI."""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import re
import shlex
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import typer
import yaml
from typer.core import TyperGroup

from dashboards.generate import artifacts, check
from kvscope.cli import app
from kvscope.demo import (
    DEFAULT_SCENARIO,
    EPOCH_ALIGN_S,
    WINDOW_S,
    DemoOptions,
    DemoResult,
    clear_outputs,
    load_demo_scenario,
    run_demo,
    summary,
)
from planner.report.plots import PLOT_FILES
from store.store import Store

REPO = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Two engines on one node, one without offload and one on LMCache, HBM limited so KV use
# moves with the (rising) load: enough for every stage to run in a few seconds.
TINY = {
    "name": "demo-test",
    "cluster": {
        "nodes": 1,
        "gpus_per_node": 2,
        "model": "llama-3.1-8b",
        "gpu_memory_utilization": 0.3,
        "engines_offload": ["none", "lmcache"],
        "cpu_cache_gb": 50,
    },
    "workload": {
        "kind": "shared_prefix",
        "groups": 16,
        "prompts_per_group": 8,
        "popularity": "zipf",
        "system_prompt_tokens": 6000,
        "question_tokens": 800,
        "output_tokens": 300,
        "qps": 2,
        "arrival": "diurnal",
        "diurnal_period_s": 7200,
        "diurnal_amplitude": 1.0,
    },
}


def _scenario(directory: Path) -> Path:
    path = directory / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY), encoding="utf-8")
    return path


@dataclass(frozen=True)
class Run:
    result: DemoResult
    err: str
    db: Path
    out: Path
    threads_before: frozenset[str]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("demo")
    db, out = tmp / "demo.db", tmp / "plots"
    db.write_bytes(b"not a database: the demo must replace it")
    out.mkdir()
    for name in PLOT_FILES:  # an earlier run's plots: each must be gone or redrawn
        (out / name).write_bytes(b"stale plot of an earlier run")
    (out / "keep.txt").write_text("not the demo's: stays", encoding="utf-8")
    before = frozenset(t.name for t in threading.enumerate())
    err = io.StringIO()
    opts = DemoOptions(
        db=f"sqlite:///{db}", out=out, speed=400.0, sim_hours=0.5, seed=3,
        scenario=_scenario(tmp),
    )  # fmt: skip
    result = run_demo(opts, err=err)
    return Run(result, err.getvalue(), db, out, before)


def test_demo_short_run_stores_windows_for_every_engine(short_run: Run) -> None:
    with Store(f"sqlite:///{short_run.db}") as store:
        engines = {e.source: e for e in store.engines()}
        windows = store.read_windows(signals=["kv_cache_usage_ratio", "preemptions_total"])
    assert {e.offload for e in engines.values()} == {"none", "lmcache"}
    assert {e.facts.get("num_gpu_blocks") for e in engines.values()} - {None}, "no engine facts"
    minutes = round(short_run.result.scenario.duration_s / WINDOW_S)
    for source in engines:
        kv = [w for w in windows if w.source == source and w.signal == "kv_cache_usage_ratio"]
        starts = sorted({w.start for w in kv})
        assert len(starts) == minutes, (source, len(starts))
        assert all(b - a == WINDOW_S for a, b in itertools.pairwise(starts))
        assert max(w.max or 0.0 for w in kv) > min(w.min or 1.0 for w in kv)  # KV use moved
    # "recent" history: the simulated period ends within the hour before the run (epoch0 is
    # on the hour so that the forecast's UTC-aligned buckets hold the same minutes every run)
    last = max(w.start + w.length_s for w in windows)
    assert time.time() - 600 - EPOCH_ALIGN_S < last <= time.time()
    assert (last - short_run.result.scenario.duration_s) % EPOCH_ALIGN_S == 0


def test_demo_short_run_saves_its_plan_as_plan_save_would(short_run: Run) -> None:
    plan = short_run.result.plan
    assert plan.cluster
    with Store(f"sqlite:///{short_run.db}") as store:
        saved = store.latest_plan(plan.cluster)
    assert saved is not None, "the API would answer 404 for the demo's cluster"
    decision = plan.decision
    assert decision is not None and saved.mode == decision.mode
    assert saved.document["decision"]["mode"] == decision.mode
    assert f"saved as plan {saved.id} of cluster {plan.cluster}" in short_run.err


def test_demo_short_run_summary_names_decision_and_files(short_run: Run) -> None:
    text = summary(short_run.result)
    decision = short_run.result.plan.decision
    assert decision is not None  # the demo has one model group: a top-level decision
    mode = decision.mode
    assert f"Decision: {mode.upper()}" in text
    for section in ("What is happening", "Fits (95 % intervals)", "Forecast", "Sizing", "Files"):
        assert section in text
    assert str(short_run.db) in text
    for path in short_run.result.plots:
        assert str(path) in text
    payload = short_run.result.to_dict()
    assert payload["decision"]["mode"] == mode
    assert payload["demo"]["windows_written"] == short_run.result.windows_written > 0


def test_demo_short_run_summary_next_steps_are_runnable_commands(short_run: Run) -> None:
    text = summary(short_run.result)
    steps = text[text.index("Next steps") :]
    cluster = short_run.result.plan.cluster
    assert cluster is not None
    assert f"/v1/clusters/{cluster}/report" in steps and "/docs" in steps
    assert "docker-compose up -d" in steps and "cp .env.example .env" in steps
    assert (REPO / ".env.example").is_file() and (REPO / "docker-compose.yml").is_file()
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    commands = [line.split(None, 1)[1] for line in steps.splitlines() if " kvscope " in line]
    assert len(commands) == 2, steps
    parsed = {}
    for line in commands:  # each parses with kvscope's own flags, on the demo's store
        name, *args = shlex.split(line)[1:]
        command = root.get_command(typer.Context(root), name)
        assert command is not None, line
        parsed[name] = command.make_context(f"kvscope {name}", args).params
        assert parsed[name]["db"] == f"sqlite:///{short_run.db}", line
    assert sorted(parsed) == ["report", "serve"]
    assert parsed["report"]["cluster"] == cluster
    assert parsed["report"]["out"] == short_run.out / "report.html"


def test_demo_short_run_progress_covers_every_phase(short_run: Run) -> None:
    for phase in ("[1/4 simulate]", "[2/4 collect]", "[3/4 plan]", "[4/4 plots]"):
        assert phase in short_run.err
    assert re.search(r"sim 0:29:45 / 0:30:00 \(99%\), 3/3 targets up", short_run.err)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert data.rstrip(b"\0").endswith(b"IEND\xaeB`\x82"), f"{path}: truncated"
    return width, height


def test_demo_short_run_writes_valid_pngs(short_run: Run) -> None:
    plots = short_run.result.plots
    assert plots, "no plot written"
    assert {p.parent for p in plots} == {short_run.out}
    assert sorted(short_run.out.glob("*.png")) == sorted(plots)  # no stale plot left
    assert (short_run.out / "keep.txt").read_text(encoding="utf-8") == "not the demo's: stays"
    for path in plots:
        width, height = _png_size(path)
        assert width >= 300 and height >= 200, (path, width, height)
        assert path.stat().st_size > 10_000, path


def test_demo_short_run_writes_the_dashboards_and_rules_it_names(short_run: Run) -> None:
    surfaces = short_run.result.surfaces
    assert {p.relative_to(short_run.out) for p in surfaces} == set(artifacts())
    assert check(short_run.out) == []  # the same bytes `kvscope dashboards build` writes
    assert all(str(p) in summary(short_run.result) for p in surfaces)
    assert short_run.result.to_dict()["demo"]["dashboards_and_rules"] == [str(p) for p in surfaces]


def test_demo_default_scenario_has_a_near_idle_trough_and_ends_at_its_peak() -> None:
    # The fits need both: low-load windows (prefill MFU: running <= 2, nothing waiting) and
    # KV saturation (preemptions, offload gains); the forecast and sizing read the end.
    sc = load_demo_scenario(DEFAULT_SCENARIO, 4.0, 1)
    wl = sc.workload
    assert wl.qps is not None and wl.arrival == "diurnal"
    step = 60.0
    rates = [
        wl.qps * (1 + wl.diurnal_amplitude * math.sin(2 * math.pi * i * step / wl.diurnal_period_s))
        for i in range(round(sc.duration_s / step) + 1)
    ]
    engines = sc.cluster.num_engines
    idle_minutes = sum(1 for r in rates if r / engines < 0.25)  # < 1 request / 4 s / engine
    assert idle_minutes >= 30, idle_minutes
    assert max(rates) >= 1.9 * wl.qps  # the peak saturates the engines without offload
    assert rates[-1] >= 0.95 * max(rates)  # the run ends at the peak, not on a slope


def test_clear_outputs_deletes_only_the_demos_own_plots(tmp_path: Path) -> None:
    for name in (*PLOT_FILES, "mine.png", "report.html"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / PLOT_FILES[0]).write_bytes(b"x")
    gone = clear_outputs(tmp_path)
    assert sorted(p.name for p in gone) == sorted(PLOT_FILES)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.png", "report.html", "sub"]
    assert (tmp_path / "sub" / PLOT_FILES[0]).exists()
    assert clear_outputs(tmp_path / "missing") == []  # nothing to clear: no error


def test_clear_outputs_a_directory_in_the_way_is_kept(tmp_path: Path) -> None:
    (tmp_path / PLOT_FILES[0]).mkdir()  # not a file: not ours to delete
    assert clear_outputs(tmp_path) == []
    assert (tmp_path / PLOT_FILES[0]).is_dir()


def _refused(url: str) -> bool:
    parts = urlsplit(url)
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((parts.hostname or "", parts.port or 0)) != 0


def test_demo_short_run_leaves_no_port_or_thread(short_run: Run) -> None:
    doc = short_run.result.endpoints
    urls = [e["url"] for e in doc["engines"]] + [p["url"] for p in doc["lmcache"]]
    assert len(urls) == 3
    assert all(_refused(u) for u in urls)
    deadline = time.monotonic() + 5
    while True:
        extra = {t.name for t in threading.enumerate() if t.is_alive()} - short_run.threads_before
        if not extra or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not extra


def _window_values(db: Path, epoch0: float) -> list[tuple[object, ...]]:
    with Store(f"sqlite:///{db}") as store:
        rows = store.read_windows()
    return sorted(
        (w.source, w.signal, w.labels, w.start - epoch0, w.delta, w.mean, w.last) for w in rows
    )


def test_demo_rerun_same_seed_overwrites_db_with_same_windows(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    scenario = _scenario(tmp_path)
    runs = []
    for _ in range(2):
        opts = DemoOptions(db=f"sqlite:///{db}", out=tmp_path / "out", speed=2000.0,
                           sim_hours=0.1, seed=5, scenario=scenario)  # fmt: skip
        result = run_demo(opts, err=io.StringIO())
        first = float(result.plan.window["first"])
        runs.append((result, _window_values(db, first)))
    (a, wa), (b, wb) = runs
    assert len(wa) == a.windows_written == b.windows_written  # the second run replaced the first
    assert wa == wb
    assert a.plan.decision is not None and b.plan.decision is not None  # one model group
    assert a.plan.decision.mode == b.plan.decision.mode


# ------------------------------------------------------------------ the command line


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvscope.cli", "demo", *args]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--speed", "0"], "--speed must be > 0"),
        (["--sim-hours", "-1"], "--sim-hours must be > 0"),
        (["--scenario", "missing.yaml"], "missing.yaml: no such scenario file nor bundled"),
        (["--scenario", "old/demo.yaml"], "old/demo.yaml: cannot read scenario"),
        (["--horizon", "soon"], "--horizon: 'soon' is not a duration"),
        (["--db", "nosuchdb://x"], "bad database URL nosuchdb://x"),
    ],
)
def test_demo_cli_bad_option_exits_2_naming_it(
    tmp_path: Path, args: list[str], message: str
) -> None:
    proc = subprocess.run(
        _cli("--out", str(tmp_path / "out"), "--db", f"sqlite:///{tmp_path}/d.db", *args),
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=_env(), check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "[1/4 simulate]" not in proc.stderr  # refused before anything started
    assert proc.stdout == ""


def test_demo_cli_out_holds_the_database_unless_db_is_given(tmp_path: Path) -> None:
    proc = subprocess.run(
        _cli("--scenario", str(_scenario(tmp_path)), "--out", str(tmp_path / "o"), "--speed",
             "2000", "--sim-hours", "0.2", "--json"),
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_env(), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    db = tmp_path / "o" / "demo.db"
    assert json.loads(proc.stdout)["demo"]["db"] == f"sqlite:///{db}"
    assert db.is_file() and not (tmp_path / "out").exists()
    with Store(f"sqlite:///{db}") as store:
        assert store.latest_plans(), "the demo saved no plan"


def test_demo_cli_help_has_example() -> None:
    proc = subprocess.run(
        _cli("--help"), capture_output=True, text=True, timeout=60, env=_env(), check=False
    )
    assert proc.returncode == 0
    assert "Example: kvscope demo" in proc.stdout


@pytest.mark.slow  # ~7 s of demo before the signal; the short demo run stays in the default suite
def test_demo_cli_sigint_stops_cleanly_and_frees_ports(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    proc = subprocess.Popen(
        _cli("--scenario", str(_scenario(tmp_path)), "--db", f"sqlite:///{db}",
             "--out", str(tmp_path / "out"), "--speed", "20", "--sim-hours", "1"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path,
    )  # fmt: skip
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # wait until windows are being written
            lines.append(line)
            if "[2/4 collect] sim" in line and " 0 windows" not in line:
                break
        proc.send_signal(signal.SIGINT)
        out, rest = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    err = "".join(lines) + rest
    assert proc.returncode == 130, err
    assert "interrupted at simulated" in err and out == ""
    urls = re.findall(r"http://127\.0\.0\.1:\d+/metrics", lines[0])
    assert len(urls) == 2 and all(_refused(u) for u in urls)
    with Store(f"sqlite:///{db}") as store:
        assert store.read_windows(), "the windows collected before Ctrl-C were not flushed"
