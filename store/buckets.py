"""A window's bucket counts as the store keeps them: one small BLOB in ``windows.buckets``.

Only the catalogue's ``keep_buckets`` histograms have them; every other row's column is
NULL. The BLOB is self-describing: a format byte, a width byte (:data:`WIDTHS`: zero, 8/16/32
bit unsigned or float64 counts), a varint length, the finite bounds as zigzag-varint decimal
mantissa and exponent (exact), then one count per bucket, +Inf last. Decoding caches each
layout prefix.

Format: store/DESIGN.md#buckets
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from decimal import Decimal
from itertools import pairwise
from typing import Any

FORMAT = 1
ZERO, U8, U16, U32, F64 = range(5)
# counts type -> (struct code, bytes a count); ZERO writes nothing
WIDTHS: dict[int, tuple[str, int]] = {ZERO: ("", 0), U8: ("B", 1), U16: ("H", 2),
                                      U32: ("I", 4), F64: ("d", 8)}  # fmt: skip
_LIMITS = ((U8, 0xFF), (U16, 0xFFFF), (U32, 0xFFFF_FFFF))
_CACHE_LIMIT = 10_000
_layouts: dict[bytes, tuple[tuple[float, ...], str, int]] = {}  # decoded, by BLOB prefix
_encoded: dict[tuple[float, ...], bytes] = {}  # encoded layouts, by bounds


def _varint(n: int, out: bytearray) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _zigzag(n: int) -> int:
    return n * 2 if n >= 0 else -n * 2 - 1


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if at >= len(data) or shift > 70:
            raise ValueError("bucket counts: a varint runs past the end")
        byte = data[at]
        at += 1
        n |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return n, at


def _decimal(bound: float) -> tuple[int, int]:
    """(mantissa, exponent) with ``float(f"{m}e{e}") == bound`` (repr's shortest decimal)."""
    sign, digits, exponent = Decimal(repr(bound)).as_tuple()
    assert isinstance(exponent, int)  # finite
    mantissa = int("".join(map(str, digits)))
    while mantissa and mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    if mantissa == 0:
        exponent = 0
    return (-mantissa if sign else mantissa), exponent


def encode_buckets(bounds: Sequence[float], counts: Sequence[float]) -> bytes:
    """The BLOB of one window's bucket counts (DESIGN.md#buckets). ValueError: bounds not
    finite and increasing, or not one count more than bounds, or a count not finite."""
    if len(counts) != len(bounds) + 1:
        raise ValueError(
            f"bucket counts: {len(counts)} counts for {len(bounds)} finite bounds (want one "
            "more: the +Inf bucket)"
        )
    layout = _encoded.get(key := tuple(bounds))
    if layout is None:
        if not _finite_increasing(key):
            raise ValueError(f"bucket counts: bounds must be finite and increasing: {bounds}")
        made = bytearray()
        for bound in key:
            mantissa, exponent = _decimal(bound)
            _varint(_zigzag(mantissa), made)
            _varint(_zigzag(exponent), made)
        if len(_encoded) >= _CACHE_LIMIT:
            _encoded.clear()
        _encoded[key] = layout = bytes(made)
    if not all(map(math.isfinite, counts)):
        raise ValueError(f"bucket counts: counts must be finite: {counts}")
    ints = list(map(int, counts))
    kind = _counts_type(ints) if ints == list(counts) else F64  # every count a whole number
    out = bytearray((FORMAT, kind))
    _varint(len(layout), out)
    out += layout
    code, _ = WIDTHS[kind]
    if code:
        out += struct.pack(f"<{len(counts)}{code}", *(map(float, counts) if kind == F64 else ints))
    return bytes(out)


def _finite_increasing(bounds: Sequence[float]) -> bool:
    return all(map(math.isfinite, bounds)) and all(a < b for a, b in pairwise(bounds))


def _counts_type(ints: list[int]) -> int:
    """The narrowest type that holds these whole counts."""
    if min(ints) < 0:
        return F64
    top = max(ints)
    if top == 0:
        return ZERO
    for kind, limit in _LIMITS:
        if top <= limit:
            return kind
    return F64


def decode_buckets(data: bytes) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(finite bounds, counts per bucket with the +Inf one last) of :func:`encode_buckets`'
    BLOB; ValueError when it is not one."""
    bounds, code, end = _split(data)
    n = len(bounds) + 1
    if not code:
        return bounds, (0.0,) * n
    return bounds, tuple(map(float, struct.unpack_from(f"<{n}{code}", data, end)))


def _split(data: bytes) -> tuple[tuple[float, ...], str, int]:
    """(bounds, struct code of the counts, where they start) of a BLOB, its length checked."""
    if len(data) < 3 or data[0] != FORMAT:
        raise ValueError(f"bucket counts: not a format-{FORMAT} BLOB ({bytes(data[:4])!r}…)")
    size, at = _read_varint(data, 2)
    end = at + size
    key = bytes(data[1:end])
    layout = _layouts.get(key)
    if layout is None:
        layout = _layout(data, at, end)
        if len(_layouts) >= _CACHE_LIMIT:
            _layouts.clear()
        _layouts[key] = layout
    bounds, code, width = layout
    if len(data) != end + (len(bounds) + 1) * width:
        raise ValueError(
            f"bucket counts: {len(data) - end} bytes of counts where "
            f"{(len(bounds) + 1) * width} were expected"
        )
    return bounds, code, end


class BucketSummer:
    """The BLOBs of many windows summed per (series, layout) without a Python object per
    window: each row is split (its layout looked up by prefix) and its counts' bytes kept;
    :meth:`sums` turns each group's bytes into one array and adds its rows up in the order
    they came (numpy's cumulative sum: the rows of a loop's order, so the sums equal a loop's,
    and integer counts are exact)."""

    def __init__(self) -> None:
        # (source, signal, labels text, bounds) -> [windows, first, last, codes, payloads]
        self._groups: dict[tuple[str, str, str, tuple[float, ...]], list[Any]] = {}

    def add(self, source: str, signal: str, labels: str, start: float, data: bytes) -> None:
        """One window's BLOB (ValueError when it is not one); rows of a series in start order."""
        bounds, code, end = _split(data)
        key = (source, signal, labels, bounds)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = [0, start, start, [], []]
        group[0] += 1
        group[2] = start
        if code:  # an all-zero window adds nothing
            group[3].append(code)
            group[4].append(data[end:])

    def sums(
        self,
    ) -> list[tuple[str, str, str, tuple[float, ...], tuple[float, ...], int, float, float]]:
        """(source, signal, labels text, bounds, counts, windows, first start, last start)
        per series and layout, in the order first seen."""
        import numpy as np  # noqa: PLC0415 - start-up: numpy (~0.09 s) off `import store.store` (kvscope plans, db migrate, serve)

        out = []
        for (source, signal, labels, bounds), (
            n,
            first,
            last,
            codes,
            parts,
        ) in self._groups.items():
            width = len(bounds) + 1
            if not parts:
                counts = (0.0,) * width
            else:
                if len(set(codes)) == 1:
                    rows = np.frombuffer(b"".join(parts), dtype=f"<{codes[0]}").reshape(-1, width)
                else:  # integer and float rows of one layout: each read apart, order kept
                    rows = np.array(
                        [
                            np.frombuffer(p, dtype=f"<{c}")
                            for c, p in zip(codes, parts, strict=True)
                        ],
                        dtype=np.float64,
                    )
                total = np.cumsum(rows.astype(np.float64), axis=0)[-1]
                counts = tuple(total.tolist())
            out.append((source, signal, labels, bounds, counts, n, first, last))
        return out


def _layout(data: bytes, at: int, end: int) -> tuple[tuple[float, ...], str, int]:
    kind = data[1]
    if kind not in WIDTHS:
        raise ValueError(f"bucket counts: unknown counts type {kind}")
    if end > len(data):
        raise ValueError("bucket counts: the layout runs past the end")
    bounds = []
    while at < end:
        zm, at = _read_varint(data, at)
        ze, at = _read_varint(data, at)
        mantissa = zm >> 1 if not zm & 1 else -((zm + 1) >> 1)
        exponent = ze >> 1 if not ze & 1 else -((ze + 1) >> 1)
        bounds.append(float(f"{mantissa}e{exponent}"))
    if at != end:
        raise ValueError("bucket counts: the layout runs past its length")
    if not _finite_increasing(bounds):
        raise ValueError(f"bucket counts: the layout's bounds are not increasing: {bounds}")
    code, width = WIDTHS[kind]
    return tuple(bounds), code, width
