"""Request size limits (api/app.py EdgeMiddleware): a body over MAX_BODY_BYTES is refused 413
before any route runs (by Content-Length) or as soon as a chunked body grows past it; a query
string over MAX_QUERY_BYTES is refused 414; neither reaches the store."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from api.app import MAX_BODY_BYTES, MAX_QUERY_BYTES
from tests.api.conftest import AUTH, TOKEN, assert_error

NETS = ("10.0.0.0/8",)


def _chunks(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        piece = min(size, total - sent)
        sent += piece
        yield b" " * piece


@pytest.mark.parametrize(
    ("how", "nbytes", "status"),
    [
        ("length", MAX_BODY_BYTES + 1, 413),
        ("chunked", MAX_BODY_BYTES + 1, 413),
        ("chunked", 3 * MAX_BODY_BYTES, 413),
        ("length", MAX_BODY_BYTES, 422),  # at the limit: read, then refused as bad JSON
        ("chunked", 1000, 422),
    ],
)  # fmt: skip
def test_request_body_over_limit_413_before_the_route(
    sqlite_url: str, make_client: Callable[..., TestClient], how: str, nbytes: int, status: int
) -> None:
    c = make_client(sqlite_url, api_token=TOKEN, allowed_target_networks=NETS)
    headers = {**AUTH, "Content-Type": "application/json"}
    content = b" " * nbytes if how == "length" else _chunks(nbytes)
    resp = c.post("/v1/targets", content=content, headers=headers)
    body = assert_error(resp, status)
    if status == 413:
        assert f"over {MAX_BODY_BYTES} bytes" in body["error"]
    assert c.get("/v1/targets").json() == {"targets": []}  # nothing was written


@pytest.mark.parametrize(("extra", "status"), [(MAX_QUERY_BYTES, 414), (100, 200)])
def test_query_string_over_limit_414(
    sqlite_url: str, make_client: Callable[..., TestClient], extra: int, status: int
) -> None:
    c = make_client(sqlite_url)
    resp = c.get("/v1/clusters", params={"x": "a" * extra})
    assert resp.status_code == status, resp.text
    if status == 414:
        assert f"over {MAX_QUERY_BYTES} bytes" in assert_error(resp, 414)["error"]
