"""Seeded synthetic clusters whose truth is known: parameter-recovery tests and benchmarks.

:func:`synthetic_frame` draws an :func:`planner.frames.frames.engine_frame`-shaped DataFrame from
the generative models the fits assume (with engine effects and serial correlation in
utilization, as real clusters have); :func:`frame_to_windows` turns such a frame back into
:class:`core.records.Window` records, so the frame builder can be tested end to end.
Nothing here is used to produce advice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy.signal import lfilter

from core.records import Kind, Labels, Window, labels_of

if TYPE_CHECKING:
    import numpy.typing as npt

# Llama-3.1-8B: 8.0e9 parameters, 32 layers, 32 query heads x 128 head_dim (model card).
LLAMA8B_PARAMS = 8.0e9
LLAMA8B_LAYERS = 32
LLAMA8B_D_ATTN = 32 * 128
# H100 SXM5 dense bf16 tensor throughput, 989 TFLOP/s (NVIDIA H100 datasheet).
H100_BF16_FLOPS = 989e12


def llama8b_prefill_flops(prompt_tokens: float) -> float:
    """Forward FLOPs of a prompt: ``2·N·S + 2·layers·S²·d_attn`` (Kaplan et al. 2020, Tab. 1)."""
    s = prompt_tokens
    return 2.0 * LLAMA8B_PARAMS * s + 2.0 * LLAMA8B_LAYERS * s * s * LLAMA8B_D_ATTN


@dataclass(frozen=True, slots=True)
class Truth:
    """The parameters :func:`synthetic_frame` draws from."""

    knee: float = 0.85  # utilization where preemptions start
    base_rate_per_s: float = 2e-4  # preemptions/s below the knee
    slope: float = 40.0  # log-rate increase per unit utilization above the knee
    # gain(u) = gain_slope * (u - break_even) tokens/s, per offload mode
    break_even: dict[str, float] = field(default_factory=lambda: {"native": 0.7, "lmcache": 0.6})
    gain_slope: float = 3000.0
    mfu: float = 0.35
    overhead_s: float = 0.04
    h_max: float = 0.6
    c0_bytes: float = 8e9


def synthetic_frame(
    n_engines: int = 12,
    n_windows: int = 720,
    *,
    seed: int = 0,
    truth: Truth | None = None,
    modes: tuple[str, ...] = ("none", "native", "lmcache"),
    util_range: dict[str, tuple[float, float]] | None = None,
    window_s: float = 60.0,
    noise_tokens_per_s: float = 300.0,
    engine_sd_tokens_per_s: float = 150.0,
) -> pd.DataFrame:
    """A frame of ``n_engines`` x ``n_windows`` windows drawn from known models.

    Engines take ``modes`` in turn. ``util_range`` optionally bounds each mode's
    utilization (to build data without overlap). Every RNG is ``numpy.random.default_rng(seed)``.
    """
    tr = truth or Truth()
    rng = np.random.default_rng(seed)
    e = np.repeat(np.arange(n_engines), n_windows)
    t = np.tile(np.arange(n_windows, dtype=float), n_engines)
    mode = np.array([modes[i % len(modes)] for i in range(n_engines)], dtype=object)[e]
    # Utilization: engine level + daily cycle + AR(1) noise, clipped to (0, 1].
    level = rng.uniform(0.35, 0.7, n_engines)[e]
    phase = rng.uniform(0, 2 * math.pi, n_engines)[e]
    ar = _ar1(rng, n_engines, n_windows, phi=0.9, sd=0.04)
    u = level + 0.28 * np.sin(2 * math.pi * t * window_s / 86400.0 * 8 + phase) + ar
    for m, (lo, hi) in (util_range or {}).items():
        sel = mode == m
        u[sel] = lo + (hi - lo) * (u[sel] - 0.05) / 0.95
    u = np.clip(u, 0.02, 1.0)
    h = np.maximum(0.0, u - tr.knee)
    pre = rng.poisson(window_s * tr.base_rate_per_s * np.exp(tr.slope * h))
    # Throughput: grows with utilization (bigger batches); offload adds gain(u).
    tok = 1500.0 + 9000.0 * u + rng.normal(0, engine_sd_tokens_per_s, n_engines)[e]
    for m, be in tr.break_even.items():
        tok = np.where(mode == m, tok + tr.gain_slope * (u - be), tok)
    tok = np.maximum(tok + rng.normal(0.0, noise_tokens_per_s, e.size), 50.0)
    prompt_share = rng.uniform(0.6, 0.9, e.size)
    running = rng.poisson(1.0 + 60.0 * u**2).astype(float)
    waiting = np.where(u > 0.9, rng.poisson(100.0 * np.maximum(u - 0.9, 0.0)), 0).astype(float)
    prefix_hit = np.clip(rng.beta(0.6, 2.0, e.size), 0.0, 1.0)
    prompt_mean = np.exp(rng.normal(math.log(1500.0), 0.8, e.size))
    # uncached tokens attend to the cached ones: F(P) − F(h·P) (planner.fit.mfu)
    flops = np.array([llama8b_prefill_flops(p) for p in prompt_mean]) - np.array(
        [llama8b_prefill_flops(p) for p in prompt_mean * prefix_hit]
    )
    ttft = (
        tr.overhead_s
        + flops / (tr.mfu * H100_BF16_FLOPS)
        + 0.05 * np.maximum(running - 2.0, 0.0)  # queueing under load
        + rng.normal(0.0, 0.01, e.size)
    )
    requests = rng.poisson(2.0 + 20 * u, e.size).astype(float)
    # LMCache L1: usage fills towards each engine's capacity; hit ratio follows the curve.
    cap = rng.uniform(2e9, 48e9, n_engines)[e]
    usage = cap * (1 - np.exp(-(t + 1) / rng.uniform(30, 400, n_engines)[e]))
    curve = tr.h_max * (1 - np.exp(-usage / tr.c0_bytes))
    # Beta with mean = curve: binomial-like spread (sd ≈ 0.07·sqrt(h(1-h))), within [0, 1].
    kappa = 200.0
    hit = rng.beta(np.maximum(curve, 1e-9) * kappa, (1 - curve) * kappa)
    is_lm = mode == "lmcache"
    nan = np.full(e.size, np.nan)
    return pd.DataFrame(
        {
            "source": np.array([f"engine-{i:03d}" for i in range(n_engines)], dtype=object)[e],
            "engine": "0",
            "start": 1.8e9 + t * window_s,
            "window_s": window_s,
            "offload_mode": mode,
            "tokens_per_s": tok,
            "prompt_tokens_per_s": tok * prompt_share,
            "output_tokens_per_s": tok * (1 - prompt_share),
            "preemptions": pre.astype(float),
            "kv_util": u,
            "kv_util_max": np.minimum(u + 0.03, 1.0),
            "running": running,
            "waiting": waiting,
            "prefix_hit_ratio": prefix_hit,
            "prefix_queries": tok * prompt_share * window_s,
            "external_hit_ratio": nan,
            "ttft_mean_s": ttft,
            "ttft_p50_s": ttft * 0.8,
            "ttft_p90_s": ttft * 1.5,
            "ttft_p99_s": ttft * 2.5,
            "ttft_count": requests,
            "e2e_mean_s": ttft + 4.0,
            "prompt_tokens_mean": prompt_mean,
            "requests": requests,
            "lmcache_hit_ratio": np.where(is_lm, np.clip(hit, 0, 1), nan),
            "lmcache_requested_tokens": np.where(is_lm, tok * prompt_share * window_s, nan),
            "l1_usage_bytes": np.where(is_lm, usage, nan),
            "l1_usage_ratio": np.where(is_lm, usage / cap, nan),
            "l1_evicted_chunks": np.where(is_lm, np.where(usage > 0.98 * cap, 10.0, 0.0), nan),
            "offload_cpu_usage_ratio": nan,
        }
    )


def _ar1(
    rng: np.random.Generator, rows: int, cols: int, phi: float, sd: float
) -> npt.NDArray[np.float64]:
    """Stationary AR(1) paths, one per row, flattened row-major."""
    eps = rng.normal(0.0, sd * math.sqrt(1 - phi * phi), (rows, cols))
    eps[:, 0] = rng.normal(0.0, sd, rows)
    out: npt.NDArray[np.float64] = lfilter([1.0], [1.0, -phi], eps, axis=1).ravel()
    return out


def frame_to_windows(frame: pd.DataFrame) -> list[Window]:
    """Window records that :func:`planner.frames.frames.engine_frame` turns back into ``frame``.

    ``request_success_total`` is split over two ``finished_reason`` series and the LMCache
    series carry no ``engine`` label (as on a real LMCache server), to exercise combining.
    """

    def num(column: str) -> list[float]:
        values: list[float] = frame[column].to_numpy(dtype=float).tolist()
        return values

    col = {c: num(c) for c in frame.columns if c not in ("source", "engine", "offload_mode")}
    sources = [str(s) for s in frame["source"].tolist()]
    engines = [str(e) for e in frame["engine"].tolist()]
    out: list[Window] = []
    lm = labels_of({"worker_id": "0", "model_name": "m"})
    for i, source in enumerate(sources):
        v = {"engine": engines[i], "model_name": "m"}
        lab = labels_of(v)
        length = col["window_s"][i]
        start = col["start"][i]

        def w(signal: str, kind: Kind, labels: Labels, **kw: float) -> None:
            vals = {k: x for k, x in kw.items() if not math.isnan(x)}
            if vals:
                out.append(
                    Window(source=source, signal=signal, labels=labels, start=start,  # noqa: B023
                           length_s=length, kind=kind, samples=4, **vals)  # type: ignore[arg-type]  # noqa: B023
                )  # fmt: skip

        def c(name: str) -> float:
            return col[name][i]  # noqa: B023

        w("preemptions_total", "counter", lab, delta=c("preemptions"))
        prompt = c("prompt_tokens_per_s")
        w("prompt_tokens_total", "counter", lab, rate=prompt, delta=prompt * length)
        w("generation_tokens_total", "counter", lab, rate=c("output_tokens_per_s"))
        w("kv_cache_usage_ratio", "gauge", lab, mean=c("kv_util"), max=c("kv_util_max"))
        w("requests_running", "gauge", lab, mean=c("running"))
        w("requests_waiting", "gauge", lab, mean=c("waiting"))
        w("prefix_cache_hit_ratio", "ratio", lab, mean=c("prefix_hit_ratio"),
          delta=c("prefix_queries"))  # fmt: skip
        tc = c("ttft_count")
        w("ttft_seconds", "histogram", lab, delta=tc, sum_delta=c("ttft_mean_s") * tc,
          p50=c("ttft_p50_s"), p90=c("ttft_p90_s"), p99=c("ttft_p99_s"))  # fmt: skip
        req = c("requests")
        w("e2e_latency_seconds", "histogram", lab, delta=req, sum_delta=c("e2e_mean_s") * req)
        w("request_prompt_tokens", "histogram", lab, delta=req,
          sum_delta=c("prompt_tokens_mean") * req)  # fmt: skip
        half = float(np.floor(req / 2))
        for reason, d in (("stop", half), ("length", req - half)):
            w("request_success_total", "counter", labels_of({**v, "finished_reason": reason}),
              delta=d)  # fmt: skip
        asked = c("lmcache_requested_tokens")
        w("lmcache_requested_tokens_total", "counter", lm, delta=asked)
        w("lmcache_hit_tokens_total", "counter", lm, delta=c("lmcache_hit_ratio") * asked)
        w("lmcache_l1_usage_bytes", "gauge", lm, mean=c("l1_usage_bytes"))
        w("lmcache_l1_usage_ratio", "gauge", lm, mean=c("l1_usage_ratio"))
        w("lmcache_l1_evicted_chunks_total", "counter", lm, delta=c("l1_evicted_chunks"))
    return out
