"""Rate ramps (workload.stages), as inference-perf runs them: per stage int(qps·duration)
requests, the next stage only once every request of the last has finished plus the gap, the
dataset restarted (or continued) per stage, and the per-stage summary rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.errors import ConfigError
from planner.simulate.cluster import Simulation
from planner.simulate.scenario import parse_scenario
from tests.clirun import run_kvscope


def _raw(**workload: Any) -> dict[str, Any]:
    wl = {
        "kind": "shared_prefix",
        "groups": 10,
        "prompts_per_group": 3,
        "system_prompt_tokens": 2000,
        "question_tokens": 100,
        "output_tokens": 50,
        "stages": [{"qps": 2.0, "duration_s": 10.0}, {"qps": 4.0, "duration_s": 10.0}],
        "stage_gap_s": 30.0,
    }
    return {
        "cluster": {"nodes": 1, "gpus_per_node": 2, "model": "llama-3.1-8b"},
        "workload": wl | workload,
        "duration_s": 10_000.0,
        "seed": 7,
    }


def _run(raw: dict[str, Any]) -> Simulation:
    sim = Simulation(parse_scenario(raw))
    sim.run()
    return sim


def test_stages_send_their_count_and_wait_for_the_drain_and_the_gap() -> None:
    sim = _run(_raw())
    wl = sim.workload
    assert wl.stage_first_rid == [0, 20]  # int(2 x 10), then int(4 x 10) requests
    assert wl.issued == 60 and len(sim.completed) == 60
    first = [c for c in sim.completed if c[6] < 20]
    second = [c for c in sim.completed if c[6] >= 20]
    drained = max(c[2] for c in first)
    assert wl.stage_starts[1] == pytest.approx(drained + 30.0)
    assert min(c[0] for c in second) > wl.stage_starts[1]
    # Poisson at 2/s: the 20th arrival near 10 s
    assert 4.0 < max(c[0] for c in first) < 20.0


def test_stages_restart_the_dataset_unless_told_to_continue() -> None:
    def contents(sim: Simulation, lo: int, hi: int) -> list[int]:
        by_rid = {c[6]: c for c in sim.completed}
        return [by_rid[r][3] for r in range(lo, hi)]  # prompt lengths stand for the items

    restart = _run(_raw(question_tokens={"dist": "uniform", "min": 10, "max": 900}))
    assert contents(restart, 0, 20) == contents(restart, 20, 40)  # stage 2 replays 0..19
    assert contents(restart, 20, 30) == contents(restart, 50, 60)  # 30 items, cycled
    cont = _run(
        _raw(question_tokens={"dist": "uniform", "min": 10, "max": 900}, stage_dataset="continue")
    )
    assert contents(cont, 0, 10) == contents(cont, 30, 40)  # items 20..29, then 0.. again
    assert contents(cont, 0, 20) != contents(cont, 20, 40)


def test_stages_summary_has_one_row_a_stage() -> None:
    sim = Simulation(parse_scenario(_raw()))
    rows = sim.run().summary["stages"]
    assert [r["qps"] for r in rows] == [2.0, 4.0]
    assert [r["requests"] for r in rows] == [20, 40]
    assert [r["completed_requests"] for r in rows] == [20, 40]
    for r, lo, hi in ((rows[0], 0, 20), (rows[1], 20, 60)):
        mine = [c for c in sim.completed if lo <= c[6] < hi]
        span = max(c[2] for c in mine) - min(c[0] for c in mine)
        assert r["span_s"] == pytest.approx(span, abs=1e-6)
        tokens = sum(c[3] + c[4] for c in mine)
        assert r["total_tokens_per_s"] == pytest.approx(tokens / span, rel=1e-6)
    plain = _raw(qps=2.0, stages=None, stage_gap_s=None)
    assert "stages" not in Simulation(parse_scenario(plain)).run().summary


@pytest.mark.parametrize(
    ("workload", "match"),
    [
        ({"qps": 3.0}, r"workload\.qps: stages set the rate of each step"),
        ({"concurrency": 4}, r"workload\.concurrency: stages set the rate"),
        ({"kind": "multi_turn"}, r"workload\.stages: a rate ramp needs kind"),
        ({"stages": []}, r"workload\.stages: must be a non-empty list"),
        ({"stages": [{"qps": 1.0}]}, r"workload\.stages\[0\]\.duration_s: is required"),
        ({"stages": [{"qps": 0.01, "duration_s": 10}]}, r"stages\[0\]\.qps: qps x duration_s"),
        ({"stages": [{"qps": 1, "duration_s": 5, "x": 1}]}, r"stages\[0\]\.x: unknown key"),
        ({"arrival": "diurnal"}, r"workload\.arrival: a stage's rate is constant"),
        ({"num_requests": 5}, r"workload\.num_requests: each stage sends"),
        ({"stage_dataset": "shuffle"}, r"workload\.stage_dataset: must be one of"),
        ({"stages": None, "qps": 1.0}, r"workload\.stage_gap_s: applies only with stages"),
    ],
)
def test_stages_bad_input_names_the_key(workload: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_scenario(_raw(**workload))


def test_stages_do_not_loop() -> None:
    with pytest.raises(ConfigError, match="a rate ramp runs once"):
        Simulation(parse_scenario(_raw()), loop=True)


def test_stages_cli_prints_a_row_a_stage_matching_its_json(tmp_path: Path) -> None:
    path = tmp_path / "ramp.yaml"
    path.write_text(yaml.safe_dump(_raw()))
    text = run_kvscope("simulate", str(path))
    as_json = run_kvscope("simulate", str(path), "--json")
    assert text.returncode == 0 and as_json.returncode == 0, text.stderr + as_json.stderr
    rows = json.loads(as_json.stdout)["stages"]
    header = next(
        i for i, ln in enumerate(text.stdout.splitlines()) if ln.split()[:2] == ["stage", "qps"]
    )
    printed = text.stdout.splitlines()[header + 1 : header + 1 + len(rows)]
    for line, row in zip(printed, rows, strict=True):
        cells = line.split()
        assert cells[:3] == [str(row["stage"]), f"{row['qps']:g}", str(row["completed_requests"])]
        assert cells[4] == f"{row['total_tokens_per_s']:,.0f}"
