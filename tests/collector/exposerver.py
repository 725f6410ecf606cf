"""A real HTTP server on 127.0.0.1 serving metric expositions for the collector tests.

Each route answers with a body built from how many times it was hit, so counters can move
between scrapes; routes can also be slow, fail with a status, stream an oversized body or
serve garbage. The exposition is always plain text `version=0.0.4`, whatever the Accept
header, as a vLLM-looking exporter must (tests/fixtures/metrics/README.md).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from core.catalog import exposed_names

TEXT_004 = "text/plain; version=0.0.4; charset=utf-8"
Body = Callable[[int], bytes]


@dataclass
class Route:
    body: Body
    status: int = 200
    delay_s: float = 0.0
    chunks: int = 1  # >1: stream the body in chunks without Content-Length
    headers: dict[str, str] = field(default_factory=dict)
    hits: int = 0
    accepts: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)  # the Host header of each hit


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    _counted = False  # this request is counted in the server's inflight

    def do_GET(self) -> None:
        route = self.server.routes.get(self.path)
        if route is None:
            self._send(404, b"not found\n", TEXT_004)
            return
        with self.server.lock:
            n = route.hits
            route.hits += 1
            route.accepts.append(self.headers.get("Accept", ""))
            route.hosts.append(self.headers.get("Host", ""))
            self.server.inflight += 1
            self.server.max_inflight = max(self.server.max_inflight, self.server.inflight)
            self._counted = True
        try:
            if route.delay_s:
                time.sleep(route.delay_s)
            self._answer(route, route.body(n))
        finally:
            self._answered()

    def _answered(self) -> None:
        """The request is no longer in flight: called just before its last bytes are
        written (the client may have them, and send its next request, before write()
        returns to this thread), or when the handler ends without answering."""
        if self._counted:
            self._counted = False
            with self.server.lock:
                self.server.inflight -= 1

    def _answer(self, route: Route, body: bytes) -> None:
        if route.chunks <= 1:
            self._send(route.status, body, TEXT_004, route.headers)
            return
        self.send_response(route.status)
        self.send_header("Content-Type", TEXT_004)
        for key, value in route.headers.items():
            self.send_header(key, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        step = max(1, len(body) // route.chunks)
        for i in range(0, len(body), step):
            piece = body[i : i + step]
            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        self._answered()
        self.wfile.write(b"0\r\n\r\n")

    def _send(
        self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self._answered()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # quiet test output
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    routes: dict[str, Route]
    lock: threading.Lock
    inflight: int = 0
    max_inflight: int = 0

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that aborts an oversized body breaks the pipe: expected here


class ExpoServer:
    def __init__(self, srv: _Server) -> None:
        self._srv = srv
        host, port = srv.server_address[:2]
        self.base = f"http://{host!s}:{port}"

    def add(self, path: str, body: Body | bytes | str, **kw: object) -> str:
        fn: Body
        if isinstance(body, str):
            data = body.encode()
            fn = lambda _n: data  # noqa: E731
        elif isinstance(body, bytes):
            fn = lambda _n, b=body: b  # type: ignore[misc]  # noqa: E731
        else:
            fn = body
        self._srv.routes[path] = Route(body=fn, **kw)  # type: ignore[arg-type]
        return self.base + path

    def route(self, path: str) -> Route:
        return self._srv.routes[path]

    @property
    def max_inflight(self) -> int:
        """The most requests this server was answering at the same time."""
        return self._srv.max_inflight


@contextmanager
def expo_server() -> Iterator[ExpoServer]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.routes = {}
    srv.lock = threading.Lock()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.daemon = True
    thread.start()
    try:
        yield ExpoServer(srv)
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


def set_sample(text: str, signal: str, value: float) -> str:
    """Rewrite every sample of a catalogue signal's exposed names to ``value``."""
    names = "|".join(re.escape(n) for n in exposed_names(signal))
    pattern = re.compile(rf"^((?:{names})(?:\{{[^}}]*\}})?) \S+$", re.MULTILINE)
    return pattern.sub(lambda m: f"{m.group(1)} {value!r}", text)


def bumping(text: str, signal: str, start: float, step: float) -> Body:
    """A body whose ``signal`` counter reads ``start + step * hit`` at each hit."""
    return lambda n: set_sample(text, signal, start + step * n).encode()
