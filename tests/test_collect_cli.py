"""`kvscope collect` as a user runs it: a subprocess, real targets on 127.0.0.1, SQLite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from core.durations import parse_duration
from core.errors import ConfigError, KvscopeError
from kvscope.cli import app
from kvscope.commands.collect import CollectFlags, _settings
from store.store import Store
from tests.collector.exposerver import bumping, expo_server
from tests.services import free_port

METRICS = Path(__file__).resolve().parent / "fixtures" / "metrics"
FIXTURE = METRICS / "vllm-0.33.0-metrics-default.txt"


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvscope.cli", "collect", *args]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _targets(tmp_path: Path, entries: list[tuple[str, str]]) -> Path:
    lines = ["cluster: cli-test", "targets:"]
    for name, url in entries:
        lines.append(f"  - {{name: {name}, url: '{url}', kind: vllm}}")
    path = tmp_path / "targets.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_collect_signal_flushes_and_exits_zero(tmp_path: Path, sig: signal.Signals) -> None:
    db = tmp_path / "kvscope.db"
    with expo_server() as srv:
        url = srv.add("/m", bumping(FIXTURE.read_text(), "preemptions_total", 0, 1))
        refused = f"http://127.0.0.1:{free_port()}/metrics"
        targets = _targets(tmp_path, [("e0", url), ("gone", refused)])
        proc = subprocess.Popen(
            _cmd("--targets", str(targets), "--db", f"sqlite:///{db}", "--interval", "200ms",
                 "--window", "60s"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 20
            while srv.route("/m").hits < 4 and time.monotonic() < deadline:
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.05)
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        hits = srv.route("/m").hits
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["mode"] == "direct" and summary["cluster"] == "cli-test"
    # The stop cancels the tick in flight: the server may have answered one request the
    # collector never finished, so it saw `hits` or `hits - 1` complete ticks of two targets.
    ticks, odd = divmod(summary["scrapes"], 2)
    assert odd == 0 and hits - ticks in (0, 1) and ticks >= 3, (summary, hits)
    assert summary["targets_up"] == 1
    assert summary["errors"] == {"connect": ticks}
    with Store(f"sqlite:///{db}") as store:
        windows = store.read_windows(sources=["e0"])
        outcomes = store.outcomes()
    # The 60 s window was still open at the signal: everything in the store came from the flush.
    assert windows and summary["windows_written"] == len(windows)
    pre = [w for w in windows if w.signal == "preemptions_total"]
    assert sum(w.samples for w in pre) == ticks
    assert sum(w.delta or 0 for w in pre) == ticks - 1  # +1 per scrape after the first
    assert len(outcomes) == 2 * ticks and "target gone is down" in err


def test_collect_once_prints_json_summary(tmp_path: Path) -> None:
    db = tmp_path / "sub" / "k.db"
    with expo_server() as srv:
        targets = _targets(tmp_path, [("e0", srv.add("/m", FIXTURE.read_bytes()))])
        proc = subprocess.run(
            _cmd("--targets", str(targets), "--db", f"sqlite:///{db}", "--once", "--cluster", "c2"),
            capture_output=True, text=True, env=_env(), timeout=60, check=False,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["ticks"] == 1 and summary["targets_up"] == 1 and summary["errors"] == {}
    assert summary["cluster"] == "c2" and summary["windows_written"] > 0
    assert summary["keep"] == "used"  # the default: only the signals kvscope reads back
    with Store(f"sqlite:///{db}") as store:
        assert [t.name for t in store.targets(cluster="c2")] == ["e0"]
        assert store.engines(cluster="c2")[0].facts["block_size"] == 16


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give exactly one of --targets FILE or --prometheus URL"),
        (["--targets", "t.yaml", "--prometheus", "http://x"], "exactly one of"),
        (["--targets", "t.yaml", "--interval", "15x"], "--interval: '15x' is not a duration"),
        (["--targets", "t.yaml", "--window", "0s"], "--window: must be greater than 0"),
        (["--targets", "t.yaml", "--window", "2d"], "--window (or KVSCOPE_WINDOW_S)"),
        (["--targets", "absent.yaml"], "absent.yaml: cannot read targets file"),
        (["--targets", "bad.yaml"], "bad.yaml: targets[0] (e0): 'kind' must be one of"),
        (["--prometheus", "http://127.0.0.1:{port}", "--once"], "connect: checking the query API"),
        (["--prometheus", "127.0.0.1:9090"], "must start with http"),
        (["--prometheus", "http://x", "--source-label", "pod"], "--source-label must be"),
        (["--prometheus", "http://x", "--since", "-1h"], "--since: '-1h' is not a duration"),
        (["--targets", "t.yaml", "--db", "mysql://x/y"], "only sqlite:/// and postgresql://"),
        (["--targets", "t.yaml", "--keep", "most"], "--keep must be one of used, all"),
        (["--prometheus", "http://x", "--keep", "Used"], "--keep must be one of used, all"),
    ],
)
def test_collect_bad_input_raises_clear_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    (tmp_path / "t.yaml").write_text("targets: [{name: e0, url: 'http://127.0.0.1:9/m'}]\n")
    (tmp_path / "bad.yaml").write_text("targets: [{name: e0, url: 'http://h/m', kind: tgi}]\n")
    monkeypatch.chdir(tmp_path)
    for key in [k for k in os.environ if k.startswith("KVSCOPE_")]:
        monkeypatch.delenv(key)
    args = [a.replace("{port}", str(free_port())) for a in args]
    if "--db" not in args:
        args += ["--db", f"sqlite:///{tmp_path / 'k.db'}"]
    result = CliRunner().invoke(app, ["collect", *args])
    assert isinstance(result.exception, KvscopeError), (result.output, result.exception)
    assert message in str(result.exception)


def test_collect_bad_input_exits_2_without_traceback(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("targets: [{name: e0, url: 'http://h/m', kind: tgi}]\n")
    proc = subprocess.run(
        _cmd("--targets", "bad.yaml", "--db", f"sqlite:///{tmp_path / 'k.db'}"),
        capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("kvscope: error: bad.yaml: targets[0] (e0): 'kind' must be")
    assert "Traceback" not in proc.stderr


def test_collect_help_has_example() -> None:
    proc = subprocess.run(
        _cmd("--help"), capture_output=True, text=True, env=_env(), check=False, timeout=60
    )
    assert proc.returncode == 0 and "Example: kvscope collect --targets" in proc.stdout


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15s", 15), ("1m", 60), ("2h", 7200), ("500ms", 0.5), ("1d", 86400), ("1w", 604800),
     ("90", 90), (" 1.5m ", 90)],
)  # fmt: skip
def test_parse_duration_units_give_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text, "--x") == seconds


@pytest.mark.parametrize("text", ["", "s", "15x", "1h30m", "-5s", "1e3s", "inf", "0", "0s"])
def test_parse_duration_malformed_raises_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="--x"):
        parse_duration(text, "--x")


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        (None, None, 7 * 86_400.0),  # the settings' default
        ("3d", None, 3 * 86_400.0),
        ("never", None, None),
        (" never ", "86400", None),  # the flag wins over KVSCOPE_DOWNSAMPLE_S
        (None, "86400", 86_400.0),
        (None, "never", None),
        ("1d", "never", 86_400.0),
    ],
)
def test_collect_downsample_after_flag_reaches_the_settings(
    flag: str | None, env: str | None, expected: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KVSCOPE_DOWNSAMPLE_S", raising=False)
    if env is not None:
        monkeypatch.setenv("KVSCOPE_DOWNSAMPLE_S", env)
    assert _settings(CollectFlags(downsample_after=flag)).downsample_s == expected
