"""API fixtures: a real store per backend (SQLite file, PostgreSQL schema) filled once per
session with a synthetic cluster (tests/planner/synthstore.py) and two saved plans — an old
one whose horizon has passed (the closed loop scores it) and the latest — and apps over it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import ApiSettings
from planner.plan import build_plan, plan_records
from store.store import Store
from tests.planner.synthstore import fill_store, shifted_frame

TOKEN = "t0k3n-for-tests-0123456789abcdef"
CLUSTER = "synth"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# A what-if that simulates in well under a second (few requests, one engine).
CHEAP_WHATIF: dict[str, Any] = {
    "model": "llama-3.1-8b",
    "gpu": "h100",
    "tp": 1,
    "prompt_tokens": 2000,
    "output_tokens": 32,
    "qps": 0.5,
    "prefix_share": 0.5,
    "engines": 1,
    "duration_s": 20.0,
}


@dataclass(frozen=True)
class Filled:
    """A store holding the synthetic cluster and its plans."""

    url: str
    backend: str
    sources: tuple[str, ...]
    old_plan_id: int
    latest_plan_id: int
    window_until: float


def _schema_url(server: str) -> tuple[str, Callable[[], None]]:
    admin = server.replace("postgresql+psycopg://", "postgresql://")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(admin, autocommit=True) as con:
        con.execute(f"CREATE SCHEMA {schema}")

    def drop() -> None:
        with psycopg.connect(admin, autocommit=True) as con:
            con.execute(f"DROP SCHEMA {schema} CASCADE")

    return f"{server}?options=-csearch_path%3D{schema}", drop


def fill(url: str, backend: str) -> Filled:
    frame = shifted_frame(n_engines=4, n_windows=100, modes=("none", "native"))
    windows = fill_store(url, frame, cluster=CLUSTER)
    first = min(w.start for w in windows)
    last = max(w.start + w.length_s for w in windows)
    with Store(url) as store:
        store.upsert_target("lmcache-0", "http://10.0.0.9:8080/metrics", "lmcache", CLUSTER)
        # An old plan of the first 65 minutes with a 30-minute horizon: due, so it is scored.
        cut = first + 65 * 60
        old = build_plan(store, cluster=CLUSTER, until=cut, horizon_s=1800, forecast_seconds=0.3)
        old_ids = [
            store.save_plan(r)
            for r in plan_records(old, cluster=CLUSTER, version="0.1.0", created_at=cut)
        ]
        # The latest plan must still be pending when the tests run: the frame ends up to
        # 61 minutes before now (shifted_frame aligns it to the hour), so a 1-hour horizon
        # could already have passed; 90 minutes (under the 100-minute history, so it is not
        # shortened) leaves it pending for at least 29 minutes.
        new = build_plan(store, cluster=CLUSTER, horizon_s=5400, forecast_seconds=0.3)
        new_ids = [
            store.save_plan(r)
            for r in plan_records(new, cluster=CLUSTER, version="0.1.0", created_at=time.time())
        ]
    sources = tuple(sorted(str(s) for s in frame["source"].unique()))
    return Filled(url, backend, sources, old_ids[0], new_ids[0], last)


@pytest.fixture(scope="session")
def sqlite_filled(tmp_path_factory: pytest.TempPathFactory) -> Filled:
    """The synthetic cluster with two saved plans in a SQLite file."""
    path: Path = tmp_path_factory.mktemp("api") / "filled.db"
    return fill(f"sqlite:///{path}", "sqlite")


@pytest.fixture(
    scope="session", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def filled(request: pytest.FixtureRequest) -> Iterator[Filled]:
    """The synthetic cluster with two saved plans, on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        yield request.getfixturevalue("sqlite_filled")
        return
    url, drop = _schema_url(request.getfixturevalue("postgres_url"))
    try:
        yield fill(url, "postgres")
    finally:
        drop()


def settings_for(url: str, **overrides: Any) -> ApiSettings:
    values: dict[str, Any] = {"db": url, "api_token": TOKEN, "forecast_seconds": 0.3}
    values.update(overrides)
    return ApiSettings(**values)


@pytest.fixture(scope="session")
def filled_app(filled: Filled) -> Iterator[tuple[FastAPI, Filled]]:
    app = create_app(settings_for(filled.url))
    yield app, filled


@pytest.fixture(scope="session")
def client(filled_app: tuple[FastAPI, Filled]) -> Iterator[TestClient]:
    """A client of the filled store's app (reads open, the test token for writes)."""
    app, _ = filled_app
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def make_client() -> Iterator[Callable[..., TestClient]]:
    """Clients of apps built from ``settings_for(url, **overrides)``; closed at the end."""
    opened: list[TestClient] = []

    def make(url: str, **overrides: Any) -> TestClient:
        c = TestClient(create_app(settings_for(url, **overrides)), raise_server_exceptions=False)
        c.__enter__()
        opened.append(c)
        return c

    yield make
    for c in opened:
        c.__exit__(None, None, None)


@pytest.fixture
def empty_url(db_url: str) -> str:
    """A fresh, migrated, empty store on each backend."""
    with Store(db_url) as store:
        store.migrate()
    return db_url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh, migrated, empty SQLite store (for tests about the API, not the backend)."""
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    with Store(url) as store:
        store.migrate()
    return url


def assert_error(resp: Any, status: int, field: str | None = None) -> dict[str, Any]:
    """The response is ErrorBody with ``status`` (and ``field`` when given)."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = resp.json()
    assert set(body) == {"error", "field"}, body
    assert isinstance(body["error"], str) and body["error"]
    if field is not None:
        assert body["field"] == field, body
    assert "Traceback" not in resp.text
    return body
