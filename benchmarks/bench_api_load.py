"""The advisory API under load: GET /v1/clusters/{c}/plan and GET /v1/clusters/{c}/signals at
rising concurrency over real uvicorn, against a bare FastAPI handler in the same run.

Run: .venv/bin/python benchmarks/bench_api_load.py [--seconds 3] [--concurrency 1,4,16,64]

A SQLite store under a temp dir gets the API tests' synthetic cluster (4 engines × 100 one-
minute windows ending within the last hour) and its saved plan (benchmarks/bench_api.py
build_store). Two servers in their own processes on free 127.0.0.1 ports, one uvicorn worker
each, the uvicorn settings `kvscope serve` uses (log_config None, log level warning, access
log off):
  * kvscope   ``python -m kvscope.cli serve --db …`` (create_app over the store),
  * baseline  a bare FastAPI app with one trivial async JSON handler on the same two paths
              (``{"ok": true}``: the cost of uvicorn + FastAPI + a JSON answer alone).
For each endpoint and each concurrency C (rising), C closed-loop workers, each on its own
keep-alive connection, drive each server for ``--seconds`` after 0.5 s of unmeasured warm-up,
the two servers in alternating order (A B, then B A: the machine's noise hits both). Printed
per step: requests/s, p50/p99 latency and errors for each server, the servers' CPU per
request (from /proc: less noisy than wall rates on a shared machine), and the ratios
kvscope/baseline. Default: 2 endpoints × 4 steps × 2 servers × 3 s = 48 s of measured load
(``--seconds 7.5`` gives kvscope alone the issue's 60 s), ~80 s in all with the store build
and the requests still in flight when a step ends. The client runs on the same cores as both
servers, so at high C it caps both rates.

Every request must answer 200: any error (status or transport) on either server exits 1.
Both servers are stopped (SIGTERM, then kill) before the script returns.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from fastapi import FastAPI  # noqa: E402

from benchmarks.bench_api import (  # noqa: E402
    CLUSTER,
    Server,
    _free_port,
    build_store,
    quantile,
    started,
)

ENDPOINTS = {
    "plan": f"/v1/clusters/{CLUSTER}/plan",
    # the synthetic windows end within the last hour: 2h finds every engine's latest
    "signals": f"/v1/clusters/{CLUSTER}/signals?since=2h",
}
WARMUP_S = 0.5
REQUEST_TIMEOUT_S = 30.0


def serve_bare(port: int) -> None:
    """The baseline server (run in a subprocess by this script): one trivial JSON handler."""
    app = FastAPI()

    @app.get("/v1/clusters/{cluster}/{what}")
    async def trivial(cluster: str, what: str) -> dict[str, bool]:
        return {"ok": True}

    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_config=None, log_level="warning", access_log=False
    )
    uvicorn.Server(config).run()


@dataclass
class Step:
    requests: int = 0
    seconds: float = 0.0
    server_cpu_s: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.server_cpu_s / self.requests if self.requests else float("nan")

    def line(self) -> str:
        lat = sorted(self.latencies)
        errors = sum(self.errors.values())
        detail = f" {dict(self.errors)}" if errors else ""
        return (
            f"{self.rate:7,.0f} req/s  p50 {1000 * quantile(lat, 0.5):7.1f} ms  "
            f"p99 {1000 * quantile(lat, 0.99):7.1f} ms  errors {errors}{detail}  "
            f"server CPU {self.cpu_ms:5.2f} ms/req"
        )


async def drive(server: Server, path: str, seconds: float, concurrency: int) -> Step:
    """``concurrency`` workers, each on its own keep-alive connection (one small client each:
    httpcore's pool scans all its connections per request, so ONE client of 64 connections
    would cap the rate itself — collector.scrape.ClientPool), each sending its next GET when
    the last answered: WARMUP_S unmeasured, then ``seconds`` measured."""
    step = Step()
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    tls = httpx.create_ssl_context()  # ~20 ms each: one for all the clients
    clients = [
        httpx.AsyncClient(
            base_url=server.base, limits=limits, timeout=REQUEST_TIMEOUT_S, verify=tls
        )
        for _ in range(concurrency)
    ]
    measuring = False
    stop = 0.0

    async def worker(client: httpx.AsyncClient) -> None:
        while (now := time.perf_counter()) < stop:
            try:
                resp = await client.get(path)
                error = None if resp.status_code == 200 else str(resp.status_code)
            except httpx.HTTPError as exc:
                error = type(exc).__name__
            if measuring:
                step.latencies.append(time.perf_counter() - now)
                if error is not None:
                    step.errors[error] += 1

    try:
        stop = time.perf_counter() + WARMUP_S
        await asyncio.gather(*(worker(c) for c in clients))
        cpu0 = server.cpu_s()
        t0 = time.perf_counter()
        measuring, stop = True, t0 + seconds
        await asyncio.gather(*(worker(c) for c in clients))
        step.seconds = time.perf_counter() - t0
        step.server_cpu_s = server.cpu_s() - cpu0
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))
    step.requests = len(step.latencies)
    return step


def load(servers: dict[str, Server], seconds: float, levels: list[int]) -> bool:
    """Every endpoint at every concurrency level on both servers; prints; False on an error."""
    ok = True
    order = list(servers)
    n = 0
    for endpoint, path in ENDPOINTS.items():
        print(f"GET {path}", flush=True)
        for c in levels:
            steps: dict[str, Step] = {}
            for name in order if n % 2 == 0 else reversed(order):
                steps[name] = asyncio.run(drive(servers[name], path, seconds, c))
                servers[name].check_alive()
            n += 1
            kv, bare = steps["kvscope"], steps["baseline"]
            for name, step in (("kvscope", kv), ("baseline", bare)):
                print(f"  {endpoint:<7} c={c:<3} {name:<8} {step.line()}", flush=True)
            lat_kv, lat_bare = sorted(kv.latencies), sorted(bare.latencies)
            print(
                f"  {endpoint:<7} c={c:<3} ratio kvscope/baseline: "
                f"{kv.rate / bare.rate:.2f}x req/s, "
                f"p50 {quantile(lat_kv, 0.5) / quantile(lat_bare, 0.5):.1f}x, "
                f"p99 {quantile(lat_kv, 0.99) / quantile(lat_bare, 0.99):.1f}x, "
                f"server CPU {kv.cpu_ms / bare.cpu_ms:.1f}x per request",
                flush=True,
            )
            ok = ok and not kv.errors and not bare.errors
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds a step")
    parser.add_argument("--concurrency", default="1,4,16,64", help="rising levels, e.g. 1,4,16")
    parser.add_argument("--serve-bare", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare:
        serve_bare(args.serve_bare)
        return 0
    levels = sorted({int(c) for c in args.concurrency.split(",")})
    if not levels or levels[0] < 1 or not 0 < args.seconds <= 60:
        parser.error("--concurrency: positive integers; --seconds: in (0, 60]")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvscope-bench-") as tmp_name:
        tmp = Path(tmp_name)
        url = build_store(tmp / "api.db")
        print(f"store with a saved plan built in {time.perf_counter() - start:.1f} s", flush=True)
        port = _free_port()
        kvscope_args = [
            sys.executable, "-m", "kvscope.cli", "serve", "--db", url,
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
        ]  # fmt: skip
        with started("kvscope", kvscope_args, port, "/healthz", tmp) as kv:
            for name, path in ENDPOINTS.items():
                resp = httpx.get(kv.base + path, timeout=REQUEST_TIMEOUT_S)
                resp.raise_for_status()
                extra = ""
                if name == "signals":
                    engines = resp.json()["engines"]
                    if not engines:
                        raise SystemExit("signals: no engine in the answer (store too old?)")
                    extra = f", {len(engines)} engines"
                print(f"GET {path}: {len(resp.content):,} bytes of JSON{extra}", flush=True)
            bare_port = _free_port()
            bare_args = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--serve-bare",
                str(bare_port),
            ]
            with started("baseline", bare_args, bare_port, ENDPOINTS["plan"], tmp) as bare:
                ok = load({"kvscope": kv, "baseline": bare}, args.seconds, levels)
            kv.check_alive()
    verdict = "zero errors" if ok else "ERRORS (see above): FAIL"
    print(f"total {time.perf_counter() - start:.0f} s; {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
