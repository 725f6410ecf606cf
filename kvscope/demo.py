"""`kvscope demo`: the main job end to end on the embedded default.

A simulated cluster (the bundled scenario ``demo``) serves live ``/metrics`` on 127.0.0.1,
the collector scrapes it into SQLite, the planner fits, forecasts, decides and sizes, and
planner.report.plots writes the PNGs; this module only wires them. The collector runs on the
simulated clock, in lockstep with the simulation and aligned to the hour (EPOCH_ALIGN_S), so
a run is a function of the scenario and its seed.

Design: kvscope/DESIGN.md#demo
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shlex
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import quote

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from collector.keep import parse_keep
from collector.run import DirectParts, collect_direct, run_until_signalled
from collector.run_config import DirectConfig
from collector.scrape import parse_targets
from core.errors import ConfigError
from dashboards.generate import write as write_surfaces
from kvscope.replan import save_plan
from planner.plan import build_plan
from planner.report.plan_text import summary_text
from planner.report.plots import PLOT_FILES, write_plots
from planner.simulate.metrics_server import ClusterServer, LiveCluster, targets_document
from planner.simulate.scenario import parse_scenario, read_scenario_file
from planner.simulate.scenarios import scenario_file
from store.store import Store

if TYPE_CHECKING:
    from collector.keep import Keep
    from collector.run import CollectStats
    from collector.scrape import TargetSet
    from planner.plan import Plan
    from planner.simulate.metrics_server import LiveCluster
    from planner.simulate.scenario import Scenario

DEFAULT_SCENARIO = "demo"  # a bundled scenario name (planner.simulate.scenarios: package data)
SCRAPE_INTERVAL_S = 15.0  # simulated seconds between scrapes (Prometheus' usual 15 s)
WINDOW_S = 60.0  # rollup window (kvscope collect's default)
EPOCH_ALIGN_S = 3600.0  # epoch0 on the hour: every forecast bucket boundary falls alike
PROGRESS_EVERY_S = 3.0  # wall seconds between progress lines
API_URL = "http://127.0.0.1:8000"  # `kvscope serve`'s default --host and --port
ENV_EXAMPLE = ".env.example"  # the local stack's settings (docker-compose.yml)


@dataclass(frozen=True, slots=True)
class DemoOptions:
    db: str = "sqlite:///out/demo.db"
    out: Path = Path("out")
    speed: float = 80.0
    sim_hours: float = 4.0
    seed: int = 1
    scenario: str | Path = DEFAULT_SCENARIO  # a file or a bundled scenario name
    horizon_s: float = 86_400.0
    keep: str = "used"  # the signals stored: used or all (collector.keep)


@dataclass(frozen=True, slots=True, eq=False)
class DemoResult:
    plan: Plan
    plots: tuple[Path, ...]
    surfaces: tuple[Path, ...]  # the Grafana dashboards and Prometheus rule files written
    db: str
    scenario: Scenario
    endpoints: dict[str, Any]
    ticks: int
    windows_written: int
    skipped_ticks: int
    collect_wall_s: float
    total_wall_s: float
    out: Path = Path("out")  # where the plots, dashboards and rules were written

    def to_dict(self) -> dict[str, Any]:
        """The plan JSON with a ``demo`` section (what was simulated, where the files are)."""
        return {
            **self.plan.to_dict(),
            "demo": {
                "scenario": self.scenario.name,
                "simulated_s": self.scenario.duration_s,
                "engines_offload": list(self.scenario.cluster.engines_offload),
                "db": self.db,
                "plots": [str(p) for p in self.plots],
                "dashboards_and_rules": [str(p) for p in self.surfaces],
                "scrape_rounds": self.ticks,
                "skipped_rounds": self.skipped_ticks,
                "windows_written": self.windows_written,
                "collect_wall_s": round(self.collect_wall_s, 2),
                "total_wall_s": round(self.total_wall_s, 2),
            },
        }


def load_demo_scenario(scenario: str | Path, sim_hours: float, seed: int) -> Scenario:
    """The scenario (a file or a bundled name, planner.simulate.scenarios.scenario_file) with
    ``duration_s`` = ``sim_hours`` (whole windows) and ``seed``."""
    if not (math.isfinite(sim_hours) and sim_hours > 0):
        raise ConfigError(f"--sim-hours must be > 0, got {sim_hours!r}")
    windows = max(2, round(sim_hours * 3600 / WINDOW_S))
    with scenario_file(scenario) as path:  # parsing reads a trace the file names
        raw = read_scenario_file(path)
        raw = {**raw, "duration_s": windows * WINDOW_S, "seed": seed}
        raw.pop("warmup_s", None)  # the demo collects from simulated t = 0
        return parse_scenario(raw, where=str(path), base_dir=path.parent)


def clear_outputs(out: Path) -> list[Path]:
    """Delete the PNGs an earlier run wrote in ``out`` (only the demo's own file names), so
    a plot this run cannot draw does not linger from a previous one. Returns what it deleted."""
    gone = []
    for name in PLOT_FILES:
        path = out / name
        try:
            if path.is_file():
                path.unlink()
                gone.append(path)
        except OSError as exc:
            raise ConfigError(f"--out {out}: cannot delete {path}: {exc.strerror or exc}") from None
    return gone


def fresh_sqlite(url: str) -> None:
    """Delete a SQLite file store (and its journals) so a re-run starts empty; create its
    directory. Other stores are kept (the plan reads only this run's period)."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigError(f"--db {url}: not a database URL: {exc}") from None
    db = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or db in ("", ":memory:") or "mode=" in db:
        return
    path = Path(db).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    except OSError as exc:
        raise ConfigError(f"--db {url}: cannot reset {path}: {exc.strerror or exc}") from None


class SimClock:
    """The simulated cluster's clock (epoch seconds) and the collector's lockstep sleep."""

    SLICE_S = 0.05  # wall seconds of pacing granularity

    def __init__(self, live: LiveCluster, epoch0: float, speed: float) -> None:
        self.live = live
        self.epoch0 = epoch0
        self.speed = speed
        self.wall0 = time.monotonic()

    def sim_now(self) -> float:
        with self.live.lock:  # the HTTP threads read the simulation under the same lock
            return self.live.sim.now

    def __call__(self) -> float:
        return self.epoch0 + self.sim_now()

    def _advance(self, t: float) -> None:
        with self.live.lock:
            self.live.sim.advance_to(t, settle=True)

    async def sleep_until(self, deadline: float, stop: asyncio.Event) -> None:
        """Advance the simulation to ``deadline``, no faster than ``speed`` × wall time."""
        target = min(deadline - self.epoch0, self.live.sim.end_time)
        if self.sim_now() < target:
            await asyncio.to_thread(self._advance, target)
        # pace: simulated time t is due at wall0 + t / speed (scrape rounds included)
        due = self.wall0 + target / self.speed - time.monotonic()
        if due > 0 and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=due)


def _hms(seconds: float) -> str:
    s = max(0, round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _wall(seconds: float) -> str:
    s = max(0, round(seconds))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class _Progress:
    """One stderr line at most every PROGRESS_EVERY_S wall seconds (and the last one)."""

    def __init__(self, clock: SimClock, duration: float, n_targets: int, err: IO[str]) -> None:
        self.clock, self.duration, self.n, self.err = clock, duration, n_targets, err
        self.start = time.monotonic()
        self.last = -math.inf

    def __call__(self, stats: CollectStats, *, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        done = self.clock.sim_now()
        elapsed = now - self.start
        eta = elapsed * (self.duration - done) / done if done > 0 else math.nan
        line = (
            f"kvscope demo: [2/4 collect] sim {_hms(done)} / {_hms(self.duration)} "
            f"({done / self.duration:.0%}), {stats.targets_up}/{self.n} targets up, "
            f"{stats.windows_written:,} windows written"
        )
        if stats.skipped_ticks:
            line += f", {stats.skipped_ticks} rounds skipped"
        line += f", {_wall(elapsed)} elapsed" + (
            "" if final or not math.isfinite(eta) else f", ETA {_wall(eta)}"
        )
        print(line, file=self.err, flush=True)


def _collect(
    live: LiveCluster,
    targets: TargetSet,
    store: Store,
    *,
    speed: float,
    epoch0: float,
    err: IO[str],
    keep: Keep,
) -> CollectStats:
    clock = SimClock(live, epoch0, speed)
    duration = live.sim.end_time
    progress = _Progress(clock, duration, len(targets), err)
    config = DirectConfig(
        interval_s=SCRAPE_INTERVAL_S,
        window_s=WINDOW_S,
        timeout_s=10.0,
        concurrency=64,
        max_body_bytes=32 * 1024 * 1024,
        max_ticks=round(duration / SCRAPE_INTERVAL_S),  # the last at duration - interval
        keep=keep,
    )
    parts = DirectParts(progress=progress, clock=clock, sleep=clock.sleep_until)
    stats = run_until_signalled(
        lambda stop: collect_direct(targets, store, config, parts, stop=stop)
    )
    progress(stats, final=True)
    if stats.ticks < round(duration / SCRAPE_INTERVAL_S):  # SIGINT/SIGTERM stopped the loop
        print(
            f"kvscope demo: interrupted at simulated {_hms(clock.sim_now())}; "
            f"{stats.windows_written:,} windows flushed to {store.url}",
            file=err,
            flush=True,
        )
        raise KeyboardInterrupt
    return stats


def describe_cluster(scenario: Scenario) -> str:
    spec = scenario.cluster
    by_mode: dict[str, list[int]] = {}
    for i, mode in enumerate(spec.engines_offload):
        by_mode.setdefault(mode, []).append(i)
    modes = "; ".join(
        f"{mode} on engine{'s' if len(ids) > 1 else ''} {','.join(map(str, ids))}"
        for mode, ids in by_mode.items()
    )
    return (
        f"{spec.num_engines} × {spec.model.name} on {spec.gpu.name} (TP{spec.tensor_parallel}), "
        f"{spec.nodes} node(s); offload: {modes}"
    )


@dataclass(frozen=True, slots=True)
class _Collected:
    endpoints: dict[str, Any]
    cluster: str
    epoch0: float
    stats: CollectStats


def _serve_and_collect(
    scenario: Scenario, store: Store, opts: DemoOptions, err: IO[str]
) -> _Collected:
    """Serve the simulated cluster on 127.0.0.1 and collect it; the servers are closed on
    the way out, whatever happens."""
    duration = scenario.duration_s
    live = LiveCluster(scenario, opts.speed)
    server = ClusterServer(live, "127.0.0.1", 0)
    try:
        server.start()
        doc = server.document()
        targets = parse_targets(targets_document(doc, scenario), source="demo endpoints")
        print(
            f"kvscope demo: [1/4 simulate] {scenario.name}: {describe_cluster(scenario)}; "
            f"{live.n_pools} LMCache pool(s); serving {len(targets)} /metrics endpoints "
            f"{doc['engines'][0]['url']} … {server.endpoints[-1].url}",
            file=err,
            flush=True,
        )
        print(
            f"kvscope demo: [2/4 collect] {_hms(duration)} simulated at {opts.speed:g}× "
            f"(≥ {_wall(duration / opts.speed)} wall), a scrape every {SCRAPE_INTERVAL_S:g} "
            f"simulated s, {WINDOW_S:g} s windows → {store.url}",
            file=err,
            flush=True,
        )
        epoch0 = math.floor((time.time() - duration) / EPOCH_ALIGN_S) * EPOCH_ALIGN_S
        stats = _collect(
            live,
            targets,
            store,
            speed=opts.speed,
            epoch0=epoch0,
            err=err,
            keep=parse_keep(opts.keep),
        )
    finally:
        server.close()
    return _Collected(doc, targets.cluster, epoch0, stats)


def run_demo(opts: DemoOptions, *, err: IO[str] | None = None) -> DemoResult:
    """Simulate, serve, collect, plan and plot (DESIGN.md#demo); progress on ``err``.

    Raises ConfigError on a bad option or scenario, StoreError on a bad store. KeyboardInterrupt
    (Ctrl-C) stops the collection: the windows so far are flushed to the store, the servers
    closed, and the interrupt re-raised. Nothing started here outlives the call.
    """
    err = err or sys.stderr
    t0 = time.monotonic()
    if not (math.isfinite(opts.speed) and opts.speed > 0):
        raise ConfigError(f"--speed must be > 0, got {opts.speed!r}")

    parse_keep(opts.keep)  # a bad --keep fails before the store is reset
    scenario = load_demo_scenario(opts.scenario, opts.sim_hours, opts.seed)
    duration = scenario.duration_s
    fresh_sqlite(opts.db)
    stale = clear_outputs(opts.out)
    if stale:
        print(
            f"kvscope demo: removed {len(stale)} plot(s) of an earlier run from {opts.out}/",
            file=err,
            flush=True,
        )
    with Store(opts.db) as store:
        store.migrate()
        got = _serve_and_collect(scenario, store, opts, err)
        collect_wall = time.monotonic() - t0
        print("kvscope demo: [3/4 plan] fits, forecast, decision, sizing …", file=err, flush=True)
        t_plan = time.monotonic()
        plan = build_plan(
            store,
            cluster=got.cluster,
            since=got.epoch0,
            until=got.epoch0 + duration,
            horizon_s=opts.horizon_s,
            seed=opts.seed,
        )
        # kept as `kvscope plan --save` keeps it: what the API serves after the demo
        saved = save_plan(store, plan, got.cluster, created_at=time.time())
    print(f"kvscope demo: [3/4 plan] done in {_wall(time.monotonic() - t_plan)}; saved as plan "
          f"{', '.join(map(str, saved))} of cluster {got.cluster}", file=err)  # fmt: skip
    plots = tuple(write_plots(plan, opts.out, seed=opts.seed))
    print(
        f"kvscope demo: [4/4 plots] {len(plots)} PNG(s) in {opts.out}/: "
        + ", ".join(p.name for p in plots),
        file=err,
        flush=True,
    )
    surfaces = tuple(write_surfaces(opts.out))
    print(
        f"kvscope demo: Grafana dashboards and Prometheus rules in {opts.out}/ "
        "(`kvscope dashboards build --out DIR` writes them anywhere)",
        file=err,
        flush=True,
    )
    return DemoResult(
        plan=plan,
        plots=plots,
        surfaces=surfaces,
        db=opts.db,
        scenario=scenario,
        endpoints=got.endpoints,
        ticks=got.stats.ticks,
        windows_written=got.stats.windows_written,
        skipped_ticks=got.stats.skipped_ticks,
        collect_wall_s=collect_wall,
        total_wall_s=time.monotonic() - t0,
        out=opts.out,
    )


def summary(result: DemoResult) -> str:
    """The readable summary: what was simulated, the plan (planner.report.plan_text), the files."""
    sc = result.scenario
    per_target = Counter(e["offload"] for e in result.endpoints["engines"])
    head = [
        f"kvscope demo — {sc.name}: {describe_cluster(sc)}",
        f"  simulated {_hms(sc.duration_s)} in {_wall(result.collect_wall_s)} of wall time; "
        f"{result.ticks} scrape rounds of {sum(per_target.values())} engines + "
        f"{len(result.endpoints['lmcache'])} LMCache pool(s), "
        f"{result.windows_written:,} windows stored (seed {sc.seed})",
    ]
    files = ["Files", f"  database  {result.db}  (kvscope plan --db {result.db} --since all)"]
    files += [f"  plot      {p}" for p in result.plots] or ["  plots     none (no fit ran)"]
    files += [
        f"  {'dashboard' if p.suffix == '.json' else 'rules':<9} {p}" for p in result.surfaces
    ]
    body = summary_text(result.plan.to_dict())
    steps = next_steps(result)
    return "\n".join(head) + "\n\n" + body + "\n" + "\n".join(files) + "\n\n" + steps


def next_steps(result: DemoResult) -> str:
    """What to run after the demo: the API and the HTML report on its store, then the local
    stack (docker-compose.yml) on a live simulated cluster."""
    db = shlex.quote(result.db)
    cluster = result.plan.cluster or "CLUSTER"
    report = shlex.quote(str(result.out / "report.html"))
    lines = [
        "Next steps",
        f"  API       kvscope serve --db {db}",
        f"            then {API_URL}/docs, the saved plan at "
        f"{API_URL}/v1/clusters/{quote(cluster, safe='')}/plan, and the report at "
        f"{API_URL}/v1/clusters/{quote(cluster, safe='')}/report",
        f"  report    kvscope report --db {db} --cluster {shlex.quote(cluster)} --since all "
        f"--out {report}",
        f"  stack     cp {ENV_EXAMPLE} .env, set its passwords and token, docker-compose up -d",
        "            (or docker compose up -d): a live simulated cluster in Grafana "
        "http://127.0.0.1:3000,",
        "            Prometheus http://127.0.0.1:9090/alerts, Alertmanager http://127.0.0.1:9093, "
        f"the API {API_URL}/docs",
        '            (README.md, "Local stack (docker-compose)")',
    ]
    return "\n".join(lines) + "\n"
