"""`kvscope costmodel …`: JSON on stdout with units and assumptions, errors exit 2."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from core.errors import ConfigError
from kvscope.cli import app
from planner.domain.costmodel import prefill_seconds, tier_read_seconds
from planner.domain.hardware import builtin_catalog, get_gpu, get_model, get_tier
from tests.clirun import assert_one_line_error, run_kvscope

RUNNER = CliRunner()


def _json(args: list[str]) -> dict[str, object]:
    result = RUNNER.invoke(app, ["costmodel", *args, "--json"])
    assert result.exit_code == 0, result.output
    payload: dict[str, object] = json.loads(result.stdout)
    return payload


def test_costmodel_reread_70b_fp8_4k_ceph_hdd_json_carries_the_kv_size_note() -> None:
    payload = _json(["reread", "--model", "llama-3.1-70b-fp8", "--gpu", "h100", "--tp", "4",
                     "--tier", "ceph-hdd", "--tokens", "4096", "--kv-dtype", "fp8"])  # fmt: skip
    assert payload["kv_bytes"] == 163_840 * 4096
    assert payload["verdict"] == "re-prefill"
    assert "500 MB" in str(payload["note"])
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


COMPARE_70B_4K_CEPH = ["compare-tiers", "--model", "llama-3.1-70b-fp8", "--gpu", "h100",
                       "--tp", "4", "--tokens", "4096", "--tier", "ceph-hdd",
                       "--kv-dtype", "both"]  # fmt: skip
# The figures of this case as printed (--json) before compare-tiers took over the command.
PREVIOUS_70B_4K_CEPH: dict[str, dict[str, Any]] = {
    "fp8": {"kv_bytes_per_token": 163_840.0, "kv_bytes": 671_088_640.0, "kv_gb": 0.671,
            "objects": 16, "read_seconds": (0.8885405301204818, 6.9508864),
            "prefill_seconds": (0.16832756020804643, 0.43023989235747384)},
    "bf16": {"kv_bytes_per_token": 327_680.0, "kv_bytes": 1_342_177_280.0, "kv_gb": 1.342,
             "objects": 16, "read_seconds": (1.6970810602409638, 13.6617728),
             "prefill_seconds": (0.16832756020804643, 0.43023989235747384)},
}  # fmt: skip


@pytest.mark.parametrize("kv", ["fp8", "bf16"])
def test_compare_tiers_70b_fp8_4k_ceph_hdd_reproduces_previous_figures(kv: str) -> None:
    payload = _json(COMPARE_70B_4K_CEPH)
    assert (payload["model"], payload["gpu"], payload["tp"], payload["tokens"]) == (
        "llama-3.1-70b-fp8", "h100-80gb", 4, 4096)  # fmt: skip
    assert payload["kv_dtypes"] == ["fp8", "bf16"] and payload["tiers"] == ["ceph-hdd"]
    rows = {row["kv_dtype"]: row for row in payload["comparisons"]}  # type: ignore[attr-defined]
    assert len(rows) == 2
    row, expected = rows[kv], PREVIOUS_70B_4K_CEPH[kv]
    assert row["tier"] == "ceph-hdd" and row["compression_ratio"] == 1.0
    for key in ("kv_bytes_per_token", "kv_bytes", "kv_gb", "objects"):
        assert row[key] == expected[key], key
    for key in ("read_seconds", "prefill_seconds"):
        low, high = expected[key]
        assert row[key]["low"] == pytest.approx(low, rel=1e-12), key
        assert row[key]["high"] == pytest.approx(high, rel=1e-12), key
    assert row["verdict"] == "re-prefill"
    note = str(payload["note"])
    assert "500 MB" in note and "0.67 GB (fp8 KV) or 1.34 GB (bf16 KV)" in note
    assert "seed" not in note.lower()


def test_compare_tiers_70b_fp8_4k_ceph_hdd_text_shows_previous_figures() -> None:
    result = RUNNER.invoke(app, ["costmodel", *COMPARE_70B_4K_CEPH])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith(("fp8", "bf16"))]
    # the figures of the one-line form "fp8 KV: 0.671 GB, read 0.889–6.95 s vs re-prefill
    # 0.168–0.43 s"
    assert rows == [
        ["fp8", "163,840", "0.671", "ceph-hdd", "0.889–6.95", "0.168–0.43", "re-prefill"],
        ["bf16", "327,680", "1.34", "ceph-hdd", "1.7–13.7", "0.168–0.43", "re-prefill"],
    ]
    assert "note: " in result.stdout and "500 MB" in result.stdout


def test_compare_tiers_several_tiers_one_row_per_kv_dtype_and_tier() -> None:
    payload = _json(["compare-tiers", "--model", "llama-3.1-8b", "--tokens", "8192",
                     "--tier", "cpu-dram-pcie,s3", "--tier", "nvme",
                     "--kv-dtype", "both"])  # fmt: skip
    rows = payload["comparisons"]
    assert isinstance(rows, list)
    tiers = ["cpu-dram-pcie", "s3-object", "local-nvme"]
    assert [(r["kv_dtype"], r["tier"]) for r in rows] == [
        (kv, t) for kv in ("fp8", "bf16") for t in tiers
    ]
    assert payload["tiers"] == tiers and payload["note"] is None
    by = {(r["kv_dtype"], r["tier"]): r for r in rows}
    for t in tiers:  # fp8 KV is half the bytes: it reads faster, the prefill does not change
        assert by["fp8", t]["kv_bytes"] * 2 == by["bf16", t]["kv_bytes"]
        assert by["fp8", t]["read_seconds"]["high"] < by["bf16", t]["read_seconds"]["high"]
    assert by["bf16", "cpu-dram-pcie"]["verdict"] == "re-read"


def test_compare_tiers_no_tier_compares_every_catalogue_tier() -> None:
    payload = _json(["compare-tiers", "--model", "qwen3-8b", "--tokens", "2048"])
    assert payload["kv_dtypes"] == ["bf16"]
    assert payload["tiers"] == list(builtin_catalog().tiers)
    assert len(payload["comparisons"]) == len(builtin_catalog().tiers)  # type: ignore[arg-type]


COMPARE_OK = ["compare-tiers", "--model", "llama-3.1-8b", "--tokens", "4096"]


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--model", "nope"], "--model: unknown model 'nope'; known: llama-3.1-70b"),
     (["--gpu", "tpu"], "--gpu: unknown GPU 'tpu'; known: a100-80gb"),
     (["--tier", "tape"], "--tier: unknown tier 'tape'; known: ceph-hdd"),
     (["--tier", "ceph-hdd,tape"], "--tier: unknown tier 'tape'"),
     (["--tier", ","], "--tier: no tier named; known: ceph-hdd"),
     (["--tokens", "0"], "--tokens must be an integer >= 1, got 0"),
     (["--tokens", "-4096"], "--tokens must be an integer >= 1, got -4096"),
     (["--kv-dtype", "int4"], "--kv-dtype: unknown KV dtype 'int4'; known: auto, bf16, fp8, both"),
     (["--tp", "3"], "--tp: tp=3 does not divide llama-3.1-8b's 32 query heads"),
     (["--tp", "0"], "--tp: tp must be an integer >= 1, got 0")],
)  # fmt: skip
def test_compare_tiers_bad_input_one_line_error_naming_the_option(
    args: list[str], message: str
) -> None:
    proc = run_kvscope("costmodel", *COMPARE_OK, *args)  # the later option wins
    assert_one_line_error(proc, f"kvscope: error: {message}")
    assert len(proc.stderr.strip().splitlines()) == 1


SAVINGS = ["savings", "--gpu", "h100", "--prefix-tokens", "6000", "--queries-per-hour", "200"]


def test_savings_8b_json_matches_hand_computed_figures() -> None:
    payload = _json([*SAVINGS, "--model", "llama-3.1-8b", "--gpu-hour-usd", "3"])
    # By hand, Llama-3.1-8B on one H100 (989 TFLOP/s bf16 at 50 % MFU, compute-bound):
    # 2·N·S + 4·layers·q_heads·head_dim·S(S+1)/2 FLOPs, plus the 0.3 ms step overhead.
    flops = 2 * 8_030_261_248 * 6000 + 4 * 32 * 32 * 128 * 6000 * 6001 / 2
    prefill = flops / (989e12 * 0.5) + 3e-4
    # 6000 tokens × 131,072 B over 50 GB/s of PCIe, plus 10 µs for each of 24 chunks.
    reload = 6000 * 131_072 / 50e9 + math.ceil(6000 / 256) * 1e-5
    reuses = 200 * 3600 / 3600 - 1  # one cache lifetime of an hour: the first query computes
    saved = reuses * (prefill - reload) * 1
    assert payload["prefill_seconds"] == pytest.approx(prefill, rel=1e-9)
    assert payload["reload_seconds"] == pytest.approx(reload, rel=1e-9)
    assert payload["reuses_per_hour"] == pytest.approx(199)
    assert payload["saved_gpu_seconds_per_hour"] == pytest.approx(saved, rel=1e-9)
    assert payload["saved_usd_per_hour"] == pytest.approx(saved / 3600 * 3.0, rel=1e-9)
    assert payload["prefix_kv_bytes"] == 6000 * 131_072
    assert {k: payload[k] for k in ("model", "gpu", "tp", "tier", "gpu_hour_usd", "mfu")} == {
        "model": "llama-3.1-8b", "gpu": "h100-80gb", "tp": 1, "tier": "cpu-dram-pcie",
        "gpu_hour_usd": 3.0, "mfu": 0.5,
    }  # fmt: skip
    sources = payload["sources"]
    assert isinstance(sources, dict)
    assert sources["tier"] == get_tier("cpu-dram-pcie").source
    assert sources["gpu"] == get_gpu("h100").source
    assert str(payload["verdict"]).startswith("caching saves")
    assert isinstance(payload["assumptions"], list) and len(payload["assumptions"]) >= 5


@pytest.mark.parametrize(
    ("extra", "qph_per_lifetime", "hit", "lifetimes_per_hour"),
    [([], 200.0, 1.0, 1.0),
     (["--hit-probability", "0.5", "--cache-lifetime-s", "600"], 200 / 6, 0.5, 6.0)],
)  # fmt: skip
def test_savings_70b_tp4_no_price_gpu_seconds_from_the_cost_model(
    extra: list[str], qph_per_lifetime: float, hit: float, lifetimes_per_hour: float
) -> None:
    payload = _json([*SAVINGS, "--model", "llama-3.1-70b", "--tp", "4", *extra])
    model, gpu, tier = get_model("llama-3.1-70b"), get_gpu("h100"), get_tier("cpu-dram-pcie")
    per_reuse = prefill_seconds(model, gpu, 4, 6000, mfu=0.5) - tier_read_seconds(
        model, tier, 6000, tp=4
    )
    reuses = (qph_per_lifetime - 1) * hit * lifetimes_per_hour
    assert payload["reuses_per_hour"] == pytest.approx(reuses)
    assert payload["saved_gpu_seconds_per_hour"] == pytest.approx(reuses * per_reuse * 4)
    assert payload["gpu_hour_usd"] is None and payload["saved_usd_per_hour"] is None


def test_savings_text_says_what_each_number_is_and_its_sources() -> None:
    result = RUNNER.invoke(app, ["costmodel", *SAVINGS, "--model", "llama-3.1-8b"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    for label in ("re-prefill of the prefix", "reload of its KV", "reuses per hour",
                  "saved GPU-seconds per hour", "saved USD per hour", "not priced",
                  "cost model", "sources:", "assumptions:"):  # fmt: skip
        assert label in out, label
    for source in (get_model("llama-3.1-8b").source, get_gpu("h100").source,
                   get_tier("cpu-dram-pcie").source):  # fmt: skip
        assert source in out


SAVINGS_OK = [*SAVINGS, "--model", "llama-3.1-8b"]


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--model", "nope"], "--model: unknown model 'nope'; known: llama-3.1-70b"),
     (["--gpu", "tpu"], "--gpu: unknown GPU 'tpu'; known: a100-80gb"),
     (["--tier", "tape"], "--tier: unknown tier 'tape'; known: ceph-hdd"),
     (["--tp", "3"], "--tp: tp=3 does not divide"),
     (["--kv-dtype", "int4"], "--kv-dtype: unknown KV dtype 'int4'"),
     (["--prefix-tokens", "0"], "--prefix-tokens must be an integer >= 1, got 0"),
     (["--queries-per-hour", "-1"], "--queries-per-hour must be a number >= 0, got -1.0"),
     (["--gpu-hour-usd", "nan"], "--gpu-hour-usd must be a number >= 0, got nan"),
     (["--gpu-hour-usd", "-2"], "--gpu-hour-usd must be a number >= 0, got -2.0"),
     (["--mfu", "1.5"], "--mfu must be in (0, 1], got 1.5"),
     (["--hit-probability", "2"], "--hit-probability must be in [0, 1], got 2.0"),
     (["--cache-lifetime-s", "0"], "--cache-lifetime-s must be a number of seconds > 0")],
)  # fmt: skip
def test_savings_bad_input_one_line_error_naming_the_option(args: list[str], message: str) -> None:
    proc = run_kvscope("costmodel", *SAVINGS_OK, *args)  # the later option wins
    assert_one_line_error(proc, f"kvscope: error: {message}")
    assert len(proc.stderr.strip().splitlines()) == 1


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
