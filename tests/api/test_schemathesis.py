"""schemathesis 4 over every operation, in-process against create_app(): no server error, and
every response (errors included) matches the schema the API publishes.

The store is a migrated SQLite file holding the clusters and targets the schema's examples
name, so the examples reach real answers. Target names resolve to an allowlisted address
(no DNS lookup leaves the machine); what-if bodies are held to one engine, a few requests
and short outputs so a run stays short (the simulator's cost grows with each).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

import collector.urlguard
from api.app import create_app
from store.store import Store
from tests.api.conftest import AUTH, settings_for

# Operations whose inputs have rules the schema cannot state: a model must fit the GPUs
# (weights + KV), the scorer's weights must not all be 0, a target's address must pass the
# SSRF guard. A 422 naming one of those fields is the right answer to schema-valid data there.
BEYOND_SCHEMA = {
    ("POST", "/v1/advise"): ("model", "scorer_weights"),
    ("POST", "/v1/targets"): ("url",),
}


# schemathesis loads the schema at collection (its lazy fixture loader needs pytest < 9):
# the app is built then; it opens its store, made by the fixture below, at the first request.
_DIR = Path(tempfile.mkdtemp(prefix="kvscope-st-"))
_URL = f"sqlite:///{_DIR / 'st.db'}"
APP = create_app(
    settings_for(_URL, allowed_target_networks=("10.0.0.0/8",), advise_workers=2, advise_queue=8)
)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@pytest.fixture(scope="module", autouse=True)
def _store() -> Iterator[None]:
    with Store(_URL) as store:
        store.migrate()
        store.upsert_engine("prod-a", "engine-0", model="llama-3.1-8b", gpu="h100")
        store.upsert_target("engine-0", "http://10.0.0.5:8000/metrics", "vllm", "prod-a")
    mp = pytest.MonkeyPatch()
    mp.setattr(collector.urlguard, "resolve_host", lambda _host, _port: ["10.0.0.7"])
    yield
    mp.undo()
    APP.state.kvscope.close()
    shutil.rmtree(_DIR, ignore_errors=True)


# what-if fields -> (schema maximum, the most this test simulates, used when absent too):
# within the schema, so a valid body stays valid and an invalid one stays invalid
CHEAP = {
    "engines": (64, 1),
    "qps": (1000, 5),
    "duration_s": (600, 4),
    "prompt_tokens": (32_768, 4096),
    "output_tokens": (8192, 32),
}


def _cheapen(body: dict[str, Any]) -> None:
    for key, (maximum, most) in CHEAP.items():
        value = body.get(key, most if key in ("duration_s",) else None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            body[key] = type(value)(most) if most < value <= maximum else value


@pytest.mark.slow  # ~16 s: every operation, 5 cases each (CI's slow suite runs it)
@schema.parametrize()
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_contract_every_operation(case: schemathesis.Case[Any]) -> None:
    if case.path == "/v1/advise" and isinstance(case.body, dict):
        _cheapen(case.body)
    response = case.call(headers=AUTH)
    excluded: list[schemathesis.CheckFunction] = []
    fields = BEYOND_SCHEMA.get((case.method.upper(), case.path), ())
    if response.status_code == 422 and fields:
        body = response.json()
        if body.get("field") in fields:
            excluded.append(positive_data_acceptance)
    case.validate_response(response, excluded_checks=excluded)
