#!/usr/bin/env python3
"""An Alertmanager webhook receiver that logs each notification as one JSON line.

Stdlib only, so it runs on a bare ``python:3.11-slim`` (docker-compose.yml's ``webhook``
service) or straight from a checkout::

    python deploy/alertmanager/webhook_logger.py --host 127.0.0.1 --port 5001 --out alerts.jsonl

Every POST (any path: Alertmanager posts to the ``url`` of its ``webhook_configs``) whose body
is a JSON object with an ``alerts`` list is answered 200 and logged on stdout as::

    {"event": "notification", "received_at": "2026-01-01T00:00:00.000Z", "path": "/alerts",
     "remote": "172.18.0.4", "status": "firing", "receiver": "webhook-logger", "n_alerts": 1,
     "alertnames": ["KvscopeCollectorDown"], "notification": {…the body as sent…}}

and, with ``--out FILE``, appended to FILE as the body alone (one JSON object per line,
Alertmanager's own shape; the file is created at start). Anything else is answered with a
4xx and logged as ``{"event": "rejected", "status_code": 400, "error": "…", …}``: a body
that is not JSON or not a notification (400), no Content-Length (411), a body over
``--max-bytes`` (413). A failure inside a request (the --out file unwritable, …) is a 500,
logged; the server keeps serving. ``GET /healthz`` answers 200 (the compose healthcheck).

Start-up prints ``{"event": "listening", "url": "http://HOST:PORT"}`` (``--port 0`` picks a
free port: read it there); SIGTERM or SIGINT stops it with ``{"event": "stopped", …}``, exit 0.

Importable too: ``make_server(host, port, out=…)`` returns a server whose ``url`` is known
before ``serve_forever()`` runs (in a thread of a test, say); ``main(argv)`` is the CLI.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import IO, Any

DEFAULT_MAX_BYTES = 4 * 1024 * 1024  # Alertmanager batches alerts; 4 MiB is thousands of them
HEALTH_PATH = "/healthz"
DRAIN_LIMIT = 64 * 1024 * 1024  # a refused body up to this size is read (and dropped) first


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Rejected(Exception):
    """A request answered with a 4xx: ``status`` and a one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def parse_notification(body: bytes) -> dict[str, Any]:
    """The notification in ``body``; Rejected(400) when it is not a JSON object with an
    ``alerts`` list of objects (Alertmanager's webhook payload, version 4)."""
    try:
        doc = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise Rejected(400, f"body is not UTF-8: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise Rejected(400, f"body is not JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise Rejected(400, "body is not JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise Rejected(400, f"not an Alertmanager notification: a JSON {type(doc).__name__}")
    alerts = doc.get("alerts")
    if not isinstance(alerts, list) or not all(isinstance(a, dict) for a in alerts):
        raise Rejected(400, "not an Alertmanager notification: no `alerts` list of objects")
    return doc


def _alertnames(doc: dict[str, Any]) -> list[str]:
    names = set()
    for alert in doc["alerts"]:
        labels = alert.get("labels")
        if isinstance(labels, dict) and isinstance(labels.get("alertname"), str):
            names.add(labels["alertname"])
    return sorted(names)


class WebhookServer(ThreadingHTTPServer):
    """The receiver: one thread per request; log lines and --out appends are serialised."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        *,
        out: Path | None = None,
        stream: IO[str] | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self.out = out
        self.stream = stream if stream is not None else sys.stdout
        self.max_bytes = max_bytes
        self.lock = threading.Lock()
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.touch()  # readers can open it before the first notification

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = f"[{host!s}]" if ":" in str(host) else str(host)
        return f"http://{shown}:{port}"

    def log_event(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, sort_keys=True, separators=(",", ":"))
        with self.lock:
            self.stream.write(line + "\n")
            self.stream.flush()

    def record(self, doc: dict[str, Any]) -> None:
        """Append the notification to --out (no-op without it); OSError propagates."""
        if self.out is None:
            return
        line = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        with self.lock, self.out.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


class _Handler(BaseHTTPRequestHandler):
    server: WebhookServer
    protocol_version = "HTTP/1.1"  # Alertmanager keeps connections alive
    timeout = 60.0  # an idle or stalled connection is dropped after this many seconds

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] == HEALTH_PATH:
            self._answer(200, {"status": "ok"})
        else:
            self._answer(404, {"error": "not found: POST notifications, GET /healthz"})

    def do_POST(self) -> None:
        base = {"path": self.path.split("?", 1)[0], "remote": self.client_address[0]}
        try:
            self._post(base)
        except Exception as exc:  # a request boundary: log it, keep serving
            self.close_connection = True
            self.server.log_event(
                {"event": "error", "received_at": _now(), "error": f"{type(exc).__name__}: {exc}",
                 **base}
            )  # fmt: skip

    def _post(self, base: dict[str, Any]) -> None:
        try:
            doc = parse_notification(self._body())
        except Rejected as exc:
            self.server.log_event(
                {"event": "rejected", "received_at": _now(), "status_code": exc.status,
                 "error": exc.reason, **base}
            )  # fmt: skip
            self._answer(exc.status, {"error": exc.reason})
            return
        try:
            self.server.record(doc)
        except OSError as exc:
            reason = f"cannot append to --out: {exc.strerror or exc}"
            self.server.log_event(
                {"event": "error", "received_at": _now(), "status_code": 500, "error": reason,
                 **base}
            )  # fmt: skip
            self._answer(500, {"error": reason})
            return
        self.server.log_event(
            {
                "event": "notification",
                "received_at": _now(),
                **base,
                "status": doc.get("status"),
                "receiver": doc.get("receiver"),
                "n_alerts": len(doc["alerts"]),
                "alertnames": _alertnames(doc),
                "notification": doc,
            }
        )
        self._answer(200, {"status": "ok"})

    def _body(self) -> bytes:
        raw = self.headers.get("Content-Length")
        if raw is None:
            self.close_connection = True  # a chunked or unframed body cannot be skipped
            raise Rejected(411, "Content-Length required")
        try:
            length = int(raw)
        except ValueError:
            self.close_connection = True
            raise Rejected(400, f"bad Content-Length {raw[:40]!r}") from None
        if length < 0:
            self.close_connection = True
            raise Rejected(400, f"bad Content-Length {length}")
        if length > self.server.max_bytes:
            self.close_connection = True
            self._drain(length)  # closing on unread data would reset the 413 away
            raise Rejected(413, f"body of {length} bytes exceeds {self.server.max_bytes}")
        body = self.rfile.read(length)
        if len(body) < length:
            self.close_connection = True
            raise Rejected(400, f"body ended after {len(body)} of {length} bytes")
        return body

    def _drain(self, length: int) -> None:
        """Read and drop up to DRAIN_LIMIT bytes of a body that is refused."""
        left = min(length, DRAIN_LIMIT)
        while left > 0:
            chunk = self.rfile.read(min(left, 65536))
            if not chunk:
                return
            left -= len(chunk)

    def _answer(self, status: int, doc: dict[str, Any]) -> None:
        payload = json.dumps(doc).encode() + b"\n"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the JSON lines are the log (http.server would write to stderr)."""


def make_server(
    host: str,
    port: int,
    *,
    out: Path | None = None,
    stream: IO[str] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> WebhookServer:
    """A bound receiver (``port`` 0: any free port; see ``.url``), not yet serving."""
    return WebhookServer((host, port), out=out, stream=stream, max_bytes=max_bytes)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Log every Alertmanager webhook notification as one JSON line on stdout.",
        epilog="Example: webhook_logger.py --host 0.0.0.0 --port 5001 --out /data/alerts.jsonl",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=5001, help="TCP port (0: any free port)")
    parser.add_argument("--out", type=Path, help="also append each notification to this file")
    parser.add_argument(
        "--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="largest body accepted"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 0 <= args.port <= 65535:
        print(f"webhook_logger: --port must be in 0..65535, got {args.port}", file=sys.stderr)
        return 2
    try:
        server = make_server(args.host, args.port, out=args.out, max_bytes=args.max_bytes)
    except OSError as exc:
        print(f"webhook_logger: cannot listen or open --out: {exc}", file=sys.stderr)
        return 2

    def stop(signum: int, frame: FrameType | None) -> None:
        # shutdown() waits for serve_forever() to return: call it from another thread
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.log_event({"event": "listening", "url": server.url, "out": str(args.out or "")})
    try:
        server.serve_forever()
    finally:
        server.server_close()
    server.log_event({"event": "stopped", "url": server.url})
    return 0


if __name__ == "__main__":
    sys.exit(main())
