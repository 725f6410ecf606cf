"""Collector fixtures: a real exporter on 127.0.0.1 scraped by a real Prometheus (session-wide)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import services
from tests.collector.exposerver import Body, ExpoServer, expo_server, set_sample

METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
PREEMPTIONS_START = 100.0
PREEMPTIONS_STEP = 5.0  # added at every scrape
SCRAPE_S = 1.0

PROM_CONFIG = """
global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: vllm
    metrics_path: /metrics
    static_configs:
      - targets: ['{hostport}']
"""


@dataclass(frozen=True)
class LiveProm:
    url: str  # Prometheus
    server: ExpoServer  # the exporter it scrapes
    hostport: str  # the exporter's instance label
    t0: float  # when Prometheus was ready


def moving_vllm_body(text: str) -> Body:
    """The fixture with the preemption counter +STEP and the KV usage flipping each scrape."""

    def body(n: int) -> bytes:
        t = set_sample(text, "preemptions_total", PREEMPTIONS_START + PREEMPTIONS_STEP * n)
        t = set_sample(t, "kv_cache_usage_ratio", 0.5 if n % 2 else 0.25)
        return t.encode()

    return body


@pytest.fixture(scope="session")
def live_prometheus() -> Iterator[LiveProm]:
    """An exporter scraped every second by Prometheus 2.42 until it has 6 samples."""
    text = (METRICS / "vllm-0.33.0-metrics-default.txt").read_text()
    with expo_server() as srv:
        srv.add("/metrics", moving_vllm_body(text))
        hostport = srv.base.removeprefix("http://")
        with services.prometheus(PROM_CONFIG.replace("{hostport}", hostport)) as url:
            t0 = time.time()
            deadline = t0 + 15
            while srv.route("/metrics").hits < 6 and time.time() < deadline:
                time.sleep(0.1)
            time.sleep(0.3)  # let the last scrape be ingested
            yield LiveProm(url, srv, hostport, t0)
