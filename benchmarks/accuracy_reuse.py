"""Accuracy of planner.fit.reuse against brute-force LRU simulations (about a minute).

Six 400k-access traces (IRM Zipf 0.9 / 0.6 / 1.0; renewal chains with log-normal gap mixes
at 5 s + 120 s and 20 s + 60 s, and a Lomax gap), each through an exact LRU of its HBM
capacity recorded the vLLM way (sample rate 1), fitted, and the predictions at 2x and 4x
capacity and for a write-through CPU tier of 3x and 0.5x HBM compared with the simulated
truth: error (pp), whether the model-based interval covers it, and whether the fit says it
can tell.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/accuracy_reuse.py [--n-boot 200]
"""

from __future__ import annotations

import argparse

import numpy as np

from planner.fit.reuse import GIB, fit_reuse, native_offload_gain
from tests.planner.reusesynth import (
    Trace,
    irm_trace,
    lognormal_mix,
    lru_hit_ratio,
    lru_record,
    renewal_trace,
    tiered_hit_ratio,
    to_inputs,
)

N = 400_000


def _lomax(rng: object) -> float:
    assert isinstance(rng, np.random.Generator)
    return float(rng.pareto(1.2) * 5.0)


def scenarios() -> dict[str, tuple[Trace, int]]:
    return {
        "irm-zipf0.9": (irm_trace(200_000, 0.9, 200.0, N, seed=1), 2000),
        "irm-zipf0.6": (irm_trace(100_000, 0.6, 200.0, N, seed=3), 8000),
        "irm-zipf1.0": (irm_trace(50_000, 1.0, 100.0, N, seed=4), 1000),
        "renewal-5s+120s": (renewal_trace(100.0, 0.7, lognormal_mix(5, 120, 1.0), N, 2), 4000),
        "renewal-20s+60s": (renewal_trace(100.0, 0.8, lognormal_mix(20, 60, 1.5), N, 5), 3000),
        "renewal-lomax": (renewal_trace(150.0, 0.6, _lomax, N, seed=6), 3000),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-boot", type=int, default=200)
    args = ap.parse_args()
    errors: list[float] = []
    covered = total = 0
    for name, (trace, cap) in scenarios().items():
        fit = fit_reuse(to_inputs(lru_record(trace, cap), cap, name=name), n_boot=args.n_boot)
        repro = fit.reproduction.error * 100
        print(f"{name}: H {fit.hit_ratio:.3f}, T_hbm {fit.t_hbm:.1f} s, rho {fit.rho:.2f}, "
              f"reproduction {repro:+.1f} pp, families {', '.join(fit.families)}")  # fmt: skip
        p2, p4 = fit.curve([2 * cap, 4 * cap])
        gain = native_offload_gain(fit, [0.5 * cap / GIB, 3 * cap / GIB], bytes_per_block=1.0)
        base, half = tiered_hit_ratio(trace, cap, cap // 2)
        _, three = tiered_hit_ratio(trace, cap, 3 * cap)
        rows = [
            ("2x HBM", p2.hit_ratio, lru_hit_ratio(trace, 2 * cap), p2.can_tell),
            ("4x HBM", p4.hit_ratio, lru_hit_ratio(trace, 4 * cap), p4.can_tell),
            ("CPU 3x", gain.points[1].extra_hit_ratio, three - base, gain.points[1].can_tell),
            ("CPU 0.5x", gain.points[0].extra_hit_ratio, half - base, gain.points[0].can_tell),
        ]
        for what, est, truth, tell in rows:
            iv = est.interval
            ok = iv.lo - 1e-9 <= truth <= iv.hi + 1e-9
            covered += ok
            total += 1
            errors.append(abs(est.value - truth))
            print(f"  {what:8s} {est.value:.3f} [{iv.lo:.3f}, {iv.hi:.3f}] truth {truth:.3f} "
                  f"error {100 * (est.value - truth):+.1f} pp {'covered' if ok else 'MISSED'}"
                  f"{'' if tell else ' (cannot tell)'}")  # fmt: skip
    print(f"intervals covering the truth: {covered}/{total}; "
          f"mean |error| {100 * sum(errors) / len(errors):.2f} pp")  # fmt: skip


if __name__ == "__main__":
    main()
