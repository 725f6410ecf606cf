"""collector.engine_rules (engines.yaml) and collector.dcgm: the facts an engine's metrics
cannot say, from label-matcher rules and from DCGM's per-GPU series; and
collector.engine_facts.describe, which orders every place a fact comes from."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.dcgm import GpuFacts, engine_gpus, gpu_slug, host_of
from collector.engine_facts import assumed_facts, describe, engine_facts_of
from collector.engine_rules import load_engine_rules, parse_engine_rules
from core.errors import ConfigError
from planner.domain.hardware import get_gpu

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "engines.yaml"


@pytest.mark.parametrize(
    ("doc", "error"),
    [
        ([], "expected a mapping with the one key 'rules'"),
        ({"rules": [], "extra": 1}, "expected a mapping with the one key 'rules'"),
        ({"rules": {}}, "'rules' must be a list"),
        ({"rules": ["x"]}, "rules[0]: expected a mapping with keys 'match' and 'set'"),
        ({"rules": [{"match": {}}]}, "rules[0]: expected a mapping with keys 'match' and 'set'"),
        ({"rules": [{"set": {"gpu": "h100"}, "when": 1}]}, "rules[0]: expected a mapping"),
        ({"rules": [{"match": ["a"], "set": {"gpu": "h100"}}]}, "rules[0].match: expected a"),
        ({"rules": [{"match": {"1x": "a"}, "set": {"gpu": "h100"}}]}, "'1x' is not a label name"),
        ({"rules": [{"match": {"job": 3}, "set": {"gpu": "h100"}}]}, "match.job: the pattern"),
        ({"rules": [{"match": {"job": "("}, "set": {"gpu": "h100"}}]}, "match.job: bad regex"),
        ({"rules": [{"set": {}}]}, "rules[0].set: expected a non-empty mapping"),
        ({"rules": [{"set": {"colour": "red"}}]}, "unknown fact(s) colour; allowed: gpu"),
        ({"rules": [{"set": {"gpu": ""}}]}, "set.gpu: expected a non-empty string"),
        ({"rules": [{"set": {"tensor_parallel": 0}}]}, "set.tensor_parallel: expected an integer"),
        ({"rules": [{"set": {"tensor_parallel": True}}]}, "set.tensor_parallel: expected an int"),
        ({"rules": [{"set": {"hbm_gb": -1}}]}, "set.hbm_gb: expected a positive number"),
        ({"rules": [{"set": {"dram_gib": float("inf")}}]}, "set.dram_gib: expected a positive"),
        ({"rules": [{"set": {"offload": "both"}}]}, "set.offload: expected one of none, native"),
        ({"rules": [{"set": {"gpu": "h100"}}, {"set": {"gpu": 1}}]}, "rules[1].set.gpu"),
    ],
)  # fmt: skip
def test_engine_rules_malformed_documents_name_what_is_wrong(doc: object, error: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_engine_rules(doc, source="e.yaml")
    assert error in str(exc.value) and str(exc.value).startswith("e.yaml")


def test_engine_rules_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read engine rules file"):
        load_engine_rules(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules: [\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:\d+: invalid YAML"):
        load_engine_rules(bad)


def test_engine_rules_first_match_sets_each_fact_anchored_regexes() -> None:
    rules = load_engine_rules(EXAMPLE)  # the shipped example parses
    assert len(rules.rules) == 3
    big = rules.facts_for({"model_name": "llama-3.1-70b", "instance": "10.0.3.4:8000"})
    assert big == {"gpu": ("h200-141gb", "engines.yaml rule 1"),
                   "tensor_parallel": (4, "engines.yaml rule 1"),
                   "dram_gib": (2048.0, "engines.yaml rule 2")}  # fmt: skip
    # anchored: "70b" inside a longer word still needs the pattern to cover the whole value
    small = rules.facts_for({"model_name": "qwen3-8b", "instance": "10.0.30.4:8000"})
    assert small == {"gpu": ("h100-80gb", "engines.yaml rule 3")}
    # a label the engine lacks is "": it matches only a pattern matching ""
    only = parse_engine_rules({"rules": [{"match": {"pod": ".+"}, "set": {"gpu": "x"}}]})
    assert only.facts_for({"instance": "a:1"}) == {}


DCGM = [
    # Kubernetes mode, Prometheus renamed the consumer pod: a TP-2 engine's two GPUs
    {"modelName": "NVIDIA H100 80GB HBM3", "gpu": "0", "UUID": "GPU-a", "Hostname": "n1",
     "instance": "10.0.0.9:9400", "exported_pod": "llama-0", "exported_namespace": "ai"},
    {"modelName": "NVIDIA H100 80GB HBM3", "gpu": "1", "UUID": "GPU-b", "Hostname": "n1",
     "instance": "10.0.0.9:9400", "exported_pod": "llama-0", "exported_namespace": "ai"},
    # bare metal: the exporter on the engine's host
    {"modelName": "NVIDIA H200", "gpu": "0", "UUID": "GPU-c", "Hostname": "n2",
     "instance": "10.0.0.2:9400"},
    # a host with two GPU models: ambiguous, no GPU fact
    {"modelName": "NVIDIA H200", "gpu": "0", "UUID": "GPU-d", "instance": "10.0.0.3:9400"},
    {"modelName": "NVIDIA A100-SXM4-80GB", "gpu": "1", "UUID": "GPU-e",
     "instance": "10.0.0.3:9400"},
    {"gpu": "0", "instance": "10.0.0.4:9400"},  # no modelName: ignored
]  # fmt: skip


def test_dcgm_joins_engines_by_pod_then_host() -> None:
    engines = {
        "10.1.0.5:8000": {"instance": "10.1.0.5:8000", "pod": "llama-0", "namespace": "ai"},
        "10.0.0.2:8000": {"instance": "10.0.0.2:8000"},
        "n2:8001": {"instance": "n2:8001"},  # by the exporter's Hostname label
        "10.0.0.3:8000": {"instance": "10.0.0.3:8000"},
        "10.0.0.4:8000": {"instance": "10.0.0.4:8000"},
        "10.1.0.6:8000": {"instance": "10.1.0.6:8000", "pod": "other", "namespace": "ai"},
    }
    got = engine_gpus(engines, DCGM)
    assert got["10.1.0.5:8000"] == GpuFacts(
        "nvidia-h100-80gb-hbm3", 2, "dcgm: 2 x NVIDIA H100 80GB HBM3 on pod ai/llama-0"
    )
    assert got["10.0.0.2:8000"] == GpuFacts(
        "nvidia-h200", None, "dcgm: NVIDIA H200 on host 10.0.0.2"
    )
    assert got["n2:8001"].gpu == "nvidia-h200"
    assert set(got) == {"10.1.0.5:8000", "10.0.0.2:8000", "n2:8001"}


@pytest.mark.parametrize(
    ("instance", "host"),
    [("10.0.0.1:8000", "10.0.0.1"), ("[::1]:9100", "::1"), ("node-a", "node-a"),
     ("fe80::1", "fe80::1"), ("host:port", "host:port")],
)  # fmt: skip
def test_host_of_splits_port_only(instance: str, host: str) -> None:
    assert host_of(instance) == host


def test_gpu_slug_is_the_hardware_catalogue_alias_spelling() -> None:
    assert get_gpu(gpu_slug("NVIDIA H100 80GB HBM3")).name == "h100-80gb"
    assert get_gpu(gpu_slug("NVIDIA H200")).name == "h200-141gb"


ON = {"kv_offloading_backend": "native", "kv_offloading_size": "8", "num_gpu_blocks": "100"}
EXPOSED = engine_facts_of({"cache_config": [ON]})
RULES = parse_engine_rules({"rules": [
    {"match": {"model_name": "m.*"}, "set": {"gpu": "h200", "tensor_parallel": 4}},
    {"match": {"source": "e2"}, "set": {"offload": "lmcache", "model": "big"}},
]})  # fmt: skip


@pytest.mark.parametrize(
    ("kw", "want"),
    [
        # exposed only: model and offload exposed; TP assumed 1; GPU unknown
        ({}, {"model": ("m1", "exposed"), "offload": ("native", "exposed"),
              "tensor_parallel": (1, "assumed"), "gpu": (None, None)}),
        # targets file: configured beats exposed for offload/model
        ({"configured": {"offload": "none", "model": "x", "gpu": "h100", "tensor_parallel": 2}},
         {"model": ("x", "configured"), "offload": ("none", "configured"),
          "tensor_parallel": (2, "configured"), "gpu": ("h100", "configured")}),
        # engines.yaml beats the targets file; DCGM beats both for GPU and TP
        ({"rules": RULES, "configured": {"gpu": "h100", "tensor_parallel": 2}},
         {"gpu": ("h200", "configured"), "tensor_parallel": (4, "configured")}),
        ({"rules": RULES, "gpus": GpuFacts("nvidia-h100-80gb-hbm3", 8, "dcgm: 8 x H100")},
         {"gpu": ("nvidia-h100-80gb-hbm3", "exposed"), "tensor_parallel": (8, "exposed")}),
        # host join: GPU from DCGM, TP from the rule
        ({"rules": RULES, "gpus": GpuFacts("nvidia-h200", None, "dcgm: H200 on host h")},
         {"gpu": ("nvidia-h200", "exposed"), "tensor_parallel": (4, "configured")}),
        ({"rules": RULES, "labels": {"source": "e2", "model_name": "zz"}},
         {"model": ("big", "configured"), "offload": ("lmcache", "configured"),
          "tensor_parallel": (1, "assumed")}),
    ],
)  # fmt: skip
def test_describe_precedence_table(
    kw: dict[str, object], want: dict[str, tuple[object, object]]
) -> None:
    kw.setdefault("labels", {"source": "e1", "model_name": "m1"})
    d = describe(EXPOSED, model_label="m1", **kw)  # type: ignore[arg-type]
    prov = d.facts["provenance"]
    for key, (value, kind) in want.items():
        assert getattr(d, key) == value, key
        assert (prov[key].split(":")[0] if key in prov else None) == kind, (key, prov)


def test_describe_nothing_exposed_assumes_offload_none_and_lists_it() -> None:
    d = describe(engine_facts_of({}), labels={"source": "e"})
    assert (d.offload, d.model, d.tensor_parallel) == ("none", None, 1)
    assert assumed_facts(d.facts) == ["offload", "tensor_parallel"]
    assert describe(EXPOSED, rules=RULES, labels={"source": "e", "model_name": "m"}).facts[
        "provenance"]["gpu"] == "configured: engines.yaml rule 1"  # fmt: skip
