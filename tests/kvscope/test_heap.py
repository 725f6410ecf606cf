"""kvscope.heap: inside reuse_freed_memory a large block comes from the heap (no mmap of its
own), the policy ends with the block (raising or not), and leaving it hands the free heap
back. (That a plan is the same plan with it: benchmarks/bench_plan.py compares the JSON.)"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kvscope import heap

BIG = 64 * 1024 * 1024  # above glibc's largest mmap threshold (32 MB)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")
    ]  # fmt: skip


def _mallinfo() -> _MallInfo2:
    libc = heap._libc()
    assert libc is not None
    libc.mallinfo2.restype = _MallInfo2
    info: _MallInfo2 = libc.mallinfo2()
    return info


def _mapped_bytes() -> int:
    """Bytes malloc holds in blocks mapped one by one (mallinfo2's hblkhd)."""
    return int(_mallinfo().hblkhd)


def _growth_while_held() -> int:
    before = _mapped_bytes()
    block = np.ones(BIG // 8)
    grown = _mapped_bytes() - before
    del block
    return grown


pytestmark = pytest.mark.skipif(heap._libc() is None, reason="glibc's malloc only")


def test_big_blocks_come_from_the_heap_inside_only() -> None:
    assert _growth_while_held() >= BIG  # glibc's default: a block this size is mapped alone
    with heap.reuse_freed_memory() as active:
        assert active
        assert _growth_while_held() == 0
    assert _growth_while_held() >= BIG  # the defaults are back


def test_the_policy_ends_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), heap.reuse_freed_memory():
        raise RuntimeError("a plan failed")
    assert _growth_while_held() >= BIG


def test_freed_memory_is_handed_back_on_leaving() -> None:
    with heap.reuse_freed_memory():
        blocks = [np.ones(BIG // 8) for _ in range(3)]
        del blocks
        held = int(_mallinfo().fordblks)  # free bytes the heap keeps
        assert held >= 3 * BIG
    assert int(_mallinfo().fordblks) < held - 2 * BIG
