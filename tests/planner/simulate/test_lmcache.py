"""LMCache's pool as LMCache 0.3.x keeps it [source: lmcache-0.3.3-source]: a lookup is an
access, a store starts at LMCache's own hit, and the 0.3.3 behaviours a scenario can ask for
(decode chunks, unfull chunks, L2 hits not copied into L1, blocking GPU->CPU stores)."""

from __future__ import annotations

from typing import Any

import pytest

from planner.domain.costmodel import transfer_seconds
from planner.simulate.cluster import Simulation
from planner.simulate.lmcache import LMCacheConnector, LMCachePool
from planner.simulate.scenario import parse_scenario
from planner.simulate.workload import ContentTree, Req

CS = 256
KV = 131_072  # Llama-3.1-8B bf16, TP1: bytes per token


def _conn(
    chunks: int, lmcache: dict[str, Any] | None = None
) -> tuple[LMCacheConnector, ContentTree]:
    """A connector on its own pool, whose L1 holds `chunks` chunks, and the pool's tree."""
    raw = {
        "cluster": {"nodes": 1, "gpus_per_node": 1, "model": "llama-3.1-8b",
                    "offload": "lmcache", "cpu_cache_gb": chunks * CS * KV / 1e9,
                    "lmcache": lmcache or {}},
        "workload": {"kind": "synthetic", "prompt_tokens": 100, "concurrency": 1},
    }  # fmt: skip
    spec = parse_scenario(raw).cluster
    assert spec.kv_bytes_per_token_engine == KV
    tree = ContentTree()
    pool = LMCachePool(0, "engine", (0,), spec, tree)
    assert pool.l1.capacity == pytest.approx(chunks)
    return LMCacheConnector(spec, pool), tree


def _req(tree: ContentTree, rid: int, prefix: int, own: int, out: int = 10) -> Req:
    """Request `rid`: the shared node `prefix` (-1: none) then `own` tokens, `out` output."""
    q = tree.new(prefix, own)
    path = ([prefix] if prefix >= 0 else []) + [q]
    prompt = tree.end[q]
    path.append(tree.new(q, out))
    return Req(rid, 0.0, path, prompt, out, affinity=0)


def _prefill(conn: LMCacheConnector, req: Req, gpu_hit: int = 0) -> int:
    """Look req up, load what LMCache adds, store the rest in one step; the chunks LMCache
    supplied."""
    ext = conn.lookup(req, req.prompt_len, gpu_hit)
    if ext:
        conn.load(req, gpu_hit, ext, 0.0)
    conn.store(req, gpu_hit + ext, req.prompt_len, 0.0)
    return ext // CS


def test_lookup_is_an_access_even_when_the_gpu_holds_the_prefix() -> None:
    conn, tree = _conn(chunks=8)
    a, b, c = (tree.shared(-1, (k,), 4 * CS) for k in "abc")
    _prefill(conn, _req(tree, 0, a, CS))  # a's 4 chunks + 1 own
    _prefill(conn, _req(tree, 1, b, CS - 1))  # b's 4 chunks (the own part is unfull)
    assert conn.pool.l1.lookup([a], 99) == 4
    # a request on `a` served from the GPU prefix cache: LMCache is asked all the same, and
    # 0.3.x pins and touches what it finds, so `a` is now more recent than `b`
    assert conn.lookup(_req(tree, 2, a, 10), 4 * CS + 10, 4 * CS) == 0
    _prefill(conn, _req(tree, 3, c, CS - 1))  # 4 more chunks: one prefix must go
    assert conn.pool.l1.lookup([a], 99) == 4
    assert conn.pool.l1.lookup([b], 99) < 4


def test_store_starts_at_lmcache_hit_not_at_the_gpu_hit() -> None:
    conn, tree = _conn(chunks=16)
    a = tree.shared(-1, ("a",), 4 * CS)
    req = _req(tree, 0, a, CS - 1)
    # the GPU prefix cache supplied the 4 prefix chunks, LMCache has none of them: the
    # connector stores from LMCache's hit (0), so the prefix reaches LMCache too
    assert conn.lookup(req, req.prompt_len, 4 * CS) == 0
    assert conn.store(req, 4 * CS, req.prompt_len, 0.0) == 4
    assert conn.pool.l1.lookup([a], 99) == 4


def test_decode_chunks_stored_only_with_save_decode_cache() -> None:
    for flag, want in ((False, 0), (True, 2)):
        conn, tree = _conn(chunks=16, lmcache={"save_decode_cache": flag})
        req = _req(tree, 0, -1, 2 * CS + 100, out=2 * CS + 50)
        _prefill(conn, req)
        used = conn.pool.l1.used
        assert used == 2
        # 2 * 256 + 100 prompt + 561 decoded = 1173 computed: chunks 2-3 filled during decode
        conn.store_on_release(req, req.prompt_len + 2 * CS + 49, 0.0)
        assert conn.pool.l1.used == used + want


def test_unfull_chunk_takes_room_no_lookup_can_hit() -> None:
    conn, tree = _conn(chunks=4, lmcache={"save_unfull_chunk": True})
    a = tree.shared(-1, ("a",), 2 * CS)
    r0 = _req(tree, 0, a, CS // 2)  # 2.5 chunks: 2 full + an unfull half
    _prefill(conn, r0)
    assert conn.pool.l1.used == pytest.approx(2.5)
    assert conn.pool.l1.lookup(r0.path, 99) == 2  # the half chunk is never a hit
    # two more requests on other prefixes: LRU evicts `a` and r0's half chunk
    for rid, k in ((1, "b"), (2, "c")):
        _prefill(conn, _req(tree, rid, tree.shared(-1, (k,), CS), CS // 4))
    assert conn.pool.l1.used <= 4
    assert conn.pool.l1.lookup([a], 99) < 2
    assert not any(n < 0 for n in conn.pool.nodes())  # the unfull objects are not nodes


def test_unfull_chunk_not_stored_by_default() -> None:
    conn, tree = _conn(chunks=4)
    _prefill(conn, _req(tree, 0, -1, CS + CS // 2))
    assert conn.pool.l1.used == 1


def test_l2_hit_promoted_to_l1_or_read_through_a_transient_buffer() -> None:
    for promote in (True, False):
        conn, tree = _conn(chunks=4, lmcache={"l2_promote": promote,
                                              "l2": {"tier": "local-nvme"}})  # fmt: skip
        a = tree.shared(-1, ("a",), 4 * CS)
        _prefill(conn, _req(tree, 0, a, 10))  # a: 4 chunks in L1 and L2
        _prefill(conn, _req(tree, 1, tree.shared(-1, ("b",), 4 * CS), 10))  # evicts a from L1
        l1 = conn.pool.l1
        assert l1.lookup([a], 99) == 0 and conn.pool.l2 is not None
        assert conn.pool.l2.lookup([a], 99) == 4
        assert _prefill(conn, _req(tree, 2, a, 10)) == 4  # all four from L2
        if promote:
            assert l1.lookup([a], 99) == 4
        else:  # the buffer evicted 4 L1 chunks and was freed: nothing of a in L1
            assert l1.lookup([a], 99) == 0
            assert l1.used == 0


def test_sync_store_blocks_the_step_for_the_copy() -> None:
    conn, tree = _conn(chunks=64, lmcache={"sync_store": True, "latency_ms": 0.5})
    req = _req(tree, 0, -1, 10 * CS + 7)
    assert conn.lookup(req, req.prompt_len, 0) == 0
    # a middle chunk of prefill stores its full chunks only
    assert conn.store_seconds([(req, 5 * CS + 3)]) == pytest.approx(
        transfer_seconds(5 * CS * KV, conn.read_Bps, latency_s=5e-4, objects=5)
    )
    conn.store(req, 0, 5 * CS + 3, 0.0)  # the step commits
    req.computed = 5 * CS + 3
    # the last step: from the last chunk boundary to the end, unfull chunk dropped
    assert conn.store_seconds([(req, 5 * CS + 4)]) == pytest.approx(
        transfer_seconds(5 * CS * KV, conn.read_Bps, latency_s=5e-4, objects=5)
    )
    conn.sync_store = False
    assert conn.store_seconds([]) == 0.0


SIM: dict[str, Any] = {
    "cluster": {"nodes": 1, "gpus_per_node": 1, "model": "llama-3.1-8b", "num_gpu_blocks": 600,
                "offload": "lmcache", "cpu_cache_gb": 3.0},
    "workload": {"kind": "shared_prefix", "groups": 12, "prompts_per_group": 6,
                 "system_prompt_tokens": 2000, "question_tokens": 200, "output_tokens": 300,
                 "concurrency": 4},
    "duration_s": 100_000,
    "seed": 3,
}  # fmt: skip


def _run(lmcache: dict[str, Any]) -> dict[str, Any]:
    raw = {**SIM, "cluster": {**SIM["cluster"], "lmcache": lmcache}}
    return Simulation(parse_scenario(raw)).run().summary


def test_lmcache_0_3_3_store_semantics_lose_hits_when_l1_is_short() -> None:
    # 3 GB of L1 holds ~89 chunks against 12 prefixes of 7 chunks and 72 requests that each
    # store one chunk of their own (HBM holds ~4 of the 2,500-token requests): what 0.3.3
    # stores besides (each request's decode chunks and unfull chunk) pushes prefixes out
    base = _run({})
    v033 = _run({"save_decode_cache": True, "save_unfull_chunk": True})
    assert base["completed_requests"] == v033["completed_requests"] == 72
    assert v033["external_hit_rate"] < base["external_hit_rate"]
    assert v033["input_tokens_per_s"] < base["input_tokens_per_s"]


def test_sync_store_slows_a_run_that_stores() -> None:
    fast, slow = _run({}), _run({"sync_store": True})
    assert slow["ttft_mean_s"] > fast["ttft_mean_s"]
    assert slow["external_hit_rate"] == fast["external_hit_rate"]
