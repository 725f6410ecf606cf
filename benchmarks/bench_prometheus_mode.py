"""Prometheus mode at scale: `kvscope collect --prometheus` over 200 engines × 6 h in a real
Prometheus 2.42, against a per-engine query loop measured in the same run.

Run: .venv/bin/python benchmarks/bench_prometheus_mode.py [--engines 200] [--hours 6]
     [--baseline-engines 10] [--postgres] [--tsdb DIR]

1. Data (timed, not counted): benchmarks/promdata.py writes ``--hours`` of 15 s scrapes of
   ``--engines`` vLLM 0.33 engines (every family kvscope reads of vLLM 0.33's default
   exposition, 285 series an engine, values moving, one restart in ten engines; labels job,
   instance, engine, model_name as a scrape stores them) as OpenMetrics text, one file per
   TSDB block range (2 h, UTC-aligned, as promtool cuts blocks), and ``promtool tsdb
   create-blocks-from openmetrics`` backfills each into a fresh TSDB directory while the next
   is generated; each file is removed once backfilled. The data ends a minute before the run
   starts. ``--tsdb DIR`` keeps the TSDB (and its description, ``bench.json``) in DIR and
   reuses it on the next run with the same ``--engines``/``--hours``/``--seed``.
2. Debian's Prometheus 2.42 on that TSDB (127.0.0.1, a free port, no scrape jobs, 30 d
   retention, ``--storage.tsdb.min/max-block-duration=2h`` as Thanos sidecars run it, so it
   does not compact the backfilled blocks while measured).
3. ``kvscope collect --prometheus URL --since S --once --window 60s`` as an operator runs it
   (a real subprocess, a fresh SQLite store in a temp dir; ``--postgres``: PostgreSQL 15 too):
   ``--since`` reaches back past the data's start, ``--once`` is the one back-fill. Measured:
   wall time, the child's CPU-s and peak RSS (wait4), Prometheus' CPU-s (/proc/PID/stat) and
   HTTP requests by handler (its own prometheus_http_requests_total) before and after.
4. Checks: every engine has its gauge and counter windows for every minute of the span, the
   windows the summary says it wrote are in the store, and one counter of an engine that
   restarted: each window's delta equals PromQL's ``increase()`` computed here from the
   generator's samples (2.42's extrapolation, resets handled), its 6 h sum the generator's.
5. Baseline, same run, same client (collector.promsource.PrometheusSource.windows, in this
   process): ``--baseline-engines`` engines over the whole span, once with one range query
   per signal per engine (``instance="…"``: the loop batching replaces) and once with one
   query per signal for all of them (``instance=~"a|b|…"``). Printed: queries, wall, client
   and Prometheus CPU of each and the loop/batched ratios; the loop's cost scaled to all
   engines against the collect run.
Exit 1 when a check fails. At the defaults on the shared 2-core machine: data 6 min (82.4 M
samples, 8 GB of text in 4 files, a 331 MB TSDB), collect 5 min, baseline 20 s; with ``--tsdb``
the runs after the first skip the data. ``--engines 20 --hours 0.5`` is a 20 s look.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from benchmarks import promdata  # noqa: E402
from benchmarks.bench_collector_load import cpu_s  # noqa: E402
from collector.promsource import PrometheusSource  # noqa: E402
from core.catalog import SIGNALS  # noqa: E402
from store.store import Store  # noqa: E402
from tests.services import free_port, postgres  # noqa: E402

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
BLOCK_S = 7200.0  # promtool's (and Prometheus') block range
WINDOW_S = 60
CLUSTER = "bench"
SPOT_SIGNAL = "prompt_tokens_total"  # the counter checked window by window
_REQUESTS = re.compile(r'^prometheus_http_requests_total\{code="(\d+)",handler="([^"]+)"\} (\S+)$')


@dataclass
class Data:
    start: float  # the span's start (a multiple of 60 s); scrapes from start + offset
    steps: int  # scrapes per engine
    engines: int
    seed: int

    @property
    def end(self) -> float:
        return self.start + self.steps * promdata.SCRAPE_S


# ------------------------------------------------------------------------------------ data


def make_tsdb(tsdb: Path, tmp: Path, data: Data) -> dict[str, float]:
    """Generate and backfill ``data`` into ``tsdb``; the timings (not counted)."""
    families = promdata.template()
    engines = [promdata.Engine(i, data.start, data.steps, data.seed) for i in range(data.engines)]
    gen_s = gen_cpu = fill_cpu = 0.0
    samples = 0
    t0 = time.monotonic()
    running: tuple[subprocess.Popen[bytes], Path] | None = None

    def finish(job: tuple[subprocess.Popen[bytes], Path]) -> float:
        proc, path = job
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        path.unlink()
        if proc.returncode != 0:
            err = (tmp / "promtool.log").read_text(errors="replace")[-2000:]
            raise SystemExit(f"promtool failed on {path.name} ({proc.returncode}):\n{err}")
        return usage.ru_utime + usage.ru_stime

    try:
        for n, (k0, k1) in enumerate(promdata.chunks(data.start, data.steps, BLOCK_S, 480)):
            path = tmp / f"chunk-{n:03d}.om"
            g0, c0 = time.monotonic(), time.process_time()
            with path.open("w", buffering=1 << 22) as out:
                samples += promdata.write_chunk(out, families, engines, k0, k1)
            took = time.monotonic() - g0
            gen_s += took
            gen_cpu += time.process_time() - c0
            if running is not None:
                fill_cpu += finish(running)
            with (tmp / "promtool.log").open("ab") as log:
                cmd = [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "-q", str(path),
                       str(tsdb)]  # fmt: skip
                running = (subprocess.Popen(cmd, stdout=log, stderr=log), path)
            print(f"  chunk {n}: scrapes {k0}-{k1} generated in {took:.1f} s", flush=True)
        if running is not None:
            fill_cpu += finish(running)
            running = None
    finally:  # a failure half-way: no promtool left running
        if running is not None and running[0].poll() is None:
            running[0].kill()
            running[0].wait()
    return {"samples": samples, "gen_wall_s": gen_s, "gen_cpu_s": gen_cpu,
            "backfill_cpu_s": fill_cpu, "total_wall_s": time.monotonic() - t0}  # fmt: skip


def prepare(args: argparse.Namespace, tmp: Path) -> tuple[Path, Data]:
    """The TSDB to serve: ``--tsdb`` reused when it holds the same data, else made."""
    tsdb = Path(args.tsdb) if args.tsdb else tmp / "tsdb"
    desc = tsdb / "bench.json"
    want = {"engines": args.engines, "hours": args.hours, "seed": args.seed}
    if desc.exists():
        meta = json.loads(desc.read_text())
        if {k: meta.get(k) for k in want} == want:
            print(f"reusing the TSDB in {tsdb} (made {time.time() - meta['made']:.0f} s ago)")
            return tsdb, Data(meta["start"], meta["steps"], args.engines, args.seed)
        shutil.rmtree(tsdb)
    tsdb.mkdir(parents=True, exist_ok=True)
    end = math.floor(time.time() / WINDOW_S) * WINDOW_S - WINDOW_S  # a minute before now
    steps = round(args.hours * 3600 / promdata.SCRAPE_S)
    data = Data(end - steps * promdata.SCRAPE_S, steps, args.engines, args.seed)
    print(f"generating {args.engines} engines × {args.hours:g} h ({steps} scrapes each) and "
          f"backfilling with promtool into {tsdb}", flush=True)  # fmt: skip
    t = make_tsdb(tsdb, tmp, data)
    print(
        f"data: {t['samples'] / 1e6:.1f} M samples; generation {t['gen_wall_s']:.0f} s wall "
        f"({t['gen_cpu_s']:.0f} CPU-s), promtool {t['backfill_cpu_s']:.0f} CPU-s, "
        f"{t['total_wall_s']:.0f} s wall together (not counted below)", flush=True
    )  # fmt: skip
    desc.write_text(json.dumps({**want, "start": data.start, "steps": steps, "made": time.time()}))
    return tsdb, data


# ------------------------------------------------------------------------------ prometheus


@contextmanager
def prometheus(tsdb: Path, tmp: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    config = tmp / "prometheus.yml"
    config.write_text(json.dumps({"global": {"scrape_interval": "15s"}, "scrape_configs": []}))
    port = free_port()
    cmd = [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
           f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=30d",
           "--storage.tsdb.min-block-duration=2h",
           "--storage.tsdb.max-block-duration=2h"]  # fmt: skip
    log = (tmp / "prometheus.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (tmp / "prometheus.log").read_text(errors="replace")[-2000:]
                raise SystemExit(f"prometheus did not get ready:\n{tail}")
            time.sleep(0.2)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def http_requests(url: str) -> dict[str, float]:
    """Prometheus' own prometheus_http_requests_total, summed over codes, by handler."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        m = _REQUESTS.match(line)
        if m:
            out[m.group(2)] = out.get(m.group(2), 0.0) + float(m.group(3))
    return out


def _delta(after: dict[str, float], before: dict[str, float], handler: str) -> int:
    return round(after.get(handler, 0.0) - before.get(handler, 0.0))


# ------------------------------------------------------------------------------- the run


@dataclass
class Run:
    wall_s: float
    cpu_s: float
    maxrss_mb: float
    prom_cpu_s: float
    range_queries: int
    instant_queries: int
    summary: dict[str, object]


def run_collect(
    url: str, prom: subprocess.Popen[bytes], db: str, data: Data, *, tmp: Path, timeout: str
) -> Run:
    since = math.ceil(time.time() - data.start) + WINDOW_S
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    cmd = [sys.executable, "-m", "kvscope.cli", "collect", "--prometheus", url, "--db", db,
           "--since", f"{since}s", "--once", "--window", f"{WINDOW_S}s", "--cluster", CLUSTER,
           "--timeout", timeout, "-q"]  # fmt: skip
    before, p0 = http_requests(url), cpu_s(prom.pid)
    t0 = time.monotonic()
    with (tmp / "collect.out").open("wb") as out, (tmp / "collect.err").open("wb") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    p1, after = cpu_s(prom.pid), http_requests(url)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        err_text = (tmp / "collect.err").read_text(errors="replace")[-3000:]
        raise SystemExit(f"kvscope collect exited {code}:\n{err_text}")
    summary = json.loads((tmp / "collect.out").read_text())
    return Run(
        wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, p1 - p0,
        _delta(after, before, "/api/v1/query_range"), _delta(after, before, "/api/v1/query"),
        summary,
    )  # fmt: skip


def check_store(db: str, data: Data, written: int) -> list[str]:
    """Failures (empty: all good): coverage of every engine and the window count."""
    first = math.ceil(data.start / WINDOW_S) * WINDOW_S
    expected = set(range(int(first), int(data.end) - WINDOW_S + 1, WINDOW_S))
    problems = []
    with Store(db) as store:
        total = store.stats()["windows"]
        if total != written:
            problems.append(f"the store holds {total} windows, the summary says {written}")
        for signal in ("kv_cache_usage_ratio", SPOT_SIGNAL, "ttft_seconds"):
            frame = store.read_frame(signals=[signal], columns=["source", "start"])
            by: dict[str, set[int]] = {}
            for source, start in zip(frame["source"].astype(str), frame["start"], strict=True):
                by.setdefault(source, set()).add(round(start))
            for i in range(data.engines):
                got = by.get(promdata.instance(i), set())
                if not expected <= got:
                    missing = sorted(expected - got)
                    problems.append(
                        f"{promdata.instance(i)} {signal}: {len(missing)} of {len(expected)} "
                        f"windows missing (first {missing[:3]})"
                    )
            if len(by) != data.engines:
                problems.append(f"{signal}: windows of {len(by)} sources, {data.engines} engines")
    return problems


def promql_increase(ts: list[float], vs: list[float], end: float, range_s: float) -> float | None:
    """PromQL 2.42's increase(x[range]) at ``end`` from raw samples (functions.go
    extrapolatedRate: counter resets added back, extrapolated to the range's edges)."""
    lo = end - range_s
    pts = [(t, v) for t, v in zip(ts, vs, strict=True) if lo <= t <= end]
    if len(pts) < 2:
        return None
    result = pts[-1][1] - pts[0][1]
    for (_, a), (_, b) in itertools.pairwise(pts):
        if b < a:
            result += a
    to_start, to_end = pts[0][0] - lo, end - pts[-1][0]
    sampled = pts[-1][0] - pts[0][0]
    avg = sampled / (len(pts) - 1)
    if result > 0 and pts[0][1] >= 0:
        to_start = min(to_start, sampled * (pts[0][1] / result))
    threshold = avg * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else avg / 2
    interval += to_end if to_end < threshold else avg / 2
    return result * (interval / sampled)


def spot_check(db: str, data: Data) -> tuple[list[str], str]:
    """One restarting engine's SPOT_SIGNAL windows against the generator's own samples."""
    index = next((i for i in range(data.engines) if i % promdata.RESTART_EVERY == 3), 0)
    eng = promdata.Engine(index, data.start, data.steps, data.seed)
    keep = eng.present.tolist()
    ts = [t for t, k in zip(eng.ts.tolist(), keep, strict=True) if k]
    values = eng.counter(SPOT_SIGNAL, {}).tolist()
    vs = [v for v, k in zip(values, keep, strict=True) if k]
    with Store(db) as store:
        found = store.read_windows(signals=[SPOT_SIGNAL], sources=[promdata.instance(index)])
    rows = [(w.start, w.delta, w.rate, w.resets) for w in found]
    problems, worst = [], 0.0
    for start, delta, rate, _resets in rows:
        want = promql_increase(ts, vs, start + WINDOW_S, WINDOW_S)
        if want is None or delta is None:
            if (want is None) != (delta is None):
                problems.append(f"window {start}: delta {delta}, PromQL increase {want}")
            continue
        err = abs(delta - want) / max(abs(want), 1.0)
        worst = max(worst, err)
        off = rate is None or abs(rate - delta / WINDOW_S) > 1e-9 * max(1.0, abs(rate))
        if err > 1e-6 or off:
            problems.append(f"window {start}: delta {delta} rate {rate}, PromQL increase {want}")
    resets = sum(1 for *_, r in rows if r)
    inc = eng.counter(SPOT_SIGNAL, {})
    truth = float(inc[-1] + (inc[eng.restart - 1] if eng.restart is not None else 0.0) - inc[0])
    got = sum(d for _, d, *_ in rows if d is not None)
    if abs(got - truth) > 0.02 * truth:
        problems.append(f"6 h sum of deltas {got:.0f} vs the generator's increase {truth:.0f}")
    if resets > 1:
        problems.append(f"{resets} windows with a reset, the generator restarted once")
    note = (
        f"spot check {promdata.instance(index)} {SPOT_SIGNAL}: {len(rows)} windows, each "
        f"delta = PromQL increase() from the generator's samples (max rel. error {worst:.1e}), "
        f"{resets} window(s) with a reset (0 when the restart falls between two windows: "
        f"PromQL's ranges do not overlap); sum {got:.4g} vs generated increase {truth:.4g} "
        f"({100 * (got / truth - 1):+.2f} %: increase() extrapolates at the edges)"
    )
    return problems, note


def baseline(url: str, prom: subprocess.Popen[bytes], data: Data, n: int) -> dict[str, float]:
    """The same client in this process over ``n`` engines: per-engine loop vs one query per
    signal for all ``n`` (module docstring, 5)."""
    start, end = data.start, data.end + WINDOW_S
    names = [promdata.instance(i) for i in range(n)]
    out: dict[str, float] = {}
    for mode in ("loop", "batched"):
        groups = [[x] for x in names] if mode == "loop" else [names]
        before, p0 = http_requests(url), cpu_s(prom.pid)
        c0, t0 = time.process_time(), time.monotonic()
        windows = 0
        for group in groups:
            matcher = (f'instance="{group[0]}"' if len(group) == 1
                       else f'instance=~"{"|".join(group)}"')  # fmt: skip
            with PrometheusSource(url, timeout_s=120, matchers=matcher) as source:
                windows += len(source.windows(start, end, WINDOW_S))
        out[f"{mode}_wall_s"] = time.monotonic() - t0
        out[f"{mode}_cpu_s"] = time.process_time() - c0
        out[f"{mode}_prom_cpu_s"] = cpu_s(prom.pid) - p0
        out[f"{mode}_queries"] = _delta(http_requests(url), before, "/api/v1/query_range")
        out[f"{mode}_windows"] = windows
    return out


# ------------------------------------------------------------------------------------ main


def report(name: str, run: Run, data: Data) -> None:
    s = run.summary
    written = int(str(s["windows_written"]))
    engine_hours = data.engines * data.steps * promdata.SCRAPE_S / 3600
    signals = len(SIGNALS)
    print(
        f"{name}: {written:,} windows of {s['targets_up']} sources in {run.wall_s:.1f} s wall = "
        f"{written / run.wall_s:,.0f} windows/s; kvscope {run.cpu_s:.1f} CPU-s "
        f"({1000 * run.cpu_s / engine_hours:.0f} CPU-ms per engine-hour, "
        f"{1e6 * run.cpu_s / written:.1f} CPU-µs per window), peak RSS {run.maxrss_mb:.0f} MB; "
        f"Prometheus {run.prom_cpu_s:.1f} CPU-s during it (kvscope/Prometheus CPU "
        f"{run.cpu_s / max(run.prom_cpu_s, 1e-9):.2f}); {run.range_queries} range + "
        f"{run.instant_queries} instant queries for {signals} signals "
        f"({run.range_queries / signals:.2f} range queries per signal); errors {s['errors']}",
        flush=True,
    )  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", type=int, default=200)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline-engines", type=int, default=10)
    ap.add_argument("--timeout", default="60s", help="kvscope collect --timeout (per query)")
    ap.add_argument("--postgres", action="store_true", help="also collect into PostgreSQL 15")
    ap.add_argument("--tsdb", help="keep the TSDB here and reuse it when it holds the same data")
    args = ap.parse_args()
    for binary in (PROMETHEUS, PROMTOOL):
        if not shutil.which(binary):
            raise SystemExit(f"{binary} missing: apt-get install prometheus (make test does)")
    if args.engines < 1 or args.hours * 3600 < 4 * WINDOW_S:
        raise SystemExit("--engines must be >= 1 and --hours at least 4 minutes (0.067)")
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kvscope-bench-prom-") as name:
        tmp = Path(name)
        tsdb, data = prepare(args, tmp)
        with prometheus(tsdb, tmp) as (url, prom):
            db = f"sqlite:///{tmp / 'kvscope.db'}"
            run = run_collect(url, prom, db, data, tmp=tmp, timeout=args.timeout)
            report("kvscope collect --prometheus, SQLite", run, data)
            written = int(str(run.summary["windows_written"]))
            problems += check_store(db, data, written)
            spot, note = spot_check(db, data)
            problems += spot
            print(note, flush=True)
            if args.postgres:
                with postgres() as pg:
                    pg_run = run_collect(url, prom, pg, data, tmp=tmp, timeout=args.timeout)
                    report("kvscope collect --prometheus, PostgreSQL 15", pg_run, data)
                    problems += check_store(pg, data, int(str(pg_run.summary["windows_written"])))
            n = min(args.baseline_engines, args.engines)
            b = baseline(url, prom, data, n)
        loop_per_engine = b["loop_wall_s"] / n
        print(
            f"baseline, {n} engines × {args.hours:g} h in this process with the same client: "
            f"per-engine loop {b['loop_queries']:.0f} queries, {b['loop_wall_s']:.1f} s wall, "
            f"{b['loop_cpu_s']:.1f} client CPU-s, Prometheus {b['loop_prom_cpu_s']:.1f} CPU-s; "
            f"one query per signal {b['batched_queries']:.0f} queries, "
            f"{b['batched_wall_s']:.1f} s, {b['batched_cpu_s']:.1f} client CPU-s, Prometheus "
            f"{b['batched_prom_cpu_s']:.1f} CPU-s; loop/batched: wall "
            f"{b['loop_wall_s'] / b['batched_wall_s']:.1f}×, client CPU "
            f"{b['loop_cpu_s'] / b['batched_cpu_s']:.1f}×, Prometheus CPU "
            f"{b['loop_prom_cpu_s'] / max(b['batched_prom_cpu_s'], 1e-9):.1f}× "
            f"(same windows: {b['loop_windows'] == b['batched_windows']})",
            flush=True,
        )  # fmt: skip
        print(
            f"per-engine loop scaled to {args.engines} engines: "
            f"~{loop_per_engine * args.engines:.0f} s "
            f"wall and {b['loop_queries'] / n * args.engines:,.0f} queries vs kvscope collect's "
            f"{run.wall_s:.0f} s and {run.range_queries + run.instant_queries} queries",
            flush=True,
        )  # fmt: skip
        if b["loop_windows"] != b["batched_windows"]:
            problems.append(
                f"baseline: the loop read {b['loop_windows']} windows, "
                f"batched {b['batched_windows']}"
            )
    for p in problems[:20]:
        print(f"CHECK FAILED: {p}", file=sys.stderr)
    print("checks: " + ("all passed" if not problems else f"{len(problems)} failed"), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
