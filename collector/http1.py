"""A lean HTTP/1.1 client for scraping: one keep-alive connection per target, GET only.

httpx stays for everything else; this client spends a fraction of its CPU per scrape
(benchmarks/README.md, ``bench_scrape.py``). RFC 9112 as far as a scraper needs it: chunked
or Content-Length framing, keep-alive, one resend of a GET on a connection the server closed
while idle, TLS with SNI, ``connect_to`` a pinned address. Errors: :class:`ConnectFailed`,
:class:`BodyCutShort`, :class:`ProtocolError`; timeouts are the caller's.

Design: collector/DESIGN.md#http1
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

MAX_HEAD_BYTES = 64 * 1024  # status line + headers (Go's net/http default is 1 MiB, nginx 8 KB)
READ_BYTES = 256 * 1024  # one read of a body
DEFAULT_PORTS = {"http": 80, "https": 443}


class HTTPClientError(Exception):
    """Base of this module's errors."""


class ConnectFailed(HTTPClientError):
    """No answer: the connection or TLS handshake failed, or it closed before a response."""


class BodyCutShort(HTTPClientError):
    """The server closed (or reset) the connection before the whole body."""


class ProtocolError(HTTPClientError):
    """The response is not readable HTTP/1.x."""


@dataclass(slots=True)
class Response:
    """A response's head; read its body with :meth:`Connection.body`."""

    status: int
    reason: str
    version: str
    headers: dict[str, str]  # lower-case names; repeated fields joined with ", "
    framing: str = "none"  # "none", "length", "chunked" or "close"
    length: int = 0
    keep_alive: bool = True
    done: bool = False  # the body was read to the end


@dataclass(frozen=True, slots=True)
class Route:
    """Where a URL's request goes: its scheme, address to connect to, SNI name, Host header
    and request target."""

    scheme: str
    address: str
    port: int
    server_name: str | None
    host_header: str
    target: str
    authorization: str | None

    @property
    def key(self) -> tuple[str, str, int, str | None]:
        return (self.scheme, self.address, self.port, self.server_name)


def route(url: str, *, connect_to: str | None = None) -> Route:
    """The route of an absolute http(s) URL; ValueError names what is wrong with it."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError(f"unsupported URL scheme {parts.scheme!r} in {url!r}")
    host = parts.hostname
    if not host:
        raise ValueError(f"no host in {url!r}")
    port = parts.port or DEFAULT_PORTS[scheme]  # ValueError on a bad port
    bracketed = f"[{host}]" if ":" in host else host
    host_header = (
        bracketed if parts.port in (None, DEFAULT_PORTS[scheme]) else f"{bracketed}:{port}"
    )
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    auth = None
    if parts.username is not None:  # as curl and httpx: userinfo becomes Basic auth
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        auth = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    return Route(
        scheme=scheme,
        address=connect_to or host,
        port=port,
        server_name=host if scheme == "https" else None,
        host_header=host_header,
        target=target,
        authorization=auth,
    )


class Connection:
    """One target's keep-alive connection (reopened when the route changes or it closed).

    One request at a time: the caller awaits :meth:`get` and then reads :meth:`body` (or
    calls :meth:`release`) before the next GET.
    """

    def __init__(self, tls: Callable[[], ssl.SSLContext], *, user_agent: str) -> None:
        self._tls = tls
        self._agent = user_agent
        self._key: tuple[str, str, int, str | None] | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._busy: Response | None = None

    @property
    def is_open(self) -> bool:
        return self._writer is not None

    async def _open(self, r: Route) -> None:
        try:
            self._reader, self._writer = await asyncio.open_connection(
                r.address,
                r.port,
                ssl=self._tls() if r.scheme == "https" else None,
                server_hostname=r.server_name,
                limit=MAX_HEAD_BYTES,
            )
        except (OSError, ssl.SSLError) as exc:  # refused, unreachable, TLS handshake
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from exc
        self._key = r.key

    async def get(
        self, url: str, headers: Mapping[str, str], *, connect_to: str | None = None
    ) -> Response:
        """Send a GET for ``url`` and read the response's head."""
        if self._busy is not None:
            self.release()
        r = route(url, connect_to=connect_to)
        lines = [f"GET {r.target} HTTP/1.1", f"Host: {r.host_header}", f"User-Agent: {self._agent}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if r.authorization is not None:
            lines.append(f"Authorization: {r.authorization}")
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            for attempt in (0, 1):
                # kept open for this route and not closed by the server while idle
                reader = self._reader
                reused = reader is not None and self._key == r.key and not reader.at_eof()
                if not reused:
                    self.close()
                    await self._open(r)
                try:
                    head = await self._send(request)
                except ConnectFailed:
                    if reused and attempt == 0:  # closed while idle: once more on a new one
                        self.close()
                        continue
                    raise
                resp = _parse_head(head)
                self._busy = resp
                return resp
        except BaseException:
            self.close()
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _send(self, request: bytes) -> bytes:
        assert self._reader is not None and self._writer is not None
        try:
            self._writer.write(request)
            await self._writer.drain()
            return await self._reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            got = len(exc.partial)
            raise ConnectFailed(
                "server closed the connection without an answer"
                + (f" ({got} bytes of a head)" if got else "")
            ) from exc
        except asyncio.LimitOverrunError as exc:
            raise ProtocolError(f"response head over {MAX_HEAD_BYTES} bytes") from exc
        except (OSError, ssl.SSLError) as exc:
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from exc

    async def body(self, resp: Response) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (de-chunked, not decoded); BodyCutShort if the
        server closes before its end. Call :meth:`release` after it (an early stop then
        closes the connection: its position in the stream is lost)."""
        reader = self._reader
        if resp is not self._busy or reader is None:
            raise RuntimeError("body() of a response that is not this connection's current one")
        try:
            if resp.framing == "length":
                left = resp.length
                while left:
                    data = await reader.read(min(left, READ_BYTES))
                    if not data:
                        raise BodyCutShort(f"{resp.length - left} of {resp.length} bytes")
                    left -= len(data)
                    yield data
            elif resp.framing == "chunked":
                async for data in _chunks(reader):
                    yield data
            elif resp.framing == "close":
                while data := await reader.read(READ_BYTES):
                    yield data
        except asyncio.IncompleteReadError as exc:
            self._abandon(resp)
            raise BodyCutShort(f"connection closed in the body: {exc}") from exc
        except (OSError, ssl.SSLError) as exc:
            self._abandon(resp)
            raise BodyCutShort(f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            self._abandon(resp)  # a protocol error, a timeout, or the generator closed early
            raise
        resp.done = True

    async def discard(self, resp: Response, *, up_to: int = 64 * 1024) -> None:
        """Read and drop a small body so that the connection serves the next request (a
        redirect's); a larger or unframed one closes the connection instead."""
        if not resp.done and resp.framing == "length" and resp.length <= up_to:
            async for _ in self.body(resp):
                pass
        self.release()

    def _abandon(self, resp: Response) -> None:
        if self._busy is resp:  # never a later request's connection
            self.close()

    def release(self) -> None:
        """Done with the current response: keep the connection if it can serve another."""
        resp, self._busy = self._busy, None
        if resp is not None and not (resp.done and resp.keep_alive):
            self.close()

    def close(self) -> None:
        writer, self._reader, self._writer, self._busy, self._key = (
            self._writer,
            None,
            None,
            None,
            None,
        )
        if writer is not None:
            writer.close()  # aborts nothing pending: this connection has no other user

    async def aclose(self) -> None:
        writer = self._writer
        self.close()
        if writer is not None:
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()


def _parse_head(head: bytes) -> Response:
    lines = head.decode("latin-1").split("\r\n")
    status_line = lines[0]
    parts = status_line.split(" ", 2)
    if (
        len(parts) < 2
        or not parts[0].startswith("HTTP/1.")
        or not (len(parts[1]) == 3 and parts[1].isdigit())
    ):
        raise ProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    version, status = parts[0], int(parts[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ProtocolError(f"malformed header line {line[:80]!r}")
        key, value = name.lower(), value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    resp = Response(status, parts[2] if len(parts) > 2 else "", version, headers)
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    resp.keep_alive = "keep-alive" in tokens if version == "HTTP/1.0" else "close" not in tokens
    if status < 200 or status in (204, 304):
        resp.framing, resp.done = "none", True
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        resp.framing = "chunked"
    elif "content-length" in headers:
        values = {v.strip() for v in headers["content-length"].split(",")}
        if len(values) != 1 or not (v := values.pop()).isdigit():
            raise ProtocolError(f"bad Content-Length {headers['content-length']!r}")
        resp.framing, resp.length = "length", int(v)
        resp.done = resp.length == 0
    else:
        resp.framing, resp.keep_alive = "close", False
    return resp


async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while True:
        try:
            line = await reader.readuntil(b"\r\n")
        except asyncio.LimitOverrunError as exc:
            raise ProtocolError("chunk-size line too long") from exc
        size_text = line[:-2].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ProtocolError(f"bad chunk size {size_text[:40]!r}") from None
        if size < 0:
            raise ProtocolError(f"bad chunk size {size_text[:40]!r}")
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass  # trailer fields: not used
            return
        left = size
        while left:
            data = await reader.read(min(left, READ_BYTES))
            if not data:
                raise asyncio.IncompleteReadError(b"", left)
            left -= len(data)
            yield data
        if await reader.readexactly(2) != b"\r\n":
            raise ProtocolError("chunk not followed by CRLF")
