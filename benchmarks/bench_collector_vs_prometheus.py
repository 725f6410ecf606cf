"""`kvscope collect` against Prometheus on the same targets: CPU-seconds per 1,000 scrapes.

Run: .venv/bin/python benchmarks/bench_collector_vs_prometheus.py [--targets 200 1000]
     [--interval 10] [--intervals 6]

For each N in ``--targets``: ONE local server process (benchmarks/bench_collector_load.py's:
asyncio on 127.0.0.1, N paths, each vLLM 0.33's own default exposition, 554 lines / 48 KB,
its counters and histograms moving at every hit) is scraped, one after the other, by

* Debian's Prometheus 2.42 (``/usr/bin/prometheus``; file_sd with the N targets,
  ``scrape_interval`` = ``--interval``, a fresh TSDB, its defaults otherwise), then
* ``kvscope collect --file-sd`` with the same file, the same interval, a 60 s window and a
  fresh SQLite store (its defaults otherwise: outcomes on, a checkpoint at each window's
  close and at least every 60 s), and with ``--every-tick`` once more with a checkpoint
  after every tick (``--checkpoint-every 0``).

Each runs for a warm-up of 2 intervals (start-up, the first scrape of every target, series
creation) and then ``--intervals`` measured intervals; its CPU is utime + stime of its
process (/proc/PID/stat) over the measured span, its scrapes the GETs the server saw in that
span. Printed per N: CPU-s per 1,000 scrapes for each and kvscope's ratio to Prometheus's
(the issue's target: <= 1.0). The two are measured in the same run on the same machine, so
the ratio holds on a noisy shared host where absolute seconds do not. ~2 × (2 + intervals) ×
interval per N: 3 minutes for N = 200 at the defaults.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from benchmarks.bench_collector_load import cpu_s, write_file_sd  # noqa: E402
from tests.services import free_port  # noqa: E402

PROMETHEUS = "/usr/bin/prometheus"
WARMUP_INTERVALS = 2


def _hits(base: str) -> list[float]:
    """The server's GET times since the last call (and forgets them)."""
    stamps: list[float] = httpx.get(f"{base}/_hits", timeout=30).json()
    return stamps


def _wait_http(url: str, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"{what} did not start") from None
            time.sleep(0.1)


def _measure(
    name: str, proc: subprocess.Popen[bytes], base: str, interval: float, intervals: int
) -> tuple[float, int]:
    """(CPU-s, scrapes) of ``proc`` over ``intervals`` intervals after the warm-up."""
    time.sleep(WARMUP_INTERVALS * interval)
    if proc.poll() is not None:
        raise SystemExit(f"{name} exited ({proc.returncode}) during the warm-up")
    _hits(base)
    c0, t0 = cpu_s(proc.pid), time.time()
    time.sleep(intervals * interval)
    c1, t1 = cpu_s(proc.pid), time.time()
    scrapes = sum(1 for t in _hits(base) if t0 <= t <= t1)
    if proc.poll() is not None:
        raise SystemExit(f"{name} exited ({proc.returncode}) while measured")
    return c1 - c0, scrapes


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_prometheus(
    tmp: Path, sd: Path, base: str, interval: float, intervals: int
) -> tuple[float, int]:
    config = tmp / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": f"{interval:g}s", "scrape_timeout": f"{0.9 * interval:g}s"},
        "scrape_configs": [{"job_name": "vllm", "file_sd_configs": [{"files": [str(sd)]}]}],
    }))  # fmt: skip
    port = free_port()
    cmd = [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
           f"--web.listen-address=127.0.0.1:{port}"]  # fmt: skip
    with (tmp / "prometheus.log").open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    try:
        _wait_http(f"http://127.0.0.1:{port}/-/ready", proc, "prometheus")
        return _measure("prometheus", proc, base, interval, intervals)
    finally:
        _stop(proc)


def run_kvscope(
    tmp: Path, sd: Path, base: str, interval: float, intervals: int, *extra: str
) -> tuple[float, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    db = tmp / f"kvscope-{len(list(tmp.glob('kvscope-*.db')))}.db"  # a fresh store each run
    cmd = [sys.executable, "-m", "kvscope.cli", "collect", "--file-sd", str(sd),
           "--db", f"sqlite:///{db}", "--interval", f"{interval:g}s",
           "--window", "60s", "-q", *extra]  # fmt: skip
    with (tmp / "collect.out").open("w") as out, (tmp / "collect.err").open("w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err)
    try:
        return _measure("kvscope collect", proc, base, interval, intervals)
    finally:
        _stop(proc)
        if proc.returncode not in (0, None):
            print((tmp / "collect.err").read_text()[-2000:], file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, nargs="+", default=[200])
    ap.add_argument("--interval", type=float, default=10.0, help="scrape interval, seconds")
    ap.add_argument("--intervals", type=int, default=6, help="measured intervals")
    ap.add_argument("--every-tick", action="store_true",
                    help="also run kvscope collect with a checkpoint after every tick "
                    "(--checkpoint-every 0)")  # fmt: skip
    args = ap.parse_args()
    if not shutil.which(PROMETHEUS):
        raise SystemExit(f"{PROMETHEUS} missing: apt-get install prometheus (make test does)")
    rows = []
    for n in args.targets:
        port = free_port()
        budget = 120 + 2 * (WARMUP_INTERVALS + args.intervals + 2) * args.interval
        server = subprocess.Popen([sys.executable, str(ROOT / "benchmarks/bench_collector_load.py"),
                                   "--serve", str(port), "--max-run-s", str(budget)])  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_http(f"{base}/_hits", server, "the targets' server")
            with tempfile.TemporaryDirectory(prefix="kvscope-bench-") as name:
                tmp = Path(name)
                sd = tmp / "targets.json"
                write_file_sd(sd, f"127.0.0.1:{port}", n)
                prom = run_prometheus(tmp, sd, base, args.interval, args.intervals)
                kv = run_kvscope(tmp, sd, base, args.interval, args.intervals)
                if args.every_tick:
                    kv0 = run_kvscope(tmp, sd, base, args.interval, args.intervals,
                                      "--checkpoint-every", "0")  # fmt: skip
        finally:
            server.terminate()
            server.wait()
        expected = n * args.intervals
        per_k = {k: 1000 * c / s if s else math.nan for k, (c, s) in (("prom", prom), ("kv", kv))}
        ratio = per_k["kv"] / per_k["prom"]
        rows.append((n, prom, kv, per_k, ratio))
        print(
            f"N={n}: Prometheus 2.42 {prom[0]:.2f} CPU-s / {prom[1]} scrapes = "
            f"{per_k['prom']:.2f} CPU-s per 1,000; kvscope collect {kv[0]:.2f} CPU-s / {kv[1]} "
            f"scrapes = {per_k['kv']:.2f} per 1,000; ratio kvscope/Prometheus {ratio:.2f} "
            f"(target <= 1.0; {expected} scrapes expected each)", flush=True
        )  # fmt: skip
        if args.every_tick:
            every = 1000 * kv0[0] / kv0[1] if kv0[1] else math.nan
            print(f"N={n}: kvscope collect --checkpoint-every 0: {kv0[0]:.2f} CPU-s / {kv0[1]} "
                  f"scrapes = {every:.2f} per 1,000; ratio to Prometheus "
                  f"{every / per_k['prom']:.2f}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
