"""collector.http1 against a scripted raw TCP server: framing, keep-alive, reuse after an
idle close, and a table of malformed responses (each a clear error, none a hang)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from collector.http1 import (
    MAX_HEAD_BYTES,
    BodyCutShort,
    ConnectFailed,
    Connection,
    HTTPClientError,
    ProtocolError,
    route,
)

Answer = Callable[[int, bytes], bytes | None]  # (request number, request head) → raw reply


@dataclass
class Seen:
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)


@asynccontextmanager
async def raw_server(
    answer: Answer, *, close_after: bool = False
) -> AsyncIterator[tuple[str, Seen]]:
    """A server that writes ``answer(n, head)`` to the n-th request (None: close at once);
    ``close_after`` closes each connection after its first answer."""
    seen = Seen()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                seen.requests.append(head)
                reply = answer(len(seen.requests), head)
                if reply is None:
                    break
                writer.write(reply)
                await writer.drain()
                if close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}", seen


def _conn() -> Connection:
    return Connection(ssl.create_default_context, user_agent="kvscope-test")


async def _fetch(conn: Connection, url: str) -> tuple[int, bytes]:
    resp = await conn.get(url, {"Accept": "text/plain"})
    try:
        body = b"".join([c async for c in conn.body(resp)])
    finally:
        conn.release()
    return resp.status, body


def _ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def run(coro: object) -> object:
    return asyncio.run(asyncio.wait_for(coro, 10))  # type: ignore[arg-type]


def test_keep_alive_one_connection_for_many_gets_and_the_request_head() -> None:
    async def go() -> None:
        async with raw_server(lambda n, _h: _ok(b"up %d\n" % n)) as (base, seen):
            conn = _conn()
            got = [await _fetch(conn, f"{base}/metrics?x=1") for _ in range(3)]
            await conn.aclose()
        assert got == [(200, b"up 1\n"), (200, b"up 2\n"), (200, b"up 3\n")]
        assert seen.connections == 1
        lines = seen.requests[0].decode().split("\r\n")
        port = base.rsplit(":", 1)[1]
        assert lines[0] == "GET /metrics?x=1 HTTP/1.1"
        assert f"Host: 127.0.0.1:{port}" in lines and "User-Agent: kvscope-test" in lines
        assert "Accept: text/plain" in lines

    run(go())


def test_chunked_body_with_extensions_and_trailers() -> None:
    reply = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n7\r\n world\n\r\n0\r\nX-Trailer: 1\r\n\r\n"
    )

    async def go() -> None:
        async with raw_server(lambda _n, _h: reply) as (base, seen):
            conn = _conn()
            a = await _fetch(conn, base + "/")
            b = await _fetch(conn, base + "/")  # the trailer was consumed: the stream is in step
            await conn.aclose()
        assert a == b == (200, b"hello world\n") and seen.connections == 1

    run(go())


def test_close_delimited_http10_body_and_connection_close_reopen() -> None:
    async def go() -> None:
        reply = b"HTTP/1.0 200 OK\r\n\r\nup 1\n"
        async with raw_server(lambda _n, _h: reply, close_after=True) as (base, seen):
            conn = _conn()
            got = [await _fetch(conn, base + "/") for _ in range(2)]
            await conn.aclose()
        assert got == [(200, b"up 1\n")] * 2 and seen.connections == 2

        close = _ok(b"up 1\n", b"Connection: close\r\n")
        async with raw_server(lambda _n, _h: close, close_after=True) as (base, seen):
            conn = _conn()
            got = [await _fetch(conn, base + "/") for _ in range(2)]
            await conn.aclose()
        assert got == [(200, b"up 1\n")] * 2 and seen.connections == 2

    run(go())


def test_idle_connection_closed_by_the_server_is_reopened_once() -> None:
    async def go() -> None:
        # the server closes every connection after one answer without saying so
        async with raw_server(lambda n, _h: _ok(b"up %d\n" % n), close_after=True) as (
            base,
            seen,
        ):
            conn = _conn()
            first = await _fetch(conn, base + "/")
            await asyncio.sleep(0.05)  # the close arrives while idle
            second = await _fetch(conn, base + "/")
            await conn.aclose()
        assert first == (200, b"up 1\n") and second == (200, b"up 2\n")
        assert seen.connections == 2

    run(go())


def test_a_fresh_connection_closed_without_answer_is_not_retried() -> None:
    async def go() -> None:
        async with raw_server(lambda _n, _h: None) as (base, seen):
            conn = _conn()
            with pytest.raises(ConnectFailed, match="without an answer"):
                await _fetch(conn, base + "/")
            await conn.aclose()
        assert seen.connections == 1

    run(go())


def test_unread_body_closes_the_connection_and_the_next_get_reopens() -> None:
    async def go() -> None:
        async with raw_server(lambda n, _h: _ok(b"x" * 1000)) as (base, seen):
            conn = _conn()
            resp = await conn.get(base + "/", {})
            async for _chunk in conn.body(resp):
                break  # an early stop (the body cap): the stream position is lost
            conn.release()
            assert not conn.is_open
            assert await _fetch(conn, base + "/") == (200, b"x" * 1000)
            await conn.aclose()
        assert seen.connections == 2

    run(go())


MALFORMED: list[tuple[str, bytes, type[HTTPClientError], str]] = [
    ("not http", b"SSH-2.0-OpenSSH_9.2\r\n\r\n", ProtocolError, "not an HTTP/1.x status line"),
    ("http/2 preface", b"HTTP/2 200\r\n\r\n", ProtocolError, "not an HTTP/1.x status line"),
    ("bad status", b"HTTP/1.1 2x0 OK\r\n\r\n", ProtocolError, "not an HTTP/1.x status line"),
    ("header without colon", b"HTTP/1.1 200 OK\r\nbroken\r\n\r\n", ProtocolError, "malformed"),
    ("space before colon", b"HTTP/1.1 200 OK\r\nContent-Length : 1\r\n\r\nx", ProtocolError,
     "malformed"),
    ("conflicting lengths", b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
     ProtocolError, "bad Content-Length"),
    ("negative length", b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", ProtocolError,
     "bad Content-Length"),
    ("bad chunk size", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
     ProtocolError, "bad chunk size"),
    ("chunk without CRLF", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxyz\r\n",
     ProtocolError, "not followed by CRLF"),
    ("short body", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", BodyCutShort,
     "3 of 10 bytes"),
    ("short chunk", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\na\r\nabc",
     BodyCutShort, "closed in the body"),
    ("no last chunk", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
     BodyCutShort, "closed in the body"),
    ("head cut short", b"HTTP/1.1 200 OK\r\nContent-Le", ConnectFailed, "without an answer"),
    ("head too large", b"HTTP/1.1 200 OK\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n",
     ProtocolError, "response head over"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "reply", "error", "says"), MALFORMED, ids=[m[0] for m in MALFORMED]
)
def test_malformed_response_is_a_named_error(
    case: str, reply: bytes, error: type[HTTPClientError], says: str
) -> None:
    async def go() -> None:
        async with raw_server(lambda _n, _h: reply, close_after=True) as (base, _seen):
            conn = _conn()
            with pytest.raises(error, match=says):
                await _fetch(conn, base + "/")
            assert not conn.is_open  # never reused after an error
            await conn.aclose()

    run(go())


def test_no_body_statuses_and_refused_connection() -> None:
    async def go() -> None:
        async with raw_server(lambda _n, _h: b"HTTP/1.1 204 No Content\r\n\r\n") as (base, seen):
            conn = _conn()
            assert await _fetch(conn, base + "/") == (204, b"")
            assert await _fetch(conn, base + "/") == (204, b"")
            await conn.aclose()
        assert seen.connections == 1
        port = base.rsplit(":", 1)[1]
        with pytest.raises(ConnectFailed, match="ConnectionRefusedError"):
            await _fetch(_conn(), f"http://127.0.0.1:{port}/")  # the server is gone

    run(go())


@pytest.mark.parametrize(
    ("url", "connect_to", "want"),
    [
        ("http://e.test/metrics", None, ("http", "e.test", 80, None, "e.test", "/metrics")),
        ("http://e.test:80", None, ("http", "e.test", 80, None, "e.test", "/")),
        ("https://e.test:8443/m?a=1", "10.0.0.1",
         ("https", "10.0.0.1", 8443, "e.test", "e.test:8443", "/m?a=1")),
        ("http://[::1]:9000/m", None, ("http", "::1", 9000, None, "[::1]:9000", "/m")),
    ],
)  # fmt: skip
def test_route(url: str, connect_to: str | None, want: tuple[object, ...]) -> None:
    r = route(url, connect_to=connect_to)
    assert (r.scheme, r.address, r.port, r.server_name, r.host_header, r.target) == want
    assert r.authorization is None


def test_route_userinfo_becomes_basic_auth_and_bad_urls_are_named() -> None:
    assert route("http://u%40x:p@e.test/").authorization == "Basic dUB4OnA="  # "u@x:p"
    for bad, says in (("ftp://e.test/", "unsupported URL scheme"), ("http:///m", "no host")):
        with pytest.raises(ValueError, match=says):
            route(bad)
