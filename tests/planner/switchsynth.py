"""Seeded synthetic switchback frames: one canary switched between none and native in periods,
control engines on none, a common time trend, AR(1) window noise and a carry-over ramp."""

from __future__ import annotations

import numpy as np
import pandas as pd

T0 = 1_700_000_000.0
WINDOW_S = 60.0


def switchback_frame(
    seed: int,
    *,
    effect: float,
    schedule: tuple[str, ...] | None = None,
    n_periods: int = 12,
    period_windows: int = 20,
    controls: int = 3,
    phi: float = 0.6,
    noise_sd: float = 0.05,
    ramp_windows: int = 3,
    requests_mean: float = 200.0,
) -> pd.DataFrame:
    """Rows of ``1 + controls`` engines over ``n_periods × period_windows`` 60 s windows.

    log tokens/s = engine level + common trend + common window shock + effect · d + AR(1),
    the AR(1) of marginal SD ``noise_sd`` running on across periods; d ramps linearly over
    ``ramp_windows`` windows after each switch (the CPU tier filling or emptying).
    ``schedule``: "on"/"off" per period (default: randomized pairs from ``seed``).
    """
    rng = np.random.default_rng(seed)
    if schedule is None:
        schedule = tuple(
            m for _ in range(n_periods // 2) for m in (("on", "off") if rng.random() < 0.5
                                                      else ("off", "on"))
        )  # fmt: skip
    n_periods = len(schedule)
    n = n_periods * period_windows
    t = np.arange(n)
    trend = 0.15 * np.sin(2 * np.pi * t / 480.0) + 0.0004 * t + rng.normal(0.0, 0.01, n)
    on = np.repeat([m == "on" for m in schedule], period_windows).astype(float)
    d = on.copy()  # carry-over: the effective treatment follows the mode with a lag
    step = 1.0 / max(ramp_windows, 1)
    for i in range(1, n):
        d[i] = min(d[i - 1] + step, 1.0) if on[i] else max(d[i - 1] - step, 0.0)
    rows = []
    for e in range(1 + controls):
        eps = np.empty(n)
        eps[0] = rng.normal(0.0, noise_sd)
        innov = rng.normal(0.0, noise_sd * np.sqrt(1 - phi**2), n)
        for i in range(1, n):
            eps[i] = phi * eps[i - 1] + innov[i]
        level = np.log(3000.0) + rng.normal(0.0, 0.2)
        canary = e == 0
        y = level + trend + eps + (effect * d if canary else 0.0)
        rows.append(
            pd.DataFrame(
                {
                    "source": f"vllm-{e}",
                    "engine": "0",
                    "start": T0 + WINDOW_S * t,
                    "window_s": WINDOW_S,
                    "offload_mode": np.where(on > 0, "native", "none") if canary else "none",
                    "tokens_per_s": np.exp(y),
                    "requests": rng.poisson(requests_mean, n).astype(float),
                    "prompt_tokens_mean": rng.normal(1500.0, 100.0, n),
                }
            )
        )
    return pd.concat(rows, ignore_index=True)
