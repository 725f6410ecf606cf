"""The garbage-collector policy of kvscope's heavy commands: ``kvscope collect`` applies it
once after start-up, ``kvscope inspect`` before it reads an exposition.

CPython frees almost every object by reference counting; its cyclic collector runs on top,
when the tracked objects allocated minus freed since the last run exceed a threshold (700
by default), and every so many of those runs it walks the older generations too. A
collector's heap is large and long-lived (imports, SQLAlchemy's metadata, every target's
roll-up state) and each scrape allocates thousands of short-lived samples, so at the
defaults the walks of that heap took ~40 % of the process's CPU
(benchmarks/bench_collector_vs_prometheus.py, 200 targets: 1.52 CPU-s per 1,000 scrapes at
the defaults, 0.87 with the cyclic collector off, 0.85 with this policy).

The policy, after start-up and before the loop:

* :func:`gc.freeze` — what start-up made (modules, settings, the store's engine) moves to a
  permanent generation no collection walks again (CPython's documented use: objects that
  live as long as the process);
* generation 0's threshold :data:`GEN0_THRESHOLD` (50,000): a young-generation run every
  50,000 net allocations instead of 700, so a scrape's short-lived objects are mostly freed
  by reference counting before any run sees them and few are promoted to the older
  generations, which are then walked far less often. The cost is that garbage in reference
  cycles waits longer: at most 50,000 tracked objects, a few MB.

A one-shot read of a federation-sized exposition (``kvscope inspect``, 156,000 lines) makes
~200,000 label tuples and samples that all live until the read ends: at the defaults each
young-generation run walks them again, ~15 % of the read (benchmarks/bench_inspect.py).

Cycles are still collected; nothing here turns the collector off.
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 50_000
GEN1_THRESHOLD = 20  # generation-0 runs per generation-1 run (CPython's default: 10)
GEN2_THRESHOLD = 10  # generation-1 runs per full run (CPython's default)


def tune_heap() -> tuple[int, int, int]:
    """Freeze the start-up heap and raise the thresholds; returns the previous thresholds."""
    before = gc.get_threshold()
    gc.collect()  # what start-up left as garbage is freed, not frozen
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD)
    return before
