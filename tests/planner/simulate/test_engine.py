"""Scheduler invariants under load: block accounting, completion, preemption, tokens."""

from __future__ import annotations

import random
from typing import Any

import pytest

from planner.simulate.cluster import Simulation
from planner.simulate.engine import Engine
from planner.simulate.scenario import parse_scenario, set_dotted

PRESSURE: dict[str, Any] = {
    "cluster": {"nodes": 1, "gpus_per_node": 2, "model": "llama-3.1-8b", "num_gpu_blocks": 2500},
    "workload": {
        "kind": "synthetic",
        "prompt_tokens": {"dist": "uniform", "min": 300, "max": 9000},
        "output_tokens": {"dist": "uniform", "min": 1, "max": 1500},
        "concurrency": 48,
        "num_requests": 400,
    },
    "duration_s": 100_000,
    "seed": 7,
}
SHARED: dict[str, Any] = {
    "cluster": {"nodes": 1, "gpus_per_node": 4, "model": "llama-3.1-8b", "num_gpu_blocks": 3000,
                "cpu_cache_gb": 8},
    "workload": {"kind": "shared_prefix", "groups": 12, "prompts_per_group": 12,
                 "system_prompt_tokens": 6000, "question_tokens": {"dist": "uniform", "min": 10,
                 "max": 700}, "output_tokens": {"dist": "lognormal", "mean": 300, "sigma": 1.0},
                 "concurrency": 40},
    "duration_s": 100_000,
    "seed": 3,
}  # fmt: skip
MULTI_TURN: dict[str, Any] = {
    "cluster": {"nodes": 1, "gpus_per_node": 2, "model": "llama-3.1-8b", "num_gpu_blocks": 2000,
                "offload": "native", "cpu_cache_gb": 4, "max_num_batched_tokens": 512,
                "max_num_seqs": 16},
    "workload": {"kind": "multi_turn", "turns": 4, "question_tokens": 700, "output_tokens": 300,
                 "system_prompt_tokens": 1000, "concurrency": 24, "num_requests": 200},
    "duration_s": 100_000,
    "seed": 5,
}  # fmt: skip

CASES: list[tuple[str, dict[str, Any]]] = [
    ("pressure-none", PRESSURE),
    ("pressure-native", set_dotted(PRESSURE, "cluster.offload", "native")),
    ("pressure-lmcache", set_dotted(PRESSURE, "cluster.offload", "lmcache")),
    ("pressure-no-prefix-cache", set_dotted(PRESSURE, "cluster.enable_prefix_caching", False)),
    ("shared-none", SHARED),
    ("shared-native", set_dotted(SHARED, "cluster.offload", "native")),
    ("shared-lmcache-cluster", set_dotted(set_dotted(SHARED, "cluster.offload", "lmcache"),
                                          "cluster.lmcache_scope", "cluster")),
    ("shared-lmcache-async-l2", set_dotted(set_dotted(SHARED, "cluster.offload", "lmcache"),
                                           "cluster.lmcache", {"async_load": True,
                                           "l2": {"tier": "local-nvme", "size_gb": 20}})),
    ("multi-turn-native-small-budget", MULTI_TURN),
    ("rag-mixed-offload", {
        "cluster": {"nodes": 1, "gpus_per_node": 3, "model": "llama-3.1-8b",
                    "num_gpu_blocks": 2500, "engines_offload": ["native", "lmcache", "none"],
                    "router": "least_loaded", "cpu_cache_gb": 6},
        "workload": {"kind": "rag", "documents": 60, "doc_tokens": 1500, "docs_per_request": 2,
                     "question_tokens": 100, "output_tokens": 120, "qps": 6,
                     "num_requests": 300},
        "duration_s": 100_000, "seed": 2}),
]  # fmt: skip


def _run_checked(raw: dict[str, Any], slice_s: float = 0.37) -> Simulation:
    """Advance in slices, recounting every engine's blocks between slices."""
    sim = Simulation(parse_scenario(raw))
    t = 0.0
    while not sim.done:
        t += slice_s
        sim.advance_to(t, settle=True)
        for eng in sim.engines:
            eng.check()
            assert eng.pool.available >= 0
            assert len(eng.running) <= eng.max_seqs
    return sim


@pytest.mark.parametrize(("name", "raw"), CASES, ids=[n for n, _ in CASES])
def test_engine_finite_workload_blocks_balance_and_every_request_completes_once(
    name: str, raw: dict[str, Any]
) -> None:
    sim = _run_checked(raw)
    rids = [c[6] for c in sim.completed]
    assert len(rids) == len(set(rids)), "a request completed twice"
    assert len(rids) == sim.workload.issued, "a request never completed"
    assert sim.outstanding == 0
    for eng in sim.engines:
        assert not eng.running and not eng.waiting and not eng.loading
        assert eng.dec.r == 0 and eng.dec.s == 0
        assert eng.pool.pinned_total == 0 and eng.pool.private_total == 0, "blocks leaked"
        eng.pool.check()
    # token conservation: every prompt and output token accounted once
    prompt = sum(c[3] for c in sim.completed)
    output = sum(c[4] for c in sim.completed)
    counters = [e.tel.counters for e in sim.engines]
    assert sum(c["prompt_tokens_total"] for c in counters) == prompt
    assert sum(c["generation_tokens_total"] for c in counters) == output
    computed = sum(e.computed_tokens for e in sim.engines)
    hits = sum(c["prefix_cache_hits_total"] + c["external_prefix_cache_hits_total"]
               for c in counters)  # fmt: skip
    if not any(e.preemptions for e in sim.engines):
        assert computed + hits == prompt
    else:
        assert computed + hits > prompt  # re-prefill of preempted requests


def test_engine_preemption_only_under_block_pressure(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    original = Engine._preempt_newest

    def spy(self: Engine, now: float) -> Any:
        # a preemption follows a failed allocation: at most one chunk's worth of blocks left
        need = self.max_tokens // self.bs + 2 + self.dec.r
        assert self.pool.available <= need
        seen.append(self.pool.available)
        return original(self, now)

    monkeypatch.setattr(Engine, "_preempt_newest", spy)
    sim = Simulation(parse_scenario(PRESSURE))
    sim.run()
    assert seen, "the pressure scenario must preempt"
    ample = set_dotted(PRESSURE, "cluster.num_gpu_blocks", 400_000)
    sim = Simulation(parse_scenario(ample))
    sim.run()
    assert sum(e.preemptions for e in sim.engines) == 0


def test_engine_preempted_request_reprefills_its_tokens() -> None:
    sim = Simulation(parse_scenario(PRESSURE))
    result: Any = sim.run()
    assert result["preemptions"] > 0
    assert result["reprefill_tokens"] > 0
    assert result["avoided_reprefill_tokens"] == 0  # nothing to restore from without offload
    native: Any = Simulation(
        parse_scenario(set_dotted(PRESSURE, "cluster.offload", "native"))
    ).run()
    assert native["avoided_reprefill_tokens"] > 0  # restored over PCIe instead
    assert native["reprefill_tokens"] < result["reprefill_tokens"]


def test_engine_prefix_hit_skips_shared_prompt() -> None:
    raw = set_dotted(SHARED, "cluster.num_gpu_blocks", 200_000)
    raw = set_dotted(raw, "cluster.gpus_per_node", 1)
    result: Any = Simulation(parse_scenario(raw)).run()
    # 12 groups x 12 prompts on one engine: all but the first of each group hit the
    # 6000-token prefix (of ~6350 prompt tokens): 11/12 x 6000/6350 = 0.87
    assert 0.8 < result["prefix_hit_rate"] < 0.87
    assert result["preemptions"] == 0


def test_engine_request_longer_than_kv_is_refused() -> None:
    raw = set_dotted(PRESSURE, "cluster.num_gpu_blocks", 100)  # 1600 tokens
    sim = Simulation(parse_scenario(raw))
    result: Any = sim.run()
    assert result["rejected_requests"] > 0
    assert result["completed_requests"] + result["rejected_requests"] == 400
    assert all(c[3] + c[4] <= 1600 for c in sim.completed)


def test_engine_chunked_prefill_respects_token_budget() -> None:
    raw = set_dotted(PRESSURE, "cluster.max_num_batched_tokens", 1024)
    sim = Simulation(parse_scenario(raw))
    sim.run()
    for eng in sim.engines:
        hist = eng.tel.hist["iteration_tokens"]
        hist.flush()
        idx = hist.bounds.index(1024.0)
        assert sum(hist.counts[idx + 1 :]) == 0, "a step exceeded max_num_batched_tokens"


def _random_raw(r: random.Random) -> dict[str, Any]:
    """A random but valid scenario: sizes, budgets, connectors, routers, workloads."""
    modes = ("none", "native", "lmcache")
    kind = r.choice(["synthetic", "shared_prefix", "multi_turn", "rag"])
    wl: dict[str, Any] = {
        "kind": kind,
        "output_tokens": {"dist": "uniform", "min": 1, "max": r.choice([50, 500, 2000])},
        "num_requests": r.randint(20, 150),
    }
    if kind == "synthetic":
        wl["prompt_tokens"] = {"dist": "uniform", "min": 1, "max": r.choice([100, 3000, 9000])}
    elif kind == "shared_prefix":
        wl.update(groups=r.randint(1, 30), prompts_per_group=r.randint(1, 10),
                  system_prompt_tokens=r.choice([0, 17, 500, 5000]), repeat=r.random() < 0.3,
                  question_tokens={"dist": "uniform", "min": 1, "max": 900})  # fmt: skip
    elif kind == "multi_turn":
        wl.update(turns=r.randint(1, 6), system_prompt_tokens=r.choice([0, 33, 1000]),
                  question_tokens={"dist": "uniform", "min": 1, "max": 900})  # fmt: skip
    else:
        wl.update(documents=r.randint(3, 50), doc_tokens=r.choice([7, 300, 2000]),
                  docs_per_request=r.randint(1, 3), question_tokens=r.randint(1, 300))  # fmt: skip
    if r.random() < 0.5:
        wl["concurrency"] = r.randint(1, 80)
    else:
        wl.update(qps=r.choice([0.5, 3.0, 20.0]), arrival=r.choice(["poisson", "bursty"]))
    nodes = r.choice([1, 2])
    seqs, budget = r.choice([4, 32, 256]), r.choice([512, 2048, 8192])
    lmcache: dict[str, Any] = {"async_load": r.random() < 0.5, "chunk_size": r.choice([64, 256])}
    if r.random() < 0.3:
        lmcache["l2"] = {"tier": "local-nvme", "size_gb": r.choice([1, 50])}
    cluster = {
        "nodes": nodes, "gpus_per_node": 2, "model": "llama-3.1-8b",
        "num_gpu_blocks": r.choice([700, 1500, 4000, 20000]), "block_size": r.choice([8, 16, 32]),
        "max_num_seqs": min(seqs, budget), "max_num_batched_tokens": budget,
        "engines_offload": [r.choice(modes) for _ in range(nodes * 2)],
        "cpu_cache_gb": r.choice([0.5, 5, 100]), "lmcache": lmcache,
        "lmcache_scope": r.choice(["engine", "node", "cluster"]),
        "router": r.choice(["round_robin", "least_loaded", "prefix_affinity"]),
        "enable_prefix_caching": r.random() < 0.8,
    }  # fmt: skip
    seed = r.randint(0, 99)
    # LMCache 0.3.3's behaviours (planner/simulate/lmcache.py), drawn last so the draws above
    # give the configurations they gave before
    for flag in ("save_decode_cache", "save_unfull_chunk", "l2_promote", "sync_store"):
        lmcache[flag] = r.random() < 0.5
    return {"cluster": cluster, "workload": wl, "duration_s": 100_000, "seed": seed}


@pytest.mark.parametrize("seed", range(8))
def test_engine_random_configurations_keep_invariants(seed: int) -> None:
    r = random.Random(seed)
    raw = _random_raw(r)
    sim = Simulation(parse_scenario(raw))
    t = 0.0
    while not sim.done:
        t += r.choice([0.05, 0.5, 3.0])
        sim.advance_to(t, settle=r.random() < 0.5)
        for eng in sim.engines:
            eng.check()
    rids = [c[6] for c in sim.completed]
    assert len(rids) == len(set(rids))
    assert len(rids) + sum(e.rejected for e in sim.engines) == sim.workload.issued
    for eng in sim.engines:
        assert not eng.running and not eng.waiting and not eng.loading, "engine stuck"
        assert eng.pool.pinned_total == 0 and eng.pool.private_total == 0
        eng.pool.check()


def test_engine_loaded_requests_cannot_deadlock_an_idle_engine() -> None:
    # found by the random test: preempted requests reload their KV asynchronously and hold
    # blocks behind a waiting head that needs them while nothing runs
    raw = {
        "cluster": {"nodes": 2, "gpus_per_node": 2, "model": "llama-3.1-8b",
                    "num_gpu_blocks": 700, "enable_prefix_caching": False, "cpu_cache_gb": 5,
                    "engines_offload": ["native", "lmcache", "lmcache", "lmcache"],
                    "lmcache_scope": "engine", "router": "least_loaded",
                    "lmcache": {"async_load": True, "chunk_size": 64,
                                "l2": {"tier": "local-nvme", "size_gb": 1}}},
        "workload": {"kind": "rag", "output_tokens": {"dist": "uniform", "min": 1, "max": 2000},
                     "documents": 7, "doc_tokens": 300, "docs_per_request": 2,
                     "question_tokens": 104, "concurrency": 69, "num_requests": 214},
        "duration_s": 100_000,
        "seed": 38,
    }  # fmt: skip
    sim = Simulation(parse_scenario(raw))
    sim.run()
    assert len(sim.completed) == 214
    assert sum(e.preemptions for e in sim.engines) > 0
