"""Benchmark: one scrape round over many targets, bounded-concurrent vs one at a time.

Run: .venv/bin/python benchmarks/bench_scrape.py [--targets N] [--repeat R]

N targets (default 200) served by one threaded HTTP server process on 127.0.0.1, answering
tests/fixtures/metrics/vllm-0.33.0-metrics-full.txt (135 KB, 2 DP engines) with 5 ms of
server-side latency (a real engine's /metrics is not instant). Prints the median wall time
of a full scrape_all round (fetch + parse) for
  * baseline    one target at a time through one client (what a naive loop does),
  * shared      64 at a time through ONE shared httpx client,
  * per-target  64 at a time, one client per target (collector.sources.ClientPool, the
                collect loop's choice),
the ratios, and the share of a 15 s interval 1,000 such targets would take.
No asserts: machines are noisy; the same run measures both.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from collector.sources import ClientPool, Target, make_client, scrape_all  # noqa: E402
from tests.services import free_port  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "metrics" / "vllm-0.33.0-metrics-full.txt"
# The exporter runs in its own process so it does not share the scraper's GIL.
SERVER = """
import sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
body = open(sys.argv[1], "rb").read()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        time.sleep(0.005)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer.request_queue_size = 1024
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), H).serve_forever()
"""


async def _round(targets: list[Target], concurrency: int, repeat: int, pooled: bool) -> float:
    times = []
    client: httpx.AsyncClient | ClientPool = (
        ClientPool(timeout_s=30) if pooled else make_client(timeout_s=30, concurrency=concurrency)
    )
    try:
        for _ in range(repeat + 1):  # the first round warms connections and caches
            t0 = time.perf_counter()
            results = await scrape_all(
                targets,
                timeout_s=30,
                concurrency=concurrency,
                max_body_bytes=32 << 20,
                client=client,
            )
            times.append(time.perf_counter() - t0)
            down = [r.outcome for r in results if not r.outcome.up]
            if down:
                raise SystemExit(f"benchmark target failed: {down[0]}")
    finally:
        await client.aclose()
    return statistics.median(times[1:])


def _wait(port: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    body = FIXTURE.read_bytes()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(FIXTURE), str(port)])
    try:
        _wait(port)
        targets = [
            Target(f"e{i}", f"http://127.0.0.1:{port}/e{i}", "vllm") for i in range(args.targets)
        ]
        base = asyncio.run(_round(targets, 1, args.repeat, pooled=False))
        shared = asyncio.run(_round(targets, 64, args.repeat, pooled=False))
        pooled = asyncio.run(_round(targets, 64, args.repeat, pooled=True))
    finally:
        server.terminate()
        server.wait()
    n = args.targets
    print(f"targets: {n} x {len(body) / 1024:.0f} KB, 5 ms server latency")
    for label, secs in (
        ("baseline  1 at a time, one client  ", base),
        ("64 at a time, one shared client    ", shared),
        ("64 at a time, one client per target", pooled),
    ):
        print(f"{label}: {secs:7.3f} s/round {n / secs:8.1f} targets/s  x{base / secs:.1f}")
    print(f"per-target clients vs shared client: x{shared / pooled:.2f} throughput")
    print(f"1,000 targets at the per-target rate: {1000 * pooled / n:.2f} s of a 15 s interval")


if __name__ == "__main__":
    main()
