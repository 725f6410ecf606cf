"""`kvscope serve` for real: uvicorn on 127.0.0.1 (a subprocess, as an operator starts it)
answers every path over HTTP, logs requests without query strings or the token, and stops
cleanly on SIGTERM; `kvscope openapi` prints the same document the server serves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import services
from tests.api.conftest import AUTH, CHEAP_WHATIF, CLUSTER, TOKEN, Filled
from tests.clirun import run_kvscope


@pytest.fixture
def server(sqlite_filled: Filled, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    token_file = tmp_path / "api-token"
    token_file.write_text(TOKEN + "\n")
    port = services.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    env |= {"KVSCOPE_ALLOWED_TARGET_NETWORKS": "10.0.0.0/8", "KVSCOPE_FORECAST_SECONDS": "0.3"}
    args = ["serve", "--db", sqlite_filled.url, "--port", str(port), "--token-file",
            str(token_file)]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvscope.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "kvscope serve did not come up"
            time.sleep(0.1)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.slow  # ~20 s of uvicorn over every path: CI runs it in test-slow
def test_serve_every_path_answers_over_http_then_stops_on_sigterm(
    server: tuple[str, subprocess.Popen[str]],
) -> None:
    base, proc = server
    c = f"/v1/clusters/{CLUSTER}"
    target = {"name": "smoke-0", "url": "http://10.0.0.77:8000/metrics", "cluster": CLUSTER}
    calls: list[tuple[str, str, dict[str, Any], int]] = [
        ("GET", "/healthz", {}, 200),
        ("GET", "/readyz", {}, 200),
        ("GET", "/v1/clusters", {}, 200),
        ("GET", f"{c}/engines", {}, 200),
        ("GET", f"{c}/signals", {"params": {"since": "3h"}}, 200),
        ("GET", f"{c}/plan", {}, 200),
        ("GET", f"{c}/plans", {}, 200),
        ("GET", f"{c}/forecast", {}, 200),
        ("GET", f"{c}/offload", {}, 200),
        ("GET", f"{c}/cpu-tier", {}, 200),
        ("GET", f"{c}/accuracy", {}, 200),
        ("GET", f"{c}/report", {}, 200),
        ("POST", "/v1/advise", {"json": CHEAP_WHATIF}, 200),
        ("POST", "/v1/costmodel/compare-tiers", {"json": {"model": "qwen3-8b", "tokens": 512}},
         200),
        ("POST", "/v1/costmodel/savings", {"json": {"model": "qwen3-8b", "gpu": "h100",
                                                    "prefix_tokens": 900,
                                                    "queries_per_hour": 60}}, 200),
        ("POST", "/v1/targets", {"json": target, "headers": AUTH}, 201),
        ("GET", "/v1/targets", {}, 200),
        ("DELETE", "/v1/targets/smoke-0", {"headers": AUTH}, 204),
        ("GET", "/metrics", {}, 200),
        ("POST", "/v1/targets", {"json": target}, 401),
        ("GET", "/v1/clusters", {"params": {"token": TOKEN}}, 400),
        ("GET", "/v1/clusters/nope/plan", {}, 404),
    ]  # fmt: skip
    heavy = {f"{c}/accuracy", f"{c}/report"}  # started first, side by side (two workers)
    with httpx.Client(base_url=base, timeout=120) as client, ThreadPoolExecutor(2) as ex:
        started = {p: ex.submit(client.request, m, p, **kw) for m, p, kw, _ in calls if p in heavy}
        got = [
            (
                m,
                p,
                (started[p].result() if p in started else client.request(m, p, **kw)).status_code,
            )
            for m, p, kw, _ in calls
        ]
        assert got == [(m, p, s) for m, p, _, s in calls]
        served = client.get("/openapi.json").json()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "kvscope serve: http://127.0.0.1:" in err and "writes enabled" in err
    assert f"GET {c}/report 200" in err and "DELETE /v1/targets/smoke-0 204" in err
    assert "GET /v1/clusters 400" in err  # the refused request is logged, its query is not
    assert TOKEN not in err and TOKEN not in out
    printed = run_kvscope("openapi")
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout)["paths"].keys() == served["paths"].keys()
