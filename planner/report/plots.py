"""PNG plots of a plan's fits and forecast (`kvscope plan --plots DIR`).

One file per fit that ran (preemption hinge, throughput and gain per offload mode, KV demand
forecast against capacity, LMCache hit-rate curve, the CPU tier via plot_tier.py).
:func:`write_plots` writes files, :func:`plot_pngs` the same figures as PNG bytes (the HTML
report inlines them). matplotlib (Agg) is imported inside the functions only.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Generator
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from core.errors import ConfigError
from planner.fit.gain import GainFit
from planner.fit.hitrate import HitRateFit
from planner.fit.preempt import PreemptionFit
from planner.report.plot_tier import tier_figure

if TYPE_CHECKING:
    from planner.plan import Plan

GIB = 1024**3
# The files write_plots may write (each only when its fit or forecast ran).
PLOT_FILES = (
    "preemptions_vs_kv_util.png",
    "throughput_vs_kv_util.png",
    "kv_demand_forecast.png",
    "lmcache_hit_rate.png",
    "cpu_tier_hit_ratio.png",
)
MODE_COLOURS = {"none": "tab:gray", "native": "tab:blue", "lmcache": "tab:orange"}
MAX_POINTS = 4000  # scatter points per series (a seeded subsample beyond)
NOTE_FONT_PT = 9
# Average glyph width of DejaVu Sans (matplotlib's default) is ~0.55 em: characters per line
# of a note = figure width in points / (font size × 0.55).
GLYPH_EM = 0.55


def write_plots(plan: Plan, directory: Path, *, seed: int = 0) -> list[Path]:
    """Write the PNGs into ``directory`` (created if needed); return the paths written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--plots {directory}: cannot create directory: {exc}") from exc
    written: list[Path] = []
    with closing(_figures(plan, seed)) as figures:
        for name, fig in figures:
            path = directory / name
            try:
                _save_png(fig, path)
            except OSError as exc:
                raise ConfigError(f"--plots: cannot write {path}: {exc}") from exc
            written.append(path)
    return written


def plot_pngs(plan: Plan, *, seed: int = 0) -> dict[str, bytes]:
    """The same PNGs as :func:`write_plots`, rendered in memory: PLOT_FILES name -> bytes
    (only the plots whose fit or forecast ran, in PLOT_FILES order)."""
    out: dict[str, bytes] = {}
    with closing(_figures(plan, seed)) as figures:
        for name, fig in figures:
            buf = io.BytesIO()
            _save_png(fig, buf)
            out[name] = buf.getvalue()
    return out


def _figures(plan: Plan, seed: int) -> Generator[tuple[str, Any], None, None]:
    """(PLOT_FILES name, figure) of each plot that can be drawn; the caller saves the figure
    before asking for the next one, which closes it (closing the iterator closes the last)."""
    import matplotlib  # noqa: PLC0415 - start-up: matplotlib (~0.3 s) loads when a plot is drawn, not on `import planner.report`

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - start-up: matplotlib (~0.3 s) loads when a plot is drawn, not on `import planner.report`

    makers = (_preemptions, _throughput, _forecast, _hitrate, _cpu_tier)
    for name, make in zip(PLOT_FILES, makers, strict=True):
        fig = make(plan, seed)
        if fig is None:
            continue
        try:
            yield name, fig
        finally:
            plt.close(fig)


def _save_png(fig: Any, target: Path | BinaryIO) -> None:
    fig.savefig(target, format="png", dpi=100, bbox_inches="tight")


def _note(fig: Any, lines: list[str]) -> None:
    """Put the "cannot tell" reasons in a box under the axes, wrapped to the figure's
    width (a long title would be clipped or squeeze the plot)."""
    if not lines:
        return
    width = fig.get_figwidth() * 72 / (NOTE_FONT_PT * GLYPH_EM)
    text = "\n".join(textwrap.fill(line, max(40, int(width * 0.95))) for line in lines)
    fig.text(
        0.5,
        -0.01,
        text,
        ha="center",
        va="top",
        multialignment="left",
        fontsize=NOTE_FONT_PT,
        bbox={"boxstyle": "round,pad=0.4", "facecolor": "#fff6e0", "edgecolor": "#c8a040"},
    )


def _title(base: str, can_tell: bool) -> str:
    return base if can_tell else f"{base}\n(cannot tell: see the note below)"


def _sample(n: int, seed: int) -> Any:
    if n <= MAX_POINTS:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, MAX_POINTS, replace=False))


_UTIL_LABEL = {
    "kv_util": "kv_util (window mean)",
    "kv_util_max": "kv_util_max (largest scraped sample in the window)",
}


def _preemptions(plan: Plan, seed: int) -> Any:
    import matplotlib.pyplot as plt  # noqa: PLC0415 - start-up: matplotlib (~0.3 s) loads when a plot is drawn, not on `import planner.report`

    fit = plan.details.fits["preemption_knee"].result
    if not isinstance(fit, PreemptionFit):
        return None
    col = fit.util_column
    data = plan.details.frame.dropna(subset=[col, "preemptions", "window_s"])
    data = data[data["window_s"] > 0]
    u = data[col].to_numpy(dtype=float)
    rate = data["preemptions"].to_numpy(dtype=float) / data["window_s"].to_numpy(dtype=float) * 60
    fig, ax = plt.subplots(figsize=(8, 5))
    idx = _sample(u.size, seed)
    ax.scatter(u[idx], rate[idx], s=6, alpha=0.3, color="tab:gray", label="windows")
    if math.isfinite(fit.estimate):
        grid = np.linspace(float(u.min()), float(u.max()), 200)
        k = fit.estimate

        def curve(base: float, slope: float) -> Any:
            # a steep upper slope bound overflows to inf far above the knee: the band is
            # drawn up to the axes' top (set from the data below), not an error
            with np.errstate(over="ignore"):
                return base * np.exp(slope * np.maximum(0.0, grid - k)) * 60

        ax.plot(
            grid,
            curve(fit.base_rate.value, fit.slope.value),
            color="tab:red",
            label=f"hinge fit ({fit.family})",
        )
        b, s = fit.base_rate.interval, fit.slope.interval
        if all(math.isfinite(v) for v in (b.lo, b.hi, s.lo, s.hi)):
            ax.fill_between(
                grid,
                curve(b.lo, s.lo),
                curve(b.hi, s.hi),
                color="tab:red",
                alpha=0.15,
                label="band (base rate × slope intervals)",
            )
        ax.axvline(k, color="black", lw=1, label=f"knee {k:.3f}")
        if math.isfinite(fit.interval.lo) and math.isfinite(fit.interval.hi):
            ax.axvspan(
                fit.interval.lo,
                fit.interval.hi,
                color="black",
                alpha=0.08,
                label=f"knee {fit.interval.level:.0%} interval",
            )
        top = float(np.quantile(rate, 0.995)) if rate.size else 1.0
        ax.set_ylim(0, max(top, float(curve(fit.base_rate.value, fit.slope.value).max())) * 1.1)
    ax.set_xlabel(_UTIL_LABEL.get(col, col))
    ax.set_ylabel("preemptions per minute")
    ax.set_title(_title("Preemptions vs KV-cache utilization", fit.can_tell))
    ax.legend(loc="upper left", fontsize=8)
    _note(fig, [] if fit.can_tell else [f"Knee: cannot tell: {fit.why}"])
    return fig


def _throughput(plan: Plan, seed: int) -> Any:
    import matplotlib.pyplot as plt  # noqa: PLC0415 - start-up: matplotlib (~0.3 s) loads when a plot is drawn, not on `import planner.report`

    fits = [plan.details.fits[n].result for n in ("equal_kv_native", "equal_kv_lmcache")]
    gains = [f for f in fits if isinstance(f, GainFit) and f.grid]
    frame = plan.details.frame.dropna(subset=["kv_util", "tokens_per_s"])
    if not gains or frame.empty:
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 8), sharex=True)
    for mode, sub in frame.groupby(frame["offload_mode"].astype(str)):
        idx = _sample(len(sub), seed)
        top.scatter(
            sub["kv_util"].to_numpy()[idx],
            sub["tokens_per_s"].to_numpy()[idx],
            s=5,
            alpha=0.25,
            color=MODE_COLOURS.get(str(mode), "tab:green"),
            label=str(mode),
        )
    drew_none = False
    for fit in gains:
        colour = MODE_COLOURS.get(fit.offload, "tab:green")
        pts = [p for p in fit.grid if abs(p.relative) > 1e-12]
        u = np.array([p.u for p in pts])
        none = np.array([p.gain / p.relative for p in pts])  # relative = gain / none(u)
        mode_curve = none + np.array([p.gain for p in pts])
        if not drew_none and u.size:
            top.plot(u, none, color="black", lw=2, label="none (fitted)")
            drew_none = True
        top.plot(u, mode_curve, color=colour, lw=2, label=f"{fit.offload} (fitted)")
        gu = np.array([p.u for p in fit.grid])
        g = np.array([p.relative for p in fit.grid]) * 100
        lo = np.array([p.relative_interval.lo for p in fit.grid]) * 100
        hi = np.array([p.relative_interval.hi for p in fit.grid]) * 100
        bottom.plot(gu, g, color=colour, lw=2, label=f"{fit.offload} vs none")
        bottom.fill_between(gu, lo, hi, color=colour, alpha=0.2)
        if fit.verdict == "crosses" and math.isfinite(fit.estimate):
            bottom.axvline(
                fit.estimate,
                color=colour,
                ls="--",
                lw=1,
                label=f"{fit.offload} break-even {fit.estimate:.2f}",
            )
            if math.isfinite(fit.interval.lo) and math.isfinite(fit.interval.hi):
                bottom.axvspan(fit.interval.lo, fit.interval.hi, color=colour, alpha=0.1)
    bottom.axhline(0, color="black", lw=0.8)
    top.set_ylabel("tokens/s per engine")
    notes = [f"{f.offload} at equal KV use: cannot tell: {f.why}" for f in gains if not f.can_tell]
    notes.append("a diagnostic: offload itself lowers KV use; capacity at the SLO is in the plan")
    top.set_title(_title("Diagnostic: tokens/s vs KV-cache use by offload mode", not notes[:-1]))
    # legends beside the axes: inside they hide the scatter
    top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    bottom.set_xlabel("kv_util (window mean)")
    bottom.set_ylabel("tokens/s vs none at equal KV use, % (95 % band)")
    bottom.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _note(fig, notes)
    return fig


def _forecast(plan: Plan, seed: int) -> Any:
    import matplotlib.pyplot as plt  # noqa: PLC0415 - start-up: matplotlib (~0.3 s) loads when a plot is drawn, not on `import planner.report`

    fc, series = plan.details.forecasts.kv, plan.details.forecasts.kv_series
    cap = plan.details.forecasts.capacity
    if fc is None or series is None or not fc.points:
        return None
    fig, ax = plt.subplots(figsize=(9, 5))
    t0 = float(series.index.min())
    hours = (series.index.to_numpy(dtype=float) - t0) / 3600
    ax.plot(hours, series.to_numpy(dtype=float), color="tab:gray", lw=0.8, label="history")
    pts = np.array(fc.points, dtype=float)
    ph = (pts[:, 0] - t0) / 3600
    ax.plot(ph, pts[:, 1], color="tab:blue", lw=2, label=f"forecast ({fc.method})")
    ax.fill_between(
        ph, pts[:, 2], pts[:, 3], color="tab:blue", alpha=0.2, label=f"{fc.level:.0%} interval"
    )
    if cap is not None:
        ax.axhline(cap.total, color="tab:red", ls="--", label=f"HBM KV capacity ({cap.unit})")
    if fc.time_to_saturation_s is not None:
        ax.axvline(
            (fc.origin_epoch + fc.time_to_saturation_s - t0) / 3600,
            color="tab:red",
            lw=1,
            label="saturation (point forecast)",
        )
    ax.set_xlabel("hours since the first window")
    ax.set_ylabel(f"KV demand ({cap.unit if cap else 'units'}, bucket peak)")
    ax.set_title("KV demand forecast against HBM KV capacity")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def _hitrate(plan: Plan, seed: int) -> Any:
    import matplotlib.pyplot as plt  # noqa: PLC0415 - start-up: matplotlib (~0.3 s) loads when a plot is drawn, not on `import planner.report`

    fit = plan.details.fits["lmcache_hitrate"].result
    if not isinstance(fit, HitRateFit) or not fit.coef:
        return None
    data = plan.details.frame.dropna(subset=["l1_usage_bytes", "lmcache_hit_ratio"])
    fig, ax = plt.subplots(figsize=(8, 5))
    idx = _sample(len(data), seed)
    ax.scatter(
        data["l1_usage_bytes"].to_numpy()[idx] / GIB,
        data["lmcache_hit_ratio"].to_numpy()[idx],
        s=5,
        alpha=0.3,
        color="tab:gray",
        label="windows",
    )
    lo, hi = fit.size_range
    seen = np.geomspace(lo, hi, 300)
    beyond = np.geomspace(hi, 4 * hi, 100)
    band = fit.curve_interval(seen)
    ax.fill_between(seen / GIB, band[0], band[1], color="tab:orange", alpha=0.2, lw=0)
    ax.plot(
        seen / GIB,
        fit.curve(seen),
        color="tab:orange",
        lw=2,
        label=f"binomial GLM, {fit.spline_df}-df spline in ln L1",
    )
    ax.plot(beyond / GIB, fit.curve(beyond), color="tab:orange", lw=1, ls="--",
            label="extrapolated")  # fmt: skip
    for p in fit.predictions:
        ax.errorbar(
            p.size_bytes / GIB,
            p.hit_ratio,
            yerr=[[p.hit_ratio - p.interval.lo], [p.interval.hi - p.hit_ratio]],
            fmt="o",
            color="tab:red",
            ms=4,
            capsize=3,
        )
    ax.set_xlabel("LMCache L1 in use (GiB)")
    ax.set_ylabel("LMCache hit ratio (tokens)")
    ax.set_title(_title("LMCache hit rate vs L1 size", fit.can_tell))
    ax.legend(fontsize=8, loc="lower right")
    _note(fig, [] if fit.can_tell else [f"Hit-rate curve: cannot tell: {fit.why}"])
    return fig


def _cpu_tier(plan: Plan, seed: int) -> Any:
    drawn = tier_figure(plan.to_dict().get("cpu_tier"))
    if drawn is None:
        return None
    fig, notes = drawn
    _note(fig, notes)
    return fig
