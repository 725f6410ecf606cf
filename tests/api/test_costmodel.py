"""The API's cost-model and advise answers are the CLI's: same inputs, same JSON objects."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from kvscope.cli import app as cli
from tests.api.conftest import CHEAP_WHATIF

RUNNER = CliRunner()


def _cli_json(args: list[str]) -> Any:
    result = RUNNER.invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def api(sqlite_url: str, make_client: Any) -> TestClient:
    c: TestClient = make_client(sqlite_url)
    return c


@pytest.mark.parametrize(
    ("body", "args"),
    [
        ({"model": "llama-3.1-70b-fp8", "gpu": "h100", "tp": 4, "tokens": 4096,
          "tiers": ["ceph-hdd"], "kv_dtype": "both"},
         ["--model", "llama-3.1-70b-fp8", "--gpu", "h100", "--tp", "4", "--tokens", "4096",
          "--tier", "ceph-hdd", "--kv-dtype", "both"]),
        ({"model": "qwen3-8b", "tokens": 100},
         ["--model", "qwen3-8b", "--tokens", "100"]),
    ],
)  # fmt: skip
def test_compare_tiers_api_equals_cli_json(
    api: TestClient, body: dict[str, Any], args: list[str]
) -> None:
    resp = api.post("/v1/costmodel/compare-tiers", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json() == _cli_json(["costmodel", "compare-tiers", *args])


@pytest.mark.parametrize(
    ("body", "args"),
    [
        ({"model": "llama-3.1-70b", "gpu": "h100", "tp": 4, "prefix_tokens": 6000,
          "queries_per_hour": 200},
         ["--model", "llama-3.1-70b", "--gpu", "h100", "--tp", "4", "--prefix-tokens", "6000",
          "--queries-per-hour", "200"]),
        ({"model": "llama-3.1-8b", "gpu": "h200", "prefix_tokens": 2000,
          "queries_per_hour": 50.5, "tier": "local-nvme", "gpu_hour_usd": 2.5, "mfu": 0.4,
          "hit_probability": 0.8, "cache_lifetime_s": 600, "kv_dtype": "fp8"},
         ["--model", "llama-3.1-8b", "--gpu", "h200", "--prefix-tokens", "2000",
          "--queries-per-hour", "50.5", "--tier", "local-nvme", "--gpu-hour-usd", "2.5",
          "--mfu", "0.4", "--hit-probability", "0.8", "--cache-lifetime-s", "600",
          "--kv-dtype", "fp8"]),
    ],
)  # fmt: skip
def test_savings_api_equals_cli_json(
    api: TestClient, body: dict[str, Any], args: list[str]
) -> None:
    resp = api.post("/v1/costmodel/savings", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json() == _cli_json(["costmodel", "savings", *args])


def test_advise_api_equals_cli_json(api: TestClient) -> None:
    w = CHEAP_WHATIF
    args = ["advise", "--model", w["model"], "--gpu", w["gpu"], "--tp", str(w["tp"]),
            "--prompt-tokens", str(w["prompt_tokens"]), "--output-tokens",
            str(w["output_tokens"]), "--qps", str(w["qps"]), "--prefix-share",
            str(w["prefix_share"]), "--engines", str(w["engines"]), "--duration",
            str(w["duration_s"])]  # fmt: skip
    resp = api.post("/v1/advise", json=w)
    assert resp.status_code == 200, resp.text
    assert _untimed(resp.json()) == _untimed(_cli_json(args))


def _untimed(obj: Any) -> Any:
    """Without the simulations' wall-clock seconds (they differ between runs)."""
    if isinstance(obj, dict):
        return {k: _untimed(v) for k, v in obj.items() if k != "wall_s"}
    if isinstance(obj, list):
        return [_untimed(v) for v in obj]
    return obj
