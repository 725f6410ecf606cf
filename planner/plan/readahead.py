"""`kvscope plan`'s windows read by a forked child while this process loads the fits.

:func:`read_ahead` starts the reads (planner/plan/windows.py ``signal_parts``) in a child
before this process opens the store; this process imports FIT_MODULES in a thread and folds
each signal as it arrives, in the order it would have read them: the same plan, ~1–3 s
sooner on 100 engines. No child with one CPU, other threads or ``KVSCOPE_PLAN_JOBS=1``.

Design: planner/plan/METHODS.md#reading-ahead
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext

from planner.plan.fork import Streamed, can_stream
from planner.plan.windows import SignalPart, signal_parts
from store.store import Store

# What the fits, verdicts and forecasts import when they first run (the imports marked
# "start-up" in planner/; tests/planner/test_readahead.py keeps the two lists equal).
FIT_MODULES = (
    "scipy.optimize",
    "scipy.special",
    "scipy.stats",
    "statsmodels.genmod.families",
    "statsmodels.genmod.generalized_linear_model",
    "statsmodels.regression.linear_model",
    "statsmodels.stats.sandwich_covariance",
    "statsmodels.stats.weightstats",
    "statsmodels.tools.sm_exceptions",
    "statsmodels.tools.tools",
    "statsmodels.tsa.exponential_smoothing.ets",
    "statsmodels.tsa.stattools",
    "statsmodels.tsa.statespace.sarimax",
)


def load_fit_modules() -> None:
    """Import FIT_MODULES now (while a child reads), not when each fit first runs."""
    for name in FIT_MODULES:
        importlib.import_module(name)


def read_ahead(
    url: str,
    cluster: Callable[[Store], str | None],
    *,
    since: float | None,
    until: float | None,
    around: Callable[[], AbstractContextManager[object]] = nullcontext,
) -> Streamed[SignalPart] | None:
    """The plan's signal parts (planner/plan/windows.py ``signal_parts``) of the store at
    ``url``, read by a child started now, inside ``around()`` (the plan's heap policy,
    kvscope/heap.py), while this process imports FIT_MODULES in a thread; ``cluster(store)``
    names the cluster to read (None: all). None where no child can be started
    (planner/plan/fork.py ``can_stream``): the plan then reads its windows itself. Call it
    before this process opens ``url``."""
    if not can_stream():
        return None

    def produce() -> Iterator[SignalPart]:
        with around(), Store(url) as store:
            yield from signal_parts(store, cluster=cluster(store), since=since, until=until)

    return Streamed(produce, meanwhile=load_fit_modules)
