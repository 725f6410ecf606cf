"""The collector under load: `kvscope collect` over 1,000 simulated vLLM targets at a 15 s
interval, the target set growing from 100 to 1,000 while it runs; CPU per interval, round
time and tick lag, against a bare httpx GET loop over the same targets in the same run.

Run: .venv/bin/python benchmarks/bench_collector_load.py [--interval 15] [--steady-ticks 4]
     [--targets 1000] [--start 100] [--step 300]

* Targets: ONE server process (asyncio, 127.0.0.1, one port) serves ``--targets`` paths
  ``/t/NNNN/metrics``, each tests/fixtures/metrics/vllm-0.33.0-metrics-default.txt (48 KB,
  vLLM 0.33's own exposition) with its counters moving at every hit of that path (counter
  +5, histogram count +1 in its middle bucket and above, sum to match), as plain text 0.0.4.
  It records when each path is hit, and exits after ``--max-run-s`` whatever happens.
* Baseline: in this process, the same targets fetched by a bare asyncio loop (one httpx
  client per target as the collector keeps, 64 at a time as its default concurrency, body
  read, nothing parsed): the cost of just fetching the bodies. A warm-up round, then 3
  measured; CPU seconds from ``time.process_time``.
* Collector: ``python -m kvscope.cli collect --file-sd FILE --interval 15s --window 60s
  --metrics-addr …`` on a fresh SQLite store, a real subprocess at the real interval (no
  scaling; ``--interval`` shortens it for a quicker look). Its file_sd file (one group per
  target: instance label, __metrics_path__) is rewritten (rename-replace) 1.5 s before each
  tick: ``--start`` targets, ``--step`` more each tick up to ``--targets``, then
  ``--steady-ticks`` ticks at the full set (the loop's immediate first tick, at start-up, is
  not measured). Ticks sit on multiples of the interval, so the process' CPU (utime + stime,
  /proc/PID/stat) sampled 1.5 s before each tick is one interval's cost (scrape, parse,
  roll-up, outcomes, checkpoints; every 60 s the windows that closed). A tick's round is its
  GETs as the server saw them (hits clustered into rounds), timed from the tick's scheduled
  start to its last GET; the tick lag (how late a tick started) is the collector's own
  health gauge (core.kvscope_metrics COLLECTOR_TICK_LAG), its max from the JSON summary the
  collector prints after SIGTERM.
Printed: per tick, targets, GETs, CPU-s, CPU-s per 1,000 scrapes and its ratio to the
baseline's, round time and lag; the steady phase's CPU per interval and per 1,000 scrapes
(its ratio to the bare GET loop), rounds, lag and skipped ticks (target: none). Exit 1 only
when the collector failed (exit status, scrape errors, a target down, a tick that scraped
part of its targets); a skipped tick is a finding, reported. ~2.5 minutes by default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from core.kvscope_metrics import (  # noqa: E402
    COLLECTOR_SKIPPED_TICKS,
    COLLECTOR_TARGETS,
    COLLECTOR_TICK_LAG,
)
from tests.services import free_port  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "metrics" / "vllm-0.33.0-metrics-default.txt"
CLK_TCK = os.sysconf("SC_CLK_TCK")
CONCURRENCY = 64  # kvscope's default scrape_concurrency (kvscope/cli_settings.py)
SAMPLE_BEFORE_S = 1.5  # CPU sampled, and the file_sd file rewritten, this long before a tick
STARTUP_S = 8.0  # imports + the loop's immediate first tick (100 new targets registered)
SAMPLE = re.compile(r"^([^\s{]+)(\{[^}]*\})? (\S+)$")
LE = re.compile(r'le="([^"]+)"')


# --------------------------------------------------------------------------- the targets


class Template:
    """The fixture as static text and moving values: ``render(n)`` is the body of the n-th hit."""

    def __init__(self, text: str) -> None:
        kinds: dict[str, str] = {}
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ", 3)
                kinds[name] = kind
        middle = self._middle_buckets(text, kinds)
        self.static: list[str] = []
        self.moving: list[tuple[float, float]] = []  # (value at hit 0, added per hit)
        pending: list[str] = []
        for line in text.splitlines(keepends=True):
            m = SAMPLE.match(line.rstrip("\n"))
            step = self._step(m, kinds, middle) if m is not None else 0.0
            if m is None or not step:
                pending.append(line)
                continue
            pending.append(f"{m.group(1)}{m.group(2) or ''} ")
            self.static.append("".join(pending))
            self.moving.append((float(m.group(3)), step))
            pending = ["\n"]
        self.tail = "".join(pending)

    @staticmethod
    def _family(name: str, kinds: dict[str, str]) -> tuple[str, str]:
        for suffix in ("_bucket", "_count", "_sum", ""):
            base = name.removesuffix(suffix) if suffix else name
            if suffix and not name.endswith(suffix):
                continue
            if base in kinds:
                return base, suffix
        return name, ""

    def _middle_buckets(self, text: str, kinds: dict[str, str]) -> dict[str, float]:
        """Per histogram family, the bucket bound new observations fall at or below."""
        bounds: dict[str, set[float]] = {}
        for line in text.splitlines():
            m = SAMPLE.match(line)
            if m is None or not m.group(1).endswith("_bucket"):
                continue
            family, _ = self._family(m.group(1), kinds)
            le = LE.search(m.group(2) or "")
            if kinds.get(family) == "histogram" and le is not None:
                bounds.setdefault(family, set()).add(float(le.group(1)))
        return {f: sorted(b)[len(b) // 2] for f, b in bounds.items()}

    def _step(self, m: re.Match[str], kinds: dict[str, str], middle: dict[str, float]) -> float:
        family, suffix = self._family(m.group(1), kinds)
        kind = kinds.get(family)
        if kind == "counter" and not m.group(1).endswith("_created"):
            return 5.0
        if kind != "histogram" or family not in middle:
            return 0.0
        if suffix == "_count":
            return 1.0
        if suffix == "_sum":
            return middle[family] if math.isfinite(middle[family]) else 1.0
        le = LE.search(m.group(2) or "")
        return 1.0 if suffix == "_bucket" and le and float(le.group(1)) >= middle[family] else 0.0

    def render(self, n: int) -> bytes:
        moving = zip(self.static, self.moving, strict=True)
        parts = [f"{s}{base + step * n!r}" for s, (base, step) in moving]
        return ("".join(parts) + self.tail).encode()


def serve_targets(port: int, max_run_s: float) -> None:
    """The targets' server (a subprocess of this script): GET /t/NNNN/metrics renders that
    path's next body; GET /_hits returns (and forgets) the hit times so far."""
    template = Template(FIXTURE.read_text())
    hits: dict[str, int] = {}
    stamps: list[float] = []
    head_ok = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                if path.startswith("/t/"):
                    n = hits.get(path, 0)
                    hits[path] = n + 1
                    stamps.append(time.time())
                    body, ctype = template.render(n), b"text/plain; version=0.0.4; charset=utf-8"
                elif path == "/_hits":
                    body, ctype = json.dumps(stamps).encode(), b"application/json"
                    stamps.clear()
                else:
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                writer.write(head_ok % (ctype, len(body)) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        async with server:
            await asyncio.sleep(max_run_s)  # stops by itself even if the parent died

    asyncio.run(main())


# --------------------------------------------------------------------------- measuring


def cpu_s(pid: int) -> float:
    """utime + stime of a process so far, in seconds (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


async def baseline(base: str, paths: list[str], rounds: int) -> tuple[float, float]:
    """(CPU-s, wall-s) of one round of bare GETs over ``paths`` (median of ``rounds``)."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    tls = httpx.create_ssl_context()  # ~20 ms each: one for all, as collector.scrape does
    clients = [
        httpx.AsyncClient(base_url=base, timeout=30, limits=limits, verify=tls) for _ in paths
    ]
    gate = asyncio.Semaphore(CONCURRENCY)

    async def get(client: httpx.AsyncClient, path: str) -> int:
        async with gate:
            resp = await client.get(path)
            resp.raise_for_status()
            return len(resp.content)

    cpu, wall = [], []
    try:
        for r in range(rounds + 1):  # the first round opens the connections
            c0, t0 = time.process_time(), time.perf_counter()
            await asyncio.gather(*(get(c, p) for c, p in zip(clients, paths, strict=True)))
            if r:
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - t0)
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))
    return statistics.median(cpu), statistics.median(wall)


def write_file_sd(path: Path, hostport: str, n: int) -> None:
    groups = [
        {"targets": [hostport], "labels": {"instance": f"t{i:04d}",
                                           "__metrics_path__": f"/t/{i:04d}/metrics"}}
        for i in range(n)
    ]  # fmt: skip
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    tmp.replace(path)  # rename-replace: a new inode, as file_sd watchers expect


def health(url: str) -> dict[str, float]:
    """The collector's unlabelled health gauges we print (names from core.kvscope_metrics)."""
    wanted = {COLLECTOR_TICK_LAG.name, COLLECTOR_SKIPPED_TICKS.name, COLLECTOR_TARGETS.name}
    out: dict[str, float] = {}
    try:
        text = httpx.get(url, timeout=10).text  # a busy collector answers slowly (GIL)
    except httpx.HTTPError:
        return out
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in wanted:
            out[name] = float(value)
    return out


def sleep_until(t: float) -> None:
    while (left := t - time.time()) > 0:
        time.sleep(min(left, 0.5))


@dataclass
class Tick:
    at: float  # scheduled start (a multiple of the interval)
    targets: int  # in the file_sd file for this tick
    cpu_s: float = math.nan
    hits: int = 0  # GETs of its round
    round_s: float = math.nan
    lag_s: float = math.nan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interval", type=float, default=15.0, help="collect interval, seconds")
    ap.add_argument("--targets", type=int, default=1000)
    ap.add_argument("--start", type=int, default=100, help="targets at the first tick")
    ap.add_argument("--step", type=int, default=300, help="targets added at each tick")
    ap.add_argument("--steady-ticks", type=int, default=4, help="ticks at the full set")
    ap.add_argument("--max-run-s", type=float, default=600.0, help=argparse.SUPPRESS)
    ap.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve_targets(args.serve, args.max_run_s)
        return 0
    if not (2 <= args.interval <= 60 and 1 <= args.start <= args.targets and args.step > 0):
        ap.error("--interval in [2, 60] s, 1 <= --start <= --targets, --step > 0")
    began = time.perf_counter()
    sizes = list(range(args.start, args.targets, args.step)) + [args.targets] * args.steady_ticks
    budget = 180 + args.interval * (len(sizes) + 3)  # the server's own end, in any case
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--max-run-s", str(budget)]
    )
    proc: subprocess.Popen[bytes] | None = None
    ok = True
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 10
        while True:
            try:
                httpx.get(f"{base}/_hits", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the targets' server did not start") from None
                time.sleep(0.05)
        body = len(Template(FIXTURE.read_text()).render(0))
        paths = [f"/t/{i:04d}/metrics" for i in range(args.targets)]
        base_cpu, base_wall = asyncio.run(baseline(base, paths, rounds=3))
        base_per_k = base_cpu * 1000 / args.targets
        print(
            f"targets: {args.targets:,} paths on one local server, {body / 1024:.0f} KB each "
            f"(vLLM 0.33 default exposition, counters moving per hit)", flush=True
        )  # fmt: skip
        print(
            f"baseline: bare httpx GET loop, {CONCURRENCY} at a time, one client per target: "
            f"{base_cpu:.2f} CPU-s and {base_wall:.2f} s wall a round of {args.targets:,} "
            f"= {base_per_k:.2f} CPU-s per 1,000 scrapes (median of 3)", flush=True
        )  # fmt: skip
        httpx.get(f"{base}/_hits", timeout=10)  # forget the baseline's hits

        with tempfile.TemporaryDirectory(prefix="kvscope-bench-") as tmp_name:
            tmp = Path(tmp_name)
            sd = tmp / "targets.json"
            hostport = f"127.0.0.1:{port}"
            write_file_sd(sd, hostport, sizes[0])
            metrics_port = free_port()
            metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
            iv = args.interval
            env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
            cmd = [
                sys.executable, "-m", "kvscope.cli", "collect", "--file-sd", str(sd),
                "--db", f"sqlite:///{tmp / 'kvscope.db'}", "--interval", f"{iv:g}s",
                "--window", "60s", "--metrics-addr", f"127.0.0.1:{metrics_port}", "-q",
            ]  # fmt: skip
            # to files, not pipes: a collector logging many errors must never block on one
            out_file, err_file = tmp / "collect.out", tmp / "collect.err"
            launched = time.time()
            with out_file.open("w") as out, err_file.open("w") as err:
                proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err)
            collector = proc
            # the loop's first tick runs at once (start-up, not measured); the first measured
            # one is the first tick boundary STARTUP_S after the launch
            first = (math.floor((launched + STARTUP_S) / iv) + 1) * iv
            ticks = [Tick(first + i * iv, n) for i, n in enumerate(sizes)]
            print(
                f"kvscope collect --file-sd (pid {collector.pid}), interval {iv:g} s, window "
                f"60 s: {' → '.join(str(n) for n in sorted(set(sizes)))} targets, then "
                f"{args.steady_ticks} ticks at {args.targets:,}; measuring "
                f"{len(ticks) * iv:.0f} s ...", flush=True
            )  # fmt: skip
            stamps: list[float] = []
            last_cpu = math.nan
            for i, tick in enumerate([*ticks, Tick(first + len(ticks) * iv, 0)]):
                sleep_until(tick.at - SAMPLE_BEFORE_S)
                if collector.poll() is not None:
                    raise SystemExit(f"collector exited: {err_file.read_text()[-2000:]}")
                now_cpu = cpu_s(collector.pid)
                gauges = health(metrics_url)
                fetched = json.loads(httpx.get(f"{base}/_hits", timeout=10).text)
                stamps.extend(t for t in fetched if t >= first - SAMPLE_BEFORE_S)
                if i > 0:
                    ticks[i - 1].cpu_s = now_cpu - last_cpu
                    ticks[i - 1].lag_s = gauges.get(COLLECTOR_TICK_LAG.name, math.nan)
                last_cpu = now_cpu
                if i < len(ticks):
                    write_file_sd(sd, hostport, tick.targets)
            t_stop = time.perf_counter()
            collector.send_signal(signal.SIGTERM)
            collector.wait(timeout=120)
            stop_s = time.perf_counter() - t_stop
            if collector.returncode != 0:
                print(f"collector exit {collector.returncode}: {err_file.read_text()[-2000:]}")
                return 1
            summary = json.loads(out_file.read_text().strip().splitlines()[-1])
            errors_logged = err_file.read_text().count("\n")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        server.terminate()
        server.wait(10)
    for start, count, end in rounds(stamps):
        for t in ticks:  # a round belongs to the tick scheduled last before it began
            if t.at - SAMPLE_BEFORE_S <= start < t.at + iv - SAMPLE_BEFORE_S:
                t.hits, t.round_s = t.hits + count, end - t.at
    print(f"{'tick':>4} {'targets':>7} {'scraped':>7} {'CPU-s':>6} {'CPU-s/1k':>8} "
          f"{'×base':>6} {'round s':>7} {'lag s':>6}")  # fmt: skip
    ok = not summary["errors"] and summary["targets_down"] == 0
    for i, t in enumerate(ticks, 1):
        per_k = t.cpu_s * 1000 / t.hits if t.hits else math.nan
        note = "" if t.hits else "  skipped (the tick before overran the interval)"
        print(
            f"{i:>4} {t.targets:>7,} {t.hits:>7,} {t.cpu_s:>6.2f} {per_k:>8.2f} "
            f"{per_k / base_per_k:>6.1f} {t.round_s:>7.2f} {t.lag_s:>6.3f}{note}"
        )
        ok = ok and t.hits in (0, t.targets)  # a tick scrapes every target, or is skipped
    steady = ticks[-args.steady_ticks :]
    ran = [t for t in steady if t.hits]
    cpu = sum(t.cpu_s for t in steady)
    per_k = cpu * 1000 / max(1, sum(t.hits for t in steady))
    print(
        f"steady, {args.targets:,} targets every {iv:g} s ({len(steady)} intervals): CPU "
        f"{cpu / len(steady):.2f} s per interval = {100 * cpu / len(steady) / iv:.0f}% of one "
        f"core; {per_k:.2f} CPU-s per 1,000 scrapes = {per_k / base_per_k:.1f}x the bare GET "
        f"loop's {base_per_k:.2f}; round (scheduled start to last GET) "
        f"{statistics.mean(t.round_s for t in ran):.2f} s mean, "
        f"{max(t.round_s for t in ran):.2f} s max of the {iv:g} s interval"
    )
    skipped = summary["skipped_ticks"]
    print(
        f"tick lag: last {steady[-1].lag_s:.3f} s, max {summary['max_lag_s']:.3f} s (JSON "
        f"summary); skipped ticks {skipped} (target 0: {'PASS' if not skipped else 'FAIL'}); "
        f"scrapes {summary['scrapes']:,}, windows written {summary['windows_written']:,}, "
        f"errors {summary['errors'] or 'none'}; SIGTERM to exit (flush) {stop_s:.1f} s"
    )
    if errors_logged:
        print(f"collector stderr: {errors_logged} lines")
    # exit 1 only when the collector failed; a skipped tick is a finding (noisy machines)
    print(f"total {time.perf_counter() - began:.0f} s; {'ok' if ok else 'COLLECTOR FAILED'}")
    return 0 if ok else 1


def rounds(stamps: list[float], gap_s: float = 1.0) -> list[tuple[float, int, float]]:
    """The scrape rounds in the server's hit times: (first hit, hits, last hit), a new round
    after ``gap_s`` without a hit (a round's GETs are back to back; ticks seconds apart)."""
    out: list[tuple[float, int, float]] = []
    for t in sorted(stamps):
        if out and t - out[-1][2] <= gap_s:
            first, n, _ = out[-1]
            out[-1] = (first, n + 1, t)
        else:
            out.append((t, 1, t))
    return out


if __name__ == "__main__":
    sys.exit(main())
