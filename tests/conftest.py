"""Shared fixtures: real PostgreSQL (session-wide), a fresh store on each backend, and the
fixture directory."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests import services

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    with services.postgres() as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty store: a SQLite file, or a new schema on the shared PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'nested' / 'kvscope.db'}"
        return
    server: str = request.getfixturevalue("postgres_url")
    admin = server.replace("postgresql+psycopg://", "postgresql://")
    schema = f"t_{uuid.uuid4().hex[:16]}"  # a schema is ~1000x faster to make than a database
    with psycopg.connect(admin, autocommit=True) as con:
        con.execute(f"CREATE SCHEMA {schema}")
    yield f"{server}?options=-csearch_path%3D{schema}"
    with psycopg.connect(admin, autocommit=True) as con:
        con.execute(f"DROP SCHEMA {schema} CASCADE")
