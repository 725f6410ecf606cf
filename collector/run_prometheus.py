"""The collect loop in Prometheus mode: back-fill, then poll a Prometheus-compatible API.

Back-fill ``[now - since, now - settle]`` once, then every ``interval_s`` query the windows
that closed since (collector.promsource); the store's upsert makes any overlap harmless.
Every source (``instance`` label) seen is registered as a target of the cluster, and as an
engine when it serves vLLM signals, so cluster-scoped reads of the store find its windows.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence

from collector.catalog import SIGNALS
from collector.errors import ConfigError, KvscopeError, ScrapeError
from collector.health import CollectorHealth
from collector.promsource import PrometheusSource
from collector.records import Window
from collector.run import CollectStats, Progress, next_tick, sleep_until, unless_stopped
from collector.store import Store

log = logging.getLogger(__name__)


async def collect_prometheus(
    source: PrometheusSource,
    store: Store,
    *,
    cluster: str,
    window_s: float,
    since_s: float,
    interval_s: float,
    settle_s: float = 30.0,
    once: bool = False,
    max_polls: int | None = None,
    stop: asyncio.Event | None = None,
    progress: Progress | None = None,
    health: CollectorHealth | None = None,
) -> CollectStats:
    """Back-fill windows of ``[now - since_s, now - settle_s]``, then poll every ``interval_s``.

    ``settle_s`` keeps the newest windows out until Prometheus has ingested their last scrape.
    The first query failing raises ScrapeError; later failures are logged, counted and retried.
    ``health``: kvscope's own collector metrics (each range query is a scrape of the source).
    """
    if not (math.isfinite(interval_s) and interval_s > 0):
        raise ConfigError(f"poll interval must be > 0 seconds, got {interval_s}")
    if not (math.isfinite(since_s) and since_s > 0):
        raise ConfigError(f"--since must be > 0 seconds, got {since_s}")
    stats = CollectStats(mode="prometheus")
    stop = stop if stop is not None else asyncio.Event()
    limit = 1 if once else max_polls
    await asyncio.to_thread(source.check)
    store.upsert_cluster(cluster)
    store.upsert_target(source.url, source.url, kind="prometheus", cluster=cluster)
    known: set[str] = set()
    cursor = math.floor((time.time() - since_s) / window_s) * window_s
    while not stop.is_set():
        began = time.time()
        end = math.floor((began - settle_s) / window_s) * window_s
        stats.scrapes += 1
        if end > cursor:
            t0 = time.perf_counter()
            try:
                windows = await unless_stopped(
                    asyncio.to_thread(source.windows, cursor, end, window_s), stop
                )
                if health is not None and windows is not None:
                    health.scraped(source.url, "up", time.perf_counter() - t0)
            except ScrapeError as exc:
                if health is not None:
                    health.scraped(source.url, exc.kind, time.perf_counter() - t0)
                if stats.ticks == 0:
                    raise
                stats.failures[exc.kind] += 1
                stats.last_error = str(exc)
                log.error("prometheus poll failed: %s", exc)
                windows = []
                end = cursor  # retry the same range next time
            if windows is None:
                break
            _register_sources(
                store, cluster=cluster, url=source.url, windows=windows, known=known, stats=stats
            )
            written_before = stats.windows_written
            try:
                stats.windows_written += store.write_windows(windows)
                cursor = end
            except KvscopeError as exc:
                stats.store_errors += 1
                stats.last_error = f"store: {exc}"
                log.error("store: writing %d windows: %s (will re-query)", len(windows), exc)
            log.info("poll: %d windows", stats.windows_written - written_before)
        stats.ticks += 1
        stats.last_tick_s = time.time() - began
        if progress is not None:
            progress(stats)
        if health is not None:
            health.ticked(stats)
        if limit is not None and stats.ticks >= limit:
            break
        await sleep_until(next_tick(time.time(), interval_s), stop)
    return stats


def _register_sources(
    store: Store,
    *,
    cluster: str,
    url: str,
    windows: Sequence[Window],
    known: set[str],
    stats: CollectStats,
) -> None:
    """Register every new source as a target (and as an engine when it serves vLLM signals)."""
    kinds: dict[str, set[str]] = {}
    for w in windows:
        sig = SIGNALS.get(w.signal)
        kinds.setdefault(w.source, set()).add(sig.source if sig is not None else "vllm")
    stats.targets_up = len(kinds)
    for source, seen in kinds.items():
        if source in known:
            continue
        kind = "lmcache" if seen == {"lmcache"} else "vllm"
        try:
            store.upsert_target(source, url, kind=kind, cluster=cluster)
            if kind == "vllm":
                store.upsert_engine(cluster, source)
        except KvscopeError as exc:
            stats.store_errors += 1
            log.error("store: registering %s: %s", source, exc)
            continue
        known.add(source)
