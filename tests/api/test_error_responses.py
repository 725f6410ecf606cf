"""Every error is ErrorBody ``{"error", "field"}`` with the right status: 404 unknown things,
422 bad fields (FastAPI's own shape replaced), 503 store down or schema not current (a real
PostgreSQL stopped mid-run, a closed port, an unmigrated or out-of-date SQLite file), 500
without a trace; and the OpenAPI document declares them on every operation."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from store.store import Store
from store.tables import SCHEMA_VERSION
from tests import services
from tests.api.conftest import AUTH, CHEAP_WHATIF, CLUSTER, assert_error, settings_for

CLUSTER_PATHS = ("engines", "signals", "plan", "plans", "forecast", "accuracy", "report")


@pytest.mark.parametrize("sub", CLUSTER_PATHS)
def test_cluster_paths_unknown_cluster_404_names_cluster(client: TestClient, sub: str) -> None:
    body = assert_error(client.get(f"/v1/clusters/nope/{sub}"), 404, "cluster")
    assert "'nope'" in body["error"]


def test_plan_unknown_group_404_names_group(client: TestClient) -> None:
    resp = client.get(f"/v1/clusters/{CLUSTER}/plan", params={"group": "gpt@b200:tp8"})
    assert "no stored plan" in assert_error(resp, 404, "group")["error"]


def test_plan_cluster_without_plans_404(
    empty_url: str, make_client: Callable[..., TestClient]
) -> None:
    with Store(empty_url) as store:
        store.upsert_engine("bare", "engine-9", model="llama-3.1-8b")
    c = make_client(empty_url)
    for sub in ("plan", "forecast"):
        assert_error(c.get(f"/v1/clusters/bare/{sub}"), 404, "cluster")
    assert c.get("/v1/clusters/bare/plans").json()["plans"] == []


def test_report_cluster_without_windows_404(
    empty_url: str, make_client: Callable[..., TestClient]
) -> None:
    with Store(empty_url) as store:
        store.upsert_engine("bare", "engine-9", model="llama-3.1-8b")
    assert_error(make_client(empty_url).get("/v1/clusters/bare/report"), 404, "cluster")


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "field"),
    [
        ("get", f"/v1/clusters/{CLUSTER}/signals", {"params": {"since": "15x"}}, "since"),
        ("get", f"/v1/clusters/{CLUSTER}/signals", {"params": {"since": "0m"}}, "since"),
        ("get", f"/v1/clusters/{CLUSTER}/plans", {"params": {"limit": 0}}, "limit"),
        ("post", "/v1/advise", {"json": {**CHEAP_WHATIF, "qps": -1}}, "qps"),
        ("post", "/v1/advise", {"json": {**CHEAP_WHATIF, "qps": 1e308}}, "qps"),
        ("post", "/v1/advise", {"json": {**CHEAP_WHATIF, "tp": 3}}, "tp"),
        ("post", "/v1/advise", {"json": {**CHEAP_WHATIF, "model": "gpt-9"}}, "model"),
        ("post", "/v1/advise", {"json": {**CHEAP_WHATIF, "surprise": 1}}, "surprise"),
        ("post", "/v1/advise", {"json": {**CHEAP_WHATIF, "vllm_version": "0.9.0"}},
         "vllm_version"),
        ("post", "/v1/advise", {"json": {k: v for k, v in CHEAP_WHATIF.items() if k != "gpu"}},
         "gpu"),
        ("post", "/v1/advise", {"content": b"{not json", "headers": {"content-type":
                                "application/json"}}, "body"),
        ("post", "/v1/advise", {"json": {**CHEAP_WHATIF, "model": "llama-3.1-70b"}}, "model"),
        ("post", "/v1/costmodel/compare-tiers",
         {"json": {"model": "llama-3.1-8b", "tokens": 10, "tiers": ["floppy"]}}, "tiers.0"),
        ("post", "/v1/costmodel/savings",
         {"json": {"model": "llama-3.1-8b", "gpu": "h100", "prefix_tokens": 0,
                   "queries_per_hour": 1}}, "prefix_tokens"),
        ("post", "/v1/targets", {"json": {"name": "bad name", "url": "http://10.0.0.1/"},
                                 "headers": AUTH}, "name"),
    ],
)  # fmt: skip
def test_bad_field_422_names_the_field(
    client: TestClient, method: str, path: str, kwargs: dict[str, Any], field: str | None
) -> None:
    body = assert_error(getattr(client, method)(path, **kwargs), 422, field)
    assert "input" not in body and "detail" not in body


def test_advise_model_too_big_for_one_gpu_names_why(client: TestClient) -> None:
    resp = client.post("/v1/advise", json={**CHEAP_WHATIF, "model": "llama-3.1-70b"})
    assert "does not fit" in assert_error(resp, 422, "model")["error"]


def test_unknown_path_and_method_answer_error_body(client: TestClient) -> None:
    assert_error(client.get("/v2/nothing"), 404)
    assert_error(client.put("/v1/clusters"), 405)


def test_unexpected_exception_500_without_trace(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("secret internals /etc/passwd")

    monkeypatch.setattr(Store, "clusters", boom)
    body = assert_error(client.get("/v1/clusters"), 500, None)
    assert "secret internals" not in body["error"]


def test_store_stopped_midway_503_then_readyz_503() -> None:
    with services.postgres() as url:
        with Store(url) as store:
            store.migrate()
        c = TestClient(create_app(settings_for(url)), raise_server_exceptions=False)
        with c:
            assert c.get("/readyz").status_code == 200
            assert c.get("/v1/clusters").json() == {"clusters": []}
            stopped_url = url
        # the context has stopped PostgreSQL: same app state, the store is now down
    with c:
        body = assert_error(c.get("/v1/clusters"), 503, None)
        assert "store unavailable" in body["error"] and stopped_url.split("@")[1] in body["error"]
        assert "store unavailable" in assert_error(c.get("/readyz"), 503)["error"]
        assert c.get("/healthz").status_code == 200  # the process itself is fine


def test_store_unreachable_at_start_503_everywhere_healthz_ok(
    make_client: Callable[..., TestClient],
) -> None:
    c = make_client(f"postgresql+psycopg://kvscope@127.0.0.1:{services.free_port()}/none")
    for path in ("/readyz", "/v1/clusters", "/v1/targets", f"/v1/clusters/{CLUSTER}/plan",
                 "/metrics"):  # fmt: skip
        assert_error(c.get(path), 503)
    assert c.get("/healthz").status_code == 200


def test_readyz_unmigrated_sqlite_503_says_migrate(
    tmp_path: Path, make_client: Callable[..., TestClient]
) -> None:
    c = make_client(f"sqlite:///{tmp_path / 'new.db'}")
    body = assert_error(c.get("/readyz"), 503)
    assert "no kvscope schema" in body["error"] and "kvscope db migrate" in body["error"]
    assert "no kvscope schema" in assert_error(c.get("/v1/clusters"), 503)["error"]


def test_readyz_old_schema_503_names_versions(
    tmp_path: Path, make_client: Callable[..., TestClient]
) -> None:
    path = tmp_path / "old.db"
    with Store(f"sqlite:///{path}") as store:
        store.migrate()
    with sqlite3.connect(path) as con:
        con.execute("UPDATE schema_version SET version = 1")
    body = assert_error(make_client(f"sqlite:///{path}").get("/readyz"), 503)
    assert "schema version 1" in body["error"] and f"needs {SCHEMA_VERSION}" in body["error"]


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m, p, op) for p, ops in doc["paths"].items() for m, op in ops.items()]


def test_openapi_every_operation_declares_error_body_responses() -> None:
    doc = create_app(settings_for("sqlite:///unused.db")).openapi()
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    ops = _operations(doc)
    assert len(ops) == 19
    for method, path, op in ops:
        codes = {c for c in op["responses"] if c.startswith(("4", "5"))}
        assert {"400"} <= codes, (method, path)
        if path not in ("/healthz",):
            assert "503" in codes, (method, path)
        if "{cluster}" in path or path == "/v1/targets/{name}":
            assert "404" in codes, (method, path)
        if op.get("parameters") or op.get("requestBody"):
            assert "422" in codes, (method, path)
        for code in codes:
            schema = op["responses"][code]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path, code)
    writes = {(m, p) for m, p, op in ops if op.get("security")}
    assert writes == {("post", "/v1/targets"), ("delete", "/v1/targets/{name}")}


def _raw_constraints(node: Any) -> list[str]:
    """Pydantic's untranslated bounds (``ge``, ``le``, …): a generator would ignore them."""
    if isinstance(node, dict):
        here = [k for k in ("ge", "le", "gt", "lt") if k in node]
        return here + [x for v in node.values() for x in _raw_constraints(v)]
    if isinstance(node, list):
        return [x for v in node for x in _raw_constraints(v)]
    return []


def test_openapi_every_field_has_an_example_and_numbers_are_bounded() -> None:
    doc = create_app(settings_for("sqlite:///unused.db")).openapi()
    assert _raw_constraints(doc) == []
    for name, schema in doc["components"]["schemas"].items():
        for field, prop in schema.get("properties", {}).items():
            assert prop.get("examples"), f"{name}.{field} has no example"
            if name.endswith("In"):
                for alt in prop.get("anyOf", [prop]):
                    types = alt.get("type")
                    types = types if isinstance(types, list) else [types]
                    if {"integer", "number"} & set(types):
                        assert "maximum" in alt or "enum" in alt, f"{name}.{field} is unbounded"
    for _m, _p, op in _operations(doc):
        for param in op.get("parameters", []):
            assert param.get("examples") or param["schema"].get("examples"), param["name"]
