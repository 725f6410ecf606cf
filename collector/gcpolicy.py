"""The garbage-collector policy of kvscope's heavy commands: ``kvscope collect`` applies it
once after start-up, ``kvscope inspect`` before it reads an exposition.

:func:`gc.freeze` moves what start-up made to the permanent generation, and generation 0's
threshold goes from 700 to GEN0_THRESHOLD, so short-lived scrape objects are freed by
reference counting before a cyclic run sees them. Cycles are still collected.

Why, and what it saves: collector/DESIGN.md#gcpolicy, benchmarks/README.md
"""

from __future__ import annotations

import gc

# a young-generation run every 50,000 net allocations (CPython: 700); measured in
# benchmarks/README.md, "Measurements behind design choices"
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
