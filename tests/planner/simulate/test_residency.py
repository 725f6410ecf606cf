"""KV residency metrics (planner/simulate/residency.py): vLLM's --kv-cache-metrics histograms
against a block-by-block reference of vLLM's BlockPool and KVCacheMetricsCollector, by hand on
a tiny trace, statistically for the sampling, and the promise that turning them on changes no
other number of a run; LMCache's L1 chunk reuse gap likewise; scenario keys; exposition."""

from __future__ import annotations

import dataclasses
import math
import random
from collections import deque
from typing import Any

import pytest

from collector.parse import read_exposition
from core import catalog
from core.errors import ConfigError
from planner.simulate.cluster import Simulation
from planner.simulate.content import ContentTree
from planner.simulate.decode import DECODE
from planner.simulate.engine import IDLE as SEG_IDLE
from planner.simulate.engine import Engine
from planner.simulate.exposition import engine_config, engine_view, pool_view, render
from planner.simulate.lmcache import LMCacheConnector, LMCachePool
from planner.simulate.request import Req
from planner.simulate.residency import (
    LMCACHE_SAMPLE_PRIME,
    RESIDENCY_HISTOGRAMS,
    KVResidency,
    L1Lifecycle,
    Sampler,
)
from planner.simulate.residency_pool import TrackedBlockPool
from planner.simulate.scenario import Scenario, load_scenario, parse_scenario, resolve_dotted
from planner.simulate.scenarios import scenario_file
from planner.simulate.telemetry import Histogram
from tests.planner.simulate import golden

LIFE, IDLE, GAP = RESIDENCY_HISTOGRAMS


def _hists() -> dict[str, Histogram]:
    """Histograms that keep every raw observation (never bucketed before they are read)."""
    return {name: Histogram((1.0,), limit=1 << 40) for name in RESIDENCY_HISTOGRAMS}


def _raw(hists: dict[str, Histogram]) -> tuple[list[float], list[float], list[float]]:
    life, idle, gap = (sorted(hists[n].pending) for n in RESIDENCY_HISTOGRAMS)
    return life, idle, gap


def _tracked(total: int, bs: int, rate: float = 1.0) -> tuple[TrackedBlockPool, ContentTree, Any]:
    tree = ContentTree()
    hists = _hists()
    res = KVResidency(Sampler(rate, random.Random(7)), hists, bs, tree.start)
    return TrackedBlockPool(total, bs, tree, res), tree, hists


def _admit(pool: TrackedBlockPool, req: Req, t: float) -> bool:
    """What Engine._admit does for a new request: lookup, reserve, then the hit's access."""
    pool.res.now = t
    p = req.prompt_len
    hit = pool.lookup(req.path, (p - 1) // pool.bs)
    if not pool.reserve(req, p):
        return False
    pool.res.accessed(req.path, hit)
    return True


def _release(pool: TrackedBlockPool, req: Req, t: float) -> None:
    pool.res.now = t
    pool.release(req)


# --------------------------------------------------------------------------- the sampler


def test_sampler_rate_one_takes_every_allocation_rate_zero_none() -> None:
    one = Sampler(1.0, random.Random(1))
    assert one.take(5) == [0, 1, 2, 3, 4] and one.take(1) == [0]
    zero = Sampler(0.0, random.Random(1))
    assert all(zero.take(m) == [] for m in (1, 10, 10**6))


def test_sampler_count_is_binomial() -> None:
    """Over n allocations in uneven batches the sampled count stays within 5 standard
    deviations of n·p (a Binomial(n, p) leaves that band with probability < 1e-6), and the
    offsets are inside their batches."""
    rng = random.Random(3)
    for p in (0.01, 0.2):
        s = Sampler(p, random.Random(11))
        n = k = 0
        while n < 300_000:
            m = rng.randrange(0, 600)
            picks = s.take(m)
            assert picks == sorted(set(picks)) and all(0 <= x < m for x in picks)
            n += m
            k += len(picks)
        assert abs(k - n * p) <= 5 * math.sqrt(n * p * (1 - p)), (p, n, k)


def test_sampler_rejects_rates_outside_0_1() -> None:
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match="sample rate"):
            Sampler(bad, random.Random(1))


# --------------------------------------------------------------------------- by hand


def test_hand_trace_lifetimes_idle_and_gaps() -> None:
    """A 4-block document hit twice, then evicted by another document; block size 4, 6
    blocks, every block sampled (rate 1.0). By vLLM's rules:
    t=0  A = doc (16 tokens) + 2: doc blocks 0-3 and A's unfilled block 4 born at 0
    t=1  A done: its unfilled block goes to the front of the free queue
    t=2  B = doc + 2: hit on blocks 0-3 (access at 2); B's unfilled block reuses A's:
         A's observed, lifetime 2, idle 2
    t=3  B done
    t=5  C = doc + 2: access at 5 (history 2, 5); C's block reuses B's: lifetime 3, idle 3
    t=6  C done
    t=8  D = another document of 24 tokens (6 full blocks): C's fresh block is reused first
         (lifetime 3, idle 3), then doc blocks 3, 2, 1, 0 are evicted: lifetime 8, idle 3
         (last access 5), one gap each (5 - 2 = 3). D's blocks stay: never observed."""
    pool, tree, hists = _tracked(total=6, bs=4)
    doc = tree.shared(-1, "doc", 16)
    reqs = []
    for rid, t in ((1, 0.0), (2, 2.0), (3, 5.0)):
        req = Req(rid, t, [doc, tree.new(doc, 2)], 18, 1, affinity=0)
        assert _admit(pool, req, t)
        _release(pool, req, t + 1.0)
        reqs.append(req)
    other = tree.shared(-1, "other", 24)
    assert _admit(pool, Req(4, 8.0, [other], 24, 1, affinity=0), 8.0)
    pool.check()
    life, idle, gap = _raw(hists)
    assert life == [2.0, 3.0, 3.0, 8.0, 8.0, 8.0, 8.0]
    assert idle == [2.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0]
    assert gap == [3.0, 3.0, 3.0, 3.0]


def test_hand_history_keeps_the_last_four_accesses() -> None:
    """A 2-block document (block size 4, 3 blocks of HBM) written at 0, then hit at 1, 2, 4,
    7 and 11 by requests of 9 tokens done a quarter second later; at 20 a 12-token request
    needs all 3 blocks. vLLM keeps the last 4 accesses (deque maxlen 4), so each document
    block observes lifetime 20, idle 9 and gaps 2, 3, 4 (not 1). Each request's unfilled
    block is reused by the next allocation: lifetimes (= idle) 1, 1, 2, 3, 4, 9."""
    pool, tree, hists = _tracked(total=3, bs=4)
    doc = tree.shared(-1, "doc", 8)
    for rid, t in enumerate((0.0, 1.0, 2.0, 4.0, 7.0, 11.0)):
        req = Req(rid, t, [doc, tree.new(doc, 1)], 9, 1, affinity=0)
        assert _admit(pool, req, t)
        _release(pool, req, t + 0.25)
    assert _admit(pool, Req(9, 20.0, [tree.shared(-1, "x", 12)], 12, 1, affinity=0), 20.0)
    life, idle, gap = _raw(hists)
    assert life == [1.0, 1.0, 2.0, 3.0, 4.0, 9.0, 20.0, 20.0]
    assert idle == [1.0, 1.0, 2.0, 3.0, 4.0, 9.0, 9.0, 9.0]
    assert gap == [2.0, 2.0, 3.0, 3.0, 4.0, 4.0]


# --------------------------------------------------------------------------- brute force


class RefVLLM:
    """vLLM's BlockPool (c59cb79) and KVCacheMetricsCollector (0ad8e2a) block by block, for
    prefill-only requests, every block sampled: explicit block ids, a free queue whose front is
    reused first (free_blocks prepends blocks without a hash and appends hashed ones, a
    request's blocks freed in reverse order), a hash -> block map, touch on a prefix hit and
    on_block_evicted for every block get_new_blocks pops."""

    def __init__(self, total: int, bs: int) -> None:
        self.bs = bs
        self.hash: list[object | None] = [None] * total
        self.ref = [0] * total
        self.free: deque[int] = deque(range(total))
        self.cached: dict[object, int] = {}
        self.metrics: dict[int, list[Any]] = {}
        self.held: dict[int, list[int]] = {}
        self.life: list[float] = []
        self.idle: list[float] = []
        self.gaps: list[float] = []

    def admit(self, rid: int, hashes: list[object], prompt: int, t: float) -> bool:
        limit = (prompt - 1) // self.bs
        hit: list[int] = []
        for h in hashes[:limit]:
            if h not in self.cached:
                break
            hit.append(self.cached[h])
        need = -(-prompt // self.bs) - len(hit)
        if need + sum(1 for b in hit if self.ref[b] == 0) > len(self.free):
            return False  # allocate_slots returns None before touching anything
        for b in hit:  # touch
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
            st = self.metrics.get(b)
            if st is not None:
                st[1] = t
                st[2] = [*st[2], t][-4:]
        new = []
        for _ in range(need):  # get_new_blocks
            b = self.free.popleft()
            st = self.metrics.pop(b, None)  # _maybe_evict_cached_block -> on_block_evicted
            if st is not None:
                self.life.append(t - st[0])
                self.idle.append(t - st[1])
                self.gaps += [y - x for x, y in zip(st[2], st[2][1:], strict=False)]
            if self.hash[b] is not None:
                del self.cached[self.hash[b]]
                self.hash[b] = None
            self.ref[b] = 1
            self.metrics[b] = [t, t, []]
            new.append(b)
        blocks = hit + new
        for i in range(len(hit), prompt // self.bs):  # cache_full_blocks
            assert hashes[i] not in self.cached  # no duplicate block in these traces
            self.hash[blocks[i]] = hashes[i]
            self.cached[hashes[i]] = blocks[i]
        self.held[rid] = blocks
        return True

    def finish(self, rid: int) -> None:
        ordered = list(reversed(self.held.pop(rid)))
        for b in ordered:
            self.ref[b] -= 1
        freed = [b for b in ordered if self.ref[b] == 0]
        self.free.extendleft(reversed([b for b in freed if self.hash[b] is None]))
        self.free.extend(b for b in freed if self.hash[b] is not None)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_tracked_pool_observes_what_vllm_observes(seed: int) -> None:
    """A random trace of requests (a block-aligned shared document + a question of their own)
    admitted and finished over time, on the simulator's tracked pool and on RefVLLM: the same
    admissions succeed and the same lifetimes, idle times and reuse gaps are observed."""
    rng = random.Random(seed)
    bs, total = 4, 48
    pool, tree, hists = _tracked(total, bs)
    ref = RefVLLM(total, bs)
    doc_blocks = [rng.randint(1, 9) for _ in range(7)]
    docs = [tree.shared(-1, ("doc", d), n * bs) for d, n in enumerate(doc_blocks)]
    running: dict[int, Req] = {}
    t = 0.0
    for rid in range(400):
        t += rng.choice((0.25, 0.5, 1.0, 3.0))
        if running and (rng.random() < 0.45 or len(running) > 6):
            victim = rng.choice(sorted(running))
            _release(pool, running.pop(victim), t)
            ref.finish(victim)
            continue
        d = rng.randrange(len(docs))
        q = rng.randint(1, 3 * bs)
        req = Req(rid, t, [docs[d], tree.new(docs[d], q)], doc_blocks[d] * bs + q, 1, affinity=0)
        hashes: list[object] = [("doc", d, i) for i in range(doc_blocks[d])]
        hashes += [("q", rid, i) for i in range(q // bs + 1)]
        ok = _admit(pool, req, t)
        assert ok == ref.admit(rid, hashes, req.prompt_len, t)
        if ok:
            running[rid] = req
        pool.check()
    life, idle, gap = _raw(hists)
    assert len(life) > 100 and len(gap) > 10  # the trace exercises what it is there for
    assert (life, idle, gap) == (sorted(ref.life), sorted(ref.idle), sorted(ref.gaps))


# --------------------------------------------------------------------------- whole runs


def _bundled(name: str, duration: float, **engine: Any) -> Scenario:
    with scenario_file(name) as path:
        raw = dict(load_scenario(path).raw)
        if engine:
            raw["engine"] = engine
        raw["duration_s"] = duration
        return parse_scenario(raw, where=str(path), base_dir=path.parent)


def _without_residency(record: dict[str, Any]) -> dict[str, Any]:
    record = dict(record)
    summary = dict(record["summary"])
    summary.pop("parameters")  # the engine keys differ, by construction
    record["summary"] = summary
    engines = []
    for engine in record["engines"]:
        e = dict(engine)
        e["histograms"] = {
            k: v for k, v in e["histograms"].items() if k not in RESIDENCY_HISTOGRAMS
        }
        engines.append(e)
    record["engines"] = engines
    return record


@pytest.mark.parametrize(
    ("name", "duration"),
    [
        ("multi_turn", 150.0),
        ("cpu_tier", 600.0),
        ("shared_prefix", 90.0),
        ("canary_switchback", 4000.0),
    ],
)
def test_metrics_on_changes_no_other_number(name: str, duration: float) -> None:
    """Same seed with kv_cache_metrics on (every block sampled) and off: every other number
    of the run (summary, each engine's counters, histograms, pool and queue state, the
    completed requests, the LMCache pools) is bit for bit the same. canary_switchback restarts
    its canary (a new block pool) at 1800 s."""
    off = golden.batch_record(
        Simulation(_bundled(name, duration, kv_cache_metrics=False)), digests=False
    )
    on_sim = Simulation(
        _bundled(name, duration, kv_cache_metrics=True, kv_cache_metrics_sample=1.0)
    )
    on = golden.batch_record(on_sim, digests=False)
    assert sum(e["histograms"][LIFE]["count"] for e in on["engines"]) > 0
    assert _without_residency(on) == _without_residency(off)


def _observed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float, tuple[float, ...]]]:
    seen: list[tuple[float, float, tuple[float, ...]]] = []
    original = KVResidency._observe

    def record(self: KVResidency, st: Any, t: float) -> None:
        seen.append((t - st.birth, t - st.last, tuple(st.hist)))
        original(self, st, t)

    monkeypatch.setattr(KVResidency, "_observe", record)
    return seen


def test_whole_run_observations_are_consistent(monkeypatch: pytest.MonkeyPatch) -> None:
    """multi_turn (decode jumps, native loads, preemptions), every block sampled: each
    eviction observes 0 <= idle <= lifetime, its history holds at most 4 accesses in time
    order, all inside the block's life, and the histograms hold exactly those values."""
    seen = _observed(monkeypatch)
    sim = Simulation(
        _bundled("multi_turn", 120.0, kv_cache_metrics=True, kv_cache_metrics_sample=1.0)
    )
    sim.run()
    assert len(seen) > 1000
    for life, idle, hist in seen:
        assert 0.0 <= idle <= life + 1e-9
        assert len(hist) <= 4 and list(hist) == sorted(hist)
    for e in sim.engines:
        for h in e.tel.hist.values():
            h.flush()
    n_life = sum(e.tel.hist[LIFE].count for e in sim.engines)
    n_gap = sum(e.tel.hist[GAP].count for e in sim.engines)
    assert n_life == len(seen)
    assert n_gap == sum(max(0, len(h) - 1) for _, _, h in seen)
    total = sum(e.tel.hist[LIFE].total for e in sim.engines)
    assert total == pytest.approx(sum(life for life, _, _ in seen), rel=1e-12)


def test_sampled_count_is_binomial_of_the_evicted_blocks() -> None:
    """The run's trajectory does not depend on the sampling, so at rate p the number of
    lifetime observations is Binomial(N, p), N = the evictions observed at rate 1: within 5
    standard deviations of N·p."""

    def count(rate: float) -> int:
        sim = Simulation(
            _bundled("cpu_tier", 900.0, kv_cache_metrics=True, kv_cache_metrics_sample=rate)
        )
        sim.run()
        return sum(s.histograms[LIFE].count for s in sim.engine_snapshots())

    n = count(1.0)
    for p in (0.01, 0.1):
        k = count(p)
        assert abs(k - n * p) <= 5 * math.sqrt(n * p * (1 - p)), (n, p, k)


def test_rate_zero_and_no_prefix_caching_observe_nothing() -> None:
    """A sample rate of 0 (vLLM refuses it; here past the validation) samples no block, and
    without prefix caching vLLM never calls on_block_evicted: the histograms are there
    (registered with the flag), empty."""
    sc = _bundled("cpu_tier", 300.0)
    zero = dataclasses.replace(
        sc, cluster=dataclasses.replace(sc.cluster, kv_cache_metrics_sample=0.0)
    )
    raw = {
        **sc.raw,
        "cluster": {**sc.raw["cluster"], "enable_prefix_caching": False},
        "duration_s": 300,
    }
    for scenario in (zero, parse_scenario(raw)):
        sim = Simulation(scenario)
        sim.run()
        for e in sim.engines:
            assert all(e.tel.hist[n].count == 0 for n in RESIDENCY_HISTOGRAMS)


def test_metrics_off_registers_no_residency_histogram() -> None:
    sim = Simulation(_bundled("cpu_tier", 60.0, kv_cache_metrics=False))
    assert not set(RESIDENCY_HISTOGRAMS) & set(sim.engines[0].tel.hist)


# --------------------------------------------------------------------------- scenario keys


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"kv_cache_metrics": "yes"}, "engine.kv_cache_metrics: must be true or false, got 'yes'"),
        ({"kv_cache_metrics_sample": 0}, "engine.kv_cache_metrics_sample: must be > 0, got 0"),
        ({"kv_cache_metrics_sample": 1.5}, "engine.kv_cache_metrics_sample: must be <= 1, got 1.5"),
        ({"kv_cache_metrics_sample": "1%"}, "engine.kv_cache_metrics_sample: must be a number"),
        ({"kv_metrics": True}, "engine.kv_metrics: unknown key"),
        (3, "engine must be a mapping, got int"),
    ],
)
def test_engine_keys_validated(engine: Any, message: str) -> None:
    raw = {**_bundled("cpu_tier", 60.0).raw, "engine": engine}
    with pytest.raises(
        ConfigError, match="^scenario: " + message.replace("(", r"\(").replace(".", r"\.")
    ):
        parse_scenario(raw)


def test_engine_keys_defaults_and_sweep_keys() -> None:
    sc = parse_scenario({**_bundled("cpu_tier", 60.0).raw, "engine": None})
    assert (sc.cluster.kv_cache_metrics, sc.cluster.kv_cache_metrics_sample) == (False, 0.01)
    params = {p.key: p for p in sc.params}
    assert params["engine.kv_cache_metrics"].value is False
    assert "vllm-kv-cache-metrics" in params["engine.kv_cache_metrics_sample"].source
    assert resolve_dotted("kv_cache_metrics_sample") == "engine.kv_cache_metrics_sample"
    assert resolve_dotted("engine.kv_cache_metrics") == "engine.kv_cache_metrics"


# --------------------------------------------------------------------------- exposition


def test_engine_endpoint_renders_vllm_residency_families() -> None:
    """A simulated engine's /metrics carries the three families with vLLM's buckets, and a
    collector reads back exactly the simulator's numbers."""
    sim = Simulation(_bundled("cpu_tier", 600.0))
    sim.run()
    snap = sim.engine_snapshots()[0]
    text = render(engine_view(snap, engine_config(sim.scenario))).decode()
    for name in RESIDENCY_HISTOGRAMS:
        family = catalog.export_spelling(name).family
        les = [
            line.split('le="')[1].split('"')[0]
            for line in text.splitlines()
            if line.startswith(family + "_bucket")
        ]
        assert les == [*(str(b) for b in catalog.KV_RESIDENCY_BUCKETS), "+Inf"]  # 0.001 … 1800.0
        assert (
            catalog.KV_RESIDENCY_BUCKETS[0] == 0.001 and catalog.KV_RESIDENCY_BUCKETS[-1] == 1800.0
        )
    samples = {s.signal: s for s in read_exposition(text, "sim", 0.0).samples}
    for name in RESIDENCY_HISTOGRAMS:
        h = snap.histograms[name]
        assert h.count > 0 and samples[name].value == h.count
        assert samples[name].sum == pytest.approx(h.sum, rel=1e-15)
        assert [c for _, c in samples[name].buckets] == [float(c) for c in h.cumulative]


def test_engine_endpoint_without_metrics_has_no_residency_family() -> None:
    sim = Simulation(_bundled("cpu_tier", 60.0, kv_cache_metrics=False))
    sim.run()
    text = render(engine_view(sim.engine_snapshots()[0], engine_config(sim.scenario))).decode()
    assert "kv_block_" not in text


# --------------------------------------------------------------------------- LMCache


def test_l1_lifecycle_by_hand() -> None:
    """Chunks 0..2 of a node written at 1 (all sampled at rate 1), read at 4 and 10 (gaps 3,
    6 each), chunk 2 written again at 12 while tracked (gap 2, LMCache's re-write), chunk 1
    evicted then written again at 20: tracked anew, no gap; read at 21: gap 1."""
    h = Histogram((1.0,), limit=1 << 40)
    tree = ContentTree()
    n = tree.new(-1, 3 * 256)
    lc = L1Lifecycle(1.0, h, tree.start, tree.end, 256)
    for t, op in ((1.0, "w"), (4.0, "r"), (10.0, "r")):
        lc.now = t
        lc.written(n, 0, 3) if op == "w" else lc.read([n], 0, 3)
    lc.now = 12.0
    lc.written(n, 2, 3)
    lc.evicted(n, 1, 2)
    lc.now = 20.0
    lc.written(n, 1, 2)
    lc.now = 21.0
    lc.read([n], 1, 2)
    assert sorted(h.pending) == [1.0, 2.0, 3.0, 3.0, 3.0, 6.0, 6.0, 6.0]


def test_l1_lifecycle_samples_by_key_hash() -> None:
    """LMCache's rule: a key is tracked iff hash(key) % 1_000_003 < int(rate * 1_000_003)."""
    h = Histogram((1.0,), limit=1 << 40)
    lc = L1Lifecycle(0.3, h, [0], [10**6], 1)
    lc.written(0, 0, 5000)
    want = {
        (0, c)
        for c in range(5000)
        if hash((0, c)) % LMCACHE_SAMPLE_PRIME < int(0.3 * LMCACHE_SAMPLE_PRIME)
    }
    assert set(lc.last) == want and 1200 < len(want) < 1800


def test_lmcache_pool_reuse_gap_from_loads_and_rendered_with_l1_tag() -> None:
    """rag_bursty (LMCache per cluster, L2): loads from L1 observe reuse gaps; the pool's
    /metrics renders the family with l1_tag, as the MP server does."""
    sim = Simulation(_bundled("rag_bursty", 90.0))
    sim.run()
    snap = sim.lmcache_snapshots()[0]
    h = snap.histograms["lmcache_l1_chunk_reuse_gap_seconds"]
    assert h.count > 0 and h.bounds == catalog.LMCACHE_L1_LIFECYCLE_BUCKETS
    text = render(pool_view(snap, "m")).decode()
    family = catalog.export_spelling("lmcache_l1_chunk_reuse_gap_seconds").family
    lines = [line for line in text.splitlines() if line.startswith(family + "_count")]
    assert lines == [f'{family}_count{{l1_tag="_default"}} {float(h.count)}']


def test_lmcache_connector_load_reads_l1_chunks() -> None:
    """A pool at rate 1: a request's chunks stored at 1, loaded by another request at 5 and
    again at 9: every chunk observes 4 twice; the chunks the GPU already held are not read."""
    sc = parse_scenario(
        {
            "cluster": {"nodes": 1, "gpus_per_node": 1, "offload": "lmcache", "cpu_cache_gb": 10},
            "workload": {"kind": "synthetic", "prompt_tokens": 100, "qps": 1},
        }
    )
    tree = ContentTree()
    pool = LMCachePool(0, "engine", (0,), sc.cluster, tree, l1_sample_rate=1.0)
    conn = LMCacheConnector(sc.cluster, pool)
    doc = tree.shared(-1, "doc", 4 * 256)
    a = Req(1, 0.0, [doc, tree.new(doc, 10)], 1034, 1, affinity=0)
    assert conn.lookup(a, 1034, 0) == 0
    conn.store(a, 0, 1034, 1.0)
    for rid, t in ((2, 5.0), (3, 9.0)):
        r = Req(rid, t, [doc, tree.new(doc, 10)], 1034, 1, affinity=0)
        ext = conn.lookup(r, 1034, 256)  # the GPU holds the first chunk
        assert ext == 3 * 256
        conn.load(r, 256, ext, t)
    gaps = sorted(pool.tel.hist["lmcache_l1_chunk_reuse_gap_seconds"].pending)
    assert gaps == [4.0] * 6


def _observed_at(
    monkeypatch: pytest.MonkeyPatch,
) -> list[tuple[float, float, float, tuple[float, ...]]]:
    """(eviction time, lifetime, idle, access history) of every observation from now on."""
    seen: list[tuple[float, float, float, tuple[float, ...]]] = []
    original = KVResidency._observe

    def record(self: KVResidency, st: Any, t: float) -> None:
        seen.append((t, t - st.birth, t - st.last, tuple(st.hist)))
        original(self, st, t)

    monkeypatch.setattr(KVResidency, "_observe", record)
    return seen


@pytest.mark.parametrize(("name", "duration"), [("multi_turn", 90.0), ("saturated_16x_h100", 30.0)])
def test_decode_jumps_observe_what_single_steps_observe(
    name: str, duration: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decode blocks are born at their decode step and evicted at the step that needs their
    room, also inside a jump of k steps (the step log, KVResidency.at): the same run stepped
    one decode step per event (max_jump=1) observes the same values, up to float rounding
    of the step times, at every time both runs have committed (a jump's steps are committed
    when it ends, so the batch run stops short of the naive one)."""
    runs = []
    cut = math.inf
    for max_jump in (None, 1):
        seen = _observed_at(monkeypatch)
        sc = _bundled(name, duration, kv_cache_metrics=True, kv_cache_metrics_sample=1.0)
        sim = Simulation(sc, max_jump=max_jump)
        sim.run()
        if max_jump is None:  # the earliest step still in flight on any engine
            cut = min(e.seg_start for e in sim.engines if e.seg != SEG_IDLE)
        runs.append(seen)
        monkeypatch.undo()
    jumped, stepped = ([o for o in sorted(run) if o[0] < cut - 1e-6] for run in runs)
    assert cut > duration / 2 and len(jumped) > 1000
    assert len(jumped) == len(stepped)
    for a, b in zip(jumped, stepped, strict=True):
        assert a[:3] == pytest.approx(b[:3], rel=1e-9, abs=1e-9)
        assert a[3] == pytest.approx(b[3], rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("max_jump", [1, None])
def test_decode_block_born_at_the_step_that_allocates_it(
    max_jump: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reference: run the naive loop (one decode step per event) and note, at every step it
    plans, which decoding request opens a new block (c computed tokens, c % block_size == 0:
    vLLM allocates its slot when it schedules the step). Every decode block the tracker
    later records (at the request's release, from the step log; also across jumps) is born
    at such a step's time."""
    sc = _bundled("multi_turn", 60.0, kv_cache_metrics=True, kv_cache_metrics_sample=1.0)
    opened: dict[tuple[int, int], list[float]] = {}
    plan = Engine._plan

    def noting(self: Engine, now: float) -> None:
        for req in self.running.values():
            if req.state == DECODE:
                c = self.dec.computed(req)
                if c % self.bs == 0:
                    opened.setdefault((req.path[-1], c // self.bs), []).append(now)
        plan(self, now)

    monkeypatch.setattr(Engine, "_plan", noting)
    Simulation(sc, max_jump=1).run()
    monkeypatch.undo()

    born: list[tuple[int, int, float]] = []
    original, settle = KVResidency.born, TrackedBlockPool.settle_decode
    settling = [False]

    def births(self: KVResidency, ranges: list[tuple[int, int, int]], times: Any) -> None:
        if settling[0]:  # blocks decode filled (a prefill's are born at its step: by hand)
            born.extend((n, b, times(b)) for n, lo, hi in ranges for b in range(lo, hi))
        original(self, ranges, times)

    def settling_decode(self: TrackedBlockPool, req: Req, computed: int) -> None:
        settling[0] = True
        try:
            settle(self, req, computed)
        finally:
            settling[0] = False

    monkeypatch.setattr(KVResidency, "born", births)
    monkeypatch.setattr(TrackedBlockPool, "settle_decode", settling_decode)
    Simulation(sc, max_jump=max_jump).run()
    checked = 0
    for n, b, t in born:
        if (n, b) in opened:
            assert any(t == pytest.approx(x, rel=1e-12, abs=1e-9) for x in opened[(n, b)])
            checked += 1
    assert checked > 10_000
