"""collector.engine_facts: the offload mode an engine exposes, from real expositions and from
the label combinations each rule keys on; and both collect modes storing it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collector.engine_facts import Described, engine_facts_of, offload_from_facts
from collector.engine_rules import parse_engine_rules
from collector.parse import read_exposition
from collector.promsource import PrometheusSource
from collector.run import CollectStats, LoopParts
from collector.run_config import PrometheusConfig
from collector.run_prometheus import _register_sources, collect_prometheus
from core.catalog import (
    CACHE_CONFIG_INFO,
    DCGM_GPU_FAMILY,
    DERIVED_RATIOS,
    KV_OFFLOAD_CONFIG_INFO,
    SIGNALS,
    exposed_names,
)
from core.records import Window
from store.store import Store
from tests import services
from tests.collector.exposerver import expo_server

METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"


def _fixture_facts(name: str) -> tuple[dict[str, list[dict[str, str]]], set[str]]:
    snap = read_exposition((METRICS / f"{name}.txt").read_text(), name, 0.0)
    facts = {k: [dict(r) for r in rows] for k, rows in snap.facts.items()}
    return facts, {s.signal for s in snap.samples}


@pytest.mark.parametrize(
    ("fixture", "mode", "basis"),
    [
        # 0.20-0.33 write kv_offloading_backend="native" with size "None" when it is off
        ("vllm-0.33.0-metrics-default", "none", 'kv_offloading_size="None"'),
        ("vllm-0.26.0-metrics-default", "none", 'kv_offloading_size="None"'),
        ("vllm-0.20.0-metrics-default", "none", 'kv_offloading_size="None"'),
        # the full rendering has kv_offload_config_info: the CPU offloading spec runs
        ("vllm-0.33.0-metrics-full", "native", "present"),
        # 0.11 has no offloading labels and no connector series: it cannot say
        ("vllm-0.11.0-metrics-default", None, "not exposed"),
    ],
)
def test_offload_from_real_expositions(fixture: str, mode: str | None, basis: str) -> None:
    got, why = offload_from_facts(*_fixture_facts(fixture))
    assert got == mode and basis in why


CACHE = "cache_config"
ON = {"kv_offloading_backend": "native", "kv_offloading_size": "93.1"}


@pytest.mark.parametrize(
    ("facts", "signals", "mode"),
    [
        ({CACHE: [ON]}, set(), "native"),
        ({CACHE: [{**ON, "kv_offloading_backend": "lmcache"}]}, set(), "lmcache"),
        ({CACHE: [{"kv_offloading_backend": "lmcache", "kv_offloading_size": "None"}]}, set(),
         "lmcache"),
        ({CACHE: [{**ON, "kv_offloading_size": "None"}]}, {"offload_bytes_total"}, "native"),
        ({CACHE: [{**ON, "kv_offloading_size": "None"}]}, {"lmcache_mp_lookup_seconds"},
         "lmcache"),
        ({CACHE: [{**ON, "kv_offloading_size": "0"}]}, {"preemptions_total"}, "none"),
        ({CACHE: [{"kv_offloading_backend": "mystery", "kv_offloading_size": "8"}]}, set(), None),
        ({}, set(), None),
    ],
)  # fmt: skip
def test_offload_rules_table(
    facts: dict[str, list[dict[str, str]]], signals: set[str], mode: str | None
) -> None:
    assert offload_from_facts(facts, signals)[0] == mode


def test_engine_facts_keep_rows_blocks_and_the_basis() -> None:
    row = {**ON, "num_gpu_blocks": "3605", "block_size": "16", "num_cpu_blocks": "47683"}
    facts = engine_facts_of({CACHE: [row, row]})
    assert (facts["num_gpu_blocks"], facts["block_size"], facts["dp_engines"]) == (3605, 16, 2)
    assert facts["offload"] == "native" and facts["offload_basis"].startswith("exposed")
    assert facts[CACHE] == [row, row]


# ------------------------------------------------------------------ both collect modes, live

PROM = """
global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: vllm
    static_configs:
      - targets: {targets}
  - job_name: dcgm
    static_configs:
      - targets: ["{dcgm}"]
"""
# what dcgm-exporter serves on a node with one H100 (labels as in its default rendering)
DCGM_BODY = (
    f"# TYPE {DCGM_GPU_FAMILY} gauge\n"
    f'{DCGM_GPU_FAMILY}{{gpu="0",UUID="GPU-1",device="nvidia0",modelName="NVIDIA H100 80GB '
    f'HBM3",Hostname="node-1",DCGM_FI_DRIVER_VERSION="550.54.15"}} 61234\n'
)


@pytest.mark.prometheus
@pytest.mark.slow
def test_prometheus_and_direct_modes_store_each_engines_exposed_offload(tmp_path: Path) -> None:
    """The demo cluster (none, native and LMCache engines) scraped by a real Prometheus: the
    collector in Prometheus mode registers every engine with the mode it runs, as the direct
    mode does from a targets file that does not say (the issue-11 bug: all were 'none')."""
    kvscope = str(Path(sys.executable).with_name("kvscope"))
    ports = tmp_path / "ports.json"
    sim = subprocess.Popen(
        [kvscope, "simulate", "demo", "--serve", "127.0.0.1:0", "--speed", "30",
         "--set", "duration_s=86400", "--ports-file", str(ports)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (ports.exists() and ports.read_text().strip()):
            assert sim.poll() is None and time.monotonic() < deadline, "simulator did not start"
            time.sleep(0.05)
        engines = json.loads(ports.read_text())["engines"]
        hostports = [e["url"].split("//")[1].split("/")[0] for e in engines]
        want = {hp: e["offload"] for hp, e in zip(hostports, engines, strict=True)}
        assert set(want.values()) == {"none", "native", "lmcache"}
        rules = parse_engine_rules(
            {"rules": [{"match": {"model_name": ".+"}, "set": {"tensor_parallel": 2}}]}
        )
        with expo_server() as dcgm:
            dcgm.add("/metrics", DCGM_BODY)
            dcgm_at = dcgm.base.split("//")[1]
            config = PROM.format(targets=json.dumps(hostports), dcgm=dcgm_at)
            with services.prometheus(config) as url:
                time.sleep(12)
                db = f"sqlite:///{tmp_path / 'p.db'}"
                with Store(db) as store, PrometheusSource(url) as source:
                    store.migrate()

                    stats = asyncio.run(
                        collect_prometheus(
                            source,
                            store,
                            PrometheusConfig(
                                cluster="c",
                                window_s=5.0,
                                since_s=10.0,
                                interval_s=1.0,
                                settle_s=1.0,
                                once=True,
                            ),
                            LoopParts(engine_rules=rules),
                        )
                    )
                    assert stats.windows_written > 0, stats
                    engines = {e.source: e for e in store.engines("c")}
        assert {s: e.offload for s, e in engines.items()} == want
        for hp in hostports:
            e = engines[hp]
            assert e.facts["offload_basis"].startswith("exposed"), e.facts
            assert e.facts["num_gpu_blocks"] > 0 and e.facts["block_size"] == 16
            # GPU from DCGM on the same host (127.0.0.1), TP from the rule, model exposed
            assert (e.gpu, e.tensor_parallel) == ("nvidia-h100-80gb-hbm3", 2)
            prov = e.facts["provenance"]
            assert prov["gpu"] == "exposed: dcgm: NVIDIA H100 80GB HBM3 on host 127.0.0.1"
            assert prov["tensor_parallel"] == "configured: engines.yaml rule 1"
            assert prov["model"] == "exposed: model_name label" and e.model
            assert [c.offload for c in e.changes] == [want[hp]]  # one regime, observed
        # direct mode, a targets file without offload: the same modes, from the same facts
        targets = tmp_path / "targets.yaml"
        targets.write_text("cluster: d\ntargets:\n" + "".join(
            f"  - {{name: {hp}, url: 'http://{hp}/metrics', engine: {{model: m}}}}\n"
            for hp in hostports))  # fmt: skip
        ddb = f"sqlite:///{tmp_path / 'd.db'}"
        rules_file = tmp_path / "engines.yaml"
        rules_file.write_text("rules:\n  - match: {instance: '127\\.0\\.0\\.1:.*'}\n"
                              "    set: {gpu: h200, tensor_parallel: 4}\n")  # fmt: skip
        proc = subprocess.run(
            [kvscope, "collect", "--targets", str(targets), "--db", ddb, "--once", "-q",
             "--engines", str(rules_file)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        with Store(ddb) as store:
            direct = store.engines("d")
        assert {e.source: e.offload for e in direct} == want
        assert {(e.model, e.gpu, e.tensor_parallel) for e in direct} == {("m", "h200", 4)}
        assert {e.facts["provenance"]["model"] for e in direct} == {"configured: targets file"}
    finally:
        sim.terminate()
        sim.wait(timeout=10)


def test_prometheus_registration_failed_facts_query_keeps_stored_facts(tmp_path: Path) -> None:
    window = Window("e0", "kv_cache_usage_ratio", (("model_name", "m"),), 0.0, 60.0, "gauge", 4)
    native = {CACHE: [{**ON, "num_gpu_blocks": "10", "block_size": "16"}]}
    with Store(f"sqlite:///{tmp_path / 'k.db'}") as store:
        store.migrate()
        known: set[str] = set()
        described: dict[str, Described] = {}

        def register(facts: dict[str, dict[str, list[dict[str, str]]]] | None, at: float) -> None:
            _register_sources(store, cluster="c", url="http://p", windows=[window], known=known,
                              stats=CollectStats(mode="prometheus"), facts=facts,
                              described=described, at=at)  # fmt: skip

        register({"e0": native}, 100.0)
        (first,) = store.engines("c")
        register(None, 200.0)  # the facts query failed this poll
        (after,) = store.engines("c")
        off = {CACHE: [{**ON, "kv_offloading_size": "None", "num_gpu_blocks": "10"}]}
        register({"e0": off}, 300.0)  # restarted with offloading off
        (last,) = store.engines("c")
    assert (first.model, first.offload, first.facts["num_gpu_blocks"]) == ("m", "native", 10)
    assert (after.offload, after.facts) == (first.offload, first.facts)
    assert [(c.at, c.offload) for c in last.changes] == [(100.0, "native"), (300.0, "none")]


def test_prometheus_registration_lmcache_server_with_derived_ratio_is_no_engine(
    tmp_path: Path,
) -> None:
    """An LMCache server's windows include a derived hit ratio (catalog.DERIVED_RATIOS),
    which is not a catalogue signal: it still counts as the server's, not as a vLLM engine."""
    ratio, numerator, _ = next(r for r in DERIVED_RATIOS if SIGNALS[r[1]].source == "lmcache")
    windows = [Window("lm:9", numerator, (), 0.0, 60.0, "counter", 4, delta=5.0),
               Window("lm:9", ratio, (), 0.0, 60.0, "gauge", 4, mean=0.5)]  # fmt: skip
    with Store(f"sqlite:///{tmp_path / 'l.db'}") as store:
        store.migrate()
        _register_sources(store, cluster="c", url="http://p", windows=windows, known=set(),
                          stats=CollectStats(mode="prometheus"), facts={}, described={},
                          at=60.0)  # fmt: skip
        assert store.engines("c") == []
        assert [(t.name, t.kind) for t in store.targets("c")] == [("lm:9", "lmcache")]


@pytest.mark.slow  # ~14 s: a live simulator scraped by Prometheus, then a back-fill
@pytest.mark.prometheus
def test_prometheus_backfill_dates_an_engine_restart_with_offload_on(tmp_path: Path) -> None:
    """An engine restarted with native offload switched on, seen only through Prometheus'
    history: the back-fill records both regimes, each from the time the series changed,
    not the whole history as the mode of its last instant."""
    (usage,) = exposed_names("kv_cache_usage_ratio")[:1]
    switch_at: list[float] = []

    def body(n: int) -> bytes:
        on = n >= 12  # the 13th scrape on: restarted with the CPU offloading spec
        if on and not switch_at:
            switch_at.append(time.time())
        size, cpu = ("8.0", "400") if on else ("None", "None")
        text = (
            f'# TYPE {usage} gauge\n{usage}{{engine="0",model_name="m"}} 0.5\n'
            f"# TYPE {CACHE_CONFIG_INFO} gauge\n"
            f'{CACHE_CONFIG_INFO}{{engine="0",block_size="16",num_gpu_blocks="100",'
            f'num_cpu_blocks="{cpu}",kv_offloading_backend="native",'
            f'kv_offloading_size="{size}"}} 1.0\n'
        )
        if on:
            text += f"# TYPE {KV_OFFLOAD_CONFIG_INFO} gauge\n"
            text += f'{KV_OFFLOAD_CONFIG_INFO}{{engine="0",offloading_spec="cpu"}} 1.0\n'
        return text.encode()

    with expo_server() as srv:
        srv.add("/metrics", body)
        config = PROM.format(targets=json.dumps([srv.base.split("//")[1]]), dcgm="127.0.0.1:1")
        config = config.replace("scrape_interval: 1s\n  scrape_timeout: 900ms",
                                "scrape_interval: 250ms\n  scrape_timeout: 200ms")  # fmt: skip
        with services.prometheus(config) as url:
            began = time.time()
            deadline = began + 30
            while srv.route("/metrics").hits < 24:
                assert time.time() < deadline, "Prometheus did not scrape"
                time.sleep(0.2)
            time.sleep(1.5)
            with Store(f"sqlite:///{tmp_path / 'h.db'}") as store, PrometheusSource(url) as src:
                store.migrate()
                asyncio.run(
                    collect_prometheus(
                        src,
                        store,
                        PrometheusConfig(
                            cluster="c",
                            window_s=1.0,
                            since_s=time.time() - began + 2,
                            interval_s=1.0,
                            settle_s=0.0,
                            once=True,
                        ),
                    )
                )
                (engine,) = store.engines("c")
    regimes = [(c.offload, c.facts.get("num_cpu_blocks")) for c in engine.changes]
    assert regimes == [("none", None), ("native", 400)], engine.changes
    # dated to the window in which Prometheus first saw the new series (1 s windows)
    assert abs(engine.changes[1].at - switch_at[0]) <= 2.0, (engine.changes, switch_at)
    assert engine.changes[0].at < switch_at[0] - 1.5
    assert engine.offload == "native"
