"""Benchmark: kvscope's exposition reader vs prometheus_client's parser, same text, same run.

Run: .venv/bin/python benchmarks/bench_parse.py [--repeat N]

Reads tests/fixtures/metrics/vllm-0.33.0-metrics-full.txt (2 DP engines, offload, spec
decode: 1,481 lines) and prints MB/s for
  * baseline  prometheus_client.parser.text_string_to_metric_families (materialised),
  * cold      read_exposition with an empty label cache (first scrape of a new target),
  * warm      read_exposition with the label cache filled (every later scrape),
  * unknown   the same text with every family renamed so nothing is a signal (the cost of
              skipping families kvscope does not use),
and the ratios against the baseline, plus the share of one core 1,000 engines scraped every
15 s would need. The target is warm >= 10x baseline. No asserts: machines are noisy.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from collector.parse import ExpositionReader  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "metrics" / "vllm-0.33.0-metrics-full.txt"


def _once(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20, help="interleaved rounds")
    args = ap.parse_args()
    text = FIXTURE.read_text()
    mb = len(text.encode()) / 1e6
    # Every family renamed (vllm:x -> zz_vllm_x): all lines are unknown to the catalogue.
    unknown_text = re.sub(r"^(# (?:HELP|TYPE) )?([a-z])", r"\1zz_\2", text, flags=re.M)
    unknown_text = unknown_text.replace("zz_vllm:", "zz_vllm_")

    warm_reader = ExpositionReader()

    def baseline() -> object:
        return [f.samples for f in text_string_to_metric_families(text)]

    def cold() -> object:
        return ExpositionReader().read(text, "bench", 0.0)

    def warm() -> object:
        return warm_reader.read(text, "bench", 0.0)

    def unknown() -> object:
        return warm_reader.read(unknown_text, "bench", 0.0)

    snap = warm_reader.read(text, "bench", 0.0)
    print(
        f"fixture: {FIXTURE.name} ({mb * 1e3:.1f} kB, {text.count(chr(10))} lines, "
        f"{len(snap.samples)} canonical series, {len(snap.unknown_families)} unknown families)"
    )
    cases = {"kvscope cold cache": cold, "kvscope warm cache": warm, "kvscope all-unknown": unknown}
    # Interleaved rounds: every round times the baseline and each case back to back, so a
    # load spike on this shared machine hits both sides of a ratio; medians over rounds.
    times: dict[str, list[float]] = {k: [] for k in ("baseline (prometheus_client)", *cases)}
    ratios: dict[str, list[float]] = {k: [] for k in cases}
    for fn in (baseline, *cases.values()):
        fn()  # warm-up
    for _ in range(args.repeat):
        t_base = _once(baseline)
        times["baseline (prometheus_client)"].append(t_base)
        for label, fn in cases.items():
            t = _once(fn)
            times[label].append(t)
            ratios[label].append(t_base / t)
    for label, ts in times.items():
        t = statistics.median(ts)
        ratio = statistics.median(ratios[label]) if label in ratios else 1.0
        print(f"{label:30s} {t * 1e3:8.2f} ms  {mb / t:8.1f} MB/s  x{ratio:6.1f}")
    t_warm = statistics.median(times["kvscope warm cache"])
    print(f"1,000 engines every 15 s (warm): {1000 * t_warm / 15 * 100:.1f}% of one core")
    warm_ratio = statistics.median(ratios["kvscope warm cache"])
    cold_ratio = statistics.median(ratios["kvscope cold cache"])
    print(f"ratio vs baseline: warm {warm_ratio:.1f}x (target >= 10x), cold {cold_ratio:.1f}x")


if __name__ == "__main__":
    main()
