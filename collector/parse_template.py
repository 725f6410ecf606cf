"""The exposition reader's fast path: a target's next exposition with the same lines as its
last one, only the sample values changed.

After a clean full read, :class:`Template` keeps the non-sample lines and each sample's
``name{labels}`` prefix; the next exposition is read against it in a few C-level passes with
every check the full reader makes. Anything that differs or fails a check makes
:meth:`Template.read` answer None and the full reader reads it, so the fast path answers only
where the full reader's answer is known to be the same.

Design: collector/DESIGN.md#parse_template
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from operator import getitem, itemgetter, le
from typing import TypeVar

from core.records import Kind, Labels, SignalSample, Snapshot

T = TypeVar("T")
# What a sample line's value must be for the full reader to read it without an anomaly.
NO_CHECK, NON_NEGATIVE, FINITE = range(3)


def picker(idx: Sequence[int]) -> Callable[[Sequence[T]], tuple[T, ...]]:
    """``seq -> tuple(seq[i] for i in idx)`` in C (itemgetter), a tuple even for one index."""
    if not idx:
        return lambda seq: ()
    if len(idx) == 1:
        i = idx[0]
        return lambda seq: (seq[i],)
    return itemgetter(*idx)


class Template:
    """One target's exposition with the sample values taken out (DESIGN.md#parse_template).

    Line numbers are 0-based indexes into ``text.split("\\n")``; a sample's *position* is its
    index among the sample lines (the order of ``sample_lines``).
    """

    __slots__ = ("_exact", "_exact_get", "_facts", "_finite", "_heads", "_hists", "_lines",
                 "_non_negative", "_sample_get", "_scalars", "_tails", "_unknown")  # fmt: skip

    def __init__(
        self,
        lines: Sequence[str],
        *,
        sample_lines: Sequence[int],
        prefixes: Sequence[str],
        checks: Sequence[int],
        scalars: Sequence[tuple[str, Kind, Labels, int]],
        hists: Sequence[tuple[str, Labels, tuple[float, ...], tuple[int, ...], int, int]],
        facts: Mapping[str, tuple[Mapping[str, str], ...]],
        unknown: tuple[str, ...],
    ) -> None:
        """``sample_lines``: the line numbers of the sample lines, with their ``prefixes``
        (the line up to its last blank) and ``checks`` (NO_CHECK, NON_NEGATIVE, FINITE);
        ``scalars``: (signal, kind, labels, position) of each counter or gauge sample, in
        the Snapshot's order; ``hists``: (signal, labels, bucket bounds, bucket positions,
        position of ``_sum`` or -1, of ``_count`` or -1) of each histogram, after them."""
        samples = set(sample_lines)
        exact = [i for i in range(len(lines)) if i not in samples]
        self._lines = len(lines)
        self._exact_get = picker(exact)
        self._exact = self._exact_get(lines)
        self._sample_get = picker(sample_lines)
        # a sample line must start with its prefix and a blank, and its value (the rest)
        # hold no blank: then the line's last blank ends the prefix, as the full reader
        # splits it (str.rfind)
        self._heads = [p + " " for p in prefixes]
        self._tails = [slice(len(p) + 1, None) for p in prefixes]
        self._non_negative = picker([p for p, c in enumerate(checks) if c == NON_NEGATIVE])
        self._finite = picker([p for p, c in enumerate(checks) if c == FINITE])
        self._scalars = tuple(scalars)
        self._hists = tuple((s, lab, bounds, picker(pos), sp, cp)
                            for s, lab, bounds, pos, sp, cp in hists)  # fmt: skip
        self._facts = {k: tuple(dict(d) for d in v) for k, v in facts.items()}
        self._unknown = unknown

    def read(self, text: str, target: str, timestamp: float) -> Snapshot | None:
        """The Snapshot the full reader would make of ``text``, or None when that is not
        known to be this template's (then the full reader must read it)."""
        lines = text.split("\n")
        if len(lines) != self._lines or self._exact_get(lines) != self._exact:
            return None
        sample_lines = self._sample_get(lines)
        if not all(map(str.startswith, sample_lines, self._heads)):
            return None
        tokens: list[str] = list(map(getitem, sample_lines, self._tails))
        joined = "".join(tokens)
        if " " in joined or "_" in joined:
            return None
        try:
            values = list(map(float, tokens))
        except ValueError:
            return None
        nn = self._non_negative(values)
        # A sum is finite only when every term is (NaN and ±Inf propagate; an overflow to
        # inf only sends a valid exposition to the full reader).
        if nn and not (min(nn) >= 0.0 and math.isfinite(sum(nn))):
            return None
        fin = self._finite(values)
        if fin and not math.isfinite(sum(fin)):
            return None
        out = [SignalSample(s, k, lab, values[p]) for s, k, lab, p in self._scalars]
        for s, lab, bounds, pick, sum_at, count_at in self._hists:
            counts = pick(values)
            if not all(map(le, counts, counts[1:])):
                return None  # not cumulative: an anomaly the full reader reports
            out.append(
                SignalSample(
                    s,
                    "histogram",
                    lab,
                    values[count_at] if count_at >= 0 else counts[-1],
                    bounds,
                    counts,
                    values[sum_at] if sum_at >= 0 else None,
                )
            )
        return Snapshot(
            target=target,
            timestamp=timestamp,
            samples=tuple(out),
            facts={k: tuple([dict(d) for d in v]) for k, v in self._facts.items()},
            unknown_families=self._unknown,
        )
