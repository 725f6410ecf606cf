"""Whole-process timings of ``kvscope plan --since all --json`` (benchmarks/bench_plan.py).

Each variant is one command on one store, run as a fresh process; the variants are run one
after the other, ``rounds`` times over (alternated, so a busy spell of the shared machine
falls on all of them), and each run's wall time, its CPU (the process and its children), the
peak RSS of its largest process, the peak Pss of its process tree (a plan forks a child for
its verdicts and forecasts: Pss counts the pages they share once), the load average when it
started and, on PostgreSQL, the server's CPU meanwhile (the backends the plan used) are
printed. Every plan's JSON is compared with the first variant's, but for
the plan's own timings and the store URL it names.
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import gitrev

ROOT = Path(__file__).resolve().parents[1]
# a revision's tree: those of them it has (gitrev leaves out the others; core/ and store/
# are newer than schema 9)
PACKAGES = ("core", "store", "collector", "planner", "dashboards", "api", "kvscope")
_TIMINGS = {"seconds", "fit_seconds"}  # plan JSON keys timing the run itself (planner/)


@dataclass(frozen=True)
class Variant:
    """One way of planning: a command and the store URL it reads."""

    name: str
    cmd: list[str]
    url: str
    server_cpu: Callable[[], float] | None = None  # the database server's CPU seconds so far


@dataclass
class Runs:
    """A variant's runs: (wall s, CPU s, server CPU s, load average) each, and its JSON."""

    samples: list[tuple[float, float, float, float]] = field(default_factory=list)
    json: str = ""
    peak_rss_mb: list[float] = field(default_factory=list)  # each run's largest process's
    peak_pss_mb: list[float] = field(default_factory=list)  # each run's process tree's

    def best(self) -> tuple[float, float, float, float]:
        """The run with the least wall time."""
        return min(self.samples)


def plan_args(url: str) -> list[str]:
    return ["plan", "--db", url, "--since", "all", "--json"]


def cli(url: str) -> list[str]:
    """This checkout's ``kvscope plan`` on ``url``."""
    return [sys.executable, "-m", "kvscope.cli", *plan_args(url)]


def tree_cli(tree: Path, url: str) -> list[str]:
    """``kvscope plan`` of the packages in ``tree`` (checked to be the ones imported)."""
    code = (
        f"import sys; sys.path.insert(0, {str(tree)!r}); import collector, planner; "
        f"assert collector.__file__.startswith({str(tree)!r}), collector.__file__; "
        "from kvscope.cli import main; sys.argv[0] = 'kvscope'; main()"
    )
    return [sys.executable, "-c", code, *plan_args(url)]


def revision_tree(rev: str) -> AbstractContextManager[Path]:
    """The packages of git revision ``rev`` (git archive) in a temporary directory."""
    return gitrev.revision_tree(rev, PACKAGES, who="bench_plan")


def postgres_cpu(url: str) -> Callable[[], float]:
    """The CPU seconds of a local PostgreSQL so far: its postmaster, the children it reaped
    (each backend of a plan, once it ends) and the children alive."""
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn) as pg:
        backend = pg.execute("SELECT pg_backend_pid()").fetchone()
    postmaster = _stat(int(backend[0]))[0] if backend else 0
    tick = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:
        time.sleep(0.2)  # the plan's backends exit as it does: let them be reaped
        _, ticks = _stat(postmaster, with_children=True)
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    ppid, own = _stat(int(entry))
                except OSError:  # gone meanwhile
                    continue
                if ppid == postmaster:
                    ticks += own
        return ticks / tick

    return cpu


def _stat(pid: int, *, with_children: bool = False) -> tuple[int, int]:
    """(parent pid, CPU ticks) of a process from /proc (with its reaped children's)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    if with_children:
        ticks += int(fields[13]) + int(fields[14])
    return int(fields[1]), ticks


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (any of its threads')."""
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                out += [int(x) for x in fh.read().split()]
    except OSError:  # gone meanwhile
        pass
    return out


def _pss_kb(pid: int) -> int:
    """A process's proportional set size (its pages, shared ones split among sharers)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_pss_peak(pid: int, done: Callable[[], bool], every_s: float = 0.05) -> float:
    """The peak over time of the summed Pss (MB) of ``pid`` and its descendants (a plan
    forks a child for its verdicts and forecasts), sampled every ``every_s`` until
    ``done()``: the memory the process tree holds, each shared page counted once."""
    peak = 0
    while not done():
        tree, todo = [], [pid]
        while todo:
            p = todo.pop()
            tree.append(p)
            todo += _children(p)
        peak = max(peak, sum(_pss_kb(p) for p in tree))
        time.sleep(every_s)
    return peak / 1024


def _run(
    cmd: list[str], env: dict[str, str]
) -> tuple[int, str, str, resource.struct_rusage, float]:
    """(exit code, stdout, stderr, the child's rusage: CPU with its children's, peak RSS of
    the largest process; the peak Pss of its process tree in MB) of one run."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    ended = False
    with ThreadPoolExecutor(3) as pool:
        out, err = pool.submit(proc.stdout.read), pool.submit(proc.stderr.read)
        pss = pool.submit(tree_pss_peak, proc.pid, lambda: ended)
        _, status, usage = os.wait4(proc.pid, 0)
        ended = True
        stdout, stderr = out.result(), err.result()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, stdout, stderr, usage, pss.result()


def run_rounds(variants: list[Variant], rounds: int) -> dict[str, Runs]:
    """Every variant ``rounds`` times, alternated; each run printed as it ends."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = {v.name: Runs() for v in variants}
    for i in range(rounds):
        for v in variants:
            load = os.getloadavg()[0]
            s0 = v.server_cpu() if v.server_cpu else 0.0
            t0 = time.perf_counter()
            code, stdout, stderr, usage, pss_mb = _run(v.cmd, env)
            wall = time.perf_counter() - t0
            if code != 0:
                raise SystemExit(f"bench_plan: {v.name} failed:\n{stderr[-3000:]}")
            cpu = usage.ru_utime + usage.ru_stime
            rss_mb = usage.ru_maxrss / 1024  # Linux: kB
            server = v.server_cpu() - s0 if v.server_cpu else 0.0
            out[v.name].samples.append((wall, cpu, server, load))
            out[v.name].peak_rss_mb.append(rss_mb)
            out[v.name].peak_pss_mb.append(pss_mb)
            out[v.name].json = stdout.replace(_redacted(v.url), "<store>")
            extra = f" + server {server:6.2f} s cpu" if v.server_cpu else ""
            print(f"  round {i + 1}: {v.name:<40s} {wall:7.2f} s wall {cpu:7.2f} s cpu{extra}"
                  f"  peak RSS {rss_mb:,.0f} MB, tree Pss {pss_mb:,.0f} MB  (load {load:.2f})",
                  flush=True)  # fmt: skip
    return out


def summary(
    variants: list[Variant],
    runs: dict[str, Runs],
    *,
    wall_target: float = 10.0,
    memory_target_mb: float = 1024.0,
) -> None:
    """Each variant's best and median run, its ratios to the first variant's best, whether
    its plan JSON is the first variant's, and whether its best wall time and its largest
    tree Pss meet the targets."""
    first = runs[variants[0].name]
    w0, c0, s0, _ = first.best()
    for v in variants:
        r = runs[v.name]
        wall, cpu, server, load = r.best()
        med = statistics.median(s[0] for s in r.samples)
        rss = max(r.peak_rss_mb) if r.peak_rss_mb else math.nan
        pss = max(r.peak_pss_mb) if r.peak_pss_mb else math.nan
        differs = differs_at(first.json, r.json)
        same = f"JSON DIFFERENT at {differs}" if differs else "JSON identical"
        total = f", +{server:.1f} s server = {cpu + server:.1f} s" if v.server_cpu else ""
        print(f"WHOLE {v.name}: best {wall:.1f} s wall / {cpu:.1f} s cpu{total} (load "
              f"{load:.2f}; median wall {med:.1f} s of {len(r.samples)}; peak RSS {rss:,.0f} MB, "
              f"tree Pss {pss:,.0f} MB); {wall / w0:.2f}x wall, "
              f"{(cpu + server) / (c0 + s0):.2f}x cpu of {variants[0].name}; {same}; "
              f"<= {wall_target:g} s: {'met' if wall <= wall_target else 'NOT met'}; "
              f"<= {memory_target_mb:,.0f} MB: {'met' if pss <= memory_target_mb else 'NOT met'}",
              flush=True)  # fmt: skip


def differs_at(a: str, b: str) -> list[str]:
    """The paths (dotted keys, list indexes) where two JSON documents differ, first ten."""
    out: list[str] = []

    def walk(x: Any, y: Any, at: str) -> None:
        if len(out) >= 10:
            return
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted((set(x) | set(y)) - _TIMINGS):
                walk(x.get(k), y.get(k), f"{at}.{k}")
        elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            for i, (u, v) in enumerate(zip(x, y, strict=True)):
                walk(u, v, f"{at}[{i}]")
        elif x != y:
            out.append(f"{at}: {str(x)[:60]} != {str(y)[:60]}")

    walk(json.loads(a), json.loads(b), "")
    return out


def _redacted(url: str) -> str:
    from store.store import redact  # noqa: PLC0415 - baseline: this module also runs with a git revision's tree first on sys.path (bench --baseline); ours import there, after the path is set

    return redact(url)
