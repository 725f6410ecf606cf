"""Auth: writes need the bearer token (403 when none is configured, 401 when it is missing or
wrong), reads are open unless reads_require_token, a credential in the query string is
refused, hmac.compare_digest does the comparing, and the token never reaches a log."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import AUTH, TOKEN, assert_error

TARGET = {"name": "engine-7", "url": "http://10.1.2.3:8000/metrics", "cluster": "c1"}
NETS = ("10.0.0.0/8",)


@pytest.mark.parametrize(
    ("configured", "headers", "status"),
    [
        (False, {}, 403),
        (False, AUTH, 403),
        (True, {}, 401),
        (True, {"Authorization": "Bearer wrong-token-0123456789"}, 401),
        (True, {"Authorization": f"Bearer {TOKEN}x"}, 401),
        (True, {"Authorization": f"Basic {TOKEN}"}, 401),
        (True, {"Authorization": "Bearer "}, 401),
        (True, {"Authorization": TOKEN}, 401),
        (True, AUTH, 201),
        (True, {"Authorization": f"bearer {TOKEN}"}, 201),
    ],
)
def test_write_auth_table_statuses(
    sqlite_url: str,
    make_client: Callable[..., TestClient],
    configured: bool,
    headers: dict[str, str],
    status: int,
) -> None:
    c = make_client(
        sqlite_url, api_token=TOKEN if configured else None, allowed_target_networks=NETS
    )
    resp = c.post("/v1/targets", json=TARGET, headers=headers)
    assert resp.status_code == status, resp.text
    delete = c.delete("/v1/targets/engine-7", headers=headers)
    assert delete.status_code == (204 if status == 201 else status)
    if status == 403:
        assert "writes disabled" in assert_error(resp, 403, None)["error"]
    if status == 401:
        assert_error(resp, 401, "Authorization")
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    if status != 201:
        assert c.get("/v1/targets").json() == {"targets": []}  # nothing was written


@pytest.mark.parametrize("param", ["token", "access_token", "api_key", "TOKEN"])
@pytest.mark.parametrize("path", ["/v1/clusters", "/v1/targets", "/metrics", "/healthz"])
def test_token_in_query_string_refused_400(
    sqlite_url: str, make_client: Callable[..., TestClient], param: str, path: str
) -> None:
    c = make_client(sqlite_url)
    body = assert_error(c.get(path, params={param: TOKEN}), 400, param.lower())
    assert "query string" in body["error"] and TOKEN not in body["error"]


def test_token_in_query_string_refused_even_for_writes_with_header(
    sqlite_url: str, make_client: Callable[..., TestClient]
) -> None:
    c = make_client(sqlite_url, allowed_target_networks=NETS)
    resp = c.post("/v1/targets", params={"token": TOKEN}, json=TARGET, headers=AUTH)
    assert_error(resp, 400, "token")
    assert c.get("/v1/targets").json() == {"targets": []}


def test_reads_open_by_default_without_token(
    sqlite_url: str, make_client: Callable[..., TestClient]
) -> None:
    c = make_client(sqlite_url)
    for path in ("/v1/clusters", "/v1/targets", "/metrics", "/readyz"):
        assert c.get(path).status_code == 200, path


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer nope-nope-nope-nope"}, 401), (AUTH, 200)],
)
def test_reads_require_token_guards_reads_not_probes(
    sqlite_url: str, make_client: Callable[..., TestClient], headers: dict[str, str], status: int
) -> None:
    c = make_client(sqlite_url, reads_require_token=True)
    for path in ("/v1/clusters", "/v1/targets", "/metrics"):
        assert c.get(path, headers=headers).status_code == status, path
    advise = c.post("/v1/advise", json={}, headers=headers)
    assert advise.status_code == (422 if status == 200 else status)
    for probe in ("/healthz", "/readyz"):
        assert c.get(probe).status_code == 200
    security = c.get("/openapi.json").json()["paths"]["/v1/clusters"]["get"].get("security")
    assert security == [{"bearer": []}]


def test_compare_digest_does_the_comparing(
    sqlite_url: str, make_client: Callable[..., TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, Any]] = []
    real = hmac.compare_digest

    def recording(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    c = make_client(sqlite_url, allowed_target_networks=NETS)
    assert c.post("/v1/targets", json=TARGET, headers=AUTH).status_code == 201
    wrong = {"Authorization": "Bearer x" + TOKEN[1:]}
    assert c.post("/v1/targets", json=TARGET, headers=wrong).status_code == 401
    assert calls == [(TOKEN.encode(), TOKEN.encode()), (wrong["Authorization"][7:].encode(),
                                                        TOKEN.encode())]  # fmt: skip

    monkeypatch.setattr(hmac, "compare_digest", lambda _a, _b: False)  # it alone decides
    assert c.post("/v1/targets", json=TARGET, headers=AUTH).status_code == 401


def test_token_never_logged_or_echoed(
    sqlite_url: str, make_client: Callable[..., TestClient], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    c = make_client(sqlite_url, allowed_target_networks=NETS)
    bodies = [
        c.post("/v1/targets", json=TARGET, headers=AUTH),
        c.post("/v1/targets", json=TARGET, headers={"Authorization": f"Bearer {TOKEN}!"}),
        c.get("/v1/clusters", params={"token": TOKEN}),
        c.post("/v1/targets", json={**TARGET, "url": f"http://{TOKEN}.invalid/"}, headers={}),
        c.delete("/v1/targets/engine-7", headers=AUTH),
    ]
    assert [r.status_code for r in bodies] == [201, 401, 400, 401, 204]
    assert all(TOKEN not in r.text for r in bodies)
    # the server's records (the test client's own httpx logger prints the URLs it sends)
    server = "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith("httpx"))
    assert "/v1/clusters 400" in server  # logged, without its query string
    assert TOKEN not in server
    assert TOKEN not in repr(c.app.state.kvscope.settings)  # type: ignore[attr-defined]
