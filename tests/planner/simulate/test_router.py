"""The scorer router (llm-d's default scheduling profile): prefix match + KV free + queue,
against the other routers on the same seeded shared-prefix workloads, and its weights'
validation."""

from __future__ import annotations

import collections
from typing import Any

import pytest

from core.errors import ConfigError
from planner.simulate.cluster import Simulation
from planner.simulate.engine import Engine
from planner.simulate.request import Req
from planner.simulate.router_spec import ScorerSpec
from planner.simulate.scenario import parse_scenario


def _raw(router: str, *, groups: int, qps: float, question: int, **cluster: Any) -> dict[str, Any]:
    return {
        "cluster": {"nodes": 1, "gpus_per_node": 4, "model": "llama-3.1-8b", "router": router}
        | cluster,
        "workload": {
            "kind": "shared_prefix",
            "groups": groups,
            "system_prompt_tokens": 4000,
            "question_tokens": question,
            "output_tokens": 64,
            "qps": qps,
            "prompts_per_group": 1000,
            "repeat": True,
        },
        "duration_s": 60.0,
        "seed": 3,
    }


def _routed(raw: dict[str, Any]) -> list[tuple[int, int]]:
    """(prefix group's content node, engine) of every routed request."""
    sim = Simulation(parse_scenario(raw))
    picks: list[tuple[int, int]] = []
    pick = sim.router.pick

    def record(req: Req) -> Engine:
        eng = pick(req)
        picks.append((req.path[0], eng.idx))
        return eng

    sim.router.pick = record  # type: ignore[method-assign]
    sim.run()
    return picks


def _top_share(picks: list[tuple[int, int]]) -> float:
    """Share of requests on their group's most used engine (1.0: every group on one)."""
    by: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for group, eng in picks:
        by[group][eng] += 1
    return sum(c.most_common(1)[0][1] for c in by.values()) / len(picks)


def test_scorer_keeps_each_prefix_on_its_engine_at_even_load() -> None:
    # 8 prefixes on 4 engines, light load: queues stay empty, so prefix match decides
    scorer = _routed(_raw("scorer", groups=8, qps=4.0, question=200))
    rr = _routed(_raw("round_robin", groups=8, qps=4.0, question=200))
    assert _top_share(scorer) > 0.99
    assert _top_share(rr) < 0.5
    assert len({e for _, e in scorer}) == 4  # the groups themselves are spread
    assert scorer == _routed(_raw("scorer", groups=8, qps=4.0, question=200))  # seeded


def test_scorer_spreads_one_prefix_once_its_engine_queues() -> None:
    light = _routed(_raw("scorer", groups=1, qps=2.0, question=2000))
    heavy = _routed(_raw("scorer", groups=1, qps=40.0, question=2000))
    assert len({e for _, e in light}) == 1  # one prefix, nothing queued: one engine
    counts = collections.Counter(e for _, e in heavy)
    assert len(counts) == 4 and min(counts.values()) > 0.15 * len(heavy)


def test_scorer_without_prefix_weight_balances_load() -> None:
    picks = _routed(_raw("scorer", groups=8, qps=4.0, question=200, scorer={"prefix": 0}))
    counts = collections.Counter(e for _, e in picks)
    assert _top_share(picks) < 0.5
    assert max(counts.values()) - min(counts.values()) <= 0.05 * len(picks)


@pytest.mark.parametrize(
    ("scorer", "router", "match"),
    [
        ({"prefix": -1}, "scorer", r"cluster\.scorer\.prefix: must be >= 0, got -1"),
        ({"kv": "x"}, "scorer", r"cluster\.scorer\.kv: must be a number"),
        ({"latency": 1}, "scorer", r"cluster\.scorer\.latency: unknown key"),
        (
            {"prefix": 0, "kv": 0, "queue": 0, "no_hit_lru": 0},
            "scorer",
            r"cluster\.scorer: the weights prefix, kv, queue, no_hit_lru, cpu_prefix are all 0",
        ),
        ({"prefix_index": "kv_events"}, "scorer", r"cluster\.scorer\.prefix_index: must be one"),
        ({"max_prefix_blocks": 0}, "scorer", r"cluster\.scorer\.max_prefix_blocks: must be >= 1"),
        ({"cpu_index_blocks": 2.5}, "scorer", r"cluster\.scorer\.cpu_index_blocks: must be an int"),
        ({"prefix": 1}, "round_robin", r"cluster\.scorer: applies only with router: scorer"),
    ],
)
def test_scorer_bad_weights_name_the_key(scorer: dict[str, Any], router: str, match: str) -> None:
    raw = _raw(router, groups=1, qps=1.0, question=10, scorer=scorer)
    with pytest.raises(ConfigError, match=match):
        parse_scenario(raw)


def test_scorer_weights_default_to_llm_d_and_are_listed() -> None:
    sc = parse_scenario(_raw("scorer", groups=1, qps=1.0, question=10, scorer={"kv": 1}))
    assert sc.cluster.scorer == ScorerSpec(kv=1.0)  # llm-d's optimized baseline but kv
    assert sc.cluster.scorer.weights == {
        "prefix": 3.0, "kv": 1.0, "queue": 2.0, "no_hit_lru": 2.0, "cpu_prefix": 0.0
    }  # fmt: skip
    assert sc.cluster.scorer.prefix_index == "routed"
    params = {p.key: (p.value, p.source) for p in sc.params}
    assert params["cluster.scorer.kv"] == (1.0, "scenario")
    assert "llm-d-inference-scheduler-config" in params["cluster.scorer.prefix"][1]
    plain = parse_scenario(_raw("round_robin", groups=1, qps=1.0, question=10))
    assert not any(p.key.startswith("cluster.scorer") for p in plain.params)


def _long(raw: dict[str, Any]) -> dict[str, Any]:
    """16,000-token prefixes (1,000 blocks, of which a routed index records the first 256),
    for 300 s."""
    raw["workload"]["system_prompt_tokens"] = 16_000
    raw["duration_s"] = 300.0
    return raw


def test_scorer_routed_index_keeps_a_prefix_its_engine_evicted() -> None:
    # 12 prefixes on 4 engines whose HBM (1,500 blocks) holds one: the engines evict them
    # between visits. The routed index (llm-d's default) remembers where it sent each prefix:
    # as large as the engine's blocks but fed only each prompt's first 256 blocks, it holds
    # ~5 prefixes an engine. The cached index sees the evictions, and queue, KV and no-hit
    # LRU scatter the group.
    tight = {"num_gpu_blocks": 1500}
    routed = _routed(_long(_raw("scorer", groups=12, qps=1.0, question=100, **tight)))
    cached = _routed(
        _long(
            _raw("scorer", groups=12, qps=1.0, question=100, scorer={"prefix_index": "cached"},
                 **tight)
        )
    )  # fmt: skip
    assert _top_share(routed) > 0.9
    assert _top_share(cached) < _top_share(routed) - 0.3


def test_scorer_no_hit_lru_deals_cold_requests_in_turn() -> None:
    # unique prompts: no index ever matches, so only the no-hit LRU scores: engines never sent
    # a cold request first, then the least recently sent: a strict rotation
    raw = _raw("scorer", groups=1, qps=2.0, question=10, scorer={"prefix": 0, "kv": 0, "queue": 0})
    raw["workload"] = {"kind": "synthetic", "prompt_tokens": 500, "output_tokens": 20, "qps": 2.0}
    picks = [e for _, e in _routed(raw)]
    assert len(picks) > 40
    assert picks[:8] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert all(picks[i] == picks[i % 4] for i in range(len(picks)))


def test_scorer_cpu_index_keeps_prefixes_the_gpu_index_forgot() -> None:
    # 16 prefixes, 4 an engine; the GPU index (1,100 blocks) holds ~4 prompts' first 256
    # blocks, the CPU index (the native pool's 50 GB, ~24,000 blocks) ~90: llm-d's tiered
    # guide adds the CPU prefix scorer so that a prefix offloaded to the CPU keeps drawing
    # its requests
    tight = {"num_gpu_blocks": 1100, "offload": "native", "cpu_cache_gb": 50}
    weights = {"prefix": 1, "kv": 1, "queue": 1, "no_hit_lru": 1}
    gpu_only = _routed(_long(_raw("scorer", groups=16, qps=1.0, question=100, scorer=weights,
                                  **tight)))  # fmt: skip
    both = _routed(
        _long(_raw("scorer", groups=16, qps=1.0, question=100,
                   scorer=weights | {"cpu_prefix": 1}, **tight))
    )  # fmt: skip
    assert _top_share(both) > 0.99
    assert _top_share(gpu_only) < 0.95
