"""`kvscope plan --save` and `kvscope plan --every`: plans kept in the store, re-made on a clock.

``--save`` writes every record of the plan with Store.save_plan (idempotent on cluster, group
and window range). ``--every`` plans every cluster (or --cluster) on every multiple of the
interval, never overlapping; a failing cluster is logged and counted, plans the store could
not take wait in memory (MAX_UNSAVED) for the next rounds, and SIGINT / SIGTERM stop it with
the JSON summary and exit 0.

Design: kvscope/DESIGN.md#replan
"""

from __future__ import annotations

import logging
import math
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError, KvscopeError, StoreError
from core.kvscope_metrics import kvscope_version
from planner.plan import NoData, plan_records

if TYPE_CHECKING:
    from planner.plan import Plan
    from store.store import Store
    from store.tables import PlanRecord

log = logging.getLogger(__name__)
# Plan records made but not saved yet (a store outage), kept for the next rounds; past this
# the oldest are dropped (logged, counted as "unsaved_dropped"). A record is a plan document
# of ~10-100 kB: this bounds the memory at a few MB.
MAX_UNSAVED = 100


def resolve_cluster(store: Store, cluster: str | None) -> str:
    """``cluster``, else the store's only cluster; ConfigError asking for --cluster otherwise."""
    if cluster is not None:
        return cluster
    names = store.clusters()
    if len(names) == 1:
        return names[0]
    held = f"{len(names)} clusters ({', '.join(names[:5])})" if names else "no cluster yet"
    raise ConfigError(f"--save: which cluster? give --cluster NAME (the store holds {held})")


def save_plan(store: Store, plan: Plan, cluster: str, *, created_at: float) -> list[int]:
    """Store every record of ``plan`` as a plan of ``cluster``; their ids."""
    return [store.save_plan(r) for r in _records(plan, cluster, created_at)]


def _records(plan: Plan, cluster: str, created_at: float) -> list[PlanRecord]:
    return plan_records(plan, cluster=cluster, version=kvscope_version(), created_at=created_at)


# --------------------------------------------------------------------------- the loop


class _Interrupted(BaseException):
    """Raised by the signal handler into a plan being made (a BaseException, so that the
    planner's loop boundaries, which catch Exception, let it through)."""


@dataclass
class ReplanStats:
    """What the loop did (the JSON summary at exit, the progress line after each round)."""

    every_s: float
    started: float = field(default_factory=time.time)
    rounds: int = 0
    rounds_failed: int = 0  # rounds in which some cluster's plan failed
    skipped_rounds: int = 0
    plans_saved: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # by kind
    last_error: str | None = None
    interrupted: bool = False  # stopped while a plan was being made
    unsaved: list[PlanRecord] = field(default_factory=list)  # made, not saved yet: retried
    store_down: bool = False  # the last round could not reach the store

    def summary(self) -> dict[str, Any]:
        return {
            "mode": "every",
            "every_s": self.every_s,
            "rounds": self.rounds,
            "rounds_failed": self.rounds_failed,
            "skipped_rounds": self.skipped_rounds,
            "plans_saved": self.plans_saved,
            "plans_unsaved": len(self.unsaved),
            "errors": dict(sorted(self.failures.items())),
            "interrupted": self.interrupted,
            "duration_s": round(time.time() - self.started, 3),
            "last_error": self.last_error,
        }

    def progress_line(self, saved: int, clusters: int, seconds: float) -> str:
        line = (
            f"plan[every {self.every_s:g}s]: round {self.rounds}: {saved} plan(s) of "
            f"{clusters} cluster(s) saved in {seconds:.1f} s; {self.plans_saved} saved, "
            f"{self.rounds_failed} round(s) with failures, {self.skipped_rounds} skipped"
        )
        return line + (f"; last error: {self.last_error}" if self.last_error else "")


def _kind(exc: BaseException) -> str:
    if isinstance(exc, NoData):
        return "no_data"
    if isinstance(exc, StoreError):
        return "store"
    return "refused" if isinstance(exc, KvscopeError) else "unexpected"


class _Stopper:
    """SIGINT / SIGTERM set ``stop``; while ``planning`` they also abandon the plan.

    The handler's exception lands wherever the main thread is, and Python swallows it there
    when that is a weakref or GC callback (SQLAlchemy has some), printing "Exception ignored
    in …" and carrying on. So a raised interrupt is remembered: the hook for unraisable
    exceptions drops ours silently, and the planning block re-raises it when it ends, before
    the plan is saved.
    """

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.planning = False
        self.raised = False

    def __call__(self, _sig: int, _frame: FrameType | None) -> None:
        self.stop.set()
        if self.planning:
            self.planning = False
            self.raised = True
            raise _Interrupted

    def _unraisable(self, previous: Callable[[Any], object]) -> Callable[[Any], object]:
        def hook(unraisable: Any) -> object:
            if isinstance(unraisable.exc_value, _Interrupted):
                return None  # re-raised where the planning block ends (interruptible)
            return previous(unraisable)

        return hook

    @contextmanager
    def installed(self) -> Iterator[None]:
        old = {s: signal.signal(s, self) for s in (signal.SIGINT, signal.SIGTERM)}
        old_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable(old_hook)
        try:
            yield
        finally:
            sys.unraisablehook = old_hook
            for s, handler in old.items():
                signal.signal(s, handler)

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        if self.stop.is_set():
            raise _Interrupted
        self.planning = True
        try:
            yield
        finally:
            self.planning = False
        if self.raised:  # the handler raised, but the exception was swallowed on its way
            raise _Interrupted


@dataclass(frozen=True, slots=True)
class ReplanConfig:
    """The --every loop: a round every ``every_s`` seconds planning ``cluster`` (None: every
    cluster of the store) over the ``since_s`` before each round (None: all history)."""

    every_s: float
    cluster: str | None = None
    since_s: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.every_s) and self.every_s > 0):
            raise ConfigError(f"--every must be a positive duration, got {self.every_s!r} s")


def run_every(
    store: Store,
    config: ReplanConfig,
    make_plan: Callable[[Store, str, float | None], Plan],
) -> ReplanStats:
    """Re-plan every ``config.every_s`` until SIGINT / SIGTERM: each round
    plans with ``make_plan(store, cluster, since)`` and saves the plans (DESIGN.md#replan)."""
    every_s = config.every_s
    stats = ReplanStats(every_s)
    stopper = _Stopper()
    with stopper.installed():
        due = time.time()
        while not stopper.stop.is_set():
            started = time.time()
            try:
                saved, clusters = _round(store, stats, stopper, config, make_plan)
            except _Interrupted:
                stats.interrupted = True
                break
            end = time.time()
            stats.skipped_rounds += max(0, math.floor(end / every_s) - math.floor(due / every_s))
            due = (math.floor(end / every_s) + 1) * every_s
            line = stats.progress_line(saved, clusters, end - started)
            print(line, file=sys.stderr, flush=True)
            stopper.stop.wait(max(0.0, due - time.time()))
    return stats


def _round(
    store: Store,
    stats: ReplanStats,
    stopper: _Stopper,
    config: ReplanConfig,
    make_plan: Callable[[Store, str, float | None], Plan],
) -> tuple[int, int]:
    """One round; (plans saved, clusters planned)."""
    cluster, since_s = config.cluster, config.since_s
    started = time.time()
    stats.rounds += 1
    failed = saved = 0

    down = False

    def fail(what: str, exc: Exception) -> None:
        nonlocal failed, down
        failed += 1
        stats.failures[_kind(exc)] += 1
        down = down or isinstance(exc, StoreError)
        stats.last_error = f"{what}: {exc}".splitlines()[0]
        log.warning("plan round %d: %s", stats.rounds, stats.last_error)

    if stats.unsaved:  # plans an outage kept from being saved: theirs is the older history
        kept, stats.unsaved = stats.unsaved, []
        saved += _save_records(store, kept, stats, fail)
    try:
        clusters = [cluster] if cluster is not None else store.clusters()
    except Exception as exc:  # loop boundary: a store outage must not end the process
        fail("listing clusters", exc)
        clusters = []
    else:
        if not clusters:
            fail("the store", NoData("no cluster registered yet: run `kvscope collect` first"))
    for name in clusters:
        since = None if since_s is None else started - since_s
        try:
            with stopper.interruptible():
                plan = make_plan(store, name, since)
            records = _records(plan, name, time.time())
        except Exception as exc:  # loop boundary: one cluster's failure is counted, not fatal
            fail(f"cluster {name}", exc)
            continue
        saved += _save_records(store, records, stats, fail)
    if stats.store_down and not down:
        log.info("plan round %d: the store is reachable again", stats.rounds)
    stats.store_down = down
    stats.rounds_failed += bool(failed)
    return saved, len(clusters)


def _save_records(
    store: Store,
    records: list[PlanRecord],
    stats: ReplanStats,
    fail: Callable[[str, Exception], None],
) -> int:
    """Save ``records`` in order; keep the ones a store error refused for the next round
    (at most MAX_UNSAVED, oldest dropped first); how many were saved (counted at once in
    ``stats``: a stop may end the round before it ends)."""
    saved = 0
    for i, record in enumerate(records):
        try:
            store.save_plan(record)
        except StoreError as exc:  # the store is away: keep this one and the rest
            fail(f"saving the plan of cluster {record.cluster} (kept for the next round)", exc)
            stats.unsaved += records[i:]
            break
        except Exception as exc:  # loop boundary: a refused record is counted, not fatal
            fail(f"saving the plan of cluster {record.cluster}", exc)
        else:
            saved += 1
            stats.plans_saved += 1
    over = len(stats.unsaved) - MAX_UNSAVED
    if over > 0:
        stats.failures["unsaved_dropped"] += over
        log.error("plan: DROPPED %d unsaved plan record(s): over %d kept", over, MAX_UNSAVED)
        del stats.unsaved[:over]
    return saved
