"""The C heap's policy while kvscope plans: freed blocks are kept for the next array.

:func:`reuse_freed_memory`, around one plan: ``mallopt(M_MMAP_MAX, 0)`` and a high
``M_TRIM_THRESHOLD``, so the plan's ~100 MB temporaries reuse freed heap blocks instead of
being mmap'd, faulted in and zeroed by the kernel again each time (glibc caps its mmap
threshold at 32 MB, ``DEFAULT_MMAP_THRESHOLD_MAX`` in malloc.c); on leaving,
``malloc_trim(0)`` and glibc's defaults (mallopt(3)). Not glibc (musl, macOS): a no-op.

Why, and what it saves: kvscope/DESIGN.md#heap, benchmarks/README.md
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
    """Keep freed blocks for reuse inside the block (DESIGN.md#heap); yields whether the
    policy is in effect (False: not glibc, nothing changed)."""
    libc = _libc()
    active = libc is not None and _set(libc, TRIM_DURING, 0)
    try:
        yield active
    finally:
        if libc is not None and active:
            _set(libc, DEFAULT_TRIM_THRESHOLD, DEFAULT_MMAP_MAX)
            libc.malloc_trim(0)
