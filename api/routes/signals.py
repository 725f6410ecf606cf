"""GET /v1/clusters/{cluster}/signals: each engine's current values, from its latest windows.

For every source of the cluster with windows in the last ``since`` (15 minutes by default),
each signal's value is taken from that signal's latest window (all label sets of the source
at that start combined: counter rates summed, gauges averaged, ratios and histogram p90s
weighted by their window's count). Names are the canonical signals of core/catalog.py.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response

from api.deps import Cluster, StoreDep, duration_s, require_read
from api.error_responses import responses
from api.respond import json_ok
from api.schemas import DURATION_PATTERN, SignalsOut
from core.records import Window

router = APIRouter(prefix="/v1", tags=["clusters"], dependencies=[Depends(require_read)])

# canonical signal -> (statistic, unit of the value)
SIGNALS: dict[str, tuple[str, str]] = {
    "kv_cache_usage_ratio": ("mean", "ratio"),
    "preemptions_total": ("rate", "preemptions/s"),
    "prefix_cache_hit_ratio": ("ratio", "ratio"),
    "external_prefix_cache_hit_ratio": ("ratio", "ratio"),
    "lmcache_hit_ratio": ("ratio", "ratio"),
    "prompt_tokens_total": ("rate", "tokens/s"),
    "generation_tokens_total": ("rate", "tokens/s"),
    "ttft_seconds": ("p90", "seconds"),
    "requests_running": ("mean", "requests"),
    "requests_waiting": ("mean", "requests"),
}
_TOKENS = ("prompt_tokens_total", "generation_tokens_total")


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _weighted(values: Sequence[tuple[float | None, float | None]]) -> float | None:
    """Σ v·w / Σ w over pairs with a finite value and weight > 0; else the plain mean."""
    pairs = [(v, w) for v, w in values if _finite(v) is not None]
    weighted = [(v, w) for v, w in pairs if w is not None and w > 0]
    if weighted:
        return sum(v * w for v, w in weighted if v is not None) / sum(w for _, w in weighted)
    plain = [v for v, _ in pairs if v is not None]
    return sum(plain) / len(plain) if plain else None


def combine(stat: str, windows: Sequence[Window]) -> float | None:
    """One value of a signal's windows of one source and start (module docstring)."""
    if stat == "rate":
        rates = [
            w.rate
            if w.rate is not None
            else (w.delta / w.length_s if w.delta is not None else None)
            for w in windows
        ]
        known = [r for r in rates if _finite(r) is not None]
        return sum(r for r in known if r is not None) if known else None
    if stat == "mean":
        means = [w.mean for w in windows if _finite(w.mean) is not None]
        return sum(m for m in means if m is not None) / len(means) if means else None
    if stat == "ratio":
        weighted = [(w.mean, w.delta) for w in windows if w.delta is not None and w.delta > 0]
        return _weighted(weighted)
    return _weighted([(w.p90, w.delta) for w in windows])


def latest_values(windows: Sequence[Window], offload: dict[str, str], now: float) -> list[Any]:
    """Per source: its signals' latest values (module docstring), by source."""
    latest: dict[tuple[str, str], list[Window]] = defaultdict(list)
    for w in windows:
        key = (w.source, w.signal)
        current = latest[key]
        if current and w.start < current[0].start:
            continue
        if current and w.start > current[0].start:
            current.clear()
        current.append(w)
    by_source: dict[str, dict[str, Any]] = defaultdict(dict)
    ends: dict[str, float] = {}
    starts: dict[str, float] = {}
    for (source, signal), group in latest.items():
        stat, unit = SIGNALS[signal]
        first = group[0]
        by_source[source][signal] = {
            "value": _finite(combine(stat, group)),
            "stat": stat,
            "unit": unit,
            "window_start": first.start,
            "window_s": first.length_s,
        }
        ends[source] = max(ends.get(source, -math.inf), first.start + first.length_s)
        starts[source] = max(starts.get(source, -math.inf), first.start)
    out = []
    for source in sorted(by_source):
        signals = by_source[source]
        rates = [signals[s]["value"] for s in _TOKENS if s in signals]
        known = [r for r in rates if r is not None]
        out.append(
            {
                "source": source,
                "offload": offload.get(source),
                "window_start": starts[source],
                "age_s": max(0.0, now - ends[source]),
                "tokens_per_s": sum(known) if known else None,
                "signals": dict(sorted(signals.items())),
            }
        )
    return out


@router.get(
    "/clusters/{cluster}/signals",
    response_model=SignalsOut,
    responses=responses(400, 401, 404, 422, 503),
)
def signals(
    cluster: Cluster,
    store: StoreDep,
    since: Annotated[
        str,
        Query(
            pattern=DURATION_PATTERN,
            max_length=5,
            description="how far back to look for each engine's latest windows",
            examples=["15m"],
        ),
    ] = "15m",
) -> Response:
    """Each engine's current KV use, preemptions/s, hit ratios, tokens/s and TTFT p90."""
    now = time.time()
    since_s = duration_s(since)
    windows = store.read_windows(signals=list(SIGNALS), cluster=cluster, since=now - since_s)
    offload = {e.source: e.offload for e in store.engines(cluster)}
    return json_ok(
        {
            "cluster": cluster,
            "since_s": since_s,
            "now": now,
            "engines": latest_values(windows, offload, now),
        }
    )
