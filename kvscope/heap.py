"""The C heap's policy while kvscope plans: freed blocks are kept for the next array.

A plan of 100 engines × 7 days holds columns of 12.75 M windows (~100 MB of float64 each)
and makes temporaries of that size at every step of the read, the frame and the fits.
glibc's malloc serves a request above its mmap threshold (which grows with use but never past
32 MB on 64-bit, ``DEFAULT_MMAP_THRESHOLD_MAX`` in glibc's malloc.c) with a fresh ``mmap``
and gives it back with ``munmap`` when it is freed, so every such temporary's pages are
faulted in and zeroed by the kernel again (numpy asks for transparent huge pages on arrays of
4 MB and more: the kernel zeroes 2 MB per fault). ``perf record`` of ``kvscope plan`` on
benchmarks/bench_plan.py's store: 34 % of the process's samples in the kernel's
``clear_page_erms``; 10–14 s of system time against 14–17 s of user time; 645,000 page
faults for a peak of 2.6 GB.

:func:`reuse_freed_memory`, around one plan:

* ``mallopt(M_MMAP_MAX, 0)``: every block comes from the heap, so a freed block serves the
  next request of its size without a fault (when the heap cannot grow, glibc still maps);
* ``mallopt(M_TRIM_THRESHOLD, TRIM_DURING)``: a free at the heap's top does not hand the
  memory back at once.

On leaving it, ``malloc_trim(0)`` hands every free page back and the two settings return to
glibc's defaults (mallopt(3)): a ``kvscope plan --every`` process holds its peak only while
it plans. Measured with benchmarks/bench_plan.py (``--baseline REV``, the same command of the
revision before this module, alternated): see docs/scale.md. Not glibc (musl, macOS): a
no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Iterator
from contextlib import contextmanager

# mallopt(3) parameters (glibc's malloc.h) and glibc's defaults for them
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
DEFAULT_TRIM_THRESHOLD = 128 * 1024
DEFAULT_MMAP_MAX = 65_536
TRIM_DURING = 2**31 - 1  # mallopt's value is a C int: 2 GiB of free top before a trim


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """glibc, or None where mallopt/malloc_trim are not glibc's."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    return libc


def _set(libc: ctypes.CDLL, trim: int, mmap_max: int) -> bool:
    """Both settings; True when glibc took them (mallopt returns 1 on success)."""
    return bool(libc.mallopt(M_TRIM_THRESHOLD, trim)) & bool(libc.mallopt(M_MMAP_MAX, mmap_max))


@contextmanager
def reuse_freed_memory() -> Iterator[bool]:
    """Keep freed blocks for reuse inside the block (module docstring); yields whether the
    policy is in effect (False: not glibc, nothing changed)."""
    libc = _libc()
    active = libc is not None and _set(libc, TRIM_DURING, 0)
    try:
        yield active
    finally:
        if libc is not None and active:
            _set(libc, DEFAULT_TRIM_THRESHOLD, DEFAULT_MMAP_MAX)
            libc.malloc_trim(0)
