"""collector.engine_facts: the offload mode an engine exposes, from real expositions and from
the label combinations each rule keys on; and both collect modes storing it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collector.engine_facts import engine_facts_of, offload_from_facts
from collector.parse import read_exposition

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
"""


@pytest.mark.prometheus
def test_prometheus_and_direct_modes_store_each_engines_exposed_offload(tmp_path: Path) -> None:
    """The demo cluster (none, native and LMCache engines) scraped by a real Prometheus: the
    collector in Prometheus mode registers every engine with the mode it runs, as the direct
    mode does from a targets file that does not say (the issue-11 bug: all were 'none')."""
    from collector.promsource import PrometheusSource
    from collector.run_prometheus import collect_prometheus
    from collector.store import Store
    from tests import services

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
        with services.prometheus(PROM.format(targets=json.dumps(hostports))) as url:
            time.sleep(12)
            db = f"sqlite:///{tmp_path / 'p.db'}"
            with Store(db) as store, PrometheusSource(url) as source:
                store.migrate()
                import asyncio

                stats = asyncio.run(collect_prometheus(
                    source, store, cluster="c", window_s=5.0, since_s=10.0, interval_s=1.0,
                    settle_s=1.0, once=True))  # fmt: skip
                assert stats.windows_written > 0, stats
                got = {e.source: e.offload for e in store.engines("c")}
                facts = {e.source: e.facts for e in store.engines("c")}
        assert got == want
        for hp in hostports:
            assert facts[hp]["offload_basis"].startswith("exposed"), facts[hp]
            assert facts[hp]["num_gpu_blocks"] > 0 and facts[hp]["block_size"] == 16
        # direct mode, a targets file without offload: the same modes, from the same facts
        targets = tmp_path / "targets.yaml"
        targets.write_text("cluster: d\ntargets:\n" + "".join(
            f"  - {{name: {hp}, url: 'http://{hp}/metrics', engine: {{model: m}}}}\n"
            for hp in hostports))  # fmt: skip
        ddb = f"sqlite:///{tmp_path / 'd.db'}"
        proc = subprocess.run(
            [kvscope, "collect", "--targets", str(targets), "--db", ddb, "--once", "-q"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        with Store(ddb) as store:
            assert {e.source: e.offload for e in store.engines("d")} == want
    finally:
        sim.terminate()
        sim.wait(timeout=10)


def test_prometheus_registration_failed_facts_query_keeps_stored_facts(tmp_path: Path) -> None:
    from collector.records import Window
    from collector.run import CollectStats
    from collector.run_prometheus import _register_sources
    from collector.store import Store

    window = Window("e0", "kv_cache_usage_ratio", (("model_name", "m"),), 0.0, 60.0, "gauge", 4)
    native = {CACHE: [{**ON, "num_gpu_blocks": "10", "block_size": "16"}]}
    with Store(f"sqlite:///{tmp_path / 'k.db'}") as store:
        store.migrate()
        known: set[str] = set()
        described: dict[str, dict[str, object]] = {}

        def register(facts: dict[str, dict[str, list[dict[str, str]]]] | None) -> None:
            _register_sources(store, cluster="c", url="http://p", windows=[window], known=known,
                              stats=CollectStats(mode="prometheus"), facts=facts,
                              described=described)  # fmt: skip

        register({"e0": native})
        (first,) = store.engines("c")
        register(None)  # the facts query failed this poll
        (after,) = store.engines("c")
    assert (first.model, first.offload, first.facts["num_gpu_blocks"]) == ("m", "native", 10)
    assert (after.offload, after.facts) == (first.offload, first.facts)
