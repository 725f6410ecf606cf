"""Sizing arithmetic (engines, native buffer, L1, L2 scope) and the configs it emits."""

from __future__ import annotations

import json
import math
import shlex
from typing import Any

import pytest

from core.errors import ConfigError
from planner.decide.decision import CapacityEvidence, Decision, Evidence, ValueCI, decide
from planner.deploy.sizing import engine_bill, l1_from_curve, size
from planner.domain.costmodel import hbm_kv_capacity_tokens, kv_bytes_per_token
from planner.domain.hardware import get_gpu, get_model

GIB = 1024**3
KV_8B = 131_072  # bytes per token, Llama-3.1-8B bf16 [source: hf-llama-3.1-8b-config]
BASE: dict[str, Any] = {
    "model": "llama-3.1-8b",
    "gpu": "h100",
    "tp": 1,
    "vllm_version": "0.14.0",
    "engines": 8,
    "engines_per_node": 8,
    "nodes": 1,
    "cpu_dram_per_node_gib": 1872,
}


def ev(**over: Any) -> Evidence:
    return Evidence(**{**BASE, **over})


def dec(mode: str, l2_ok: bool | None = None) -> Decision:
    return Decision(mode, 0.8, "high", (), (), (), (), True, l2_ok)


def hbm_kv_gib_8b() -> float:
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h100")
    return hbm_kv_capacity_tokens(model, gpu, 1) * kv_bytes_per_token(model, 1) / GIB


# ---- engines --------------------------------------------------------------------------------


def test_size_engines_peak_with_headroom_and_bounds() -> None:
    peak = ValueCI(100_000, 80_000, 130_000)
    s = size(ev(demand_peak=peak, engine_capacity=10_000), dec("none"))
    assert s.engines is not None
    # ceil(100k·1.2/10k) = 12, ceil(80k·1.2/10k) = ceil(9.6) = 10, ceil(130k·1.2/10k) = 16
    assert (s.engines.needed, s.engines.lo, s.engines.hi) == (12, 10, 16)
    assert s.engines.current == 8 and s.engines.unit == "tokens/s"


def test_size_engines_exact_multiple_is_not_rounded_up() -> None:
    s = size(
        ev(demand_peak=ValueCI(100_000, 100_000, 100_000), engine_capacity=12_000), dec("none")
    )
    assert s.engines is not None and s.engines.needed == 10  # 120,000 / 12,000 exactly


def test_size_engines_capacity_derived_from_current_load() -> None:
    # 60k tokens/s on 8 engines at 75 % p50 KV use -> 10k per engine at full KV.
    e = ev(demand_peak=ValueCI(100_000, 80_000, 130_000), demand_now=60_000, kv_util_p50=0.75)
    s = size(e, dec("none"), headroom=0.0)
    assert s.engines is not None
    assert s.engines.capacity_per_engine == pytest.approx(10_000)
    assert (s.engines.needed, s.engines.lo, s.engines.hi) == (10, 8, 13)
    assert "kv_util_p50" in s.engines.basis


def test_size_engines_with_measured_capacity_ratio_needs_fewer_and_bills_the_saving() -> None:
    ratio = ValueCI(1.25, 1.2, 1.3)
    fit = CapacityEvidence(True, ratio, ratio, units=(3, 3))
    e = ev(demand_peak=ValueCI(100_000, 80_000, 130_000), engine_capacity=10_000, tp=2,
           native_capacity=fit)  # fmt: skip
    s = size(e, dec("native"))
    assert s.engines is not None
    assert s.engines.needed == 12 and s.engines.needed_with_offload == 10  # 120k / 12.5k = 9.6
    # 120k / 13k = 9.2 -> 10 engines at the ratio's upper end, 120k / 12k = 10 at its lower
    assert s.engines.with_offload_range == (10, 10)
    assert s.engines.gpu_hours_saved_per_day == (12 - 10) * 2 * 24


def test_engine_bill_lower_bound_ratio_bounds_the_saving_from_below_only() -> None:
    ratio = ValueCI(1.5, 1.2, 1.5)
    fit = CapacityEvidence(True, ratio, ratio, lower_bound=True, units=(2, 4))
    b = engine_bill(100_000, 10_000, 0.2, fit, 1)
    assert b is not None
    assert (b.needed, b.with_offload, b.with_offload_range) == (12, 8, (8, 10))
    assert b.gpu_hours_saved_range == ((12 - 10) * 24, None)


def test_engine_bill_without_a_ratio_that_can_tell_is_none() -> None:
    assert engine_bill(100_000, 10_000, 0.2, CapacityEvidence(False, why="1 unit"), 1) is None
    assert engine_bill(100_000, 10_000, 0.2, None, 1) is None


def test_size_engines_unknown_capacity_named() -> None:
    s = size(ev(demand_peak=ValueCI(1.0, 1.0, 1.0)), dec("none"))
    assert s.engines is None
    assert any(u.startswith("engine_capacity") for u in s.unknowns)


def test_size_engines_without_forecast_named() -> None:
    s = size(ev(engine_capacity=5.0), dec("none"))
    assert s.engines is None and any("demand_peak" in u for u in s.unknowns)


def test_size_none_mode_has_no_configs() -> None:
    s = size(ev(), dec("none"))
    assert s.configs == {} and s.native_cpu_gib is None and s.l1_size_gib is None


# ---- native buffer --------------------------------------------------------------------------


def test_size_native_without_working_set_is_twice_hbm_kv() -> None:
    s = size(ev(), dec("native"))
    assert s.native_cpu_gib == math.floor(2 * hbm_kv_gib_8b())
    argv = shlex.split(s.configs["vllm"])
    assert argv == [
        "--kv-offloading-size",
        str(int(s.native_cpu_gib)),
        "--kv-offloading-backend",
        "native",
    ]


def test_size_native_from_working_set() -> None:
    s = size(ev(distinct_prefix_tokens=1_000_000), dec("native"))
    # 1e6 tokens · 131,072 B = 122.07 GiB, / 0.8 watermark = 152.6 GiB, above the HBM KV.
    assert s.native_cpu_gib == math.floor(1_000_000 * KV_8B / GIB / 0.8) == 152


def test_size_native_capped_by_dram_per_engine() -> None:
    s = size(ev(cpu_dram_per_node_gib=512), dec("native"))
    assert s.native_cpu_gib == math.floor(512 * 0.8 / 8)  # 51 GiB per engine
    assert any("less than its HBM KV" in n for n in s.notes)


def test_size_native_old_vllm_emits_num_cpu_blocks() -> None:
    s = size(ev(vllm_version="0.12.0", cpu_dram_per_node_gib=512), dec("native"))
    argv = shlex.split(s.configs["vllm"])
    extra = json.loads(argv[1])["kv_connector_extra_config"]
    assert extra == {"block_size": 16, "num_cpu_blocks": 51 * GIB // (16 * KV_8B)}


def test_size_native_without_hardware_gives_no_configs() -> None:
    s = size(Evidence(engines_per_node=2), dec("native"))
    assert s.configs == {} and s.native_cpu_gib is None
    assert any(u.startswith("model/gpu/tp") for u in s.unknowns)


# ---- LMCache L1 -----------------------------------------------------------------------------


def test_size_l1_from_working_set_over_watermark() -> None:
    s = size(ev(distinct_prefix_tokens=2_000_000), dec("lmcache"))
    # 2e6 · 131,072 B = 244.14 GiB; / 0.8 = 305.18 -> 306 GiB
    assert s.l1_size_gib == math.ceil(2_000_000 * KV_8B / GIB / 0.8) == 306
    assert s.eviction_watermark == 0.8 and s.l2 is None  # fits DRAM, one node
    argv = shlex.split(s.configs["lmcache_server"])
    assert argv[argv.index("--l1-size-gb") + 1] == "306"
    assert argv[argv.index("--eviction-trigger-watermark") + 1] == "0.8"


def test_size_l1_capped_by_dram_spills_to_local_fs() -> None:
    s = size(ev(distinct_prefix_tokens=2_000_000, cpu_dram_per_node_gib=256), dec("lmcache"))
    assert s.l1_size_gib == math.ceil(256 * 0.8)  # 205
    assert "capped" in s.l1_basis
    assert s.l2 is not None and s.l2.kind == "fs" and s.l2.scope == "node"
    argv = shlex.split(s.configs["lmcache_server"])
    assert json.loads(argv[argv.index("--l2-adapter") + 1])["type"] == "fs"


def test_size_l1_without_working_set_backs_node_hbm_kv() -> None:
    s = size(ev(engines_per_node=4), dec("lmcache"))
    assert s.l1_size_gib == math.ceil(4 * hbm_kv_gib_8b())
    assert any(u.startswith("distinct_prefix_tokens") for u in s.unknowns)


def test_size_l1_from_hit_rate_curve_plateau() -> None:
    curve = ((16.0, 0.3), (64.0, 0.6), (128.0, 0.8), (256.0, 0.84))
    s = size(ev(l1_hit_curve=curve, distinct_prefix_tokens=9e9), dec("lmcache"))
    # 95 % of the 0.84 plateau = 0.798: 64 + 64 · (0.198 / 0.2) = 127.36 -> 128 GiB
    assert s.l1_size_gib == 128
    assert "hit-rate curve" in s.l1_basis


@pytest.mark.parametrize(
    ("curve", "target", "gib"),
    [
        (((16.0, 0.3), (64.0, 0.6), (128.0, 0.8)), 0.7, 96.0),
        (((16.0, 0.3), (64.0, 0.6), (128.0, 0.8)), 0.2, 16.0),
        (((16.0, 0.3), (64.0, 0.6), (128.0, 0.8)), 0.95, 128.0),
        (((16.0, 0.5), (32.0, 0.4), (64.0, 0.7)), 0.6, 48.0),  # a dip is smoothed away
        (((64.0, 0.6), (16.0, 0.3)), 0.45, 40.0),  # unsorted input
    ],
)
def test_l1_from_curve_interpolates(
    curve: tuple[tuple[float, float], ...], target: float, gib: float
) -> None:
    assert l1_from_curve(curve, target)[0] == pytest.approx(gib)


def test_l1_from_curve_empty_raises() -> None:
    with pytest.raises(ConfigError, match="empty"):
        l1_from_curve((), None)


def test_size_both_splits_dram_between_native_and_l1() -> None:
    s = size(ev(distinct_prefix_tokens=2_000_000, vllm_version="0.12.0", nodes=1), dec("both"))
    usable = 1872 * 0.8
    assert s.native_cpu_gib == math.floor(min(2_000_000 * KV_8B / GIB / 0.8, usable / 8 / 2))
    assert s.l1_size_gib == math.ceil(
        min(2_000_000 * KV_8B / GIB / 0.8, usable - 8 * s.native_cpu_gib)
    )
    config = json.loads(shlex.split(s.configs["vllm"])[1])
    assert config["kv_connector"] == "MultiConnector"


# ---- L2 by sharing scope --------------------------------------------------------------------


def test_size_cross_node_reuse_picks_shared_mooncake_with_placeholders() -> None:
    e = ev(nodes=4, cross_node_reuse=0.5, distinct_prefix_tokens=100_000)
    s = size(e, dec("lmcache"))
    assert s.l2 is not None and (s.l2.kind, s.l2.scope) == ("mooncake_store", "cluster")
    assert json.loads(s.l2.spec)["master_server_addr"] == "MOONCAKE_MASTER:50051"
    assert any("placeholders" in n for n in s.notes)


@pytest.mark.parametrize(
    ("tier", "kind"),
    [("s3-object", "s3"), ("remote-lmcache-25gbe", "resp"), ("local-nvme", "mooncake_store")],
)
def test_size_cross_node_l2_kind_follows_tier(tier: str, kind: str) -> None:
    e = ev(nodes=2, cross_node_reuse=0.3, distinct_prefix_tokens=100_000, l2_tier=tier)
    s = size(e, dec("lmcache", l2_ok=True))
    assert s.l2 is not None and s.l2.kind == kind


def test_size_l2_params_replace_placeholders() -> None:
    params = {"host": "valkey.internal", "port": 6380}
    e = ev(
        nodes=2,
        cross_node_reuse=0.3,
        distinct_prefix_tokens=100_000,
        l2_tier="remote-lmcache-25gbe",
    )
    s = size(e, dec("lmcache"), l2_params=params)
    assert s.l2 is not None and json.loads(s.l2.spec) == {"type": "resp", **params}


def test_size_slow_tier_means_no_l2() -> None:
    e = ev(
        nodes=2,
        cross_node_reuse=0.3,
        cross_engine_reuse=0.5,
        l2_tier="ceph-hdd",
        prompt_tokens_p90=4000,
    )
    d = decide(e)
    assert d.l2_ok is False
    s = size(e, dec("lmcache", l2_ok=False))
    assert s.l2 is None and any("R3_slow_tier" in n for n in s.notes)


def test_size_lmcache_configs_point_vllm_at_the_server() -> None:
    s = size(
        ev(distinct_prefix_tokens=100_000, tp=2),
        dec("lmcache"),
        lmcache_host="$(HOST_IP)",
        isolated_ipc=True,
    )
    config = json.loads(shlex.split(s.configs["vllm"])[1])
    assert config["kv_connector_extra_config"] == {
        "lmcache.mp.host": "tcp://$(HOST_IP)",
        "lmcache.mp.port": 5555,
        "lmcache.mp.isolated_ipc": True,
    }
    argv = shlex.split(s.configs["lmcache_server"])
    assert argv[argv.index("--host") + 1] == "0.0.0.0" and "--isolated-ipc" in argv
    assert any("DaemonSet" in n for n in s.notes)


def test_size_unknown_vllm_version_assumes_latest_and_says_so() -> None:
    s = size(ev(vllm_version=None), dec("native"))
    assert s.configs["vllm"].startswith("--kv-offloading-size")
    assert any(u.startswith("vllm_version") for u in s.unknowns)


def test_size_unsupported_vllm_version_gives_note_not_crash() -> None:
    s = size(ev(vllm_version="0.9.2"), dec("native"))
    assert s.configs == {} and any("no configs" in n for n in s.notes)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"headroom": -0.1}, "headroom"), ({"dram_reserve_fraction": 1.0}, "dram")],
)
def test_size_bad_parameters_raise(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        size(ev(), dec("native"), **kwargs)  # type: ignore[arg-type]


def test_size_to_dict_is_json() -> None:
    e = ev(
        distinct_prefix_tokens=2_000_000,
        cpu_dram_per_node_gib=256,
        demand_peak=ValueCI(5, 4, 6),
        engine_capacity=1,
    )
    doc = json.loads(json.dumps(size(e, dec("both")).to_dict()))
    assert doc["mode"] == "both" and doc["engines"]["needed"] == 6 and "vllm" in doc["configs"]
