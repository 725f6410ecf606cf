"""`kvscope inspect --json` on one federation-sized exposition, whole process, against
prometheus_client's text parser reading the same file in a process of its own.

Run: .venv/bin/python benchmarks/bench_inspect.py [--engines 400] [--rounds 3]

The exposition is vLLM 0.33's default one (tests/fixtures/metrics, 554 lines) for
``--engines`` engines, as a federation endpoint serves it: each family's HELP and TYPE once,
then its samples for every engine, each with ``instance`` and ``job`` labels and its own
``engine`` label (400 engines: ~20 MB, 156,000 samples). Every line is new to the reader, so
this is the cold path (the per-target template and prefix caches of a collector's steady
state never hit). Both commands run as fresh processes, alternated, ``--rounds`` times;
printed: the best wall time of each and the ratio (the issue's target: >= 5x).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests/fixtures/metrics/vllm-0.33.0-metrics-default.txt"
BASELINE = (
    "import sys\n"
    "from prometheus_client.parser import text_string_to_metric_families\n"
    "text = open(sys.argv[1]).read()\n"
    "print(sum(len(f.samples) for f in text_string_to_metric_families(text)))\n"
)


def federation(engines: int) -> str:
    """The fixture's families, each with the samples of ``engines`` engines."""
    blocks: list[tuple[list[str], list[str]]] = []
    for line in FIXTURE.read_text().splitlines():
        if line.startswith("# HELP") or not blocks:
            blocks.append(([], []))
        if line.startswith("#"):
            blocks[-1][0].append(line)
        elif line:
            blocks[-1][1].append(line)
    out: list[str] = []
    for meta, samples in blocks:
        out += meta
        for e in range(engines):
            extra = f'instance="10.0.{e // 250}.{e % 250}:8000",job="vllm"'
            for sample in samples:
                if "{" in sample:
                    line = sample.replace("{", "{" + extra + ",", 1)
                else:
                    name, _, value = sample.partition(" ")
                    line = f"{name}{{{extra}}} {value}"
                out.append(line.replace('engine="0"', f'engine="{e}"'))
    return "\n".join(out) + "\n"


def _run(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvscope-bench-inspect-") as tmp:
        path = Path(tmp) / "federate.txt"
        path.write_text(federation(args.engines))
        mb = path.stat().st_size / 1e6
        kv, pc = [], []
        for _ in range(args.rounds):
            kv.append(_run([sys.executable, "-m", "kvscope.cli", "inspect", "--json", str(path)]))
            pc.append(_run([sys.executable, "-c", BASELINE, str(path)]))
    print(
        f"{args.engines} engines, {mb:.1f} MB: kvscope inspect --json {min(kv):.2f} s, "
        f"prometheus_client's parser {min(pc):.2f} s (best of {args.rounds}, whole processes): "
        f"{min(pc) / min(kv):.2f}x (target >= 5x)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
