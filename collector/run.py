"""The collect loop: scrape (or query Prometheus) on a fixed tick, roll up, write to the store.

Direct mode: every ``interval_s`` all targets are scraped concurrently; each target has its
own :class:`~collector.rollup.Rollup`; closed windows and every scrape outcome are written to
the store. Ticks sit on multiples of the interval (no drift); a tick whose scrape is still
running when the next one is due makes that next tick be skipped and counted, never overlap.
With ``store_targets`` the targets table is re-read at every tick and its vllm/lmcache rows
are scraped besides the targets file's (a file target wins a name clash): a target
registered through the API is scraped from the next tick on, a deleted one is no longer
scraped (its open windows are written). Those targets are checked by collector.urlguard at
every scrape; a refused one is an outcome of kind ``refused``, never a stop.
With ``file_sd`` (collector.file_sd) Prometheus file_sd files are re-read when they change and
their targets scraped too: the targets file wins a name clash over them, they win over the
store's; a file that stops parsing keeps its last targets (the error is logged and counted in
``file_sd_errors``), a target gone from the files is no longer scraped from the next tick.
A stop (SIGINT/SIGTERM, or ``stop.set()``) cancels the scrape in flight, flushes every open
window to the store and returns the loop's own statistics.

Prometheus mode lives in collector.run_prometheus (same statistics, same stop handling).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from collector.engine_facts import describe, engine_facts_of
from collector.engine_rules import EngineRules
from collector.errors import ConfigError, KvscopeError
from collector.file_sd import Discovered, FileSD
from collector.health import CollectorHealth
from collector.records import ScrapeOutcome, Snapshot, Window
from collector.rollup import Rollup
from collector.sources import (
    TARGET_KINDS,
    ClientPool,
    Clock,
    EngineMeta,
    ScrapeResult,
    Target,
    TargetSet,
    scrape_all,
)
from collector.store import Store
from collector.urlguard import URLPolicy

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class CollectStats:
    """The loop's own observability (returned at the end, shown in progress lines; served as
    metrics by collector.health.CollectorHealth under ``--metrics-addr``)."""

    mode: str
    started: float = field(default_factory=time.time)
    ticks: int = 0
    skipped_ticks: int = 0
    scrapes: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    windows_written: int = 0
    outcomes_written: int = 0
    targets_up: int = 0
    targets_down: int = 0
    last_lag_s: float = 0.0
    max_lag_s: float = 0.0
    last_tick_s: float = 0.0
    last_error: str | None = None
    store_errors: int = 0
    loop_errors: int = 0
    file_sd_errors: int = 0

    def summary(self) -> dict[str, Any]:
        """The JSON summary `kvscope collect` prints on stdout."""
        return {
            "mode": self.mode,
            "scrapes": self.scrapes,
            "ticks": self.ticks,
            "skipped_ticks": self.skipped_ticks,
            "windows_written": self.windows_written,
            "outcomes_written": self.outcomes_written,
            "targets_up": self.targets_up,
            "targets_down": self.targets_down,
            "errors": dict(sorted(self.failures.items())),
            "store_errors": self.store_errors,
            "loop_errors": self.loop_errors,
            "file_sd_errors": self.file_sd_errors,
            "max_lag_s": round(self.max_lag_s, 4),
            "duration_s": round(time.time() - self.started, 3),
            "last_error": self.last_error,
        }

    def progress_line(self) -> str:
        line = (
            f"collect[{self.mode}]: {self.targets_up} up, {self.targets_down} down, "
            f"{self.scrapes} scrapes, {self.windows_written} windows written, "
            f"{self.skipped_ticks} ticks skipped, lag {self.last_lag_s:.3f}s"
        )
        if self.last_error:
            line += f"; last error: {self.last_error}"
        return line


Progress = Callable[[CollectStats], None]
# Waits until the clock reaches ``deadline`` (or ``stop`` is set): sleep_until for the wall
# clock; a simulated cluster passes one that advances its simulation to the deadline.
SleepUntil = Callable[[float, asyncio.Event], Awaitable[None]]


def next_tick(now: float, interval_s: float) -> float:
    """The first multiple of ``interval_s`` strictly after ``now``."""
    return (math.floor(now / interval_s) + 1) * interval_s


def install_stop_signals(stop: asyncio.Event) -> None:
    """Make SIGINT and SIGTERM set ``stop`` (clean stop: flush, then exit 0)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


async def sleep_until(deadline: float, stop: asyncio.Event) -> None:
    delay = deadline - time.time()
    if delay <= 0 or stop.is_set():
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=delay)


async def unless_stopped(coro: Coroutine[Any, Any, T], stop: asyncio.Event) -> T | None:
    """Await ``coro`` unless ``stop`` is set first (then cancel it and return None)."""
    task = asyncio.ensure_future(coro)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


# --------------------------------------------------------------------------- engine facts


def engine_facts(snapshot: Snapshot) -> dict[str, Any]:
    """Facts worth keeping about an engine, from its exposition's info families and the
    signals it serves (collector.engine_facts: the raw rows, per-engine block counts, the
    offload mode it exposes and on what basis)."""
    return engine_facts_of(snapshot.facts, {s.signal for s in snapshot.samples})


def _model_of(snapshot: Snapshot) -> str | None:
    for sample in snapshot.samples:
        for key, value in sample.labels:
            if key == "model_name" and value:
                return value
    return None


def configured_facts(meta: EngineMeta | None) -> dict[str, Any]:
    """The engine facts a targets file wrote for a target (None: nothing written)."""
    if meta is None:
        return {}
    return {"model": meta.model, "gpu": meta.gpu, "tensor_parallel": meta.tensor_parallel,
            "offload": meta.offload}  # fmt: skip


def rule_labels(
    source: str, url: str, model: str | None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The labels engines.yaml rules match an engine on (collector.engine_rules)."""
    out = dict(extra or {})
    out |= {"source": source, "instance": urlsplit(url).netloc or source}
    if model:
        out["model_name"] = model
    return out


def register_targets(store: Store, targets: TargetSet) -> None:
    """Record the cluster, every target and the engine metadata of the targets file."""
    if not targets.targets:  # --targets-from-store alone: no file, no cluster of its own
        return
    store.upsert_cluster(targets.cluster)
    for t in targets:
        store.upsert_target(t.name, t.url, kind=t.kind, cluster=targets.cluster)
        if t.engine is not None:
            store.upsert_engine(
                targets.cluster,
                t.name,
                model=t.engine.model,
                gpu=t.engine.gpu,
                tensor_parallel=t.engine.tensor_parallel,
                offload=t.engine.offload,
            )


# --------------------------------------------------------------------------- direct mode


@dataclass(frozen=True, slots=True)
class StoreTargets:
    """Scrape the store's targets table too (re-read every tick), each URL under ``guard``.

    ``cluster``: only that cluster's targets (None: every cluster's).
    """

    guard: URLPolicy
    cluster: str | None = None


class _Direct:
    """State of the direct-scrape loop between ticks."""

    def __init__(
        self,
        targets: TargetSet,
        store: Store,
        window_s: float,
        stats: CollectStats,
        health: CollectorHealth | None = None,
        *,
        rules: EngineRules | None = None,
        file_sd: FileSD | None = None,
    ):
        self.targets = targets
        self.file_sd = file_sd
        self.discovered: dict[str, Discovered] = {}  # file_sd targets as registered in the store
        self.rules = rules  # engines.yaml (collector.engine_rules)
        self.store = store
        self.stats = stats
        self.health = health
        self.window_s = window_s
        self.rollups = {t.name: Rollup(t.name, window_s) for t in targets}
        self.facts: dict[str, dict[str, Any]] = {}
        self.state: dict[str, str] = {}  # target -> "up" or its last error kind
        self.pending: list[Window] = []
        self.clusters = {t.name: targets.cluster for t in targets}  # where engines register
        self.registered: list[Target] = []  # the store's targets as last read

    def current(self, source: StoreTargets | None) -> list[Target]:
        """This tick's targets: the file's, then file_sd's, then the store's (re-read; kept if
        that fails); the first of a name is scraped."""
        own = {t.name for t in self.targets}
        found = self._discover(self.file_sd, own) if self.file_sd is not None else []
        if source is not None:
            try:
                rows = self.store.targets(cluster=source.cluster)
            except KvscopeError as exc:
                self._store_failed("reading the targets table (scraping the last list read)", exc)
            else:
                ours = {n: (d.target.url, d.target.kind, d.cluster)
                        for n, d in self.discovered.items()}  # fmt: skip
                self.registered = [
                    Target(r.name, r.url, r.kind, guard=source.guard)
                    for r in rows
                    if r.kind in TARGET_KINDS  # not "prometheus" rows
                    and r.name not in own
                    and ours.get(r.name) != (r.url, r.kind, r.cluster)  # file_sd's own row
                ]
                for r in rows:
                    self.clusters.setdefault(r.name, r.cluster)
        taken = own | {t.name for t in found}
        targets = [*self.targets, *found, *(t for t in self.registered if t.name not in taken)]
        self._retarget({t.name for t in targets})
        return targets

    def _discover(self, sd: FileSD, own: set[str]) -> list[Target]:
        """file_sd's targets now (files re-read when changed); new ones registered in the store."""
        for error in sd.poll(reserved=own):  # each logged by file_sd
            self.stats.file_sd_errors += 1
            self.stats.last_error = f"file_sd: {error}"
        found = sd.targets
        fresh: dict[str, list[Discovered]] = {}
        for d in found:
            self.clusters[d.target.name] = d.cluster
            if self.discovered.get(d.target.name) != d:
                fresh.setdefault(d.cluster, []).append(d)
        for cluster, group in fresh.items():
            try:
                register_targets(self.store, TargetSet(cluster, tuple(d.target for d in group)))
            except KvscopeError as exc:  # tried again at the next tick
                self._store_failed(f"registering {len(group)} file_sd target(s)", exc)
            else:
                self.discovered.update((d.target.name, d) for d in group)
        return [d.target for d in found]

    def _retarget(self, names: set[str]) -> None:
        """A roll-up per new target; a gone one's open windows are written, its state dropped."""
        for name in sorted(names - self.rollups.keys()):
            self.rollups[name] = Rollup(name, self.window_s)
            log.warning("target %s registered: scraping it", name)
        gone = sorted(self.rollups.keys() - names)
        if not gone:
            return
        windows: list[Window] = []
        for name in gone:
            windows += self.rollups.pop(name).flush()
            for kept in (self.facts, self.state, self.clusters):
                kept.pop(name, None)
            log.warning("target %s no longer registered: not scraping it", name)
        self._write([], windows)

    def absorb(self, results: Sequence[ScrapeResult]) -> None:
        stats = self.stats
        windows: list[Window] = []
        up = 0
        for r in results:
            o = r.outcome
            stats.scrapes += 1
            self._log_transition(r.target, o)
            if self.health is not None:
                self.health.scraped(o.target, _outcome_kind(o), o.duration_s)
            if r.snapshot is None:
                stats.failures[_outcome_kind(o)] += 1
                stats.last_error = f"{o.target}: {o.error_kind}: {o.error}"
                continue
            up += 1
            windows += self.rollups[r.target.name].add(r.snapshot)
            self._register_facts(r.target, r.snapshot)
        stats.targets_up, stats.targets_down = up, len(results) - up
        self._write([r.outcome for r in results], windows)

    def flush(self) -> None:
        windows = [w for rollup in self.rollups.values() for w in rollup.flush()]
        self._write([], windows)

    def _log_transition(self, target: Target, outcome: ScrapeOutcome) -> None:
        now = "up" if outcome.up else (outcome.error_kind or "down")
        before = self.state.get(target.name)
        self.state[target.name] = now
        if before == now:
            return
        if outcome.up:
            if before is not None:
                log.warning("target %s is up again", target.name)
        else:
            log.warning("target %s is down: %s: %s", target.name, now, outcome.error)

    def _register_facts(self, target: Target, snapshot: Snapshot) -> None:
        """Store the engine's facts (collector.engine_facts.describe) when what it exposes
        changed since the last scrape, with the scrape's time as the change's."""
        if target.kind != "vllm":
            return
        facts = engine_facts(snapshot)
        if self.facts.get(target.name) == facts:
            return
        model = _model_of(snapshot)
        d = describe(
            facts, model_label=model, configured=configured_facts(target.engine),
            labels=rule_labels(target.name, target.url, model), rules=self.rules,
        )  # fmt: skip
        cluster = self.clusters.get(target.name, self.targets.cluster)
        try:
            self.store.upsert_engine(
                cluster, target.name, model=d.model, gpu=d.gpu, hbm_gb=d.hbm_gb,
                tensor_parallel=d.tensor_parallel, offload=d.offload, facts=d.facts,
                observed_at=snapshot.timestamp,
            )  # fmt: skip
        except KvscopeError as exc:
            self._store_failed(f"registering engine {target.name}", exc)
            return
        self.facts[target.name] = facts

    def _write(self, outcomes: list[ScrapeOutcome], windows: list[Window]) -> None:
        stats = self.stats
        try:
            if outcomes:
                stats.outcomes_written += self.store.write_outcomes(outcomes)
        except KvscopeError as exc:
            self._store_failed(f"writing {len(outcomes)} outcomes", exc)
        batch = self.pending + windows
        if not batch:
            return
        try:
            stats.windows_written += self.store.write_windows(batch)
            self.pending = []
        except KvscopeError as exc:
            # Keep them for the next tick (bounded: the oldest go first).
            self.pending = batch[-MAX_PENDING_WINDOWS:]
            self._store_failed(f"writing {len(batch)} windows (kept for retry)", exc)

    def _store_failed(self, what: str, exc: KvscopeError) -> None:
        self.stats.store_errors += 1
        self.stats.last_error = f"store: {what}: {exc}"
        log.error("store: %s: %s", what, exc)


MAX_PENDING_WINDOWS = 1_000_000


def _outcome_kind(outcome: ScrapeOutcome) -> str:
    """The outcome's name in metrics and summaries: up, or the error kind."""
    return "up" if outcome.up else (outcome.error_kind or "unknown")


async def collect_direct(
    targets: TargetSet,
    store: Store,
    *,
    interval_s: float,
    window_s: float,
    timeout_s: float,
    concurrency: int,
    max_body_bytes: int,
    once: bool = False,
    max_ticks: int | None = None,
    stop: asyncio.Event | None = None,
    progress: Progress | None = None,
    clock: Clock = time.time,
    sleep: SleepUntil = sleep_until,
    health: CollectorHealth | None = None,
    store_targets: StoreTargets | None = None,
    engine_rules: EngineRules | None = None,
    file_sd: FileSD | None = None,
) -> CollectStats:
    """Scrape ``targets`` every ``interval_s`` into ``store`` until stopped; see module doc.

    ``once``: a single scrape of every target; its outcomes are written and the flush writes
    the gauge and histogram-count windows a single sample gives (counter deltas and rates
    need two samples, so they are None in those windows). The per-target timeout is at most
    90 % of the interval, so a scrape round normally ends before the next tick.

    ``clock`` and ``sleep`` put the loop on another clock than the wall's (kvscope demo runs
    it on a simulated cluster's clock): ticks, lag and snapshot times follow ``clock``,
    ``sleep(deadline, stop)`` waits for the next tick; timeouts stay in wall seconds.

    ``health``: kvscope's own collector metrics, fed per scrape and per tick (None: not kept).

    ``store_targets``: also scrape the store's targets table, re-read at every tick (module
    doc); ``targets`` may then be empty.

    ``engine_rules``: engines.yaml rules for the facts the engines' metrics cannot say.

    ``file_sd``: also scrape the targets of Prometheus file_sd files, re-read when they change
    (module doc, collector.file_sd); ``targets`` may then be empty too.
    """
    if not (math.isfinite(interval_s) and interval_s > 0):
        raise ConfigError(f"scrape interval must be > 0 seconds, got {interval_s}")
    stats = CollectStats(mode="direct")
    stop = stop if stop is not None else asyncio.Event()
    limit = 1 if once else max_ticks
    timeout = min(timeout_s, 0.9 * interval_s) if not once else timeout_s
    register_targets(store, targets)
    state = _Direct(targets, store, window_s, stats, health, rules=engine_rules, file_sd=file_sd)
    async with ClientPool(timeout_s=timeout) as client:
        index = math.floor(clock() / interval_s)  # the first tick runs at once
        scheduled = clock()
        while not stop.is_set():
            began = clock()
            stats.last_lag_s = max(0.0, began - scheduled)
            stats.max_lag_s = max(stats.max_lag_s, stats.last_lag_s)
            try:
                now = state.current(store_targets)
                if health is not None:
                    health.set_targets(t.name for t in now)
                await client.retain(now)
                results = await unless_stopped(
                    scrape_all(
                        now,
                        timeout_s=timeout,
                        concurrency=concurrency,
                        max_body_bytes=max_body_bytes,
                        client=client,
                        clock=clock,
                    ),
                    stop,
                )
                if results is None:
                    break
                state.absorb(results)
            except Exception as exc:  # loop boundary: a bug in one round must not end collection
                log.exception("collect round failed")
                stats.loop_errors += 1
                stats.last_error = f"internal: {type(exc).__name__}: {exc}"
            stats.ticks += 1
            stats.last_tick_s = clock() - began
            if progress is not None:
                progress(stats)
            if health is not None:
                health.ticked(stats)
            if limit is not None and stats.ticks >= limit:
                break
            following = math.floor(clock() / interval_s) + 1
            if following - index > 1:  # the scrape overran whole ticks: skip them, never overlap
                stats.skipped_ticks += following - index - 1
                log.warning(
                    "scrape round took %.3f s > interval %g s: skipped %d tick(s)",
                    stats.last_tick_s,
                    interval_s,
                    following - index - 1,
                )
            index = following
            scheduled = index * interval_s
            await sleep(scheduled, stop)
    state.flush()
    if progress is not None:
        progress(stats)
    if health is not None:
        health.ticked(stats)  # the flush's windows (no tick: the last-success stamp stays)
    return stats


def run_until_signalled(main: Callable[[asyncio.Event], Coroutine[Any, Any, T]]) -> T:
    """Run ``main(stop)`` in a fresh event loop with SIGINT/SIGTERM wired to ``stop``."""

    async def runner() -> T:
        stop = asyncio.Event()
        install_stop_signals(stop)
        return await main(stop)

    return asyncio.run(runner())
