"""The collect loop: scrape (or query Prometheus) on a fixed tick, roll up, write to the store.

Direct mode: every ``interval_s`` all targets (the targets file, the store's table, file_sd
files) are scraped concurrently, each into its own Rollup; closed windows of the kept signals
and every scrape outcome go to the store through a spool, and each target's roll-up is
checkpointed, so outages and kill -9 lose no counter increase. Ticks never drift or overlap;
a stop flushes every open window. Prometheus mode lives in collector.run_prometheus.

Design: collector/DESIGN.md#run
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

from collector.checkpoint import Checkpoints, Saved, newest, open_windows, resume
from collector.engine_facts import describe, engine_facts_of
from collector.engine_rules import EngineRules
from collector.file_sd import Discovered, FileSD
from collector.keep import kept_windows
from collector.rollup import Rollup
from collector.run_config import DirectConfig
from collector.scrape import (
    TARGET_KINDS,
    ClientPool,
    Clock,
    EngineMeta,
    ScrapeResult,
    Target,
    TargetSet,
    scrape_all,
)
from collector.self_metrics import CollectorHealth
from collector.spool import Spool, SpoolCounts
from collector.urlguard import URLPolicy
from core.errors import KvscopeError
from core.records import ScrapeOutcome, Snapshot, Window
from store.retention import Pruner
from store.store import Store

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class CollectStats:
    """The loop's own observability (returned at the end, shown in progress lines; served as
    metrics by collector.self_metrics.CollectorHealth under ``--metrics-addr``)."""

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
    checkpoint_errors: int = 0
    states_taken: int = 0  # roll-up states resumed from the store (store.handoff)
    states_left: int = 0  # roll-up states left in the store at the stop
    spool: SpoolCounts = field(default_factory=SpoolCounts)  # the loop's Spool's own counts

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
            "checkpoint_errors": self.checkpoint_errors,
            "states_taken": self.states_taken,
            "states_left": self.states_left,
            "spool": self.spool.summary(),
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
        if self.spool.pending_windows or self.spool.pending_outcomes:
            line += f", {self.spool.pending_windows} windows spooled"
        if self.spool.dropped_windows:
            line += f", {self.spool.dropped_windows} windows DROPPED"
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
            "offload": meta.offload, "pool": meta.pool}  # fmt: skip


def rule_labels(
    source: str, url: str, model: str | None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The labels engines.yaml rules match an engine on (collector.engine_rules)."""
    out = dict(extra or {})
    out |= {"source": source, "instance": urlsplit(url).netloc or source}
    if model:
        out["model_name"] = model
    return out


def _with_pool(store: Store, source: str, pool: str | None) -> dict[str, Any] | None:
    """The engine's stored facts with the targets file's ``pool`` (None: leave them as they
    are), so registering from configuration never drops facts an engine exposed."""
    if pool is None:
        return None
    known = store.engines(source=source)
    facts = dict(known[0].facts or {}) if known else {}
    return facts | {"pool": pool}


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
                facts=_with_pool(store, t.name, t.engine.pool),
            )


# --------------------------------------------------------------------------- direct mode


@dataclass(frozen=True, slots=True)
class StoreTargets:
    """Scrape the store's targets table too (re-read every tick), each URL under ``guard``.

    ``cluster``: only that cluster's targets (None: every cluster's).
    """

    guard: URLPolicy
    cluster: str | None = None


@dataclass(frozen=True, slots=True)
class LoopParts:
    """What a collect loop reports to and works with besides its source and the store.

    ``progress``: called after each tick; ``health``: kvscope's own collector metrics;
    ``engine_rules``: engines.yaml, for the facts the engines' metrics cannot say;
    ``pruner``: retention, at the start and every hour (store.retention). None: not used.
    """

    progress: Progress | None = None
    health: CollectorHealth | None = None
    engine_rules: EngineRules | None = None
    pruner: Pruner | None = None


@dataclass(frozen=True, slots=True)
class DirectParts(LoopParts):
    """LoopParts plus the direct loop's own: other target sources, local state, the clock.

    ``store_targets``, ``file_sd``: more targets, re-read every tick; ``spool``: where
    refused writes wait; ``checkpoints``: roll-up states saved and resumed; ``clock`` and
    ``sleep``: the loop's time (collect_direct's docstring).
    """

    store_targets: StoreTargets | None = None
    file_sd: FileSD | None = None
    spool: Spool | None = None
    checkpoints: Checkpoints | None = None
    clock: Clock = time.time
    sleep: SleepUntil = sleep_until


class _StoreSink:
    """The store as the spool's sink: windows written with ``keep_fuller`` (a partial version
    of a window never replaces a fuller one; collector.checkpoint)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def write_windows(self, windows: Sequence[Window]) -> int:
        return self.store.write_windows(windows, keep_fuller=True)

    def write_outcomes(self, outcomes: Sequence[ScrapeOutcome]) -> int:
        return self.store.write_outcomes(outcomes)


class _DirectLoopState:
    """State of the direct-scrape loop between ticks."""

    def __init__(
        self,
        targets: TargetSet,
        store: Store,
        config: DirectConfig,
        parts: DirectParts,
        stats: CollectStats,
    ):
        self.keep = config.keep  # the signals written (collector.keep; None: all)
        self.shard = config.shard  # splits file_sd's and the store's targets at every tick
        self.handoff = not config.once  # take and leave roll-up states in the store
        self.targets = targets
        self.file_sd = parts.file_sd
        self.discovered: dict[str, Discovered] = {}  # file_sd targets as registered in the store
        self.rules = parts.engine_rules  # engines.yaml (collector.engine_rules)
        self.store = store
        self.stats = stats
        self.health = parts.health
        self.window_s = config.window_s
        self.spool = parts.spool if parts.spool is not None else Spool(None, store_id=store.url)
        stats.spool = self.spool.counts
        self.sink = _StoreSink(store)
        self.drain_budget_s = max(0.5, 0.5 * config.interval_s)
        self.checkpoints = parts.checkpoints
        self.clock = parts.clock
        self.urls: dict[str, str] = {}  # target -> the URL its roll-up state is of
        self.leftover: list[Window] = []  # open windows of checkpoints not resumed
        self.rollups: dict[str, Rollup] = {}
        self._add_rollups(targets.targets)
        self.facts: dict[str, dict[str, Any]] = {}
        self.state: dict[str, str] = {}  # target -> "up" or its last error kind
        self.clusters = {t.name: targets.cluster for t in targets}  # where engines register
        self.registered: list[Target] = []  # the store's targets as last read
        self.saves = 0  # checkpoints written
        self.checkpoint_s = config.checkpoint_s  # at most this long between saves (0: each tick)
        self.saved_at: float | None = None  # clock() of the last save

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
        others = [*found, *(t for t in self.registered if t.name not in taken)]
        if self.shard is not None:  # the file's targets were split once, by collect_direct
            others = self.shard.select(others)
        targets = [*self.targets, *others]
        self._retarget(targets)
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

    def _retarget(self, targets: Sequence[Target]) -> None:
        """A roll-up per new target; a gone one's open windows are written, its state dropped."""
        names = {t.name for t in targets}
        new = sorted((t for t in targets if t.name not in self.rollups), key=lambda t: t.name)
        self._add_rollups(new)
        for t in new:
            log.warning("target %s registered: scraping it", t.name)
        gone = sorted(self.rollups.keys() - names)
        if not gone:
            return
        windows: list[Window] = []
        for name in gone:
            windows += self.rollups.pop(name).flush()
            for kept in (self.facts, self.state, self.clusters, self.urls):
                kept.pop(name, None)
            log.warning("target %s no longer registered: not scraping it", name)
        self._write([], windows)

    # -- restarts (collector.checkpoint) ----------------------------------------------------

    def _add_rollups(self, targets: Sequence[Target]) -> None:
        """A roll-up per target, resumed from the newer of its checkpoint and the state the
        store holds for it (store.handoff) when it can be (collector.checkpoint.resume);
        the open windows of states not resumed are written at the next write."""
        handed: dict[str, Saved] = {}
        if self.handoff and targets:
            try:
                handed = self.store.take_rollup_states([t.name for t in targets])
            except KvscopeError as exc:  # they start afresh, as without a state
                self._store_failed(f"taking the roll-up states of {len(targets)} target(s)", exc)
        for t in targets:
            self.urls[t.name] = t.url
            local = self.checkpoints.claim(t.name) if self.checkpoints is not None else None
            saved, older = newest(local, handed.get(t.name))
            rollup, left_open = resume(saved, t.name, t.url, self.window_s, self.clock())
            if saved is not None and saved is not local and rollup.last_timestamp is not None:
                self.stats.states_taken += 1
            if older is not None and older is local:  # a kill -9 never wrote its open windows
                left_open += open_windows(older, now=self.clock())
            self.leftover += left_open
            self.rollups[t.name] = rollup

    def leave_states(self) -> None:
        """At the stop: every target's roll-up state in the store, for whichever collector
        scrapes it next (store.handoff)."""
        if not self.handoff or not self.rollups:
            return
        now = self.clock()  # the samples' clock: retention prunes states by it
        states = [Saved(name, self.urls[name], now, r.export_state())
                  for name, r in self.rollups.items()]  # fmt: skip
        try:
            self.stats.states_left += self.store.leave_rollup_states(states)
        except KvscopeError as exc:
            self._store_failed(
                f"leaving {len(states)} roll-up states (a collector elsewhere starts those "
                "targets afresh; one on this state directory resumes its checkpoints)",
                exc,
            )

    def save_checkpoint(self, *, force: bool = True) -> None:
        """Checkpoint every roll-up (after the tick's windows were written or spooled). The
        first save writes the open windows of gone collectors' stale states first.

        Unless ``force``, only when ``checkpoint_s`` have passed since the last save: a tick
        that closed windows must force it (a checkpoint older than a written window would,
        resumed, count the counter increase before that window's end twice)."""
        if self.checkpoints is None:
            return
        now = self.clock()
        if not force and self.saved_at is not None and now - self.saved_at < self.checkpoint_s:
            return
        self.saved_at = now
        if not self.saves:
            for saved in self.checkpoints.stale(now=now):
                self.leftover += open_windows(saved, now=now)
        if self.leftover:
            self._write([], [])
        states = {name: (self.urls[name], r.export_state()) for name, r in self.rollups.items()}
        if self.checkpoints.save(states):
            self.saves += 1
        else:
            self.stats.checkpoint_errors += 1
            self.stats.last_error = f"checkpoint: cannot write {self.checkpoints.path}"

    def roll_up_and_write(self, results: Sequence[ScrapeResult]) -> int:
        """Roll the results up, write the windows they closed and every outcome; returns how
        many windows closed."""
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
            if self.health is not None:  # value anomalies of an up scrape (collector.parse)
                self.health.anomalies(o.target, r.snapshot.anomalies)
            windows += self.rollups[r.target.name].add(r.snapshot)
            self._register_facts(r.target, r.snapshot)
        stats.targets_up, stats.targets_down = up, len(results) - up
        self._write([r.outcome for r in results], windows)
        return len(windows)

    def flush(self) -> None:
        """Write every open window (the stop): the checkpoint keeps them open for a restart."""
        windows = [w for rollup in self.rollups.values() for w in rollup.flush()]
        self._write([], windows, budget_s=STOP_DRAIN_BUDGET_S)

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

    def _write(
        self,
        outcomes: list[ScrapeOutcome],
        windows: list[Window],
        *,
        budget_s: float | None = None,
    ) -> None:
        """Write through the spool: what it holds first (for at most ``budget_s``, default the
        loop's), then these (spooled when refused)."""
        if self.leftover:
            windows, self.leftover = [*self.leftover, *windows], []
        windows = list(kept_windows(windows, self.keep))
        budget = self.drain_budget_s if budget_s is None else budget_s
        done = self.spool.write(self.sink, windows, outcomes, budget_s=budget)
        self.stats.windows_written += done.windows
        self.stats.outcomes_written += done.outcomes
        if done.error is not None:
            pending = self.spool.counts.pending_windows
            self._store_failed(
                f"writing {len(windows)} windows and {len(outcomes)} outcomes "
                f"(spooled: {pending} windows waiting)",
                done.error,
            )

    def _store_failed(self, what: str, exc: KvscopeError) -> None:
        self.stats.store_errors += 1
        self.stats.last_error = f"store: {what}: {exc}"
        log.error("store: %s: %s", what, exc)


# How long a stop may spend writing spooled windows back (the rest stays spooled, on disk, for
# the next start): well inside Kubernetes' default 30 s grace period before its SIGKILL.
STOP_DRAIN_BUDGET_S = 10.0


def _outcome_kind(outcome: ScrapeOutcome) -> str:
    """The outcome's name in metrics and summaries: up, or the error kind."""
    return "up" if outcome.up else (outcome.error_kind or "unknown")


async def collect_direct(
    targets: TargetSet,
    store: Store,
    config: DirectConfig,
    parts: DirectParts | None = None,
    *,
    stop: asyncio.Event | None = None,
) -> CollectStats:
    """Scrape ``targets`` every ``interval_s`` into ``store`` until stopped (DESIGN.md#run).

    ``once``: one scrape of every target. ``clock``/``sleep``: another clock than the wall's.
    ``health``: kvscope's own metrics. ``store_targets`` / ``file_sd``: scrape those targets
    too (``targets`` may then be empty). ``engine_rules``: engines.yaml. ``spool``: where what
    the store refused waits (None: memory only). ``checkpoints`` / ``checkpoint_s``: save and
    resume roll-up states (collector.checkpoint). ``shard``: this shard's targets only.
    ``pruner``: retention every hour. ``keep``: the signals whose windows are written.
    """
    parts = parts if parts is not None else DirectParts()
    interval_s, clock, health = config.interval_s, parts.clock, parts.health
    stats = CollectStats(mode="direct")
    stop = stop if stop is not None else asyncio.Event()
    limit = 1 if config.once else config.max_ticks
    if config.shard is not None:
        targets = TargetSet(targets.cluster, tuple(config.shard.select(targets)))
    register_targets(store, targets)
    state = _DirectLoopState(targets, store, config, parts, stats)
    async with ClientPool() as client:
        index = math.floor(clock() / interval_s)  # the first tick runs at once
        scheduled = clock()
        while not stop.is_set():
            began = clock()
            stats.last_lag_s = max(0.0, began - scheduled)
            stats.max_lag_s = max(stats.max_lag_s, stats.last_lag_s)
            try:
                if not await _direct_round(state, client, config, parts, stop):
                    break
            except Exception as exc:  # loop boundary: a bug in one round must not end collection
                log.exception("collect round failed")
                stats.loop_errors += 1
                stats.last_error = f"internal: {type(exc).__name__}: {exc}"
            stats.ticks += 1
            stats.last_tick_s = clock() - began
            _report(stats, parts)
            if limit is not None and stats.ticks >= limit:
                break
            index = _next_index(stats, index, clock(), interval_s)
            scheduled = index * interval_s
            await parts.sleep(scheduled, stop)
    state.save_checkpoint()  # the open windows still open: a restart inside them resumes them
    state.leave_states()  # the same, for a collector elsewhere that takes a target over
    state.flush()
    if parts.pruner is not None:
        await parts.pruner.close()
    if parts.progress is not None:
        parts.progress(stats)
    if health is not None:
        health.ticked(stats)  # the flush's windows (no tick: the last-success stamp stays)
        health.spooled(stats.spool)
    return stats


async def _direct_round(
    state: _DirectLoopState,
    client: ClientPool,
    config: DirectConfig,
    parts: DirectParts,
    stop: asyncio.Event,
) -> bool:
    """One tick: scrape this tick's targets, roll up, write, checkpoint, prune; False when
    the stop came during the scrape."""
    interval_s = config.interval_s
    timeout = min(config.timeout_s, 0.9 * interval_s) if not config.once else config.timeout_s
    now = state.current(parts.store_targets)
    if parts.health is not None:
        parts.health.set_targets(t.name for t in now)
    await client.retain(now)
    results = await unless_stopped(
        scrape_all(
            now,
            timeout_s=timeout,
            concurrency=config.concurrency,
            max_body_bytes=config.max_body_bytes,
            client=client,
            clock=parts.clock,
        ),
        stop,
    )
    if results is None:
        return False
    closed = state.roll_up_and_write(results)
    state.save_checkpoint(force=closed > 0)
    if parts.pruner is not None:
        parts.pruner.tick(parts.clock())
    return True


def _report(stats: CollectStats, parts: LoopParts) -> None:
    """After a tick: the progress callback and the health metrics."""
    if parts.progress is not None:
        parts.progress(stats)
    if parts.health is not None:
        parts.health.ticked(stats)
        parts.health.spooled(stats.spool)


def _next_index(stats: CollectStats, index: int, now: float, interval_s: float) -> int:
    """The next tick's index; the ticks a scrape round overran are skipped (never overlap),
    counted and logged."""
    following = math.floor(now / interval_s) + 1
    if following - index > 1:
        stats.skipped_ticks += following - index - 1
        log.warning(
            "scrape round took %.3f s > interval %g s: skipped %d tick(s)",
            stats.last_tick_s,
            interval_s,
            following - index - 1,
        )
    return following


def run_until_signalled(main: Callable[[asyncio.Event], Coroutine[Any, Any, T]]) -> T:
    """Run ``main(stop)`` in a fresh event loop with SIGINT/SIGTERM wired to ``stop``."""

    async def runner() -> T:
        stop = asyncio.Event()
        install_stop_signals(stop)
        return await main(stop)

    return asyncio.run(runner())
