"""Benchmark: the CPU of one scrape's HTTP GET — collector.http1 against httpx — and of a
whole scrape (GET + parse).

Run: .venv/bin/python benchmarks/bench_scrape.py [--targets N] [--rounds R]

N targets (default 200) on benchmarks/bench_collector_load.py's server (one asyncio process
on 127.0.0.1, N paths, each vLLM 0.33's default exposition, 554 lines / 48 KB, values moving
at every hit). In this process, R rounds (after one that opens the connections) of a GET of
every target, 64 at a time, one keep-alive connection per target:

* httpx     one ``httpx.AsyncClient`` per target (the collector's client before http1);
* http1     collector.http1.Connection (the collector's client);
* scrape    collector.scrape.scrape_all with its ClientPool: GET, inflate/cap, parse in a
            worker thread, the outcome — what ``kvscope collect`` spends per scrape before
            roll-up and store.

Printed: the median CPU (process time, all threads) per GET of each, and http1's ratio to
httpx. No asserts: machines are noisy; the same run measures all of them.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_collector_load import CONCURRENCY, baseline  # noqa: E402
from collector.http1 import Connection, HTTPClientError  # noqa: E402
from collector.scrape import ClientPool, Target, scrape_all  # noqa: E402
from tests.services import free_port  # noqa: E402

SERVER = (
    "import sys; sys.path.insert(0, {root!r}); "
    "from benchmarks.bench_collector_load import serve_targets; serve_targets({port}, 600)"
)


async def _http1(base: str, paths: list[str], rounds: int) -> float:
    """CPU-s of one round of GETs over ``paths`` through http1 (median of ``rounds``)."""
    conns = [Connection(ssl.create_default_context, user_agent="bench") for _ in paths]
    gate = asyncio.Semaphore(CONCURRENCY)

    async def get(conn: Connection, path: str) -> int:
        async with gate:
            resp = await conn.get(base + path, {"Accept": "text/plain"})
            try:
                size = sum([len(c) async for c in conn.body(resp)])
            finally:
                conn.release()
            if resp.status != 200:
                raise SystemExit(f"benchmark target failed: HTTP {resp.status}")
            return size

    cpu = []
    try:
        for r in range(rounds + 1):  # the first round opens the connections
            c0 = time.process_time()
            await asyncio.gather(*(get(c, p) for c, p in zip(conns, paths, strict=True)))
            if r:
                cpu.append(time.process_time() - c0)
    finally:
        await asyncio.gather(*(c.aclose() for c in conns))
    return statistics.median(cpu)


async def _scrape(base: str, paths: list[str], rounds: int) -> float:
    targets = [Target(f"t{i}", base + p, "vllm") for i, p in enumerate(paths)]
    cpu = []
    async with ClientPool() as pool:
        for r in range(rounds + 1):
            c0 = time.process_time()
            results = await scrape_all(
                targets, timeout_s=30, concurrency=CONCURRENCY, max_body_bytes=32 << 20, client=pool
            )
            if r:
                cpu.append(time.process_time() - c0)
            down = [x.outcome for x in results if not x.outcome.up]
            if down:
                raise SystemExit(f"benchmark target failed: {down[0]}")
    return statistics.median(cpu)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER.format(root=str(ROOT), port=port)])
    base = f"http://127.0.0.1:{port}"
    paths = [f"/t/{i:04d}/metrics" for i in range(args.targets)]
    try:
        deadline = time.monotonic() + 30
        while True:  # the server is up when a GET goes through
            try:
                asyncio.run(_http1(base, paths[:1], 1))
                break
            except (OSError, HTTPClientError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        rows: dict[str, list[float]] = {"httpx": [], "http1": [], "scrape": []}
        for _ in range(2):  # interleaved, so that a noisy spell hits both
            rows["httpx"].append(asyncio.run(baseline(base, paths, args.rounds))[0])
            rows["http1"].append(asyncio.run(_http1(base, paths, args.rounds)))
            rows["scrape"].append(asyncio.run(_scrape(base, paths, args.rounds)))
    finally:
        server.terminate()
        server.wait()
    n = args.targets
    ms = {k: statistics.median(v) / n * 1e3 for k, v in rows.items()}
    print(f"{n} targets x vLLM 0.33 default exposition (48 KB), {CONCURRENCY} at a time")
    print(f"  httpx   GET            {ms['httpx']:.3f} ms CPU per GET")
    print(f"  http1   GET            {ms['http1']:.3f} ms CPU per GET")
    print(f"  scrape  GET + parse    {ms['scrape']:.3f} ms CPU per scrape")
    print(f"http1 / httpx: {ms['http1'] / ms['httpx']:.2f}x the CPU per GET")


if __name__ == "__main__":
    main()
