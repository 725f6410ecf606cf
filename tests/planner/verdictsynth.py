"""Seeded synthetic analysis frames with a known capacity ratio per offload mode.

Each engine e of mode m has a capacity c_e = BASE × ratio[m] × exp(unit_sd · z_e) tokens/s;
its windows carry a diurnal load (served tokens/s) that reaches ``peak`` × BASE × share_e;
TTFT p90 is 0.3 s below 0.9 c_e and grows as exp(8 (x / c_e − 0.9)) above, so it crosses
the default SLO (2 s) at x = (0.9 + ln(2 / 0.3) / 8) c_e: the capacity at the SLO of every
engine is the same multiple of c_e, and the true capacity ratio of mode m over none is
ratio[m] (in the geometric mean over engines). Engines of one ``pool`` share a capacity
draw (they are one unit). ``prompt`` per engine shifts TTFT by (prompt / 4000) at any load:
a traffic-mix confounder when the router sends longer prompts to one arm.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

BASE = 10_000.0  # tokens/s per engine without offload at c_e
TTFT0 = 0.3
SLOPE = 8.0
TRUE_SLO_MULTIPLE = 0.9 + math.log(2.0 / TTFT0) / SLOPE  # capacity at a 2 s p90 SLO / c_e


def cluster_frame(
    modes: Sequence[str],
    *,
    ratio: Mapping[str, float],
    seed: int,
    windows: int = 240,
    peak: float = 1.4,
    unit_sd: float = 0.05,
    shares: Sequence[float] | None = None,
    pools: Mapping[int, str] | None = None,
    prompt: Sequence[float] | None = None,
    ttft_effect: Mapping[str, float] | None = None,
    prompt_sd: float = 0.0,
    ttft_engine_sd: float = 0.1,
) -> pd.DataFrame:
    """One row per engine and 60 s window (planner/frames/frames.py columns the verdict reads).

    ``modes``: the mode of each engine; ``shares``: its share of the load (default 1);
    ``pools``: engine index -> pool name (engines of a pool share their capacity draw);
    ``prompt``: mean prompt tokens per engine (default 4000), varying from window to window
    by a log-normal factor of SD ``prompt_sd``; ``ttft_effect``: a log TTFT shift per mode
    at every load (default 0)."""
    rng = np.random.default_rng(seed)
    n = len(modes)
    shares = list(shares or [1.0] * n)
    prompt = list(prompt or [4000.0] * n)
    draw: dict[str, float] = {}
    rows = []
    t = np.arange(windows) * 60.0
    diurnal = 0.15 + (peak - 0.15) * 0.5 * (1 - np.cos(2 * np.pi * t / (windows * 60.0)))
    for e, mode in enumerate(modes):
        key = (pools or {}).get(e, f"engine-{e}")
        if key not in draw:
            draw[key] = float(rng.normal())
        cap = BASE * ratio.get(mode, 1.0) * math.exp(unit_sd * draw[key])
        offered = BASE * shares[e] * diurnal * np.exp(rng.normal(0, 0.03, windows))
        load = np.minimum(offered, cap * 1.3)  # served load saturates past capacity
        over = np.maximum(0.0, offered / cap - 0.9)
        tokens = prompt[e] * np.exp(rng.normal(0, prompt_sd, windows)) if prompt_sd else prompt[e]
        shift = (ttft_effect or {}).get(mode, 0.0) + tokens / 4000.0 - 1.0
        shift = shift + ttft_engine_sd * float(rng.normal())
        p90 = TTFT0 * np.exp(SLOPE * over + shift + rng.normal(0, 0.1, windows))
        tokens_per_request = tokens + 300.0
        requests = np.maximum(1.0, np.round(load * 60.0 / tokens_per_request))
        waiting = np.maximum(0.0, (offered - load) / tokens_per_request * 60.0)
        waiting = np.cumsum(waiting) * (offered > load)  # a queue that grows past saturation
        rows.append(
            pd.DataFrame(
                {
                    "source": f"e{e}",
                    "engine": "0",
                    "start": 1.8e9 + t,
                    "window_s": 60.0,
                    "offload_mode": mode,
                    "group": "g",
                    "tokens_per_s": load,
                    "prompt_tokens_per_s": load * tokens / tokens_per_request,
                    "output_tokens_per_s": load * 300.0 / tokens_per_request,
                    "preemptions": rng.poisson(np.where(over > 0, 5.0, 0.1)).astype(float),
                    "kv_util": np.minimum(1.0, load / cap),
                    "running": requests / 10.0,
                    "waiting": waiting,
                    "ttft_mean_s": p90 / 1.6,
                    "ttft_p50_s": p90 / 2.0,
                    "ttft_p90_s": p90,
                    "ttft_p99_s": p90 * 1.5,
                    "e2e_mean_s": p90 + 5.0,
                    "prompt_tokens_mean": tokens * np.ones(windows),
                    "requests": requests,
                }
            )
        )
    return pd.concat(rows, ignore_index=True)
