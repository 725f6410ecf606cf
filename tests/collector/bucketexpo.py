"""Expositions of the keep_buckets histograms (the KV residency families, LMCache's L1 reuse
gap) as an exporter writes them, and a brute-force reference of their window bucket counts.

Shared by tests/collector/test_buckets.py and tests/planner/test_residency.py. Names come
from the catalogue; the reference works on the raw scraped values pair by pair (not on the
rollup's running accumulators).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from core.catalog import SIGNALS, export_sample_name
from core.records import Labels

INF = math.inf
ENGINE: Labels = (("engine", "0"), ("model_name", "m"))
POOL: Labels = (("l1_tag", "_default"),)
VLLM_FAMILIES = ("kv_block_lifetime_seconds", "kv_block_idle_before_evict_seconds",
                 "kv_block_reuse_gap_seconds")  # fmt: skip
L1_FAMILY = "lmcache_l1_chunk_reuse_gap_seconds"


@dataclass(frozen=True)
class Hist:
    """One histogram series as exposed: finite bounds, cumulative counts (the +Inf one last,
    left out when ``no_inf``), sum."""

    signal: str
    labels: Labels
    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    total: float = 0.0
    no_inf: bool = False


def render(hists: Sequence[Hist]) -> str:
    """Prometheus text 0.0.4 of these series (one TYPE line per family)."""
    lines: list[str] = []
    typed: set[str] = set()
    for h in hists:
        name = export_sample_name(h.signal)
        if name not in typed:
            typed.add(name)
            lines.append(f"# TYPE {name} histogram")
        own = [f'{k}="{v}"' for k, v in h.labels]
        les = [repr(b) for b in h.bounds] + ([] if h.no_inf else ["+Inf"])
        for le, count in zip(les, h.cumulative, strict=False):
            inner = ",".join([*own, f'le="{le}"'])
            lines.append(f"{name}_bucket{{{inner}}} {count!r}")
        braces = "{" + ",".join(own) + "}" if own else ""
        lines.append(f"{name}_count{braces} {h.cumulative[-1]!r}")
        lines.append(f"{name}_sum{braces} {h.total!r}")
    return "\n".join(lines) + "\n"


def random_walk(
    rng: random.Random, bounds: tuple[float, ...], steps: int, *, reset_p: float = 0.0
) -> list[tuple[float, ...]]:
    """Cumulative counts of a histogram observed ``steps`` times: each step adds a few
    observations per bucket; with probability ``reset_p`` the exporter restarts first."""
    per = [0] * (len(bounds) + 1)
    out = []
    for _ in range(steps):
        if rng.random() < reset_p:
            per = [0] * len(per)
        per = [p + rng.choice((0, 0, 1, 2, 7, 300)) for p in per]
        running, cumulative = 0, []
        for p in per:
            running += p
            cumulative.append(float(running))
        out.append(tuple(cumulative))
    return out


def catalogue_bounds(signal: str) -> tuple[float, ...]:
    return SIGNALS[signal].buckets


# (timestamp, finite bounds, cumulative counts with the +Inf one last) of one series
Raw = tuple[float, tuple[float, ...], tuple[float, ...]]


def brute_windows(
    raw: Sequence[Raw], window_s: float = 60.0
) -> dict[float, tuple[tuple[float, ...], tuple[float, ...]] | None]:
    """window start -> (bounds, counts per bucket) of one series' scraped samples, pair by
    pair: the observations each bucket gained from one sample to the next (the next sample's
    own when any count fell or the bounds changed: a reset), added up in the window the later
    sample falls in; None for a window whose pairs end in more than one layout."""
    pairs: dict[float, list[tuple[tuple[float, ...], list[float]]]] = {}
    for (_, b0, c0), (t1, b1, c1) in pairwise(raw):
        new = [c1[0]] + [b - a for a, b in pairwise(c1)]  # per bucket, not cumulative
        if b0 == b1 and all(y >= x for x, y in zip(c0, c1, strict=True)):
            old = [c0[0]] + [b - a for a, b in pairwise(c0)]
            gained = [y - x for x, y in zip(old, new, strict=True)]
        else:
            gained = new
        pairs.setdefault(math.floor(t1 / window_s) * window_s, []).append((b1, gained))
    out: dict[float, tuple[tuple[float, ...], tuple[float, ...]] | None] = {}
    for start, got in pairs.items():
        if len({b for b, _ in got}) > 1:
            out[start] = None
            continue
        total = [0.0] * len(got[0][1])
        for _, gained in got:
            total = [a + b for a, b in zip(total, gained, strict=True)]
        out[start] = (got[0][0], tuple(total))
    return out
