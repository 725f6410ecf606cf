"""collector.keep and the catalogue's ``stored`` flag: every signal a store reader asks for is
stored, and the collector writes only those by default (direct and Prometheus mode, spool
included); ``--keep all`` writes every signal."""

from __future__ import annotations

import ast
import asyncio
import functools
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import pytest

from api.routes.signals import SIGNALS as API_SIGNALS
from collector.keep import KEEP_CHOICES, kept_windows, parse_keep, query_signals
from collector.promsource import PrometheusSource
from collector.run import DirectParts, collect_direct
from collector.run_config import DirectConfig, PrometheusConfig
from collector.run_prometheus import collect_prometheus
from collector.scrape import Target, TargetSet
from collector.spool import Sink, Spool, Written
from core.catalog import BUCKET_SIGNALS, DERIVED_RATIOS, SIGNALS, STORED_SIGNALS
from core.errors import ConfigError
from core.records import ScrapeOutcome, Window
from planner.frames.residency import RESIDENCY_SIGNALS
from planner.plan import needed
from planner.plan.needed import NEEDED_SIGNALS
from store.store import Store
from tests.collector.conftest import LiveProm
from tests.collector.exposerver import bumping, expo_server

ROOT = Path(__file__).resolve().parents[2]
METRICS = ROOT / "tests" / "fixtures" / "metrics"
READ_METHODS = frozenset({"read_windows", "read_frame", "read_buckets", "sum_buckets"})
# Every module of kvscope that reads windows back from the store -> the signals it asks for,
# taken from the code itself. A module that starts reading the store fails
# test_every_store_reader_is_known until it is added here (and its signals flagged stored).
READERS: dict[str, frozenset[str]] = {
    "planner/plan/build.py": NEEDED_SIGNALS,  # kvscope plan, report, outcomes, replan, demo
    "planner/plan/windows.py": NEEDED_SIGNALS,  # the plan's reads, a signal at a time
    "planner/frames/residency.py": frozenset(RESIDENCY_SIGNALS),  # the plan's CPU tier
    "api/routes/signals.py": frozenset(API_SIGNALS),  # GET /v1/clusters/{c}/signals
}
# The store's own modules and what is no part of kvscope's readers.
_NOT_READERS = ("store/", "tests/", "benchmarks/")


def _store_readers() -> set[str]:
    """Files (outside the store itself) that call a window-reading method of the store."""
    found = set()
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith((*_NOT_READERS, ".")) or "/." in rel:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in READ_METHODS
            ):
                found.add(rel)
    return found


def test_every_store_reader_is_known() -> None:
    assert _store_readers() == set(READERS), (
        "a module reads windows from the store: add it and the signals it reads to READERS, "
        "and flag those signals stored=True in core/catalog.py"
    )


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_signal_a_reader_asks_for_is_stored(reader: str) -> None:
    missing = sorted(READERS[reader] - STORED_SIGNALS)
    assert not missing, f"{reader} reads {missing}: flag them stored=True in core/catalog.py"


def test_stored_signals_cover_the_plans_inner_readers_and_buckets() -> None:
    # the forecast reads the plan's frame (NEEDED_SIGNALS); Store.read_buckets / sum_buckets
    # default to the keep_buckets histograms
    forecast = {needed.KV_SIGNAL, needed.RATE_SIGNAL, needed.RUNNING_SIGNAL}
    assert forecast <= NEEDED_SIGNALS
    assert BUCKET_SIGNALS <= STORED_SIGNALS


def test_stored_signals_are_the_flag_plus_ratios_of_stored_counters() -> None:
    flagged = {n for n, s in SIGNALS.items() if s.stored}
    ratios = {r for r, num, den in DERIVED_RATIOS if num in flagged and den in flagged}
    assert flagged | ratios == STORED_SIGNALS
    assert 0 < len(flagged) < len(SIGNALS)


def test_parse_keep_used_all_and_a_clear_error() -> None:
    assert parse_keep("used") == STORED_SIGNALS and parse_keep("all") is None
    assert set(KEEP_CHOICES) == {"used", "all"}
    with pytest.raises(ConfigError, match=r"--keep must be one of used, all .* got 'some'"):
        parse_keep("some")


def _win(signal: str) -> Window:
    return Window("e0", signal, (), 0.0, 60.0, "gauge", samples=4, mean=0.5)


def test_kept_windows_and_query_signals() -> None:
    ws = [_win("kv_cache_usage_ratio"), _win("router_qps"), _win("prefix_cache_hit_ratio")]
    assert kept_windows(ws, None) is ws
    assert [w.signal for w in kept_windows(ws, STORED_SIGNALS)] == [
        "kv_cache_usage_ratio",
        "prefix_cache_hit_ratio",
    ]
    assert query_signals(None) is None
    asked = query_signals(frozenset({"lmcache_hit_ratio"}))
    assert asked is not None
    # the ratio's counters, and what engine facts read (queried, not written)
    assert {"lmcache_hit_tokens_total", "lmcache_requested_tokens_total"} <= set(asked)
    assert {"offload_bytes_total", "lmcache_mp_lookup_seconds"} <= set(asked)
    assert set(query_signals(STORED_SIGNALS) or ()) >= STORED_SIGNALS & set(SIGNALS)


# --------------------------------------------------------------------------- direct mode


class _RecordingSpool(Spool):
    """A spool remembering every window handed to it (what it may keep on disk)."""

    def __init__(self) -> None:
        super().__init__(None, store_id="test")
        self.handed: list[Window] = []

    def write(
        self,
        sink: Sink,
        windows: Sequence[Window] = (),
        outcomes: Sequence[ScrapeOutcome] = (),
        *,
        budget_s: float | None = None,
    ) -> Written:
        self.handed += windows
        return super().write(sink, windows, outcomes, budget_s=budget_s)


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[dict[str, Store]]:
    with (
        Store(f"sqlite:///{tmp_path / 'used.db'}") as a,
        Store(f"sqlite:///{tmp_path / 'all.db'}") as b,
    ):
        a.migrate()
        b.migrate()
        yield {"used": a, "all": b}


def test_collect_direct_default_keeps_stored_signals_only_spool_included(
    stores: dict[str, Store],
) -> None:
    text = (METRICS / "vllm-0.33.0-metrics-full.txt").read_text()
    spools = {name: _RecordingSpool() for name in stores}
    with expo_server() as srv:
        url = srv.add("/m", bumping(text, "preemptions_total", 0, 5.0))
        targets = TargetSet("c", (Target("e0", url, "vllm"),))
        for name, store in stores.items():
            config = functools.partial(
                DirectConfig, interval_s=0.2, window_s=0.4, timeout_s=5.0, concurrency=2,
                max_body_bytes=1 << 20, max_ticks=6,
            )  # fmt: skip
            loop = config(keep=None) if name == "all" else config()  # the default: used
            asyncio.run(collect_direct(targets, store, loop, DirectParts(spool=spools[name])))
    used = {w.signal for w in stores["used"].read_windows()}
    every = {w.signal for w in stores["all"].read_windows()}
    assert used and used <= STORED_SIGNALS
    assert {w.signal for w in spools["used"].handed} <= STORED_SIGNALS
    assert used == every & STORED_SIGNALS and len(every) > len(used)
    assert {w.signal for w in spools["all"].handed} == every


# --------------------------------------------------------------------------- Prometheus mode


class _AskedSource(PrometheusSource):
    """The collector's source, remembering which signals each windows() read asked for."""

    asked: list[list[str] | None]

    def windows(
        self, start: float, end: float, window_s: float, signals: Iterable[str] | None = None
    ) -> list[Window]:
        self.asked.append(None if signals is None else list(signals))
        return super().windows(start, end, window_s, signals)


@pytest.mark.prometheus
def test_collect_prometheus_default_queries_and_writes_stored_signals_only(
    stores: dict[str, Store], live_prometheus: LiveProm
) -> None:
    asked = {}
    for name, store in stores.items():
        source = _AskedSource(live_prometheus.url)
        source.asked = []
        with source:
            asyncio.run(
                collect_prometheus(
                    source,
                    store,
                    PrometheusConfig(
                        cluster="prom",
                        window_s=2,
                        since_s=60,
                        interval_s=0.5,
                        settle_s=0,
                        once=True,
                        keep=None if name == "all" else STORED_SIGNALS,
                    ),
                )
            )
        asked[name] = source.asked
    assert asked["all"] and all(a is None for a in asked["all"])
    assert asked["used"] and all(a == query_signals(STORED_SIGNALS) for a in asked["used"])
    used = {w.signal for w in stores["used"].read_windows()}
    every = {w.signal for w in stores["all"].read_windows()}
    assert used and used <= STORED_SIGNALS and len(every) > len(used)
    engines = [(e.source, e.offload, e.model) for e in stores["used"].engines()]
    assert engines == [(e.source, e.offload, e.model) for e in stores["all"].engines()]
