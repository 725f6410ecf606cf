"""`kvscope plan`: JSON shape, readable summary, PNG plots, and clear errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from core.errors import ConfigError, KvscopeError
from kvscope.cli import app
from planner.plan import NoData
from store.store import Store
from tests.clirun import assert_one_line_error, run_kvscope
from tests.planner.synthstore import fill_store, shifted_frame, sqlite_url

RUNNER = CliRunner()
PNG = b"\x89PNG\r\n\x1a\n"
PLOTS = (
    "preemptions_vs_kv_util.png",
    "throughput_vs_kv_util.png",
    "kv_demand_forecast.png",
    "lmcache_hit_rate.png",
)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = sqlite_url(tmp_path_factory.mktemp("plancli") / "k.db")
    fill_store(url, shifted_frame(3, 150, seed=11))
    return url


def plan(*args: str) -> tuple[int, str, str, BaseException | None]:
    r = RUNNER.invoke(app, ["plan", *args, "--forecast-seconds", "1"])
    return r.exit_code, r.stdout, r.stderr, r.exception


def test_plan_cli_json_shape_and_plots(db: str, tmp_path: Path) -> None:
    out = tmp_path / "plots"
    code, stdout, stderr, exc = plan(
        "--db",
        db,
        "--since",
        "all",
        "--json",
        "--plots",
        str(out),
        "--gpu-price",
        "2.5",
        "--horizon",
        "3d",
    )
    assert code == 0, exc
    d = json.loads(stdout)
    assert set(d) >= {
        "cluster",
        "window",
        "happening",
        "decision",
        "fits",
        "forecast",
        "sizing",
        "configs",
        "basis",
    }
    assert d["decision"]["mode"] in ("none", "native", "lmcache", "both")
    assert 0.05 <= d["decision"]["score"] <= 0.95
    assert set(d["fits"]) == {
        "preemption_knee",
        "equal_kv_native",
        "equal_kv_lmcache",
        "prefill_mfu",
        "lmcache_hitrate",
    }
    # 150 one-minute windows of history: the 3 d asked is cut to the history's 2.5 h
    fc = d["forecast"]
    assert fc["horizon_asked_s"] == 3 * 86400 and fc["horizon_s"] == 150 * 60
    assert fc["kv_demand"]["horizon_note"].startswith("horizon shortened from 3.0 d to 2.5 h")
    assert d["cost"]["gpu_price_per_hour"] == 2.5
    assert d["window"]["engines"] == 3
    for name in PLOTS:
        path = out / name
        assert path.read_bytes()[:8] == PNG and path.stat().st_size > 10_000, name
        assert f"wrote {path}" in stderr


def test_plan_cli_text_summary_has_every_section(db: str) -> None:
    code, stdout, _, exc = plan("--db", db, "--cluster", "synth", "--since", "24h")
    assert code == 0, exc
    for heading in (
        "What is happening",
        "Decision:",
        "Fits (95 % intervals)",
        "Forecast (",
        "Sizing for",
        "time to HBM saturation",
        "KV-cache use",
        "score",
    ):
        assert heading in stdout, heading
    assert "cluster synth" in stdout.splitlines()[0]


def test_plan_cli_horizon_within_the_history_is_kept(db: str) -> None:
    code, stdout, _, exc = plan("--db", db, "--since", "all", "--json", "--horizon", "1h")
    assert code == 0, exc
    fc = json.loads(stdout)["forecast"]
    assert fc["horizon_s"] == fc["horizon_asked_s"] == 3600
    assert fc["kv_demand"]["horizon_note"] == "" and fc["kv_demand"]["points"][-1][0] > 0


def test_plan_cli_help_has_example() -> None:
    r = RUNNER.invoke(app, ["plan", "--help"])
    assert r.exit_code == 0 and "Example: kvscope plan" in r.stdout


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (["--since", "yesterday"], ConfigError, "--since: 'yesterday' is not a duration"),
        (["--horizon", "0"], ConfigError, "--horizon: must be greater than 0"),
        (["--gpu-price", "-1"], ConfigError, "gpu price must be a number >= 0"),
        (["--cluster", "nope"], NoData, "no windows of cluster 'nope'"),
        (
            ["--since", "1h", "--cluster", "synth", "--forecast-seconds", "0"],
            ConfigError,
            "forecast time budget",
        ),
    ],
)
def test_plan_cli_bad_arguments_raise_named_errors(
    db: str, args: list[str], error: type[KvscopeError], match: str
) -> None:
    r = RUNNER.invoke(app, ["plan", "--db", db, *args])
    assert isinstance(r.exception, error), r.exception
    assert match in str(r.exception)


def test_plan_cli_missing_and_empty_store_exit_2_without_traceback(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    Store(sqlite_url(empty)).migrate()
    for url, message in (
        (sqlite_url(tmp_path / "typo.db"), "no such SQLite file"),
        (sqlite_url(empty), "holds no windows yet: run `kvscope collect` first"),
    ):
        assert_one_line_error(run_kvscope("plan", "--db", url), message)
    assert not (tmp_path / "typo.db").exists()  # not created by mistake
