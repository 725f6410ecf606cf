"""The collect loop in Prometheus mode: back-fill, then poll a Prometheus-compatible API.

Back-fill ``[now - since, now - settle]`` once in BACKFILL_CHUNK_S chunks, then every
``interval_s`` query the windows that closed since (collector.promsource); sources become
targets and engines of the cluster. The cursor moves only once a poll's windows are written:
a failed poll writes nothing and the next re-queries from the cursor; a failed facts query
costs the facts of that poll only.

Design: collector/DESIGN.md#run_prometheus
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping, Sequence

from collector.dcgm import engine_gpus
from collector.engine_facts import ENGINE_FACTS, Described, describe, engine_facts_of
from collector.engine_rules import EngineRules
from collector.keep import kept_windows, query_signals
from collector.promsource import PrometheusSource
from collector.run import CollectStats, LoopParts, next_tick, sleep_until, unless_stopped
from collector.run_config import PrometheusConfig
from core.catalog import DERIVED_RATIOS, SIGNALS
from core.errors import KvscopeError, ScrapeError
from core.records import Window
from store.store import Store

log = logging.getLogger(__name__)
# A derived ratio's window (lmcache_hit_ratio, …) is of its numerator's source: without this
# an LMCache server's hit-ratio windows made it a "vllm" source, registered as an engine.
_RATIO_NUMERATOR = {ratio: numerator for ratio, numerator, _ in DERIVED_RATIOS}


async def collect_prometheus(  # noqa: PLR0912, PLR0915 - the collector's loop: start, each tick, stop
    source: PrometheusSource,
    store: Store,
    config: PrometheusConfig,
    parts: LoopParts | None = None,
    *,
    stop: asyncio.Event | None = None,
) -> CollectStats:
    """Back-fill windows of ``[now - since_s, now - settle_s]``, then poll every ``interval_s``.

    ``settle_s`` keeps the newest windows out until Prometheus has ingested their last scrape.
    The first query failing raises ScrapeError; later failures are logged, counted and retried.
    ``health``: kvscope's own metrics; ``engine_rules``: engines.yaml; ``pruner``: retention
    after each poll when due; ``chunk_s``: a longer range is read and written this much at a
    time; ``keep``: the signals queried and written (None: all). Design: DESIGN.md#run_prometheus
    """
    parts = parts if parts is not None else LoopParts()
    cluster, window_s, keep = config.cluster, config.window_s, config.keep
    health, engine_rules = parts.health, parts.engine_rules
    stats = CollectStats(mode="prometheus")
    stop = stop if stop is not None else asyncio.Event()
    limit = 1 if config.once else config.max_polls
    await asyncio.to_thread(source.check)
    store.upsert_cluster(cluster)
    store.upsert_target(source.url, source.url, kind="prometheus", cluster=cluster)
    known: set[str] = set()
    described: dict[str, Described] = {}  # source -> the engine facts last stored
    cursor = math.floor((time.time() - config.since_s) / window_s) * window_s
    first = cursor  # the back-fill's start
    # the back-fill's regimes (queried once, at its first windows) and how many of them are
    # registered: each chunk registers the instants up to its end
    history: list[tuple[float, dict[str, dict[str, list[dict[str, str]]]]]] | None = None
    applied = 0
    failed = 0  # polls failed in a row
    chunk = max(1, math.floor(config.chunk_s / window_s)) * window_s
    windows: list[Window] | None = []
    signals = query_signals(keep)
    while not stop.is_set():
        began = time.time()
        end = math.floor((began - config.settle_s) / window_s) * window_s
        stats.scrapes += 1
        while end > cursor:  # a back-fill longer than chunk_s: one chunk after the other
            upto = min(end, cursor + chunk)
            t0 = time.perf_counter()
            try:
                windows = await unless_stopped(
                    asyncio.to_thread(source.windows, cursor, upto, window_s, signals), stop
                )
                if health is not None and windows is not None:
                    health.scraped(source.url, "up", time.perf_counter() - t0)
                if failed and windows is not None:
                    log.warning(
                        "prometheus answers again after %d failed poll(s): windows from %s read",
                        failed, _utc(cursor),
                    )  # fmt: skip
                    failed = 0
            except ScrapeError as exc:
                if health is not None:
                    health.scraped(source.url, exc.kind, time.perf_counter() - t0)
                if stats.ticks == 0:
                    raise
                stats.failures[exc.kind] += 1
                stats.last_error = str(exc)
                failed += 1
                log.error(
                    "prometheus poll failed (%d in a row): %s; windows from %s re-queried next",
                    failed, exc, _utc(cursor),
                )  # fmt: skip
                windows = []
                end = upto = cursor  # retry the same range next time
            if windows is None:
                break
            facts, gpu_series = None, None
            if windows:
                facts = await asyncio.to_thread(_facts, source, upto, window_s, stats)
                gpu_series = await asyncio.to_thread(_gpus, source, upto, window_s, stats)
            if windows and history is None:  # the back-fill: date each regime it spans
                history = await asyncio.to_thread(_history, source, first, end, window_s, stats)
            if windows and history is not None:
                while applied < len(history) and history[applied][0] <= upto:
                    at, earlier = history[applied]
                    _register_sources(
                        store, cluster=cluster, url=source.url, windows=windows, known=known,
                        stats=stats, facts=earlier, described=described, at=at,
                        rules=engine_rules, gpu_series=gpu_series, partial=True,
                    )  # fmt: skip
                    applied += 1
            _register_sources(
                store, cluster=cluster, url=source.url, windows=windows, known=known,
                stats=stats, facts=facts, described=described, at=upto, rules=engine_rules,
                gpu_series=gpu_series,
            )  # fmt: skip
            written_before = stats.windows_written
            try:
                stats.windows_written += store.write_windows(kept_windows(windows, keep))
                cursor = upto
            except KvscopeError as exc:
                stats.store_errors += 1
                stats.last_error = f"store: {exc}"
                log.error("store: writing %d windows: %s (will re-query)", len(windows), exc)
                end = cursor  # the next poll re-queries from the cursor
            log.info("poll: %d windows", stats.windows_written - written_before)
        if windows is None:
            break
        _polled(stats, parts, began)
        if limit is not None and stats.ticks >= limit:
            break
        await sleep_until(next_tick(time.time(), config.interval_s), stop)
    if parts.pruner is not None:
        await parts.pruner.close()
    return stats


def _polled(stats: CollectStats, parts: LoopParts, began: float) -> None:
    """After a poll: retention when due, the tick counted, progress and health told."""
    if parts.pruner is not None:
        parts.pruner.tick(time.time())
    stats.ticks += 1
    stats.last_tick_s = time.time() - began
    if parts.progress is not None:
        parts.progress(stats)
    if parts.health is not None:
        parts.health.ticked(stats)


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


# How far back the fact families are looked up: info gauges are constant, so any recent
# sample is as good as the last one; 10 minutes rides over a few missed scrapes.
FACTS_LOOKBACK_S = 600.0
# A back-fill dates regime changes to the window, or to 1/HISTORY_POINTS of its span when
# longer (7 days of 1-minute windows: 10,080 instants, one range query per family).
HISTORY_POINTS = 10_080


def _facts(
    source: PrometheusSource, at: float, window_s: float, stats: CollectStats
) -> dict[str, dict[str, list[dict[str, str]]]] | None:
    """The engines' info families at ``at``; None when the query failed (it costs the facts
    of this poll, never the windows, and never overwrites the facts already stored)."""
    try:
        return source.facts(at, max(FACTS_LOOKBACK_S, 2 * window_s), keys=ENGINE_FACTS)
    except ScrapeError as exc:
        stats.failures[exc.kind] += 1
        log.error("prometheus: engine facts: %s", exc)
        return None


def _history(
    source: PrometheusSource, start: float, end: float, window_s: float, stats: CollectStats
) -> list[tuple[float, dict[str, dict[str, list[dict[str, str]]]]]]:
    """The engines' facts at each change in ``[start, end]`` (PrometheusSource.facts_history,
    at window resolution, at most HISTORY_POINTS instants); [] when the query failed: the
    back-fill's windows then all count as the regime of its last instant."""
    step = max(window_s, (end - start) / HISTORY_POINTS)
    try:
        return source.facts_history(start, end, step, ENGINE_FACTS)
    except ScrapeError as exc:
        stats.failures[exc.kind] += 1
        log.error("prometheus: engine facts history: %s", exc)
        return []


def _gpus(
    source: PrometheusSource, at: float, window_s: float, stats: CollectStats
) -> list[dict[str, str]] | None:
    """DCGM's GPUs at ``at`` (collector.dcgm); None when the query failed (the GPU facts of
    this poll are then left out: the stored ones stay)."""
    try:
        return source.gpu_series(at, max(FACTS_LOOKBACK_S, 2 * window_s))
    except ScrapeError as exc:
        stats.failures[exc.kind] += 1
        log.error("prometheus: DCGM GPUs: %s", exc)
        return None


def _register_sources(  # noqa: PLR0913 - the loop's parts it wires together, once
    store: Store,
    *,
    cluster: str,
    url: str,
    windows: Sequence[Window],
    known: set[str],
    stats: CollectStats,
    facts: Mapping[str, Mapping[str, list[dict[str, str]]]] | None,
    described: dict[str, Described],
    at: float,
    rules: EngineRules | None = None,
    gpu_series: Sequence[Mapping[str, str]] | None = None,
    partial: bool = False,
) -> None:
    """Register every new source as a target (and as an engine, with its model, when it
    serves vLLM signals), and each engine's exposed facts (offload mode with its basis, KV
    blocks) whenever they change: Prometheus holds the same ``cache_config_info`` a direct
    scrape reads. ``facts`` None (the query failed): the stored facts stay as they are.
    ``at``: when the facts were read (the time of a change they show); ``rules``: engines.yaml;
    ``gpu_series``: DCGM's GPUs (PrometheusSource.gpu_series) joined to the engines;
    ``partial``: ``facts`` holds only the sources that had fact series then (a back-fill
    instant): the others' facts are left as they are, not read as "none exposed"."""
    kinds: dict[str, set[str]] = {}
    signals: dict[str, set[str]] = {}
    models: dict[str, str] = {}
    for w in windows:
        sig = SIGNALS.get(w.signal) or SIGNALS.get(_RATIO_NUMERATOR.get(w.signal, ""))
        kinds.setdefault(w.source, set()).add(sig.source if sig is not None else "vllm")
        signals.setdefault(w.source, set()).add(w.signal)
        if w.source not in models and (model := dict(w.labels).get("model_name")):
            models[w.source] = model
    stats.targets_up = len(kinds)
    engines = [s for s, seen in kinds.items() if seen != {"lmcache"}]
    labels = {s: _engine_labels(s, facts.get(s, {}) if facts else {}) for s in engines}
    gpus = engine_gpus(labels, gpu_series or [])
    for source, seen in kinds.items():
        kind = "lmcache" if seen == {"lmcache"} else "vllm"
        new = source not in known
        now = None
        if kind == "vllm" and facts is not None and (source in facts or not partial):
            exposed = engine_facts_of(facts.get(source, {}), signals[source])
            model = models.get(source)
            now = describe(
                exposed, model_label=model, rules=rules, gpus=gpus.get(source),
                labels=labels[source] | ({"model_name": model} if model else {}),
            )  # fmt: skip
            if described.get(source) == now:
                now = None  # unchanged: nothing to write
        try:
            if new:
                store.upsert_target(source, url, kind=kind, cluster=cluster)
            if kind == "vllm" and now is not None:
                store.upsert_engine(
                    cluster, source, model=now.model, gpu=now.gpu, hbm_gb=now.hbm_gb,
                    tensor_parallel=now.tensor_parallel, offload=now.offload, facts=now.facts,
                    observed_at=at,
                )  # fmt: skip
            elif kind == "vllm" and new:
                store.upsert_engine(cluster, source, model=models.get(source))
        except KvscopeError as exc:
            stats.store_errors += 1
            log.error("store: registering %s: %s", source, exc)
            continue
        known.add(source)
        if now is not None:
            described[source] = now


def _engine_labels(source: str, facts: Mapping[str, list[dict[str, str]]]) -> dict[str, str]:
    """What engines.yaml rules and the DCGM join see of an engine: its source, instance
    (the part after ``job/`` with --source-label job/instance) and its info series' labels
    (Kubernetes' namespace/pod among them)."""
    out: dict[str, str] = {}
    for rows in facts.values():
        for row in rows[:1]:
            out |= row
    job, _, instance = source.rpartition("/")
    out |= {"source": source, "instance": instance}
    if job:
        out["job"] = job
    return out
