"""collector.gcpolicy: the start-up heap is frozen, the thresholds raised, cycles still
collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from collector.gcpolicy import GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD, tune_heap


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


@pytest.mark.usefixtures("restored_gc")
def test_tune_freezes_the_heap_and_raises_the_thresholds() -> None:
    gc.unfreeze()
    before = gc.get_threshold()
    assert tune_heap() == before
    assert gc.get_threshold() == (GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD)
    assert gc.get_freeze_count() > 1_000  # the modules and everything imported


@pytest.mark.usefixtures("restored_gc")
def test_cycles_made_after_it_are_still_collected() -> None:
    tune_heap()

    class Node:
        def __init__(self) -> None:
            self.other: Node | None = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    ref = weakref.ref(a)
    del a, b
    assert ref() is not None  # a cycle: reference counting alone never frees it
    gc.collect()
    assert ref() is None
