"""Same scenario + seed -> same JSON (in-process, across processes with different hash seeds,
and whether the run is advanced in one go or in slices)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from planner.simulate.cluster import Simulation
from planner.simulate.scenario import parse_scenario, set_dotted

RAW: dict[str, Any] = {
    "cluster": {"nodes": 2, "gpus_per_node": 2, "model": "llama-3.1-8b", "num_gpu_blocks": 3000,
                "offload": "lmcache", "engines_offload": ["lmcache", "native", "none", "lmcache"],
                "router": "least_loaded", "cpu_cache_gb": 10},
    "workload": {"kind": "shared_prefix", "groups": 20, "prompts_per_group": 8,
                 "system_prompt_tokens": 3000, "question_tokens": {"dist": "uniform", "min": 50,
                 "max": 500}, "output_tokens": {"dist": "lognormal", "mean": 200, "sigma": 0.8},
                 "qps": 4, "arrival": "bursty", "popularity": "zipf", "num_requests": 300},
    "duration_s": 400,
    "seed": 11,
}  # fmt: skip


def _json(raw: dict[str, Any]) -> dict[str, Any]:
    result = Simulation(parse_scenario(raw)).run()
    out = result.to_dict()
    out.pop("wall_s")
    return out


def test_simulation_same_seed_same_json() -> None:
    assert _json(RAW) == _json(RAW)


def test_simulation_other_seed_other_json() -> None:
    assert _json(RAW) != _json(set_dotted(RAW, "seed", 12))


def test_simulation_sliced_advances_match_one_run() -> None:
    one = Simulation(parse_scenario(RAW))
    one.advance_to(400)
    sliced = Simulation(parse_scenario(RAW))
    t = 0.0
    while t < 400:
        t += 7.3
        sliced.advance_to(t)
    assert [c[:6] for c in one.completed] == [c[:6] for c in sliced.completed]


def test_cli_json_identical_across_hash_seeds(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(RAW), encoding="utf-8")
    outs = []
    for hash_seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        proc = subprocess.run(
            [sys.executable, "-m", "kvscope.cli", "simulate", str(path), "--json"],
            capture_output=True, text=True, check=False, env=env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        doc.pop("wall_s")
        outs.append(doc)
    assert outs[0] == outs[1]
    assert outs[0]["completed_requests"] > 0
