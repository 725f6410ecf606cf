"""`kvscope collect --file-sd`: Prometheus file_sd files as an operator points kvscope at them.

A subprocess as an operator runs it, real targets on 127.0.0.1, a SQLite store. In the
long-running test a targets-file target scraped every tick is the clock: "the next tick" is
counted in its hits.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from core.errors import KvscopeError
from kvscope.cli import app
from store.store import Store
from tests.collector.exposerver import expo_server

METRICS = Path(__file__).resolve().parent / "fixtures" / "metrics"
V033 = (METRICS / "vllm-0.33.0-metrics-default.txt").read_bytes()
LMCACHE = (METRICS / "lmcache-0.5.6-legacy-metrics.txt").read_bytes()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvscope.cli", "collect", *args]


def test_collect_file_sd_once_good_file_scraped_broken_file_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in [k for k in os.environ if k.startswith("KVSCOPE_")]:
        monkeypatch.delenv(key)
    db = f"sqlite:///{tmp_path / 'k.db'}"
    sd = tmp_path / "sd"
    sd.mkdir()
    with expo_server() as srv:
        srv.add("/metrics", V033)
        srv.add("/lmcache", LMCACHE)
        host = srv.base.removeprefix("http://")
        (sd / "a.json").write_text(json.dumps([
            {"targets": [host], "labels": {"job": "vllm", "model": "llama-3.1-8b"}},
            {"targets": [host], "labels": {"job": "lmcache", "instance": "pool-0",
                                           "__metrics_path__": "/lmcache"}},
        ]))  # fmt: skip
        (sd / "b.yaml").write_text("- targets: ['10.9.9.9:8000']\n  labels: {offload: cpu}\n")
        result = CliRunner().invoke(app, [
            "collect", "--file-sd", str(sd / "*.json"), "--file-sd", str(sd / "*.yaml"),
            "--once", "--db", db, "--cluster", "cli",
        ])  # fmt: skip
    assert result.exit_code == 0, (result.output, result.exception)
    summary = json.loads(result.stdout)
    assert summary["targets_up"] == 2 and summary["targets_down"] == 0
    assert summary["errors"] == {} and summary["file_sd_errors"] == 1
    assert summary["last_error"] == (
        f"file_sd: {sd / 'b.yaml'}:1: group [0]: label 'offload' must be one of none, native, "
        "lmcache, got 'cpu'"
    )
    assert summary["cluster"] == "cli" and summary["windows_written"] > 0
    with Store(db) as store:
        assert [(t.name, t.kind) for t in store.targets(cluster="cli")] == [
            (host, "vllm"), ("pool-0", "lmcache")
        ]  # fmt: skip
        assert {w.source for w in store.read_windows()} == {host, "pool-0"}
        assert [(e.source, e.model) for e in store.engines(cluster="cli")] == [
            (host, "llama-3.1-8b")
        ]


def _wait(proc: subprocess.Popen[str], until: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not until():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_collect_file_sd_file_created_scraped_next_tick_deleted_stops_errors_logged(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'k.db'}"
    sd = tmp_path / "sd"
    sd.mkdir()
    with expo_server() as srv:
        clock = srv.add("/clock", V033)
        srv.add("/sd", V033)
        targets = tmp_path / "targets.yaml"
        targets.write_text(f"cluster: cli\ntargets:\n  - {{name: clock, url: '{clock}'}}\n")
        bad = tmp_path / "bad.json"
        bad.write_text('[{"targets": ["10.9.9.9:8000"], "labels": {"kind": "tgi"}}]')
        proc = subprocess.Popen(
            _cmd("--targets", str(targets), "--file-sd", str(sd / "*.yaml"), "--file-sd",
                 str(bad), "--db", db, "--interval", "200ms"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
        )  # fmt: skip

        def ticks() -> int:
            return srv.route("/clock").hits

        def hits() -> int:
            return srv.route("/sd").hits

        try:
            _wait(proc, lambda: ticks() >= 1, "the first tick")
            tmp = sd / ".new.yaml.tmp"  # written aside, renamed in: never seen half-written
            tmp.write_text(f"- targets: ['{srv.base.removeprefix('http://')}']\n"
                           "  labels: {instance: sd-0, __metrics_path__: /sd}\n")  # fmt: skip
            tmp.rename(sd / "new.yaml")
            created_at = ticks()
            _wait(proc, lambda: hits() >= 1, "the new file's target scraped")
            first_scrape_at = ticks()
            _wait(proc, lambda: hits() >= 2, "more scrapes of it")
            (sd / "new.yaml").unlink()
            deleted_at, at_delete = ticks(), hits()
            _wait(proc, lambda: ticks() >= deleted_at + 2, "ticks after the delete")
            after_delete = hits()
            _wait(proc, lambda: ticks() >= deleted_at + 4, "more ticks")
            assert hits() == after_delete  # no scrape since
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    # The tick in flight may have listed the directory just before the rename: then the next
    # one reads it (two ticks at most, counted in the clock target's hits).
    assert first_scrape_at - created_at <= 2, (created_at, first_scrape_at)
    assert after_delete - at_delete <= 1  # the tick in flight may have listed it still
    summary = json.loads(out)
    assert summary["errors"] == {} and summary["file_sd_errors"] == 1  # read once: unchanged
    assert f"kvscope: file_sd: no file matches {sd / '*.yaml'} (yet)\n" in err
    assert (
        f"kvscope: file_sd: {bad}: group [0]: label 'kind' must be one of vllm, lmcache, got "
        "'tgi'; no targets from it yet\n" in err
    )
    assert "target sd-0 registered: scraping it" in err
    assert f"file_sd: {sd / 'new.yaml'} is gone, and its 1 target(s) with it" in err
    with Store(db) as store:
        assert [(t.name, t.cluster) for t in store.targets()] == [("clock", "cli"), ("sd-0", "cli")]
        assert len(store.outcomes(targets=["sd-0"])) == after_delete


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--file-sd", "sd/targets.txt"], "--file-sd 'sd/targets.txt' is not a file_sd file name "
         "or pattern: it must end in .json, .yml or .yaml, with '*' only in its last path"),
        (["--file-sd", "sd*/a.json"], "--file-sd 'sd*/a.json' is not a file_sd file name"),
        (["--file-sd", "a.json", "--file-sd", "b"], "--file-sd 'b' is not a file_sd file name"),
        (["--file-sd", "a.json", "--prometheus", "http://x"],
         "--file-sd is direct mode: not with --prometheus"),
        (["--once"], "give exactly one of --targets FILE or --prometheus URL (or "
         "--targets-from-store, --file-sd)"),
    ],
)  # fmt: skip
def test_collect_file_sd_flags_bad_raise_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    for key in [k for k in os.environ if k.startswith("KVSCOPE_")]:
        monkeypatch.delenv(key)
    result = CliRunner().invoke(app, ["collect", *args, "--db", f"sqlite:///{tmp_path / 'k.db'}"])
    assert isinstance(result.exception, KvscopeError), (result.output, result.exception)
    assert message in str(result.exception)
    assert not (tmp_path / "k.db").exists()  # refused before anything was written


def test_collect_help_file_sd_says_precedence() -> None:
    result = CliRunner().invoke(app, ["collect", "--help"], terminal_width=200)
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "--file-sd" in text and "PATH_OR_GLOB" in text
    assert "the --targets file wins over file_sd, file_sd over the store" in text
