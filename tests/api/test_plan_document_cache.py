"""GET …/plan encodes a stored plan's document once: repeated reads reuse the bytes, and a
plan re-saved over the same window range (same id, new created_at) is served anew."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import ApiSettings
from store.store import Store
from store.tables import PlanRecord


def _record(created_at: float, mode: str) -> PlanRecord:
    return PlanRecord(
        cluster="c1", group="", created_at=created_at, window_from=0.0, window_until=3600.0,
        horizon_s=3600.0, version="0.1.0", mode=mode,
        document={"decision": {"mode": mode}, "x": [1.5, 2.5]}, headline={"score": 0.5},
    )  # fmt: skip


def test_plan_route_repeated_reads_encode_document_once_resave_served_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    with Store(url) as store:
        store.migrate()
        first = store.save_plan(_record(100.0, "native"))
    reads: list[int] = []
    original = Store.plan_document

    def counting(self: Store, plan_id: int) -> dict[str, object] | None:
        reads.append(plan_id)
        return original(self, plan_id)

    monkeypatch.setattr(Store, "plan_document", counting)
    with TestClient(create_app(ApiSettings(db=url))) as client:
        bodies = [client.get("/v1/clusters/c1/plan").json() for _ in range(3)]
        assert reads == [first]
        assert all(b["document"] == {"decision": {"mode": "native"}, "x": [1.5, 2.5]}
                   for b in bodies)  # fmt: skip
        assert bodies[0]["id"] == first and bodies[0]["mode"] == "native"
        with Store(url) as store:
            assert store.save_plan(_record(200.0, "lmcache")) == first  # same row, replaced
        body = client.get("/v1/clusters/c1/plan").json()
        assert body["document"]["decision"]["mode"] == "lmcache" and body["created_at"] == 200.0
        assert reads == [first, first]
        json.dumps(body)  # one valid JSON object
