"""Shared fixtures: real PostgreSQL (session-wide) and the fixture directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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
