"""planner/simulate/metrics_server: the simulated cluster over real HTTP on 127.0.0.1, read back by
kvscope's parser and CLI, and scraped by a real Prometheus 2.42."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from collector.parse import read_exposition
from collector.scrape import load_targets
from core import catalog
from core.errors import ConfigError
from core.records import SignalSample
from planner.simulate.exposition import CONTENT_TYPE, engine_view, expected_values, pool_view
from planner.simulate.metrics_server import (
    ClusterServer,
    LiveCluster,
    file_sd,
    parse_address,
    serve_scenario,
)
from planner.simulate.scenario import Scenario, load_scenario
from tests import services

SCENARIO = """\
name: serve-test
duration_s: 3600
seed: 7
cluster:
  nodes: 1
  gpus_per_node: 4
  gpu: h100-80gb
  model: llama-3.1-8b
  engines_offload: [none, native, lmcache, lmcache]
  cpu_cache_gb: 20
workload:
  kind: shared_prefix
  qps: 20
  groups: 8
  system_prompt_tokens: 2000
  prompt_tokens: 300
  output_tokens: 150
  prompts_per_group: 50
  repeat: true
"""
OPENMETRICS_ACCEPT = "application/openmetrics-text; version=1.0.0"
# What Prometheus 2.42 sends (scrape.go acceptHeader)
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
REPO = Path(__file__).resolve().parents[3]
KVSCOPE = [sys.executable, "-c", "from kvscope.cli import main; main()"]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    path = tmp_path_factory.mktemp("scenario") / "serve-test.yaml"
    path.write_text(SCENARIO)
    return load_scenario(path)


@pytest.fixture(scope="module")
def served(scenario: Scenario) -> Iterator[ClusterServer]:
    """One cluster served for the tests that only look at HTTP behaviour."""
    with serving(scenario) as server:
        yield server


@contextmanager
def serving(scenario: Scenario, speed: float = 1.0, port: int = 0) -> Iterator[ClusterServer]:
    live = LiveCluster(scenario, speed)
    server = ClusterServer(live, "127.0.0.1", port)
    server.start()
    try:
        yield server
    finally:
        server.close()


# One client for the module: building an httpx.Client (its SSL context) costs ~0.1 s.
HTTP = httpx.Client(timeout=10)


@pytest.fixture(scope="module", autouse=True)
def _close_http() -> Iterator[None]:
    yield
    HTTP.close()


def _get(url: str, accept: str = PROMETHEUS_ACCEPT) -> httpx.Response:
    return HTTP.get(url, headers={"Accept": accept})


def _samples(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], SignalSample]:
    snap = read_exposition(body, "test", 0.0)
    return {(s.signal, s.labels): s for s in snap.samples}


# ------------------------------------------------------------------ what is served = the simulator


def test_serve_endpoints_read_back_equal_simulator_numbers(scenario: Scenario) -> None:
    with serving(scenario) as server:
        live = server.live
        with live.lock:
            live.sim.advance_to(60.0, settle=True)
        engines = [e for e in server.endpoints if e.kind == "engine"]
        pools = [e for e in server.endpoints if e.kind == "lmcache"]
        assert [e.offload for e in engines] == ["none", "native", "lmcache", "lmcache"]
        assert len(pools) == 1 and pools[0].engines == (2, 3)
        for ep in engines:
            got = _samples(_get(ep.url).text)
            snap = live.sim.engines[ep.index].snapshot(live.sim.now)
            want = expected_values(engine_view(snap, live.engine_config))
            assert set(got) == set(want), ep.offload
            for key, value in want.items():
                if isinstance(value, float):
                    assert got[key].value == value, key
                else:
                    assert got[key].value == value.count and got[key].sum == value.sum, key
            assert snap.counters["prompt_tokens_total"] > 0  # the simulation did run
        (pool_snap,) = live.sim.lmcache_snapshots()
        got = _samples(_get(pools[0].url).text)
        want = expected_values(pool_view(pool_snap, live.model_name))
        assert set(got) == set(want)
        for key, value in want.items():  # (the L1 chunk reuse gap is a histogram)
            if isinstance(value, float):
                assert got[key].value == value, key
            else:
                assert got[key].value == value.count and got[key].sum == value.sum, key
        assert pool_snap.counters["lmcache_hit_tokens_total"] > 0


@pytest.mark.parametrize(
    "accept", [OPENMETRICS_ACCEPT, PROMETHEUS_ACCEPT, "text/plain", "application/json", ""]
)
def test_serve_any_accept_header_gets_text_004_with_colons(
    served: ClusterServer, accept: str
) -> None:
    resp = _get(served.endpoints[0].url, accept)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == CONTENT_TYPE
    preempt = catalog.export_sample_name("preemptions_total")
    assert re.search(rf"^{re.escape(preempt)}\{{", resp.text, re.M)
    assert "# EOF" not in resp.text  # not OpenMetrics


@pytest.mark.parametrize("path", ["/", "/metric", "/metrics/", "/metricsx", "/api/v1/query"])
def test_serve_other_paths_404(served: ClusterServer, path: str) -> None:
    for ep in served.endpoints:
        base = ep.url.removesuffix("/metrics")
        resp = _get(base + path)
        assert resp.status_code == 404
        assert resp.headers["content-type"] == CONTENT_TYPE
        assert _get(base + "/metrics?x=1").status_code == 200


def _consecutive_free(n: int) -> int:
    for _ in range(50):
        base = services.free_port()
        socks = []
        try:
            for k in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + k))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


def test_serve_ports_consecutive_engines_then_pools(scenario: Scenario) -> None:
    base = _consecutive_free(5)
    with serving(scenario, port=base) as server:
        ports = [int(urllib.parse.urlsplit(e.url).port or 0) for e in server.endpoints]
        kinds = [e.kind for e in server.endpoints]
        doc = server.document()
    assert ports == list(range(base, base + 5))
    assert kinds == ["engine"] * 4 + ["lmcache"]
    assert [e["url"] for e in doc["engines"]] == [
        f"http://127.0.0.1:{p}/metrics" for p in ports[:4]
    ]
    assert doc["lmcache"][0]["engines"] == [2, 3]
    sd = file_sd(doc)
    assert [t["targets"] for t in sd] == [[f"127.0.0.1:{p}"] for p in ports]
    assert [t["labels"]["job"] for t in sd] == ["vllm"] * 4 + ["lmcache"]


def test_serve_port_in_use_config_error_and_nothing_left_listening(scenario: Scenario) -> None:
    base = _consecutive_free(5)
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", base + 2))
    blocker.listen()
    try:
        with pytest.raises(ConfigError, match=rf"127\.0\.0\.1:{base + 2}"):
            ClusterServer(LiveCluster(scenario, 1.0), "127.0.0.1", base)
        for port in (base, base + 1):
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))  # released again
    finally:
        blocker.close()


def test_serve_ports_beyond_65535_config_error(scenario: Scenario) -> None:
    with pytest.raises(ConfigError, match="endpoint 3 would need port 65536"):
        ClusterServer(LiveCluster(scenario, 1.0), "127.0.0.1", 65533)  # endpoints 0-4


BAD_ADDRESSES = ["9100", "127.0.0.1", "127.0.0.1:", ":9100", "127.0.0.1:http", "127.0.0.1:70000"]


@pytest.mark.parametrize("value", BAD_ADDRESSES)
def test_parse_address_malformed_config_error(value: str) -> None:
    with pytest.raises(ConfigError, match="HOST:PORT"):
        parse_address(value)


def test_parse_address_ipv4_and_ipv6() -> None:
    assert parse_address("127.0.0.1:9100") == ("127.0.0.1", 9100)
    assert parse_address("[::1]:0") == ("::1", 0)


def test_live_cluster_speed_not_positive_config_error(scenario: Scenario) -> None:
    for speed in (0.0, -1.0, float("nan")):
        with pytest.raises(ConfigError, match="--speed"):
            LiveCluster(scenario, speed)


# ------------------------------------------------------------------ scaled real time


def _preempt_and_prompt(body: str) -> tuple[float, float]:
    got = {s.signal: s.value for s in read_exposition(body, "t", 0.0).samples}
    return got["preemptions_total"], got["prompt_tokens_total"]


def test_serve_scenario_advances_in_scaled_time_and_stops(
    scenario: Scenario, tmp_path: Path
) -> None:
    out, err = io.StringIO(), io.StringIO()
    stop = threading.Event()
    ports_file = tmp_path / "ports.json"
    targets_file = tmp_path / "targets.json"
    result: list[int] = []
    thread = threading.Thread(
        target=lambda: result.append(
            serve_scenario(
                scenario,
                "127.0.0.1:0",
                speed=40.0,
                ports_file=ports_file,
                targets_file=targets_file,
                stop=stop,
                out=out,
                err=err,
            )
        ),
        daemon=True,
    )
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
        doc = json.loads(out.getvalue().splitlines()[0])
        assert json.loads(ports_file.read_text()) == doc
        targets = load_targets(targets_file)
        assert [t.url for t in targets] == [e["url"] for e in doc["engines"] + doc["lmcache"]]
        assert [t.kind for t in targets] == ["vllm"] * 4 + ["lmcache"]
        offloads = [t.engine.offload for t in targets if t.engine is not None]
        assert offloads == ["none", "native", "lmcache", "lmcache"]
        url = doc["engines"][0]["url"]
        first = _preempt_and_prompt(_get(url).text)
        time.sleep(1.0)
        second = _preempt_and_prompt(_get(url).text)
        assert second[1] > first[1]  # 40 simulated seconds of traffic went by
        assert second[0] >= first[0]
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive() and result == [0]
    assert "stopped at simulated t=" in err.getvalue()
    with pytest.raises(httpx.ConnectError):
        _get(url)


# ------------------------------------------------------------------ the CLI, as a process


Served = tuple[subprocess.Popen[str], dict[str, Any]]


@contextmanager
def _cli_serving(scenario_file: Path, port: int, speed: float, *extra: str) -> Iterator[Served]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [*KVSCOPE, "simulate", str(scenario_file), "--serve", f"127.0.0.1:{port}",
           "--speed", str(speed), *extra]  # fmt: skip
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=REPO, env=env) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None and proc.stderr is not None
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            yield proc, json.loads(line)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.slow  # ~9 s; the in-process serve tests stay in the default suite
def test_cli_simulate_serve_inspect_reads_consistent_values_sigint_exits_0(tmp_path: Path) -> None:
    scenario_file = tmp_path / "serve-test.yaml"
    scenario_file.write_text(SCENARIO)
    port = _consecutive_free(5)
    targets_file, sd_file = tmp_path / "targets.json", tmp_path / "sd.json"
    extra = ("--targets-file", str(targets_file), "--file-sd-file", str(sd_file))
    with _cli_serving(scenario_file, port, 50.0, *extra) as (proc, doc):
        url = doc["engines"][1]["url"]
        assert url == f"http://127.0.0.1:{port + 1}/metrics"
        before = _get(url, OPENMETRICS_ACCEPT)
        assert before.headers["content-type"] == CONTENT_TYPE
        assert catalog.export_sample_name("kv_cache_usage_ratio") + "{" in before.text
        inspect = subprocess.run([*KVSCOPE, "inspect", url, "--json"], capture_output=True,
                                 text=True, timeout=60, cwd=REPO, check=True)  # fmt: skip
        after = _get(url)
        seen = {(e["signal"], json.dumps(e["labels"], sort_keys=True)): e["value"]
                for e in json.loads(inspect.stdout)["series"]}  # fmt: skip
        lo = _samples(before.text)
        hi = _samples(after.text)
        checked = 0
        for (signal_name, labels), sample in lo.items():
            if sample.kind != "counter":
                continue
            value = seen[(signal_name, json.dumps(dict(labels), sort_keys=True))]
            assert sample.value <= value <= hi[(signal_name, labels)].value, signal_name
            checked += 1
        assert checked >= 10
        # kvscope's own collector, pointed at the written targets file, finds all 5 up
        collect = subprocess.run(
            [*KVSCOPE, "collect", "--targets", str(targets_file), "--once", "--quiet",
             "--db", f"sqlite:///{tmp_path / 'kvscope.db'}"],
            capture_output=True, text=True, timeout=60, cwd=REPO, check=True,
        )  # fmt: skip
        summary = json.loads(collect.stdout)
        assert (summary["targets_up"], summary["targets_down"]) == (5, 0)
        assert summary["cluster"] == "sim-serve-test"
        # and through the written file_sd file: the same 5 endpoints, engines and the pool
        collect = subprocess.run(
            [*KVSCOPE, "collect", "--file-sd", str(sd_file), "--once", "--quiet",
             "--db", f"sqlite:///{tmp_path / 'sd.db'}"],
            capture_output=True, text=True, timeout=60, cwd=REPO, check=True,
        )  # fmt: skip
        assert (
            json.loads(collect.stdout)["targets_up"],
            json.loads(collect.stdout)["targets_down"],
        ) == (5, 0)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0  # a clean shutdown, within seconds
        assert proc.stderr is not None
        assert "stopped at simulated t=" in proc.stderr.read()


# ------------------------------------------------------------------ a real Prometheus 2.42


def _query(prom: str, expr: str) -> list[dict[str, Any]]:
    resp = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=5)
    resp.raise_for_status()
    result: list[dict[str, Any]] = resp.json()["data"]["result"]
    return result


@pytest.mark.prometheus
def test_prometheus_scrapes_two_engines_names_keep_colon(scenario: Scenario) -> None:
    with serving(scenario, speed=30.0) as server:
        live = server.live
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(0.1):
                live.tick()

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        targets = [urllib.parse.urlsplit(e.url).netloc for e in server.endpoints[:2]]
        config = (
            "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: vllm\n    static_configs: [{{targets: {json.dumps(targets)}}}]\n"
        )
        try:
            with services.prometheus(config) as prom:
                preempt = catalog.export_sample_name("preemptions_total")
                usage = catalog.export_sample_name("kv_cache_usage_ratio")
                prompt = catalog.export_sample_name("prompt_tokens_total")
                assert ":" in preempt and ":" in usage
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    if len(_query(prom, f"{prompt} > 0")) == 2 and len(_query(prom, usage)) == 2:
                        break
                    time.sleep(0.25)
                found = _query(prom, preempt)
                assert sorted(r["metric"]["instance"] for r in found) == sorted(targets)
                assert all(r["metric"]["__name__"] == preempt for r in found)
                assert {r["metric"]["engine"] for r in found} == {"0"}
                assert len(_query(prom, f"{prompt} > 0")) == 2
                usage_rows = _query(prom, usage)
                assert len(usage_rows) == 2
                assert all(0.0 <= float(r["value"][1]) <= 1.0 for r in usage_rows)
                underscored = preempt.replace(":", "_")
                assert _query(prom, underscored) == []  # never escaped
        finally:
            stop.set()
            ticker.join(timeout=5)
