"""`kvscope plan --save` and `kvscope plan --every`: plans kept in the store, re-made on a clock.

``--save`` writes every record of the plan (planner.plan.plan_records: the cluster's, and
each model group's when it was planned per group) with Store.save_plan, under kvscope's
version and the time it was made. Saving a plan of the same history again replaces it
(the store is idempotent on cluster, group and window range). The cluster is --cluster, else
the store's only cluster; with several (or none) a ConfigError asks for --cluster.

``--every`` is a long-running process like `kvscope collect`: one round at start, then one
on every multiple of the interval (no drift; a round still running when the next is due
makes that one be skipped and counted, never overlap). A round plans every cluster of the
store (or the one given) over the ``--since`` before it and saves the plans. A cluster that
fails (NoData, a store outage, any refusal) is logged on stderr and counted, never fatal.
SIGINT / SIGTERM stop the loop: a plan being made is abandoned (nothing of it was written),
a save in progress finishes; the JSON summary goes to stdout and the exit code is 0.
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

from collector.errors import ConfigError, KvscopeError, StoreError
from collector.selfmetrics import kvscope_version

if TYPE_CHECKING:
    from collector.store import Store
    from planner.plan import Plan

log = logging.getLogger(__name__)


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
    from planner.plan import plan_records

    records = plan_records(plan, cluster=cluster, version=kvscope_version(), created_at=created_at)
    return [store.save_plan(r) for r in records]


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

    def summary(self) -> dict[str, Any]:
        return {
            "mode": "every",
            "every_s": self.every_s,
            "rounds": self.rounds,
            "rounds_failed": self.rounds_failed,
            "skipped_rounds": self.skipped_rounds,
            "plans_saved": self.plans_saved,
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
    from planner.plan import NoData

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


def run_every(
    store: Store,
    *,
    every_s: float,
    cluster: str | None,
    since_s: float | None,
    make_plan: Callable[[Store, str, float | None], Plan],
) -> ReplanStats:
    """Re-plan every ``every_s`` until SIGINT / SIGTERM (module docstring): each round plans
    ``cluster`` or every cluster of the store with ``make_plan(store, cluster, since)`` over
    the ``since_s`` before it (None: all history) and saves the plans."""
    if not (math.isfinite(every_s) and every_s > 0):
        raise ConfigError(f"--every must be a positive duration, got {every_s!r} s")
    stats = ReplanStats(every_s)
    stopper = _Stopper()
    with stopper.installed():
        due = time.time()
        while not stopper.stop.is_set():
            started = time.time()
            try:
                saved, clusters = _round(store, stats, stopper, cluster, since_s, make_plan)
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


def _round(  # noqa: PLR0917 - the loop's state and the round's arguments
    store: Store,
    stats: ReplanStats,
    stopper: _Stopper,
    cluster: str | None,
    since_s: float | None,
    make_plan: Callable[[Store, str, float | None], Plan],
) -> tuple[int, int]:
    """One round; (plans saved, clusters planned)."""
    started = time.time()
    stats.rounds += 1
    failed = saved = 0

    def fail(what: str, exc: Exception) -> None:
        nonlocal failed
        failed += 1
        stats.failures[_kind(exc)] += 1
        stats.last_error = f"{what}: {exc}".splitlines()[0]
        log.warning("plan round %d: %s", stats.rounds, stats.last_error)

    try:
        clusters = [cluster] if cluster is not None else store.clusters()
    except Exception as exc:  # loop boundary: a store outage must not end the process
        fail("listing clusters", exc)
        clusters = []
    else:
        if not clusters:
            from planner.plan import NoData

            fail("the store", NoData("no cluster registered yet: run `kvscope collect` first"))
    for name in clusters:
        since = None if since_s is None else started - since_s
        try:
            with stopper.interruptible():
                plan = make_plan(store, name, since)
            saved += len(save_plan(store, plan, name, created_at=time.time()))
        except Exception as exc:  # loop boundary: one cluster's failure is counted, not fatal
            fail(f"cluster {name}", exc)
    stats.plans_saved += saved
    stats.rounds_failed += bool(failed)
    return saved, len(clusters)
