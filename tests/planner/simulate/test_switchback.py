"""Switchback canaries (planner/simulate/switchback.py, Engine.restart, Simulation._switch)
and weighted round robin (`cluster.load_shares`): the schedule, what a switch does to an
engine, every router with one or two canaries and a shared LMCache pool, and the regimes a
live collector records in the store."""

from __future__ import annotations

import copy
import io
import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.errors import ConfigError
from kvscope.demo import DemoOptions, _serve_and_collect, load_demo_scenario
from planner.simulate import cluster
from planner.simulate.cluster import Simulation
from planner.simulate.compare import compare
from planner.simulate.kvcache import BlockPool
from planner.simulate.lmcache import LMCacheConnector
from planner.simulate.metrics_server import file_sd, targets_document
from planner.simulate.offload import Connector, NativeOffload
from planner.simulate.request import Req
from planner.simulate.scenario import load_scenario, parse_scenario
from planner.simulate.scenarios import scenario_file
from planner.simulate.switchback import Schedule, SwitchbackSpec
from store.store import Store

# 4 engines on one node, HBM small enough that the prefixes do not all fit, engine 0 a
# native-offload canary switching every 120 s; open loop, so requests are in flight at every
# switch
BASE: dict[str, Any] = {
    "cluster": {"nodes": 1, "gpus_per_node": 4, "model": "llama-3.1-8b", "num_gpu_blocks": 1500,
                "engines_offload": ["none", "none", "none", "none"], "cpu_cache_gb": 20,
                "switchback": {"engines": [0], "mode": "native", "block_s": 120, "seed": 5}},
    "workload": {"kind": "shared_prefix", "groups": 24, "prompts_per_group": 8,
                 "system_prompt_tokens": 3000, "question_tokens": 300, "output_tokens": 200,
                 "qps": 6, "popularity": "zipf"},
    "duration_s": 720,
    "seed": 3,
}  # fmt: skip


def _raw(**cluster: Any) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    raw["cluster"].update(cluster)
    return raw


# --- the schedule -----------------------------------------------------------------------------


def test_schedule_same_seed_same_periods_every_pair_balanced() -> None:
    spec = SwitchbackSpec(engines=(0,), mode="native", period_s=60.0, seed=7)
    a, b = Schedule(spec), Schedule(spec)
    periods = [a.on(i) for i in range(400)]
    assert periods == [b.on(i) for i in reversed(range(400))][::-1]  # drawn lazily, any order
    assert all(periods[2 * p] != periods[2 * p + 1] for p in range(200))
    assert sum(periods) == 200
    firsts = [periods[2 * p] for p in range(200)]
    assert 60 < sum(firsts) < 140  # the pair orders are drawn, not alternating
    other = Schedule(SwitchbackSpec(engines=(0,), mode="native", period_s=60.0, seed=8))
    assert [other.on(i) for i in range(400)] != periods


@pytest.mark.parametrize("start", ["on", "off"])
def test_schedule_start_fixes_the_first_pair_only(start: str) -> None:
    free = Schedule(SwitchbackSpec(engines=(0,), mode="native", period_s=60.0, seed=3))
    fixed = Schedule(
        SwitchbackSpec(engines=(0,), mode="native", period_s=60.0, seed=3, start=start)
    )
    assert fixed.on(0) is (start == "on") and fixed.on(1) is (start != "on")
    assert [fixed.on(i) for i in range(2, 100)] == [free.on(i) for i in range(2, 100)]


def test_schedule_explicit_list_is_cycled_and_equal_neighbours_are_no_switch() -> None:
    spec = SwitchbackSpec(
        engines=(0,), mode="lmcache", period_s=100.0, schedule=(True, True, False), seed=1
    )
    s = Schedule(spec)
    assert [s.mode(i) for i in range(6)] == ["lmcache", "lmcache", "none"] * 2
    assert s.next_switch(0) == 2 and s.next_switch(2) == 3
    assert s.regimes(700.0) == [(0.0, "lmcache"), (200.0, "none"), (300.0, "lmcache"),
                                (500.0, "none"), (600.0, "lmcache")]  # fmt: skip
    never = Schedule(SwitchbackSpec(engines=(0,), mode="native", period_s=1.0, schedule=(False,)))
    assert never.next_switch(0) is None and never.regimes(1e9) == [(0.0, "none")]


def test_schedule_regimes_are_the_switches_of_the_periods() -> None:
    s = Schedule(SwitchbackSpec(engines=(0,), mode="native", period_s=30.0, seed=11))
    regimes = s.regimes(3000.0)
    want = [(0.0, s.mode(0))] + [
        (b * 30.0, s.mode(b)) for b in range(1, 100) if s.on(b) != s.on(b - 1)
    ]
    assert regimes == want
    assert all(a[1] != b[1] for a, b in itertools.pairwise(regimes))


# --- the scenario section -----------------------------------------------------------------------


def test_parse_switchback_seed_defaults_to_the_scenarios_and_period_0_sets_engines_offload() -> (
    None
):
    raw = _raw()
    del raw["cluster"]["switchback"]["seed"]
    sc = parse_scenario(raw)
    assert sc.cluster.switchback is not None and sc.cluster.switchback.seed == 3
    first = Schedule(sc.cluster.switchback).mode(0)
    assert sc.cluster.engines_offload == (first, "none", "none", "none")
    params = {p.key: (p.value, p.source) for p in sc.params}
    assert params["cluster.switchback.seed"] == (3, "default: the scenario's seed")
    assert params["cluster.switchback.engines"] == ([0], "scenario")


def test_parse_switchback_yaml_on_off_read_as_booleans() -> None:
    raw = yaml.safe_load(
        "cluster: {engines_offload: [none, none], gpus_per_node: 2,"
        " switchback: {engines: [1], start: off, block_s: 60}}\n"
        "workload: {qps: 1, prompt_tokens: 100}\n"
    )
    sc = parse_scenario(raw)
    assert sc.cluster.switchback is not None and sc.cluster.switchback.start == "off"
    assert sc.cluster.engines_offload == ("none", "none")
    raw["cluster"]["switchback"] = {"engines": [1], "schedule": [True, "off", "ON"]}
    sb = parse_scenario(raw).cluster.switchback
    assert sb is not None and sb.schedule == (True, False, True) and sb.period_s == 1800.0


@pytest.mark.parametrize(
    ("switchback", "cluster", "message"),
    [
        ({"engines": [4]}, {}, r"switchback\.engines\[0\]: must be an engine index 0\.\.3"),
        ({"engines": [1, 1]}, {}, r"engines\[1\]: engine 1 is listed twice"),
        ({"engines": []}, {}, r"switchback\.engines: must be a non-empty list"),
        ({"engines": [0]}, {"engines_offload": ["native", "none", "none", "none"]},
         r"engine 0 runs native offload .* must be none"),
        ({"engines": [0], "mode": "lmcache"}, {}, r"switchback\.mode: lmcache needs .*"
         r"lmcache_scope"),
        ({"engines": [0], "mode": "none"}, {}, r"switchback\.mode: must be one of native"),
        ({"engines": [0], "schedule": ["on"], "start": "on"}, {}, r"start: applies only without"),
        ({"engines": [0], "schedule": ["maybe"]}, {}, r"schedule\[0\]: must be on or off"),
        ({"engines": [0], "block_s": 0}, {}, r"switchback\.block_s: must be > 0"),
        ({"engines": [0], "every": 3}, {}, r"switchback\.every: unknown key"),
    ],
)  # fmt: skip
def test_parse_switchback_refuses_what_cannot_run(
    switchback: dict[str, Any], cluster: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_scenario(_raw(switchback=switchback, **cluster))


def test_parse_switchback_lmcache_with_a_pool_scope_given() -> None:
    sc = parse_scenario(
        _raw(switchback={"engines": [0], "mode": "lmcache", "start": "on"}, lmcache_scope="node")
    )
    assert sc.cluster.engines_offload == ("lmcache", "none", "none", "none")


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ({"load_shares": [1, 1]}, r"load_shares: must be a list of 4 weights"),
        ({"load_shares": [1, -1, 1, 1]}, r"load_shares\[1\]: must be a finite number >= 0"),
        ({"load_shares": [0, 0, 0, 0]}, r"load_shares: the weights are all 0"),
        ({"load_shares": [1, 1, 1, 1], "router": "least_loaded"},
         r"load_shares: applies only with router: round_robin"),
    ],
)  # fmt: skip
def test_parse_load_shares_refuses_bad_weights(cluster: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_scenario(_raw(**cluster))


def test_scenarios_without_the_new_keys_record_no_new_parameter() -> None:
    raw = _raw()
    del raw["cluster"]["switchback"]
    keys = {p.key for p in parse_scenario(raw).params}
    assert not any(k.startswith(("cluster.switchback", "cluster.load_shares")) for k in keys)


# --- a restart ----------------------------------------------------------------------------------


def test_req_retry_is_a_fresh_request_arriving_then() -> None:
    fresh = Req(7, 12.5, [1, 2], 100, 20, affinity=3, client=2, turn=1)
    used = Req(7, 1.0, [1, 2], 100, 20, affinity=3, client=2, turn=1)
    for name in Req.__slots__:  # every scheduler field moved off its initial value
        value = getattr(used, name)
        if name not in ("rid", "path", "prompt_len", "output_len", "affinity", "client", "turn"):
            setattr(used, name, (not value) if isinstance(value, bool) else value + 5)
    used.retry(12.5)
    assert {n: getattr(used, n) for n in Req.__slots__} == {
        n: getattr(fresh, n) for n in Req.__slots__
    }


def _sim(raw: dict[str, Any]) -> Simulation:
    return Simulation(parse_scenario(raw))


def test_restart_empties_hbm_and_the_cpu_pool_and_aborts_what_it_held() -> None:
    sim = _sim(_raw(switchback={"engines": [0], "mode": "native", "block_s": 1e6, "start": "on"}))
    sim.advance_to(300.0, settle=True)
    eng = sim.engines[0]
    assert isinstance(eng.conn, NativeOffload) and eng.conn.pool.used > 0
    assert eng.pool.cached_total > 0 and eng.load_estimate() > 0
    held = {r.rid for r in (*eng.waiting, *eng.loading, *eng.running.values())}
    counters = dict(eng.tel.counters)
    out = eng.restart(sim.now, Connector())
    assert {r.rid for r in out} == held
    assert [(r.arrival, r.rid) for r in out] == sorted((r.arrival, r.rid) for r in out)
    assert isinstance(eng.pool, BlockPool) and eng.pool.cached_total == 0
    assert eng.pool.used == 0 and eng.load_estimate() == 0 and eng.dec.r == 0
    assert eng.conn.mode == "none" and not eng.has_conn and eng.factor == 1.0
    assert all(eng.tel.counters[k] >= v for k, v in counters.items())  # telemetry goes on
    eng.check()


def test_switch_leaves_only_what_the_retries_brought(tmp_path: Path) -> None:
    sim = _sim(_raw())
    assert sim.schedule is not None
    t_switch = sim.schedule.next_switch(0)
    assert t_switch is not None
    t = t_switch * 120.0
    sim.advance_to(t - 1e-6, settle=True)
    eng = sim.engines[0]
    pool_before, conn_before = eng.pool, eng.conn
    assert pool_before.cached_total > 0
    sim.advance_to(t)
    assert eng.pool is not pool_before and eng.conn is not conn_before
    assert eng.conn.mode == sim.schedule.mode(t_switch)
    # at the switch instant the HBM holds only blocks of the requests it was sent since
    paths = {n for r in (*eng.waiting, *eng.loading, *eng.running.values()) for n in r.path}
    assert set(eng.pool.cached) <= paths
    if isinstance(eng.conn, NativeOffload):
        assert eng.conn.pool.used == 0  # a new CPU pool: nothing stored yet
    last = sim.switches[-1]
    assert (last.t, last.engine, last.offload) == (t, 0, eng.conn.mode) and last.aborted > 0


def test_scorer_reads_a_restarted_canarys_new_caches() -> None:
    raw = _raw(router="scorer", switchback={"engines": [0], "mode": "native", "block_s": 60,
                                            "schedule": ["on", "off"]})  # fmt: skip
    raw["cluster"]["scorer"] = {"prefix_index": "cached", "cpu_prefix": 2}
    sim = _sim(raw)
    eng = sim.engines[0]
    for t, mode in ((30.0, "native"), (90.0, "none"), (150.0, "native")):
        sim.advance_to(t, settle=True)
        pool, gpu, cpu, _ = sim.router._stores[0]
        assert eng.conn.mode == mode and pool is eng.pool and gpu is eng.pool.cached
        if isinstance(eng.conn, NativeOffload):
            assert cpu is eng.conn.pool.cached
        else:
            assert cpu is None


def test_canary_cpu_tier_counters_grow_only_in_on_periods() -> None:
    sim = _sim(_raw())
    assert sim.schedule is not None
    eng = sim.engines[0]
    grew = {True: 0, False: 0}
    prev = 0.0
    step = 10.0
    t = 0.0
    while t < 720.0:
        t += step
        sim.advance_to(t, settle=True)
        stored = eng.tel.offload_bytes["store"] + eng.tel.offload_bytes["load"]
        on = sim.schedule.on(int((t - step) // 120.0))
        if stored > prev:
            grew[on] += 1
        prev = stored
        assert (eng.conn.mode == "native") is sim.schedule.on(int(t // 120.0))
    assert grew[False] == 0 and grew[True] >= 10
    for other in sim.engines[1:]:
        assert other.tel.offload_bytes == {"load": 0.0, "store": 0.0}


def test_every_request_completes_across_switches() -> None:
    # a closed loop over a finite dataset: each prompt once, so the run ends by itself
    raw = _raw(switchback={"engines": [0, 1], "mode": "native", "block_s": 5, "seed": 2})
    raw["workload"] = {"kind": "shared_prefix", "groups": 10, "prompts_per_group": 12,
                       "system_prompt_tokens": 2000, "question_tokens": 200,
                       "output_tokens": 400, "concurrency": 16}  # fmt: skip
    raw["duration_s"] = 3600
    sim = _sim(raw)
    result = sim.run().to_dict()
    assert sorted(c[6] for c in sim.completed) == list(range(120))
    aborted = sum(s.aborted for s in sim.switches)
    assert aborted > 0
    # the switch after the last completion is no event: the run ends with its work
    assert result["finished_early"] and sim.last_event == max(c[2] for c in sim.completed)
    for eng in sim.engines:
        eng.check()
    sb = result["switchback"]
    assert sb["engines"] == [0, 1] and sum(c["aborted_requests"] for c in sb["changes"]) == aborted
    assert math.isclose(sb["on_s"] + sb["off_s"], result["simulated_s"])


# --- routers with canaries and a shared pool ----------------------------------------------------

ROUTERS: list[tuple[str, dict[str, Any]]] = [
    ("round_robin", {}),
    ("least_loaded", {}),
    ("prefix_affinity", {}),
    ("scorer", {}),
    ("scorer", {"prefix_index": "cached", "cpu_prefix": 2}),
    ("scorer", {"cpu_prefix": 2}),
]


@pytest.mark.parametrize(("router", "scorer"), ROUTERS)
@pytest.mark.parametrize("canaries", [[0], [0, 1]])
@pytest.mark.parametrize("mode", ["native", "lmcache"])
def test_routers_run_with_canaries_and_a_shared_lmcache_pool(
    router: str, scorer: dict[str, Any], canaries: list[int], mode: str
) -> None:
    # engines 2 and 3 share the node's LMCache server for the whole run; an lmcache canary
    # joins that pool when on
    sb = {"engines": canaries, "mode": mode, "block_s": 60, "seed": 4}
    raw = _raw(router=router, engines_offload=["none", "none", "lmcache", "lmcache"],
               lmcache_scope="node", switchback=sb)  # fmt: skip
    if scorer:
        raw["cluster"]["scorer"] = scorer
    raw["duration_s"] = 300
    sim = _sim(raw)
    assert sim.schedule is not None
    members = tuple(sorted({2, 3} | (set(canaries) if mode == "lmcache" else set())))
    assert [p.engines for p in sim.pools] == [members]
    result = sim.run().to_dict()
    assert result["completed_requests"] > 500
    for eng in sim.engines:
        eng.check()
    changes = result["switchback"]["changes"]
    assert {c["engine"] for c in changes} == set(canaries)
    assert len(changes) >= 3 * len(canaries)
    for eng in sim.engines:  # the run ends at t = 300, the start of period 5
        want = (
            sim.schedule.mode(5)
            if eng.idx in canaries
            else ("none", "none", "lmcache", "lmcache")[eng.idx]
        )
        assert eng.conn.mode == want


def test_lmcache_canary_restart_keeps_the_shared_pool() -> None:
    raw = _raw(engines_offload=["none", "none", "lmcache", "lmcache"], lmcache_scope="node",
               switchback={"engines": [0], "mode": "lmcache", "block_s": 60,
                           "schedule": ["on", "off"]})  # fmt: skip
    sim = _sim(raw)
    pool = sim.pools[0]
    sim.advance_to(59.9, settle=True)
    used = pool.l1.used
    assert used > 0
    sim.advance_to(60.0)  # the canary restarts without LMCache: the server keeps its chunks
    assert sim.engines[0].conn.mode == "none" and pool.l1.used >= used
    canary = sim.engines[0].tel.counters
    sim.advance_to(119.9, settle=True)
    queried = canary["external_prefix_cache_queries_total"]
    sim.advance_to(179.9, settle=True)  # on again: the canary looks up in the same pool
    conn = sim.engines[0].conn
    assert isinstance(conn, LMCacheConnector) and conn.pool is pool
    assert canary["external_prefix_cache_queries_total"] > queried


# --- weighted round robin -----------------------------------------------------------------------


def test_load_shares_split_requests_in_proportion() -> None:
    raw = _raw(load_shares=[1, 2, 3, 4])
    del raw["cluster"]["switchback"]
    raw["workload"]["qps"] = 4
    raw["duration_s"] = 600
    sim = _sim(raw)
    sim.run()
    counts = [sum(1 for c in sim.completed if c[5] == i) for i in range(4)]
    n = sum(counts)
    assert n > 2000
    for i, share in enumerate((0.1, 0.2, 0.3, 0.4)):
        slack = 3.0 * math.sqrt(n * share * (1 - share))  # binomial, 3 sigma
        assert abs(counts[i] - n * share) <= slack, (i, counts)


def test_load_shares_equal_weights_are_round_robin() -> None:
    plain = _raw()
    del plain["cluster"]["switchback"]
    weighted = copy.deepcopy(plain)
    weighted["cluster"]["load_shares"] = [2, 2, 2, 2]
    a, b = _sim(plain), _sim(weighted)
    a.run()
    b.run()
    assert a.completed == b.completed


# --- the canary scenario and its live regimes ---------------------------------------------------


def test_bundled_canary_switchback_is_one_native_canary_in_30_minute_periods() -> None:
    with scenario_file("canary_switchback") as path:
        sc = load_scenario(path)
    sb = sc.cluster.switchback
    assert sb is not None and sb.engines == (0,) and sb.mode == "native"
    assert sb.period_s == 1800.0 and sc.duration_s == 6 * 3600.0
    assert sc.cluster.num_engines == 4 and sc.cluster.nodes == 1
    assert sc.cluster.engines_offload[1:] == ("none", "none", "none")
    regimes = Schedule(sb).regimes(sc.duration_s)
    on = sum(
        (regimes[k + 1][0] if k + 1 < len(regimes) else sc.duration_s) - t
        for k, (t, mode) in enumerate(regimes)
        if mode == "native"
    )
    assert on == sc.duration_s / 2  # 6 complete pairs


def _tiny_canary(directory: Path) -> Path:
    raw = _raw(switchback={"engines": [1], "mode": "native", "block_s": 90, "seed": 9})
    raw["cluster"].update(gpus_per_node=2, engines_offload=["none", "none"])
    raw["workload"]["qps"] = 2
    raw["name"] = "canary-test"
    path = directory / "canary.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def test_live_demo_collection_records_the_schedule_in_engine_changes(tmp_path: Path) -> None:
    scenario = load_demo_scenario(_tiny_canary(tmp_path), sim_hours=0.25, seed=3)
    sb = scenario.cluster.switchback
    assert sb is not None and sb.seed == 9
    opts = DemoOptions(db=f"sqlite:///{tmp_path / 'demo.db'}", out=tmp_path, speed=3000.0,
                       scenario=tmp_path / "canary.yaml")  # fmt: skip
    with Store(opts.db) as store:
        store.migrate()
        got = _serve_and_collect(scenario, store, opts, io.StringIO())
        changes = store.engine_changes()
        engines = {e.source: e for e in store.engines()}
    regimes = Schedule(sb).regimes(scenario.duration_s)
    assert len(regimes) >= 4
    recorded = [(c.at - got.epoch0, c.offload) for c in changes["sim-engine-1"]]
    assert recorded == regimes
    assert [(c.at - got.epoch0, c.offload) for c in changes["sim-engine-0"]] == [(0.0, "none")]
    assert "configured" not in engines["sim-engine-1"].facts["provenance"]["offload"]
    assert got.endpoints["engines"][1]["switching"] is True
    assert got.endpoints["switchback"] == {"engines": [1], "mode": "native", "block_s": 90.0,
                                           "seed": 9}  # fmt: skip


def test_served_targets_and_file_sd_leave_a_canarys_offload_to_the_engine() -> None:
    sc = parse_scenario(_raw())
    doc = {
        "engines": [
            {"engine": 0, "node": 0, "offload": "native", "url": "http://h:1/metrics",
             "switching": True},
            {"engine": 1, "node": 0, "offload": "none", "url": "http://h:2/metrics"},
        ],
        "lmcache": [],
    }  # fmt: skip
    targets = targets_document(doc, sc)["targets"]
    assert "offload" not in targets[0]["engine"] and targets[1]["engine"]["offload"] == "none"
    sd = file_sd(doc)
    assert "offload" not in sd[0]["labels"] and sd[1]["labels"]["offload"] == "none"


def test_compare_runs_each_mode_throughout_without_the_switchback() -> None:
    raw = _raw()
    raw["duration_s"] = 120
    doc = compare(raw, ("none", "native"), progress=lambda _msg: None)
    rows = doc["points"][0]["modes"]
    assert set(rows) == {"none", "native"} and rows["native"]["throughput_gain"] is not None


def test_looping_served_run_switches_on_across_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "PRUNE_MIN_NODES", 256)  # prune often: retries hold paths
    raw = _raw(switchback={"engines": [0, 3], "mode": "native", "block_s": 50, "seed": 6})
    raw["duration_s"] = 120
    sim = Simulation(parse_scenario(raw), loop=True, retain_requests=False)
    assert sim.schedule is not None
    t = 0.0
    while t < 600.0:
        t += 7.5
        sim.advance_to(t, settle=True)
    assert sim.loop_index >= 4 and sim.prunes > 0
    for i in (0, 3):
        mine = [(s.t, s.offload) for s in sim.switches if s.engine == i]
        assert mine == sim.schedule.regimes(600.0 + 1e-9)
    for eng in sim.engines:
        eng.check()
