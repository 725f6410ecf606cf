"""The advisory API over real HTTP: GET /v1/clusters/{c}/plan against a bare FastAPI app
serving the same bytes, and a burst of POST /v1/advise against the bounded pool.

Run: .venv/bin/python benchmarks/bench_api.py [--seconds 5] [--rounds 2] [--concurrency 16]
     [--burst 50]

A SQLite store under a temp dir gets a synthetic cluster and its saved plan (the API tests'
helpers: tests/planner/synthstore.py, planner.plan.build_plan, plan_records,
Store.save_plan). Two servers run in their own processes on free 127.0.0.1 ports, one uvicorn
worker each, same uvicorn settings (log_config None, log level warning, access log off):
  * kvscope   ``python -m kvscope.cli serve --db … --log-level warning`` (create_app over the
              store: cluster lookup, latest plan read from SQLite, JSON written per request),
  * baseline  a bare FastAPI app whose one async handler, on the same path, returns the
              kvscope answer's bytes from memory (the cost of uvicorn + FastAPI alone).
One httpx async client (``--concurrency`` connections and as many workers, each sending its
next request when the last answered) drives each server for ``--seconds``, after 0.5 s of
warm-up on the same connections, ``--rounds`` times in alternating order (A B B A …: the
machine's noise hits both). Printed per server: requests/s, p50 and p99 latency, and the
server's CPU time per request (from /proc: less noisy than wall rates on a shared machine);
then the ratio kvscope/baseline of requests/s against the target >= 0.5 (PASS/FAIL, no exit
status: machines are noisy). The client runs on the same cores, so it caps both rates.

Then ``--burst`` concurrent POST /v1/advise with distinct bodies (the seed differs: no cache
hit), each a short simulation: every one must be answered, 200 or 429 with Retry-After, none
5xx, none hung (60 s client timeout). That check failing, or a server failing, exits 1.
Both servers are stopped (SIGTERM, then kill) before the script returns; ~40 s in all.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi.responses import Response  # noqa: E402

from planner.plan import build_plan, plan_records  # noqa: E402
from store.store import Store  # noqa: E402
from tests.planner.synthstore import fill_store, shifted_frame  # noqa: E402
from tests.services import free_port  # noqa: E402

CLUSTER = "synth"
PLAN_PATH = f"/v1/clusters/{CLUSTER}/plan"
TARGET = 0.5
BURST_TIMEOUT_S = 60.0
# A what-if that simulates in well under a second (tests/api/conftest.py's CHEAP_WHATIF,
# shorter); the seed makes each body of the burst distinct.
WHATIF: dict[str, Any] = {
    "model": "llama-3.1-8b",
    "gpu": "h100",
    "tp": 1,
    "prompt_tokens": 2000,
    "output_tokens": 32,
    "qps": 0.5,
    "prefix_share": 0.5,
    "engines": 1,
    "duration_s": 10.0,
}
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def build_store(path: Path) -> str:
    """A SQLite store with the synthetic cluster and its latest plan saved; its URL."""
    url = f"sqlite:///{path}"
    frame = shifted_frame(n_engines=4, n_windows=100, modes=("none", "native"))
    fill_store(url, frame, cluster=CLUSTER)
    with Store(url) as store:
        plan = build_plan(store, cluster=CLUSTER, horizon_s=3600, forecast_seconds=0.3)
        for record in plan_records(plan, cluster=CLUSTER, version="0.1.0", created_at=time.time()):
            store.save_plan(record)
    return url


def serve_bare(port: int, body_file: Path) -> None:
    """The baseline server (run in a subprocess by this script): one route, bytes from memory."""
    body = body_file.read_bytes()
    app = FastAPI()

    @app.get("/v1/clusters/{cluster}/plan")
    async def plan(cluster: str) -> Response:
        return Response(body, media_type="application/json")

    # The settings `kvscope serve` gives uvicorn (kvscope/commands/serve.py).
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_config=None, log_level="warning", access_log=False
    )
    uvicorn.Server(config).run()


@dataclass
class Server:
    name: str
    base: str
    proc: subprocess.Popen[bytes]
    log: Path

    def cpu_s(self) -> float:
        """User + system CPU seconds of the server process so far (0 without /proc)."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.name} server exited ({self.proc.returncode}):\n{tail}")


def _free_port() -> int:
    return free_port()


@contextmanager
def started(
    name: str, args: list[str], port: int, ready_path: str, logdir: Path
) -> Iterator[Server]:
    """A server process on 127.0.0.1:``port``, up once ``ready_path`` answers 200; stopped
    (SIGTERM, then kill after 10 s) on exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    log = logdir / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    server = Server(name, f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            server.check_alive()
            try:
                if httpx.get(server.base + ready_path, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} server did not come up in 30 s")
            time.sleep(0.1)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass
class Segment:
    requests: int = 0
    seconds: float = 0.0
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    bad: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)


async def drive(server: Server, seconds: float, concurrency: int, warmup_s: float = 0.5) -> Segment:
    """``concurrency`` workers on as many connections, each sending its next GET when the last
    answered: ``warmup_s`` unmeasured, then ``seconds`` measured."""
    seg = Segment()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=server.base, limits=limits, timeout=30) as client:
        measuring = False
        stop = 0.0

        async def worker() -> None:
            while (now := time.perf_counter()) < stop:
                try:
                    resp = await client.get(PLAN_PATH)
                    status = str(resp.status_code) if resp.status_code != 200 else None
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                if measuring:
                    seg.latencies.append(time.perf_counter() - now)
                    if status is not None:
                        seg.bad[status] += 1

        stop = time.perf_counter() + warmup_s
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        cpu0, client0 = server.cpu_s(), time.process_time()
        t0 = time.perf_counter()
        measuring, stop = True, t0 + seconds
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seg.seconds = time.perf_counter() - t0
        seg.server_cpu_s = server.cpu_s() - cpu0
        seg.client_cpu_s = time.process_time() - client0
    seg.requests = len(seg.latencies)
    return seg


def quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def merged(segments: list[Segment]) -> Segment:
    out = Segment()
    for s in segments:
        out.requests += s.requests
        out.seconds += s.seconds
        out.server_cpu_s += s.server_cpu_s
        out.client_cpu_s += s.client_cpu_s
        out.bad.update(s.bad)
        out.latencies.extend(s.latencies)
    out.latencies.sort()
    return out


def describe(name: str, seg: Segment) -> str:
    lat = sorted(seg.latencies)
    rate = seg.requests / seg.seconds if seg.seconds else 0.0
    cpu_us = 1e6 * seg.server_cpu_s / seg.requests if seg.requests else float("nan")
    bad = f", NOT 200: {dict(seg.bad)}" if seg.bad else ""
    return (
        f"{name}: {rate:,.0f} req/s ({seg.requests:,} in {seg.seconds:.1f} s), "
        f"p50 {1000 * quantile(lat, 0.50):.1f} ms, p99 {1000 * quantile(lat, 0.99):.1f} ms, "
        f"server CPU {cpu_us:,.0f} us/req, client CPU {seg.client_cpu_s:.1f} s{bad}"
    )


def throughput(servers: dict[str, Server], seconds: float, rounds: int, concurrency: int) -> bool:
    """The alternating GET runs; prints the figures; False when a request failed."""
    runs: dict[str, list[Segment]] = {name: [] for name in servers}
    names = list(servers)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            seg = asyncio.run(drive(servers[name], seconds, concurrency))
            servers[name].check_alive()
            runs[name].append(seg)
            print(f"  round {r + 1} {describe(name, seg)}", flush=True)
    total = {name: merged(segs) for name, segs in runs.items()}
    for name, seg in total.items():
        print(describe(name, seg))
    rate = {n: s.requests / s.seconds for n, s in total.items()}
    ratio = rate["kvscope"] / rate["baseline"]
    cpu = {n: s.server_cpu_s / s.requests for n, s in total.items()}
    verdict = "PASS" if ratio >= TARGET else "FAIL"
    print(
        f"ratio kvscope/baseline {ratio:.2f}x req/s (target >= {TARGET}: {verdict}); "
        f"server CPU per request {cpu['kvscope'] / cpu['baseline']:.2f}x the baseline's"
    )
    return not any(s.bad for s in total.values())


async def burst(server: Server, n: int) -> bool:
    """``n`` concurrent distinct what-ifs; prints the statuses; True when every one was
    answered 200, or 429 with Retry-After."""
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(
        base_url=server.base, limits=limits, timeout=BURST_TIMEOUT_S
    ) as client:

        async def one(seed: int) -> tuple[str, float, httpx.Response | None]:
            t0 = time.perf_counter()
            try:
                resp = await client.post("/v1/advise", json={**WHATIF, "seed": seed})
            except httpx.HTTPError as exc:
                return type(exc).__name__, time.perf_counter() - t0, None
            return str(resp.status_code), time.perf_counter() - t0, resp

        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(seed) for seed in range(n)))
        wall = time.perf_counter() - t0
    statuses = Counter(status for status, _, _ in results)
    no_retry_after = sum(
        1 for s, _, r in results if s == "429" and r is not None and "retry-after" not in r.headers
    )
    retry_after = sorted(
        {
            r.headers["retry-after"]
            for s, _, r in results
            if s == "429" and r is not None and "retry-after" in r.headers
        }
    )
    misses = sum(
        1
        for s, _, r in results
        if s == "200" and r is not None and r.headers.get("x-kvscope-cache") == "miss"
    )
    slowest = {s: max(t for s2, t, _ in results if s2 == s) for s in statuses}
    print(
        f"burst of {n} POST /v1/advise (distinct bodies): {dict(sorted(statuses.items()))} "
        f"in {wall:.2f} s wall; 200s simulated (cache miss): {misses}; Retry-After values "
        f"{retry_after}; slowest answer per status "
        f"{ {s: round(t, 2) for s, t in sorted(slowest.items())} } s"
    )
    checks = {
        f"every request answered within {BURST_TIMEOUT_S:.0f} s": sum(statuses.values()) == n
        and all(s.isdigit() for s in statuses),
        "only 200 or 429": set(statuses) <= {"200", "429"},
        "no 5xx": not any(s.startswith("5") for s in statuses),
        "Retry-After on every 429": no_retry_after == 0,
    }
    for what, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {what}")
    return all(checks.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs per server, alternating")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--burst", type=int, default=50)
    parser.add_argument("--serve-bare", nargs=2, metavar=("PORT", "BODY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare:
        serve_bare(int(args.serve_bare[0]), Path(args.serve_bare[1]))
        return 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvscope-bench-") as tmp_name:
        tmp = Path(tmp_name)
        url = build_store(tmp / "api.db")
        print(f"store with a saved plan built in {time.perf_counter() - start:.1f} s", flush=True)
        port = _free_port()
        kvscope_args = [
            sys.executable,
            "-m",
            "kvscope.cli",
            "serve",
            "--db",
            url,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
        with started("kvscope", kvscope_args, port, "/healthz", tmp) as kv:
            body = httpx.get(kv.base + PLAN_PATH, timeout=30)
            body.raise_for_status()
            (tmp / "plan.json").write_bytes(body.content)
            print(f"GET {PLAN_PATH}: {len(body.content):,} bytes of JSON", flush=True)
            port = _free_port()
            bare_args = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--serve-bare",
                str(port),
                str(tmp / "plan.json"),
            ]
            with started("baseline", bare_args, port, PLAN_PATH, tmp) as bare:
                ok = throughput(
                    {"baseline": bare, "kvscope": kv}, args.seconds, args.rounds, args.concurrency
                )
            ok = asyncio.run(burst(kv, args.burst)) and ok
            kv.check_alive()
    print(f"total {time.perf_counter() - start:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
