"""Simulated telemetry through the real collector path, without HTTP, at simulator speed.

:func:`generate` runs a scenario in :mod:`planner.simulate` and, every ``scrape_s`` of
SIMULATED time, does for each engine (and, optionally, each LMCache pool) what a scrape
does: the simulator's snapshot is rendered by the real exposition renderer
(:func:`planner.simulate.exposition.render`: the text vLLM 0.33 / ``lmcache server``
serve), that text is read by :func:`collector.parse.read_exposition` into a Snapshot and
rolled into windows by one :class:`collector.rollup.Rollup` per source — exactly the
objects ``kvscope collect`` writes to the store. Nothing is served, nothing sleeps: the
simulation is advanced to each scrape time (``settle=True``, so counters are current to
within one engine step) and the scrape happens at that instant.

A run is a pure function of the scenario (its seed included) and the arguments: the same
inputs give the same windows, float for float.

Sources are named ``{prefix}engine-{i}`` / ``{prefix}lmcache-{j}``; :attr:`Telemetry.engines`
maps each engine source to its offload mode (what a targets file records), ready to be
passed as ``engines_meta`` to :func:`planner.frames.frames.engine_frame`. Timestamps are
``epoch0 + simulated seconds`` (``epoch0`` a multiple of ``window_s`` so windows align on
simulated time); windows that start before ``drop_before_s`` (default: the scenario's
``warmup_s``) are left out — the cold start of a simulated cluster is not history an
operator would have.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from collector.parse import read_exposition
from collector.rollup import Rollup
from core.errors import ConfigError
from core.records import BucketSum, Labels, Window
from planner.frames.frames import engine_frame
from planner.simulate.cluster import Simulation
from planner.simulate.exposition import engine_config, engine_view, pool_view, render

if TYPE_CHECKING:
    import pandas as pd

    from planner.simulate.scenario import Scenario

DEFAULT_SCRAPE_S = 15.0  # Prometheus' default scrape_interval is 1m; 15 s is the usual setting
DEFAULT_WINDOW_S = 60.0  # kvscope collect's default rollup window
DEFAULT_EPOCH0 = 1_700_000_040.0  # a multiple of 60 s (2023-11-14), so windows align


@dataclass(frozen=True, slots=True)
class EngineMeta:
    """What a targets file says about one engine source."""

    offload: str  # none | native | lmcache
    engine: int  # index in the simulated cluster
    node: int
    pool: int | None = None  # LMCache pool of the engine


@dataclass(frozen=True, slots=True)
class Telemetry:
    """Windows of every source, and the engine metadata the planner needs."""

    scenario: str
    windows: tuple[Window, ...]
    engines: dict[str, EngineMeta]  # engine source -> metadata
    pools: tuple[str, ...]  # LMCache pool sources (when rendered)
    scrape_s: float
    window_s: float
    epoch0: float
    scrapes: int  # scrape rounds
    sim_wall_s: float  # wall seconds spent simulating
    collect_wall_s: float  # wall seconds spent rendering, parsing and rolling up
    skipped: dict[str, int] = field(default_factory=dict)  # rollup skips by reason

    def frame(self) -> pd.DataFrame:
        """The planner's analysis frame (:func:`planner.frames.frames.engine_frame`)."""
        return engine_frame(list(self.windows), self.engines)


def generate(
    scenario: Scenario,
    *,
    scrape_s: float = DEFAULT_SCRAPE_S,
    window_s: float = DEFAULT_WINDOW_S,
    epoch0: float = DEFAULT_EPOCH0,
    pools: bool = False,
    drop_before_s: float | None = None,
    prefix: str = "",
    progress: Callable[[float, float], None] | None = None,
) -> Telemetry:
    """Simulate ``scenario`` and collect its telemetry every ``scrape_s`` simulated seconds.

    ``pools`` also scrapes the LMCache pools (their windows carry no ``engine`` label and
    are not needed by the gain fit; rendering them costs time). ``progress(now, end)`` is
    called about every 5 % of the simulated duration.
    """
    for name, value in (("scrape_s", scrape_s), ("window_s", window_s)):
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"telemetry {name} must be a positive number of seconds: {value}")
    if scrape_s > window_s:
        raise ConfigError(f"telemetry scrape_s ({scrape_s:g}) must be <= window_s ({window_s:g})")
    if not math.isfinite(epoch0) or epoch0 % window_s:
        raise ConfigError(f"telemetry epoch0 ({epoch0}) must be a multiple of window_s")
    cut = scenario.warmup_s if drop_before_s is None else drop_before_s
    sim = Simulation(scenario)
    cfg = engine_config(scenario)
    spec = scenario.cluster
    l2 = spec.lmcache.l2
    l2_name = l2.name if l2 is not None else ""
    pool_of = {e: p.idx for p in sim.pools for e in p.engines}
    engines = {
        f"{prefix}engine-{i}": EngineMeta(mode, i, i // spec.engines_per_node, pool_of.get(i))
        for i, mode in enumerate(spec.engines_offload)
    }
    eng_sources = list(engines)
    pool_sources = [f"{prefix}lmcache-{p.idx}" for p in sim.pools] if pools else []
    rollups = {s: Rollup(s, window_s) for s in [*eng_sources, *pool_sources]}
    out: list[Window] = []
    end = scenario.duration_s
    n_scrapes = math.floor(end / scrape_s + 1e-9) + 1  # t = 0, scrape_s, ..., <= end
    sim_wall = collect_wall = 0.0
    every = max(1, n_scrapes // 20)
    for k in range(n_scrapes):
        t = k * scrape_s
        t0 = time.perf_counter()
        sim.advance_to(t, settle=True)
        t1 = time.perf_counter()
        ts = epoch0 + t
        for i, source in enumerate(eng_sources):
            body = render(engine_view(sim.engines[i].snapshot(sim.now), cfg)).decode()
            out.extend(rollups[source].add(read_exposition(body, source, ts)))
        if pool_sources:
            for snap, source in zip(sim.lmcache_snapshots(), pool_sources, strict=True):
                body = render(pool_view(snap, cfg.model_name, l2_name)).decode()
                out.extend(rollups[source].add(read_exposition(body, source, ts)))
        sim_wall += t1 - t0
        collect_wall += time.perf_counter() - t1
        if progress is not None and (k % every == 0 or k == n_scrapes - 1):
            progress(t, end)
    t1 = time.perf_counter()
    skipped: dict[str, int] = {}
    for r in rollups.values():
        # the window holding the last scrape is partial (it ends with the run): close it
        # only when the last scrape is its final sample, as a clean collector stop would
        out.extend(r.flush())
        for reason, n in r.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + n
    collect_wall += time.perf_counter() - t1
    last_full = epoch0 + math.floor(end / window_s) * window_s  # windows ending after: partial
    keep = tuple(
        w for w in out if w.start >= epoch0 + cut and w.start + w.length_s <= last_full + 1e-9
    )
    return Telemetry(
        scenario=scenario.name,
        windows=keep,
        engines=engines,
        pools=tuple(pool_sources),
        scrape_s=scrape_s,
        window_s=window_s,
        epoch0=epoch0,
        scrapes=n_scrapes,
        sim_wall_s=sim_wall,
        collect_wall_s=collect_wall,
        skipped=skipped,
    )


def merge(parts: list[Telemetry], name: str = "") -> Telemetry:
    """Several runs' telemetry as one cluster's (sources must be distinct: use ``prefix``)."""
    if not parts:
        raise ConfigError("telemetry merge needs at least one part")
    engines: dict[str, EngineMeta] = {}
    for p in parts:
        clash = set(engines) & set(p.engines)
        if clash:
            raise ConfigError(f"telemetry merge: source {sorted(clash)[0]!r} appears twice")
        engines.update(p.engines)
    first = parts[0]
    if any((p.window_s, p.epoch0) != (first.window_s, first.epoch0) for p in parts):
        raise ConfigError("telemetry merge: parts have different window_s or epoch0")
    skipped: dict[str, int] = {}
    for p in parts:
        for k, v in p.skipped.items():
            skipped[k] = skipped.get(k, 0) + v
    return Telemetry(
        scenario=name or first.scenario,
        windows=tuple(w for p in parts for w in p.windows),
        engines=engines,
        pools=tuple(s for p in parts for s in p.pools),
        scrape_s=first.scrape_s,
        window_s=first.window_s,
        epoch0=first.epoch0,
        scrapes=sum(p.scrapes for p in parts),
        sim_wall_s=sum(p.sim_wall_s for p in parts),
        collect_wall_s=sum(p.collect_wall_s for p in parts),
        skipped=skipped,
    )


def bucket_sums(windows: Iterable[Window]) -> list[BucketSum]:
    """The bucket counts of ``windows`` summed per series and bucket layout, as
    ``Store.sum_buckets`` sums the same windows once written (each series' windows added in
    start order; windows without bucket counts left out): feed them to
    :func:`planner.frames.residency.combine` for the per-engine residency histograms the plan
    reads, without a store."""
    groups: dict[tuple[str, str, Labels, tuple[float, ...]], list[Window]] = {}
    for w in windows:
        if w.bucket_counts:
            groups.setdefault((w.source, w.signal, w.labels, w.bucket_bounds), []).append(w)
    out = []
    for (source, signal, labels, bounds), ws in groups.items():
        ws.sort(key=lambda w: w.start)
        counts = [0.0] * (len(bounds) + 1)
        for w in ws:
            counts = [a + float(b) for a, b in zip(counts, w.bucket_counts, strict=True)]
        out.append(
            BucketSum(source, signal, labels, bounds, tuple(counts), len(ws), ws[0].start,
                      ws[-1].start)
        )  # fmt: skip
    return sorted(out, key=lambda b: (b.source, b.signal, b.labels, b.last))
