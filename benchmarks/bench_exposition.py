"""Cost of one simulated engine scrape: snapshot under the lock, render, vs. prometheus_client.

Baseline (same run): prometheus_client's ``generate_latest`` over a registry holding the
same families as real Counter/Gauge/Histogram objects — what a real vLLM process does per
scrape. Ratios, not absolute times, are what to compare across machines.

    .venv/bin/python benchmarks/bench_exposition.py [SCENARIO]  # a file or bundled name
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest  # noqa: E402

from collector.parse import read_exposition  # noqa: E402
from core import catalog  # noqa: E402
from planner.simulate.exposition import engine_view, render  # noqa: E402
from planner.simulate.metrics_server import LiveCluster  # noqa: E402
from planner.simulate.scenario import load_scenario  # noqa: E402
from planner.simulate.scenarios import scenario_file  # noqa: E402


def _best(fn: Callable[[], object], n: int = 200, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n)
    return best


def main() -> None:
    with scenario_file(sys.argv[1] if len(sys.argv) > 1 else "shared_prefix") as path:
        live = LiveCluster(load_scenario(path), 30.0)
    live.sim.advance_to(120.0, settle=True)
    eng = live.sim.engines[0]

    def snapshot() -> object:
        with live.lock:
            return eng.snapshot(live.sim.now)

    snap = eng.snapshot(live.sim.now)
    view = engine_view(snap, live.engine_config)
    body = render(view)
    reg = CollectorRegistry()
    labels = ("engine", "model_name")
    for name in snap.counters:
        Counter(catalog.SIGNALS[name].exported, "h", labels, registry=reg).labels("0", "m").inc()
    for name in snap.gauges:
        Gauge(catalog.SIGNALS[name].exported, "h", labels, registry=reg).labels("0", "m").set(1)
    for name, h in snap.histograms.items():
        hist = Histogram(catalog.SIGNALS[name].exported, "h", labels, buckets=h.bounds,
                         registry=reg)  # fmt: skip
        hist.labels("0", "m").observe(1.0)
    t_snap = _best(snapshot)
    t_render = _best(lambda: render(engine_view(snap, live.engine_config)))
    t_base = _best(lambda: generate_latest(reg))
    text = body.decode()
    t_parse = _best(lambda: read_exposition(text, "bench", 0.0))
    print(f"engine body {len(body)} bytes, {text.count(chr(10))} lines ({path})")
    print(f"snapshot under lock  {t_snap * 1e6:8.0f} us")
    print(f"render               {t_render * 1e3:8.2f} ms")
    print(
        f"baseline (registry)  {t_base * 1e3:8.2f} ms   render/baseline = {t_render / t_base:.2f}"
    )
    print(
        f"collector parse      {t_parse * 1e3:8.2f} ms   parse/render    = {t_parse / t_render:.2f}"
    )


if __name__ == "__main__":
    main()
