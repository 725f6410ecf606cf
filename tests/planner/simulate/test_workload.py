"""Workloads: arrival processes, closed loops, shared prefixes, sessions, RAG, traces."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError
from planner.simulate.cluster import Simulation
from planner.simulate.scenario import parse_scenario
from planner.simulate.spec import Section
from planner.simulate.workload import ContentTree, Req, Workload
from planner.simulate.workload_spec import WorkloadSpec, load_trace, parse_workload


def _spec(**workload: Any) -> WorkloadSpec:
    return parse_workload(Section(workload, "workload", "test", []), None)


def _arrivals(spec: WorkloadSpec, n: int) -> list[float]:
    wl = Workload(spec, 1, ContentTree())
    reqs = wl.initial()
    out = [reqs[0].arrival]
    req: Req | None = reqs[0]
    while len(out) < n and req is not None:
        req = wl.after_arrival(req)
        if req is not None:
            out.append(req.arrival)
    return out


def test_poisson_arrivals_have_the_requested_rate_and_cv_one() -> None:
    times = _arrivals(_spec(prompt_tokens=10, qps=5.0), 20_000)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.fmean(gaps) == pytest.approx(0.2, rel=0.03)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.05)


def test_bursty_arrivals_keep_the_rate_with_higher_variability() -> None:
    times = _arrivals(_spec(prompt_tokens=10, qps=5.0, arrival="bursty", burstiness=0.25), 20_000)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.fmean(gaps) == pytest.approx(0.2, rel=0.05)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(2.0, rel=0.1)


def test_diurnal_arrivals_follow_the_sinusoid() -> None:
    spec = _spec(prompt_tokens=10, qps=20.0, arrival="diurnal", diurnal_period_s=1000,
                 diurnal_amplitude=0.8)  # fmt: skip
    times = _arrivals(spec, 100_000)
    times = [t for t in times if t < 5000]
    peak = sum(1 for t in times if 200 <= (t % 1000) < 300)  # sin ≈ +0.95
    trough = sum(1 for t in times if 700 <= (t % 1000) < 800)  # sin ≈ -0.95
    assert peak / trough > 5


def test_closed_loop_keeps_concurrency_requests_in_flight() -> None:
    raw = {
        "cluster": {"nodes": 1, "gpus_per_node": 1},
        "workload": {"kind": "synthetic", "prompt_tokens": 200, "output_tokens": 30,
                     "concurrency": 17, "think_time_s": 0.0},
        "duration_s": 20,
    }  # fmt: skip
    sim = Simulation(parse_scenario(raw))
    for t in (1.0, 5.0, 12.0):
        sim.advance_to(t)
        assert sim.outstanding == 17


def test_shared_prefix_dataset_is_every_group_times_prompts_shuffled() -> None:
    spec = _spec(kind="shared_prefix", groups=5, prompts_per_group=4, system_prompt_tokens=100,
                 question_tokens=20, concurrency=3)  # fmt: skip
    tree = ContentTree()
    wl = Workload(spec, 2, tree)
    reqs = wl.initial()
    while True:
        nxt = wl.after_completion(reqs[-1], 1.0)
        if nxt is None:
            break
        reqs.append(nxt)
    assert len(reqs) == 20 and wl.exhausted
    groups = [r.affinity for r in reqs]
    assert sorted(groups) == sorted(g for g in range(5) for _ in range(4))
    assert groups != sorted(groups)  # shuffled, as SGLang bench_serving does
    for r in reqs:
        assert tree.end[r.path[0]] == 100 and r.prompt_len == 120
        assert tree.start[r.path[-1]] == r.prompt_len  # output segment follows the prompt
    assert len({r.path[0] for r in reqs}) == 5  # one shared node per group


def test_multi_turn_prompt_contains_the_whole_history() -> None:
    spec = _spec(kind="multi_turn", turns=3, question_tokens=50, output_tokens=20,
                 system_prompt_tokens=100, concurrency=1)  # fmt: skip
    tree = ContentTree()
    wl = Workload(spec, 1, tree)
    first = wl.initial()[0]
    second = wl.after_completion(first, 1.0)
    assert second is not None
    third = wl.after_completion(second, 2.0)
    assert third is not None
    assert second.prompt_len == first.prompt_len + first.output_len + 50
    assert second.path[: len(first.path)] == first.path
    assert third.path[: len(second.path)] == second.path
    nxt = wl.after_completion(third, 3.0)  # session over: a new one starts
    assert nxt is not None and nxt.turn == 0 and nxt.prompt_len == 150


def test_rag_requests_share_document_prefixes() -> None:
    spec = _spec(kind="rag", documents=3, doc_tokens=500, docs_per_request=2, zipf_s=1.2,
                 question_tokens=30, qps=1.0)  # fmt: skip
    tree = ContentTree()
    wl = Workload(spec, 1, tree)
    reqs = [wl.initial()[0]]
    for _ in range(50):
        nxt = wl.after_arrival(reqs[-1])
        assert nxt is not None
        reqs.append(nxt)
    assert all(r.prompt_len == 1030 for r in reqs)
    assert len({tuple(r.path[:2]) for r in reqs}) <= 6  # 3·2 ordered document pairs


def test_trace_replay_uses_arrival_times_and_prefix_groups(tmp_path: Path) -> None:
    lines = [
        {"arrival_s": 0.0, "prompt_tokens": 300, "output_tokens": 5, "prefix_group": "a",
         "prefix_tokens": 200},
        {"arrival_s": 0.5, "prompt_tokens": 400, "output_tokens": 5},
        {"arrival_s": 2.0, "prompt_tokens": 250, "output_tokens": 5, "prefix_group": "a",
         "prefix_tokens": 200},
    ]  # fmt: skip
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    raw = {"cluster": {"gpus_per_node": 1}, "workload": {"kind": "trace", "path": "t.jsonl"},
           "duration_s": 100}  # fmt: skip
    sim = Simulation(parse_scenario(raw, base_dir=tmp_path))
    result: Any = sim.run()
    assert result["completed_requests"] == 3
    assert sorted(c[0] for c in sim.completed) == [0.0, 0.5, 2.0]
    assert result["prefix_hit_rate"] > 0  # the third request reuses group a's 200 tokens


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", ":1: not valid JSON"),
        ('{"arrival_s": 1, "prompt_tokens": 5}', "'output_tokens'"),
        ('{"arrival_s": -1, "prompt_tokens": 5, "output_tokens": 1}', "'arrival_s'"),
        ('{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1, "x": 1}', "unknown key 'x'"),
        ('{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1, "prefix_group": "g"}',
         "'prefix_tokens'"),
        ('{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1, "prefix_group": "g", '
         '"prefix_tokens": 9}', "exceeds prompt_tokens"),
        ("[1, 2]", "JSON object"),
    ],
)  # fmt: skip
def test_load_trace_bad_line_names_line_and_key(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_trace(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_load_trace_rejects_time_going_backwards(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = [{"arrival_s": 5, "prompt_tokens": 5, "output_tokens": 1},
            {"arrival_s": 1, "prompt_tokens": 5, "output_tokens": 1}]  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    with pytest.raises(ConfigError, match=":2: arrival_s goes backwards"):
        load_trace(path)


def test_workload_that_cannot_fit_the_kv_cache_is_rejected() -> None:
    raw = {"cluster": {"gpus_per_node": 1, "num_gpu_blocks": 10},
           "workload": {"prompt_tokens": 500, "qps": 1}, "duration_s": 10}  # fmt: skip
    with pytest.raises(ConfigError, match="num_gpu_blocks"):
        Simulation(parse_scenario(raw))
