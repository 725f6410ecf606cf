"""`kvscope costmodel …`: JSON on stdout with units and assumptions, errors exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from collector.errors import ConfigError
from kvscope.cli import app

RUNNER = CliRunner()


def _json(args: list[str]) -> dict[str, object]:
    result = RUNNER.invoke(app, ["costmodel", *args, "--json"])
    assert result.exit_code == 0, result.output
    payload: dict[str, object] = json.loads(result.stdout)
    return payload


def test_costmodel_reread_seed_exercise_json() -> None:
    payload = _json(["reread", "--model", "llama-3.1-70b-fp8", "--gpu", "h100", "--tp", "4",
                     "--tier", "ceph-hdd", "--tokens", "4096", "--kv-dtype", "fp8"])  # fmt: skip
    assert payload["kv_bytes"] == 163_840 * 4096
    assert payload["verdict"] == "re-prefill"
    assert "500 MB" in str(payload["seed_exercise_note"])
    read = payload["read_seconds"]
    assert isinstance(read, dict) and read["low"] < read["high"]
    assert isinstance(payload["assumptions"], list) and len(payload["assumptions"]) >= 5


def test_costmodel_reread_compression_shortens_read() -> None:
    args = ["reread", "--tier", "ceph-hdd", "--tokens", "4096"]
    plain, packed = _json(args), _json([*args, "--compression", "4"])
    assert packed["read_seconds"]["high"] < plain["read_seconds"]["high"]  # type: ignore[index]


def test_costmodel_breakeven_lists_every_tier() -> None:
    payload = _json(["breakeven", "--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "1"])
    tiers = payload["tiers"]
    assert isinstance(tiers, list) and len(tiers) >= 9
    regimes = {row["tier"]: row["regime"] for row in tiers}
    assert regimes["cpu-dram-pcie"] == "always"
    assert regimes["ceph-hdd"] == "never"
    assert 3.0e9 < float(payload["b_star_Bps"]) < 4.5e9  # type: ignore[arg-type]


def test_costmodel_catalog_user_yaml_adds_tier(tmp_path: Path) -> None:
    extra = tmp_path / "mine.yaml"
    tier = {"read_gbps": 40, "write_gbps": 40, "latency_ms": 0.02, "source": "our RDMA store"}
    extra.write_text(yaml.safe_dump({"tiers": {"rdma-store": tier}}), encoding="utf-8")
    payload = _json(["catalog", "--catalog", str(extra)])
    names = [t["name"] for t in payload["tiers"]]  # type: ignore[attr-defined]
    assert "rdma-store" in names
    assert all(g["source"] for g in payload["gpus"])  # type: ignore[attr-defined]


def test_costmodel_seed_exercise_both_kv_dtypes() -> None:
    payload = _json(["seed-exercise"])
    kv = payload["kv_dtype"]
    assert isinstance(kv, dict) and set(kv) == {"fp8", "bf16"}


def test_costmodel_unknown_tier_raises_config_error() -> None:
    result = RUNNER.invoke(app, ["costmodel", "reread", "--tier", "tape"])
    assert isinstance(result.exception, ConfigError)
    assert "ceph-hdd" in str(result.exception)


@pytest.mark.parametrize("args", [["reread", "--tp", "0"], ["breakeven", "--mfu", "1.5"]])
def test_costmodel_bad_numbers_exit_2(args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvscope.cli", "costmodel", *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "kvscope: error:" in proc.stderr
