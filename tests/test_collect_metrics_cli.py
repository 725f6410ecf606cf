"""`kvscope collect --metrics-addr`: the collector's own /metrics, from a real subprocess
scraping real targets on 127.0.0.1, read over real HTTP, stopped by SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from core import kvscope_metrics as sm
from tests.clirun import assert_one_line_error, run_kvscope
from tests.collector.exposerver import bumping, expo_server
from tests.services import free_port

FIXTURE = (
    Path(__file__).resolve().parent / "fixtures" / "metrics" / "vllm-0.33.0-metrics-default.txt"
)
Series = dict[str, list[tuple[dict[str, str], float]]]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _targets(tmp_path: Path, entries: list[tuple[str, str]]) -> Path:
    lines = ["cluster: metrics-test", "targets:"]
    lines += [f"  - {{name: {name}, url: '{url}', kind: vllm}}" for name, url in entries]
    path = tmp_path / "targets.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _scrape(url: str) -> Series | None:
    """The endpoint's samples by name, or None while it does not answer yet."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def _one(series: Series, metric: sm.MetricDef, **labels: str) -> float:
    found = [v for lab, v in series.get(metric.name, []) if lab.items() >= labels.items()]
    assert len(found) == 1, (metric.name, labels, series.get(metric.name))
    return found[0]


def test_collect_metrics_addr_serves_health_and_sigterm_releases_port(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with expo_server() as srv:
        good = srv.add("/m", bumping(FIXTURE.read_text(), "preemptions_total", 0, 1))
        bad = srv.add("/500", b"no\n", status=500)
        targets = _targets(tmp_path, [("e0", good), ("broken", bad)])
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvscope.cli", "collect", "--targets", str(targets),
             "--db", f"sqlite:///{tmp_path / 'k.db'}", "--interval", "200ms", "--window", "1s",
             "--metrics-addr", f"127.0.0.1:{port}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
        )  # fmt: skip
        try:
            series: Series | None = None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                assert proc.poll() is None, proc.communicate()
                series = _scrape(url)
                written = (series or {}).get(sm.COLLECTOR_WINDOWS_WRITTEN.name, [({}, 0.0)])
                if series and written[0][1] > 0 and srv.route("/500").hits >= 3:
                    break
                time.sleep(0.1)
            assert series is not None, "the metrics endpoint never answered"
            with urllib.request.urlopen(url.removesuffix("/metrics") + "/healthz", timeout=2) as r:
                assert r.status == 200 and r.read().decode().startswith("ok: last scrape or tick")
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err
    assert f"collector metrics on {url}" in err
    up = _one(series, sm.COLLECTOR_SCRAPES, target="e0", outcome="up")
    failed = _one(series, sm.COLLECTOR_SCRAPES, target="broken", outcome="http_status")
    assert up >= 3 and failed >= 3, series[sm.COLLECTOR_SCRAPES.name]
    assert not [lab for lab, _ in series[sm.COLLECTOR_SCRAPES.name]
                if lab["target"] == "e0" and lab["outcome"] != "up"]  # fmt: skip
    assert _one(series, sm.COLLECTOR_WINDOWS_WRITTEN) > 0
    # 200 ms ticks: a lag of seconds would mean rounds started far behind their schedule
    assert 0 <= _one(series, sm.COLLECTOR_TICK_LAG) < 5.0
    assert _one(series, sm.COLLECTOR_TARGETS) == 2
    assert _one(series, sm.COLLECTOR_TARGET_UP, target="e0") == 1
    assert _one(series, sm.COLLECTOR_TARGET_UP, target="broken") == 0
    assert _one(series, sm.COLLECTOR_INFO, cluster="metrics-test", mode="direct") == 1
    assert next(lab for lab, _ in series[sm.BUILD_INFO.name])["version"]
    count = f"{sm.COLLECTOR_SCRAPE_DURATION}_count"
    observed = next(v for lab, v in series[count] if lab["target"] == "broken")
    assert abs(observed - failed) <= 1  # read live: a scrape may sit between the two updates
    assert time.time() - _one(series, sm.COLLECTOR_LAST_SUCCESSFUL_TICK) < 30
    # the endpoint saw no more scrapes than the run's summary reports
    summary = json.loads(out)
    assert summary["errors"]["http_status"] >= failed and summary["windows_written"] > 0
    with socket.socket() as sock:  # the port is released
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()


def test_collect_metrics_addr_malformed_is_one_line_error(tmp_path: Path) -> None:
    targets = _targets(tmp_path, [("e0", "http://127.0.0.1:9/m")])
    proc = run_kvscope("collect", "--targets", str(targets), "--db",
                       f"sqlite:///{tmp_path / 'k.db'}", "--metrics-addr", "9464")  # fmt: skip
    assert_one_line_error(proc, "--metrics-addr: '9464' is not HOST:PORT")


def test_collect_metrics_addr_in_use_is_one_line_error(tmp_path: Path) -> None:
    targets = _targets(tmp_path, [("e0", "http://127.0.0.1:9/m")])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        addr = f"127.0.0.1:{busy.getsockname()[1]}"
        proc = run_kvscope("collect", "--targets", str(targets), "--db",
                           f"sqlite:///{tmp_path / 'k.db'}", "--metrics-addr", addr)  # fmt: skip
    assert_one_line_error(proc, f"--metrics-addr {addr}: cannot listen")
