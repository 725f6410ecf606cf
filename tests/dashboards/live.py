"""A live stack for the dashboards' and rules' PromQL: real processes on 127.0.0.1.

- ``kvscope simulate demo --serve`` (8 engines: none, native and LMCache offload, 1 LMCache
  server), running in scaled real time;
- every vendor fixture exposition (vLLM 0.11–0.33, LMCache legacy and MP, the
  production-stack router) served with counters and histograms growing at each scrape, so
  legacy-only spellings have data too;
- ``kvscope collect`` scraping the simulated engines, serving its own ``--metrics-addr``;
- the planner gauges of a stored plan (api.plan_metrics, what ``kvscope serve``'s
  ``/metrics`` renders) with every headline figure set;
- Debian's Prometheus 2.42 scraping all of them every second, with the generated rule files
  loaded. ``trap=True`` rewrites every sample name's ``:`` to ``_`` (prometheus-client's
  OpenMetrics "colon trap"), as a Prometheus that negotiated OpenMetrics would store them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from api.plan_metrics import render_plan_metrics
from dashboards.generate import RULES_DIR, artifacts
from store.store import Store
from store.tables import PlanRecord
from tests import services
from tests.collector.exposerver import ExpoServer, expo_server
from tests.tierdoc import SECTION as CPU_TIER

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "metrics"
KVSCOPE = str(Path(sys.executable).with_name("kvscope"))
# Jobs the mixin's default selectors expect (dashboards/config.py).
LMCACHE_JOB, COLLECTOR_JOB, PLANNER_JOB = "lmcache", "kvscope-collector", "kvscope-api"
VLLM_FIXTURES = ("vllm-0.11.0-metrics-default", "vllm-0.11.0-metrics-hidden",
                 "vllm-0.15.0-metrics-default", "vllm-0.20.0-metrics-default",
                 "vllm-0.26.0-metrics-default", "vllm-0.33.0-metrics-full",
                 "production-stack-router-metrics")  # fmt: skip
LMCACHE_FIXTURES = ("lmcache-0.5.6-legacy-metrics", "lmcache-0.5.6-mp-server-idle-metrics")
# An L2 tier behind a 20 GB L1 (the demo's 64 prefixes need ~50 GB of KV): L2 stores and
# loads and L2 hits appear within the settle time.
L2_TIER = ("--set", "cluster.lmcache.l2.tier=local-nvme", "--set",
           "cluster.lmcache.l2.size_gb=2000", "--set", "cluster.cpu_cache_gb=20")  # fmt: skip
PLAN_CLUSTER, PLAN_GROUPS = "demo", ("", "llama-3.1-8b")
SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)(.*)$")
MOVING = ("counter", "histogram")


def _types(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            out[name] = kind.strip()
    return out


def _family(name: str, types: dict[str, str]) -> str | None:
    if name.endswith("_created"):
        return None
    for suffix in ("", "_total", "_bucket", "_sum", "_count"):
        if suffix and name.endswith(suffix) and name[: -len(suffix)] in types:
            return name[: -len(suffix)]
        if not suffix and name in types:
            return name
    return None


def growing(text: str, n: int) -> str:
    """The exposition with every counter and histogram sample v at scrape n set to
    v + n·(1 + v/100): increasing in v, so histogram buckets stay cumulative."""
    types = _types(text)
    out = []
    for line in text.splitlines():
        m = SAMPLE.match(line)
        family = _family(m.group(1), types) if m else None
        if m and family and types.get(family) in MOVING:
            v = float(m.group(3))
            out.append(f"{m.group(1)}{m.group(2) or ''} {v + n * (1 + v / 100):.17g}{m.group(4)}")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def colon_trap(text: str) -> str:
    """Sample names with ``:`` → ``_``; HELP/TYPE lines keep the colon (client_python#1177)."""
    out = []
    for line in text.splitlines():
        m = SAMPLE.match(line)
        out.append(m.group(1).replace(":", "_") + line[len(m.group(1)) :] if m else line)
    return "\n".join(out) + "\n"


def plan_record(now: float, group: str = "") -> PlanRecord:
    """A stored plan with every headline figure, deployed native offload, a recommended
    LMCache, saturation within its horizon, and what a CPU tier would buy."""
    headline = {
        "score": 0.72,
        "breakeven_native": 0.62, "breakeven_native_lo": 0.55, "breakeven_native_hi": 0.7,
        "breakeven_lmcache": 0.48, "breakeven_lmcache_lo": 0.4, "breakeven_lmcache_hi": 0.57,
        "capacity_native": 0.98, "capacity_native_lo": 0.96, "capacity_native_hi": 0.995,
        "capacity_lmcache": 1.11, "capacity_lmcache_lo": 1.05, "capacity_lmcache_hi": 1.17,
        "kv_util_now": 0.58,
        "forecast_peak": 1.1e6, "forecast_peak_lo": 0.9e6, "forecast_peak_hi": 1.3e6,
        "kv_capacity": 1.0e6,
        "saturation_s": 9000.0, "saturation_lo_s": 5400.0, "saturation_hi_s": 20000.0,
        "p_saturation": 0.7,
    }  # fmt: skip
    document = {
        "happening": {"current_mode": {"mode": "native", "basis": "test"}},
        "forecast": {"kv_demand": {"unit": "KV tokens"}},
        "offload": {"modes": {"native": {
            "today": {"effects": [
                {"outcome": "ttft_p90_s", "can_tell": True, "estimate": 0.6,
                 "interval": {"lo": 0.5, "hi": 0.7, "level": 0.9}},
                {"outcome": "preemptions_per_1k", "can_tell": True, "estimate": -50.0,
                 "interval": {"lo": -70.0, "hi": -30.0, "level": 0.9}},
            ]},
            "bill": {"can_tell": True, "engines_without_offload": 8, "engines_with_mode": 6,
                     "engines_with_mode_range": [5, 7], "gpu_hours_saved_per_day": 48.0,
                     "gpu_hours_saved_range": [24.0, 72.0]},
        }}},
        "cpu_tier": CPU_TIER,
    }  # fmt: skip
    return PlanRecord(PLAN_CLUSTER, group, now - 60, now - 7200, now - 60, 86400.0, "test",
                      "lmcache", document, headline)  # fmt: skip


@dataclass(frozen=True)
class Stack:
    prometheus: str  # URL
    trap: bool

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.prometheus}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/query", query=expr)["result"])


def _prom_config(jobs: dict[str, tuple[str, list[str]]], rules: list[Path]) -> str:
    lines = ["global:", "  scrape_interval: 1s", "  scrape_timeout: 900ms",
             "  evaluation_interval: 1s", "rule_files:"]  # fmt: skip
    lines += [f"  - {p}" for p in rules]
    lines.append("scrape_configs:")
    for job, (path, targets) in jobs.items():
        lines += [f"  - job_name: {job}", f"    metrics_path: {path}", "    static_configs:",
                  f"      - targets: {json.dumps(targets)}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def _hostport(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc


def _wait_file(path: Path, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{path} not written (exit {proc.poll()})")
        time.sleep(0.05)


def _grown(text: str, transform: Callable[[str], str]) -> Callable[[int], bytes]:
    return lambda n: transform(growing(text, n)).encode()


def _serve_fixtures(srv: ExpoServer, transform: Callable[[str], str]) -> dict[str, str]:
    """route path -> fixture name, each growing at every scrape."""
    paths = {}
    for name in (*VLLM_FIXTURES, *LMCACHE_FIXTURES):
        text = (FIXTURES / f"{name}.txt").read_text()
        path = f"/{name}"
        srv.add(path, _grown(text, transform))
        paths[path] = name
    return paths


def _proxy(url: str, transform: Callable[[str], str]) -> Callable[[int], bytes]:
    def body(_n: int) -> bytes:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return transform(resp.read().decode()).encode()

    return body


@contextmanager
def live_stack(trap: bool = False, settle_s: float = 12.0) -> Iterator[Stack]:
    """The stack above; yields once Prometheus has ~``settle_s`` s of samples."""
    transform = colon_trap if trap else (lambda t: t)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvscope-live-")))
        rules = []
        for rel, text in artifacts().items():
            if rel.parent == RULES_DIR:
                (tmp / rel.name).write_text(text)
                rules.append(tmp / rel.name)
        ports = tmp / "ports.json"
        sim = subprocess.Popen(
            [KVSCOPE, "simulate", "demo", "--serve", "127.0.0.1:0", "--speed", "30",
             "--set", "duration_s=86400", *L2_TIER, "--ports-file", str(ports),
             "--targets-file", str(tmp / "targets.yaml")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        stack.callback(_stop, sim)
        _wait_file(ports, sim)
        endpoints = json.loads(ports.read_text())
        store_url = f"sqlite:///{tmp / 'plans.db'}"
        with Store(store_url) as store:
            store.migrate()
            for group in PLAN_GROUPS:  # the cluster's plan and its model group's
                store.save_plan(plan_record(time.time(), group))
        srv = stack.enter_context(expo_server())
        coverage = {(PLAN_CLUSTER, g): (0.84, 0.9) for g in PLAN_GROUPS}

        def plan_body(_n: int) -> bytes:
            with Store(store_url) as s:
                return render_plan_metrics(s, coverage=coverage)

        srv.add("/plan-metrics", plan_body)
        fixture_paths = _serve_fixtures(srv, transform)
        engines = [e["url"] for e in endpoints["engines"]]
        pools = [p["url"] for p in endpoints["lmcache"]]
        if trap:  # every simulated endpoint through a rewriting proxy route
            for i, url in enumerate(engines + pools):
                srv.add(f"/sim-{i}", _proxy(url, transform))
        metrics_port = services.free_port()
        collector = subprocess.Popen(
            [KVSCOPE, "collect", "--targets", str(tmp / "targets.yaml"), "--db",
             f"sqlite:///{tmp / 'collect.db'}", "--interval", "1s", "--window", "5s", "-q",
             "--metrics-addr", f"127.0.0.1:{metrics_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        stack.callback(_stop, collector)
        here = _hostport(srv.base)
        jobs: dict[str, tuple[str, list[str]]] = {}
        if trap:
            n = len(engines)
            for i in range(n + len(pools)):
                job = "vllm" if i < n else LMCACHE_JOB
                jobs[f"{job}-{i}" if i < n else f"{LMCACHE_JOB}-sim-{i}"] = (f"/sim-{i}", [here])
        else:
            jobs["vllm"] = ("/metrics", [_hostport(u) for u in engines])
            jobs[LMCACHE_JOB] = ("/metrics", [_hostport(u) for u in pools])
        for path, name in fixture_paths.items():
            job = f"{LMCACHE_JOB}-{name}" if name in LMCACHE_FIXTURES else f"fixture-{name}"
            jobs[job] = (path, [here])
        jobs[COLLECTOR_JOB] = ("/metrics", [f"127.0.0.1:{metrics_port}"])
        jobs[PLANNER_JOB] = ("/plan-metrics", [here])
        url = stack.enter_context(services.prometheus(_prom_config(jobs, rules)))
        time.sleep(settle_s)
        yield Stack(url, trap)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
