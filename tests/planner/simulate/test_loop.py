"""Looping served simulations: the load repeats every duration_s, counters only grow, each
loop draws fresh arrivals of the same shape, and the retained state stays bounded."""

from __future__ import annotations

import gc
import io
import itertools
import json
import re
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from collector.parse import read_exposition
from core.errors import ConfigError
from planner.simulate import cluster
from planner.simulate.cluster import Simulation
from planner.simulate.content import ContentTree
from planner.simulate.lmcache import LMCacheConnector
from planner.simulate.metrics_server import serve_scenario
from planner.simulate.scenario import Scenario, parse_scenario
from planner.simulate.spec import Section
from planner.simulate.telemetry import EngineSnapshot
from planner.simulate.workload import Req, Workload
from planner.simulate.workload_spec import WorkloadSpec, parse_workload
from tests.clirun import assert_one_line_error, run_kvscope

PERIOD = 60.0
# Two engines (no offload, LMCache) on a diurnal shared-prefix load whose period is the loop.
RAW: dict[str, Any] = {
    "name": "loop-test",
    "cluster": {"nodes": 1, "gpus_per_node": 2, "model": "llama-3.1-8b", "num_gpu_blocks": 900,
                "engines_offload": ["none", "lmcache"], "cpu_cache_gb": 5},
    "workload": {"kind": "shared_prefix", "groups": 6, "prompts_per_group": 4,
                 "system_prompt_tokens": 1500, "question_tokens": 200, "popularity": "zipf",
                 "output_tokens": {"dist": "lognormal", "mean": 60, "sigma": 0.5},
                 "qps": 4, "arrival": "diurnal", "diurnal_period_s": PERIOD,
                 "diurnal_amplitude": 0.9},
    "duration_s": PERIOD,
    "seed": 3,
}  # fmt: skip


def _scenario(**workload: Any) -> Scenario:
    return parse_scenario({**RAW, "workload": {**RAW["workload"], **workload}})


def _spec(**workload: Any) -> WorkloadSpec:
    return parse_workload(Section(workload, "workload", "test", []), None)


def _flat(snap: EngineSnapshot) -> dict[str, float]:
    """Every monotone figure of an engine snapshot, by name."""
    out = {f"c:{k}": v for k, v in snap.counters.items()}
    out.update({f"f:{k}": float(v) for k, v in snap.finished.items()})
    out.update({f"ob:{k}": v for k, v in snap.offload_bytes.items()})
    for name, h in snap.histograms.items():
        out[f"h:{name}:count"] = float(h.count)
        out[f"h:{name}:sum"] = h.sum
        out.update({f"h:{name}:le{i}": float(c) for i, c in enumerate(h.cumulative)})
    return out


# ------------------------------------------------------------------ counters across boundaries


def test_loop_counters_monotonic_across_three_boundaries_grow_every_loop() -> None:
    sim = Simulation(_scenario(), loop=True, retain_requests=False)
    last: list[dict[str, float]] = [_flat(s) for s in sim.engine_snapshots()]
    prompt_at_boundary = [0.0]
    t = 0.0
    while t < 3.5 * PERIOD:
        t += 2.5
        sim.advance_to(t, settle=True)
        now = [_flat(s) for s in sim.engine_snapshots()]
        for before, after in zip(last, now, strict=True):
            shrunk = [k for k in before if after[k] < before[k]]
            assert not shrunk, (t, shrunk)
        last = now
        if t % PERIOD == 0:
            prompt_at_boundary.append(sum(x["c:prompt_tokens_total"] for x in now))
    assert sim.loop_index == 3 and sim.now == 3.5 * PERIOD
    assert sim.end_time == float("inf")
    # every loop brought new traffic (no loop is a frozen copy of the last values)
    assert all(b > a for a, b in itertools.pairwise(prompt_at_boundary))


def test_loop_first_loop_equals_the_run_without_looping() -> None:
    # a closed loop capped by num_requests: it stops within the loop, the next restarts it
    sc = _scenario(qps=None, arrival="poisson", concurrency=6, num_requests=40,
                   diurnal_period_s=86400)  # fmt: skip
    plain = Simulation(sc)
    looped = Simulation(sc, loop=True, retain_requests=False)
    for step in range(1, 20):  # up to 57 s: the second loop begins at 60 s
        t = 3.0 * step
        plain.advance_to(t, settle=True)
        looped.advance_to(t, settle=True)
        a, b = plain.engine_snapshots(), looped.engine_snapshots()
        assert [s.counters for s in a] == [s.counters for s in b], t
        assert [s.histograms for s in a] == [s.histograms for s in b], t
    assert plain.workload.exhausted  # the cap was reached in the first loop …
    looped.advance_to(2 * PERIOD - 1, settle=True)
    finished = sum(s.finished["stop"] for s in looped.engine_snapshots())
    assert finished == 80  # … and the second loop sent its 40 again


# ------------------------------------------------------------------ arrivals per loop


def _loop_arrivals(wl: Workload, loops: int) -> list[list[Req]]:
    """The open-loop arrivals of each loop (the simulation's hooks, without engines)."""
    out: list[list[Req]] = []
    first = wl.initial()
    for _ in range(loops):
        reqs: list[Req] = []
        nxt: Req | None = first[0] if first else None
        while nxt is not None:
            reqs.append(nxt)
            nxt = wl.after_arrival(nxt)
        out.append(reqs)
        first = wl.next_loop()
    return out


def _bins(reqs: list[Req], offset: float, width: float, n: int) -> list[int]:
    counts = [0] * n
    for r in reqs:
        counts[int((r.arrival - offset) // width)] += 1
    return counts


def test_loop_arrivals_same_diurnal_shape_in_loop_local_time_but_fresh() -> None:
    # loop period 1500 s, diurnal period 1000 s: loop-local time, not absolute time, drives
    # the rate (absolute 1700-1800 s would be a trough, loop-local 200-300 s is a peak)
    period = 1500.0
    spec = _spec(prompt_tokens=10, qps=6.0, arrival="diurnal", diurnal_period_s=1000,
                 diurnal_amplitude=0.9)  # fmt: skip
    loops = _loop_arrivals(Workload(spec, 1, ContentTree(), period=period), 3)
    bins = [_bins(reqs, k * period, 100.0, 15) for k, reqs in enumerate(loops)]
    for k, reqs in enumerate(loops):
        assert all(k * period <= r.arrival < (k + 1) * period for r in reqs)
        b = bins[k]
        assert b[2] > 5 * b[7] and b[12] > 5 * b[7]  # peaks at 250 and 1250 s, trough at 750 s
    assert statistics.correlation(bins[1], bins[2]) > 0.9
    local = [[r.arrival - k * period for r in reqs] for k, reqs in enumerate(loops)]
    assert local[1] != local[2] and local[0] != local[1]  # fresh draws every loop
    rids = [r.rid for reqs in loops for r in reqs]
    assert len(set(rids)) == len(rids)  # request ids never repeat
    again = _loop_arrivals(Workload(spec, 1, ContentTree(), period=period), 3)
    assert [[r.arrival for r in x] for x in again] == [[r.arrival for r in x] for x in loops]


def test_loop_shared_prefixes_and_questions_persist_across_loops() -> None:
    spec = _spec(kind="shared_prefix", groups=4, prompts_per_group=3, system_prompt_tokens=100,
                 question_tokens=20, qps=5.0)  # fmt: skip
    loops = _loop_arrivals(Workload(spec, 1, ContentTree(), period=30.0), 3)
    prompts = [{tuple(r.path[:2]) for r in reqs} for reqs in loops]
    assert len(prompts[0] | prompts[1] | prompts[2]) <= 12  # the same 4 x 3 prompts in each loop
    assert prompts[1] & prompts[0] and prompts[2] & prompts[0]
    assert all(len(r.path) == 3 for reqs in loops for r in reqs)  # + each request's own output


def test_loop_multi_turn_session_goes_on_across_the_boundary() -> None:
    spec = _spec(kind="multi_turn", turns=3, question_tokens=50, output_tokens=20,
                 concurrency=1, think_time_s=0.0)  # fmt: skip
    wl = Workload(spec, 1, ContentTree(), period=10.0)
    first = wl.initial()[0]
    assert wl.next_loop() == []  # the client is busy: nothing new at the boundary
    second = wl.after_completion(first, 10.5)
    assert second is not None and second.turn == 1 and second.affinity == first.affinity
    assert second.path[: len(first.path)] == first.path


def test_loop_trace_replays_shifted_by_the_loop_start_past_period_dropped(
    tmp_path: Path,
) -> None:
    rows = [(0.0, "a"), (0.5, None), (2.0, "a"), (12.0, None)]  # the last is past the period
    lines = [
        {"arrival_s": t, "prompt_tokens": 300, "output_tokens": 5}
        | ({"prefix_group": g, "prefix_tokens": 200} if g else {})
        for t, g in rows
    ]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(x) for x in lines), encoding="utf-8")
    sc = parse_scenario({"cluster": {"gpus_per_node": 1}, "duration_s": 10,
                         "workload": {"kind": "trace", "path": "t.jsonl"}},
                        base_dir=tmp_path)  # fmt: skip
    tree = ContentTree()
    loops = _loop_arrivals(Workload(sc.workload, 1, tree, period=10.0), 3)
    assert [[r.arrival for r in reqs] for reqs in loops] == [
        [0.0, 0.5, 2.0],
        [10.0, 10.5, 12.0],
        [20.0, 20.5, 22.0],
    ]
    assert loops[2][2].path[0] == loops[0][0].path[0]  # prefix group a: one node throughout
    assert len({r.rid for reqs in loops for r in reqs}) == 9


# ------------------------------------------------------------------ bounded retained state


def _live_requests() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, Req))


def _sizes(sim: Simulation, *, count_requests: bool) -> dict[str, int]:
    lmc = [e.conn for e in sim.engines if isinstance(e.conn, LMCacheConnector)]
    out = {
        "tree": len(sim.tree),
        "interned": sim.tree.interned,
        "heap": len(sim.heap),
        "queued": sum(len(e.waiting) + len(e.loading) + len(e.running) for e in sim.engines),
        "decode_heap": sum(len(e.dec.heap) for e in sim.engines),
        "buffers": sum(len(e.tel.requests) + len(e.tel.firsts) for e in sim.engines),
        "l1_chunks": sum(len(c._l1_chunks) for c in lmc),
    }
    if count_requests:  # every Req object alive in the process (finished ones must be freed)
        out["requests"] = _live_requests()
    return out


@pytest.fixture()
def small_prune(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(cluster, "PRUNE_MIN_NODES", 256)
    yield


@pytest.mark.usefixtures("small_prune")
@pytest.mark.parametrize(
    "workload",
    [
        {},
        {"kind": "rag", "documents": 40, "doc_tokens": 300, "docs_per_request": 3,
         "question_tokens": 100, "zipf_s": 1.1},
        {"kind": "multi_turn", "turns": 4, "question_tokens": 150, "system_prompt_tokens": 500,
         "qps": None, "arrival": "poisson", "concurrency": 12, "think_time_s": 1.0},
    ],
    ids=["shared_prefix", "rag", "multi_turn"],
)  # fmt: skip
def test_loop_retained_state_bounded_does_not_grow_with_loops(workload: dict[str, Any]) -> None:
    sim = Simulation(_scenario(**workload), loop=True, retain_requests=False)
    early: dict[str, int] = {}
    late: dict[str, int] = {}
    created_at_5 = 0
    t = 0.0
    while t < 8 * PERIOD:
        t += 5.0
        sim.advance_to(t, settle=True)
        sim.engine_snapshots()  # a scrape (empties the telemetry buffers)
        sizes = _sizes(sim, count_requests=t % 30 == 0)
        into = early if t <= 2 * PERIOD else late if t > 5 * PERIOD else {}
        for k, v in sizes.items():
            into[k] = max(into.get(k, 0), v)
        if t == 5 * PERIOD:
            created_at_5 = sim.tree.created
    assert sim.completed == [] and sim.prunes > 3
    # nodes kept coming (more in the last three loops than the tree ever held then) …
    assert sim.tree.created - created_at_5 > late["tree"]
    for key, peak in late.items():  # … but what is held stays at its early size
        assert peak <= 1.5 * early[key] + 20, (key, early[key], peak)


def test_served_telemetry_buffers_bounded_without_scrapes_nothing_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cluster, "SERVED_BUFFER", 64)
    sim = Simulation(_scenario(qps=8), loop=True, retain_requests=False)
    held = 0
    for step in range(1, 25):  # 120 simulated seconds, ~1,000 requests, no snapshot
        sim.advance_to(5.0 * step)
        for e in sim.engines:
            tel = e.tel
            held = max(held, len(tel.requests), len(tel.firsts),
                       *(len(h.pending) for h in tel.hist.values()))  # fmt: skip
    assert 48 <= held < 64  # buffers fill up, and are bucketed when 64 wait
    snaps = sim.engine_snapshots()
    finished = sum(s.finished["stop"] for s in snaps)
    assert finished > 600
    assert sum(s.histograms["e2e_latency_seconds"].count for s in snaps) == finished


def test_simulation_batch_run_keeps_every_request_never_prunes() -> None:
    sim = Simulation(_scenario())
    result = sim.run()
    assert result["completed_requests"] > 0 and len(sim.completed) >= result["completed_requests"]
    assert sim.prunes == 0 and len(sim.tree) == sim.tree.created


@pytest.mark.parametrize(("loop", "retain"), [(True, True), (False, False), (True, False)])
def test_simulation_run_without_an_end_or_records_config_error(loop: bool, retain: bool) -> None:
    with pytest.raises(ConfigError, match="retain_requests=True"):
        Simulation(_scenario(), loop=loop, retain_requests=retain).run()


# ------------------------------------------------------------------ served, and the CLI


def _prompt_tokens(url: str) -> float:
    body = httpx.get(url, timeout=10).text
    return sum(s.value for s in read_exposition(body, "t", 0.0).samples
               if s.signal == "prompt_tokens_total")  # fmt: skip


def test_serve_scenario_loop_counters_grow_past_several_loops_over_http() -> None:
    sc = parse_scenario({**RAW, "duration_s": 4.0})  # a loop every 0.1 s of wall time at 40x
    out, err = io.StringIO(), io.StringIO()
    stop = threading.Event()
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(
        serve_scenario(sc, "127.0.0.1:0", speed=40.0, loop=True, stop=stop, out=out, err=err)
    ), daemon=True)  # fmt: skip
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
        doc = json.loads(out.getvalue().splitlines()[0])
        assert doc["loop"] is True and doc["duration_s"] == 4.0
        url = doc["engines"][0]["url"]
        seen = [_prompt_tokens(url)]
        for _ in range(3):
            time.sleep(0.4)  # 16 simulated seconds: 4 loops
            seen.append(_prompt_tokens(url))
    finally:
        stop.set()
        thread.join(timeout=10)
    assert result == [0]
    assert all(b > a for a, b in itertools.pairwise(seen)), seen
    assert "looping every 4 simulated s" in err.getvalue()
    assert re.search(r"loop \d+ began \(simulated t=\d+ s\)", err.getvalue())


@pytest.mark.parametrize("extra", [[], ["--json"], ["--compare", "none,native"]])
def test_cli_simulate_loop_without_serve_one_line_error_names_the_flag(extra: list[str]) -> None:
    proc = run_kvscope("simulate", "shared_prefix", "--loop", *extra)
    assert_one_line_error(proc, "--loop needs --serve")
