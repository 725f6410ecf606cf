"""`kvscope db migrate|stats|seal` on a real SQLite file: JSON on stdout, errors exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from core.errors import StoreError
from core.records import Window
from kvscope.cli import app
from store.store import Store
from store.tables import SCHEMA_VERSION

RUNNER = CliRunner()


def _run(*args: str) -> dict[str, object]:
    result = RUNNER.invoke(app, ["db", *args])
    assert result.exit_code == 0, result.output
    payload: dict[str, object] = json.loads(result.stdout)
    return payload


def test_db_migrate_then_stats_reports_rows_range_and_signals(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'out' / 'kv.db'}"
    assert _run("migrate", "--db", url) == {"db": url, "schema_version": SCHEMA_VERSION}
    assert _run("migrate", "--db", url)["schema_version"] == SCHEMA_VERSION  # idempotent
    with Store(url) as store:
        store.write_windows(
            Window("e1", sig, (("engine", "0"),), 600.0 + 60 * m, 60.0, "gauge", 4, mean=0.5)
            for sig in ("a_ratio", "b_ratio")
            for m in range(3)
        )
    stats = _run("stats", "--db", url)
    assert stats["rows"] == {"clusters": 0, "engines": 0, "engine_changes": 0, "targets": 0,
                             "scrape_outcomes": 0, "series": 2, "head": 6, "chunks": 0,
                             "chunks_5m": 0, "plans": 0, "rollup_states": 0}  # fmt: skip
    assert stats["windows"] == 6
    assert (stats["windows_from"], stats["windows_until"]) == (600.0, 780.0)
    assert stats["signals"] == {"a_ratio": {"windows": 3, "series": 1},
                                "b_ratio": {"windows": 3, "series": 1}}  # fmt: skip


def test_db_default_url_from_environment(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    result = RUNNER.invoke(app, ["db", "migrate"], env={"KVSCOPE_DB": url})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["db"] == url


def test_db_error_exits_2_with_redacted_url_on_stderr() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvscope.cli", "db", "migrate", "--db",
         "postgresql://kv:s3cr3t@127.0.0.1:1/kv"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "kv:***@127.0.0.1:1" in proc.stderr and "s3cr3t" not in proc.stderr
    assert proc.stdout == ""


def test_db_stats_unmigrated_raises_store_error_with_hint(tmp_path: Path) -> None:
    result = RUNNER.invoke(app, ["db", "stats", "--db", f"sqlite:///{tmp_path / 'empty.db'}"])
    assert isinstance(result.exception, StoreError)
    assert "kvscope db migrate" in str(result.exception)
    assert result.stdout == ""


def test_db_help_has_examples() -> None:
    for sub in ("migrate", "stats"):
        result = RUNNER.invoke(app, ["db", sub, "--help"])
        assert result.exit_code == 0
        assert f"kvscope db {sub} --db" in result.stdout


def test_db_seal_seals_the_hours_of_a_source_that_stopped_mid_hour(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'seal.db'}"
    _run("migrate", "--db", url)

    def hour(h: int, value: float) -> list[Window]:
        return [Window("e1", "a_ratio", (("engine", "0"),), 3600.0 * h + 60 * m, 60.0, "gauge",
                       4, mean=value) for m in range(60)]  # fmt: skip

    with Store(url) as store:
        store.write_windows(hour(0, 0.1) + hour(1, 0.1) + hour(2, 0.1))  # hours 0, 1 sealed
        store.write_windows(hour(0, 0.9))  # a late re-write: into hour 0's chunk
        assert store.stats()["rows"]["head"] == 60  # hour 2, still written
    first = _run("seal", "--db", url)
    assert (first["db"], first["windows_sealed"]) == (url, 0)  # each source's newest hour stays
    with Store(url) as store:
        frame = store.read_frame(signals=["a_ratio"], columns=["start", "mean"])
    assert sorted(frame.loc[frame["start"] < 3600.0, "mean"].unique()) == [0.9]
    assert len(frame) == 180
