"""`kvscope collect --targets-from-store`: targets registered in the store while it runs.

A subprocess as an operator runs it, real targets on 127.0.0.1, a SQLite store written by
the test as `POST /v1/targets` would (Store.upsert_target / delete_target). A targets-file
target scraped every tick is the clock: "within two ticks" is counted in its hits.
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

V033 = "vllm-0.33.0-metrics-default.txt"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "metrics" / V033


def _collect(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    env["PYTHONUNBUFFERED"] = "1"
    return subprocess.Popen(
        [sys.executable, "-m", "kvscope.cli", "collect", "--interval", "200ms", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def _wait(proc: subprocess.Popen[str], until: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not until():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _migrated(db: Path) -> str:
    url = f"sqlite:///{db}"
    with Store(url) as store:
        store.migrate()
    return url


def test_collect_targets_from_store_registered_scraped_within_two_ticks_deleted_stops(
    tmp_path: Path,
) -> None:
    db = _migrated(tmp_path / "kvscope.db")
    with expo_server() as srv, Store(db) as store:
        clock = srv.add("/clock", FIXTURE.read_bytes())
        url = srv.add("/reg", FIXTURE.read_bytes())
        targets = tmp_path / "targets.yaml"
        targets.write_text(f"cluster: cli\ntargets:\n  - {{name: clock, url: '{clock}'}}\n")
        proc = _collect("--targets", str(targets), "--targets-from-store", "--db", db,
                        "--allow-network", "127.0.0.1/32")  # fmt: skip

        def ticks() -> int:
            return srv.route("/clock").hits

        def reg() -> int:
            return srv.route("/reg").hits

        try:
            _wait(proc, lambda: ticks() >= 2, "the first ticks")
            store.upsert_target("reg-0", url, kind="vllm", cluster="cli")
            registered_at = ticks()
            _wait(proc, lambda: reg() >= 1, "the registered target's first scrape")
            first_scrape_at = ticks()
            _wait(proc, lambda: reg() >= 3, "more scrapes of the registered target")
            assert store.delete_target("reg-0")
            deleted_at = ticks()
            _wait(proc, lambda: ticks() >= deleted_at + 3, "ticks after the delete")
            after_delete = reg()
            _wait(proc, lambda: ticks() >= deleted_at + 6, "more ticks")
            assert reg() == after_delete  # no scrape since
        finally:
            out, err = _stop(proc)
    assert proc.returncode == 0, err
    # The tick in flight may have read the table just before the insert: then the next
    # one scrapes it (two ticks at most, counted in the clock target's hits).
    assert first_scrape_at - registered_at <= 2, (registered_at, first_scrape_at)
    summary = json.loads(out)
    assert summary["errors"] == {} and summary["cluster"] == "cli"
    assert "target reg-0 registered: scraping it" in err
    assert "target reg-0 no longer registered" in err
    with Store(db) as store:
        assert len(store.outcomes(targets=["reg-0"])) == after_delete


def test_collect_targets_from_store_loopback_without_allowlist_refused_not_fatal(
    tmp_path: Path,
) -> None:
    db = _migrated(tmp_path / "kvscope.db")
    with expo_server() as srv, Store(db) as store:
        url = srv.add("/reg", FIXTURE.read_bytes())
        store.upsert_target("reg-0", url, kind="vllm", cluster="cli")
        proc = _collect("--targets-from-store", "--db", db)
        try:
            _wait(proc, lambda: len(store.outcomes(targets=["reg-0"])) >= 3, "3 outcomes")
        finally:
            out, err = _stop(proc)
        hits = srv.route("/reg").hits
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["errors"]["refused"] >= 3 and set(summary["errors"]) == {"refused"}
    assert hits == 0  # never connected
    assert (
        f"target reg-0 is down: refused: target URL {url} refused: loopback address 127.0.0.1 "
        "not allowed (allowlist it with --allow-network 127.0.0.1/32" in err
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--targets-from-store", "--prometheus", "http://x"], "--targets-from-store is direct"),
        (["--targets", "t.yaml", "--allow-network", "10.0.0.0/8"],
         "--allow-network applies to --targets-from-store targets only"),
        (["--targets-from-store", "--allow-network", "10.0.0.1/8"],
         "--allow-network '10.0.0.1/8': not a network: 10.0.0.1/8 has host bits set"),
        (["--targets-from-store", "--allow-network", "169.254.169.254"],
         "cloud-metadata addresses cannot be allowlisted"),
        ([], "give exactly one of --targets FILE or --prometheus URL"),
    ],
)  # fmt: skip
def test_collect_store_target_flags_bad_raise_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    (tmp_path / "t.yaml").write_text("targets: [{name: e0, url: 'http://127.0.0.1:9/m'}]\n")
    monkeypatch.chdir(tmp_path)
    for key in [k for k in os.environ if k.startswith("KVSCOPE_")]:
        monkeypatch.delenv(key)
    result = CliRunner().invoke(
        app, ["collect", *args, "--db", f"sqlite:///{tmp_path / 'k.db'}", "--once"]
    )
    assert isinstance(result.exception, KvscopeError), (result.output, result.exception)
    assert message in str(result.exception)
