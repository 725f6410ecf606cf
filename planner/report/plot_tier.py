"""The plot of "What a CPU tier would buy" (the plan's ``cpu_tier`` section,
planner/plan/tier.py): prefix-cache hit ratio against CPU tier size.

One panel per tier with a curve: vLLM's native CPU offload (x: GiB per engine) and an LMCache
L1 pool (x: GiB per node pool, a lower bound). Each shows the modelled curve with its
model-based interval (never a confidence interval), today's hit ratio at 0 GiB (HBM only, as
vLLM counted it), the HBM KV size, and the recommended size; the part of the curve past the
HBM eviction time is extrapolated and drawn dashed. planner/report/plots.py draws it with
the other plots; matplotlib is imported inside the function only.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["TIER_MODES", "TierCurve", "tier_curves", "tier_figure"]

# (section key, panel title, what the x axis is in GiB of)
TIER_MODES = (
    ("native", "vLLM native CPU offload", "CPU tier"),
    ("lmcache", "LMCache L1 pool", "LMCache L1"),
)
TITLE_CHARS = 60  # a panel title's line length (the scope can be long)
COLOURS = {"native": "tab:blue", "lmcache": "tab:orange"}


def _num(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return float(x)


class TierCurve:
    """One tier's curve as drawn: sizes, hit ratios and interval ends (None: unknown), which
    points are extrapolated, the HBM size on the same axis and the recommended size."""

    __slots__ = ("extrapolated", "gib", "hbm_gib", "hi", "hit", "lo", "recommended", "tier")

    def __init__(self, tier: Mapping[str, Any], hbm_per_engine: float | None) -> None:
        points = [p for p in tier.get("curve") or () if isinstance(p, Mapping)]
        points = [
            p
            for p in points
            if _num(p.get("gib")) is not None and _num(p.get("hit_ratio")) is not None
        ]
        points.sort(key=lambda p: float(p["gib"]))
        self.tier = tier
        self.gib = [float(p["gib"]) for p in points]
        self.hit = [float(p["hit_ratio"]) for p in points]
        self.lo = [_num(p.get("lo")) for p in points]
        self.hi = [_num(p.get("hi")) for p in points]
        rows = [r for r in tier.get("rows") or () if isinstance(r, Mapping)]
        if any("extrapolated" in p for p in points):
            self.extrapolated = [bool(p.get("extrapolated")) for p in points]
        else:  # the rows say which sizes are; past the largest one that is not, the curve is
            within = [
                g
                for r in rows
                if r.get("extrapolated") is False and (g := _num(r.get("gib"))) is not None
            ]
            edge = max(within, default=0.0)
            self.extrapolated = [g > edge for g in self.gib]
        # the HBM size on this axis: a row's size over its multiple (a pool's HBM for LMCache)
        sizes = [
            g / m
            for r in rows
            if r.get("label") != "recommended"
            and (g := _num(r.get("gib"))) is not None
            and (m := _num(r.get("multiple")))
        ]
        self.hbm_gib = sizes[0] if sizes else hbm_per_engine
        rec = tier.get("recommended")
        self.recommended = _num(rec.get("gib")) if isinstance(rec, Mapping) else None


def tier_curves(section: Mapping[str, Any] | None) -> dict[str, TierCurve]:
    """The tiers of a ``cpu_tier`` section that have a curve to draw (none when the section
    is missing, cannot tell, or has no curve)."""
    if not isinstance(section, Mapping) or not section.get("can_tell"):
        return {}
    hbm = section.get("hbm")
    per_engine = _num(hbm.get("gib_per_engine")) if isinstance(hbm, Mapping) else None
    out = {}
    for key, _, _ in TIER_MODES:
        tier = section.get(key)
        if isinstance(tier, Mapping):
            curve = TierCurve(tier, per_engine)
            if len(curve.gib) >= 2:
                out[key] = curve
    return out


def _segments(flags: Sequence[bool]) -> list[tuple[int, int, bool]]:
    """Runs of equal flags as (first, last, flag), each run sharing its first point with the
    previous run's last (so the drawn line is continuous)."""
    runs: list[tuple[int, int, bool]] = []
    start = 0
    for i in range(1, len(flags) + 1):
        if i == len(flags) or flags[i] != flags[start]:
            runs.append((max(start - 1, 0) if runs else start, i - 1, flags[start]))
            start = i
    return runs


def _panel(
    ax: Any, key: str, curve: TierCurve, *, title: str, xlabel: str, today: float | None, level: str
) -> list[str]:
    """Draw one tier; return the lines of its note (cannot-tell sizes)."""
    colour = COLOURS[key]
    named: set[bool] = set()
    for first, last, extrap in _segments(curve.extrapolated):
        xs, ys = curve.gib[first : last + 1], curve.hit[first : last + 1]
        label = "extrapolated past the HBM eviction time" if extrap else "modelled"
        style = "--" if extrap else "-"
        ax.plot(xs, ys, color=colour, lw=2, ls=style, label=None if extrap in named else label)
        named.add(extrap)
    band = [
        (g, lo, hi)
        for g, lo, hi in zip(curve.gib, curve.lo, curve.hi, strict=True)
        if lo is not None and hi is not None
    ]
    if band:
        bx, blo, bhi = zip(*band, strict=True)
        label = f"{level} model-based interval (not a confidence interval)"
        ax.fill_between(bx, blo, bhi, color=colour, alpha=0.18, lw=0, label=label)
    if today is not None:
        label = f"today, HBM only: {today * 100:.1f} % (measured)"
        ax.plot([0.0], [today], "o", color="black", ms=7, zorder=5, label=label)
    if curve.hbm_gib:
        label = f"1× HBM KV ({curve.hbm_gib:,.1f} GiB)"
        ax.axvline(curve.hbm_gib, color="tab:gray", ls=":", lw=1, label=label)
    rec = curve.recommended
    if rec is not None:
        said = (curve.tier.get("recommended") or {}).get("extrapolated")
        extra = " (extrapolated)" if said else ""
        ax.axvline(rec, color="tab:red", lw=1.5, label=f"recommended {rec:,.0f} GiB{extra}")
    scope = str(curve.tier.get("scope") or "")
    bound = "; a lower bound" if curve.tier.get("lower_bound") else ""
    head = f"{title} ({scope}{bound})" if scope else title
    ax.set_title(textwrap.fill(head, TITLE_CHARS), fontsize=9)
    # "per engine (node topology unknown: …)" -> "GiB per engine"
    per = scope.split(" (", 1)[0] if scope.startswith("per ") else "per engine or pool"
    ax.set_xlabel(f"{xlabel}, GiB {per}")
    ax.set_xlim(left=-0.02 * max(curve.gib[-1], 1.0))  # today's point at 0 stays inside
    ax.legend(fontsize=7, loc="upper left")
    notes = [
        f"{title}, {r.get('label')}: cannot tell ({r.get('why')})"
        for r in curve.tier.get("rows") or ()
        if isinstance(r, Mapping) and r.get("can_tell") is False
    ]
    rec_entry = curve.tier.get("recommended")
    if rec is None and isinstance(rec_entry, Mapping) and rec_entry.get("why"):
        notes.append(f"{title}: no recommended size ({rec_entry['why']})")
    if rec is not None and rec > curve.gib[-1]:
        notes.append(
            f"{title}: the recommended {rec:,.0f} GiB lies past the curve's end "
            f"({curve.gib[-1]:,.1f} GiB)"
        )
    return notes


def tier_figure(section: Mapping[str, Any] | None) -> tuple[Any, list[str]] | None:
    """The figure of a ``cpu_tier`` section and the lines of its note (the caller puts them
    under the axes), or None when no tier has a curve."""
    curves = tier_curves(section)
    if not curves or section is None:
        return None
    import matplotlib.pyplot as plt  # noqa: PLC0415 - start-up: matplotlib (~0.3 s) loads when a plot is drawn, not on `import planner.report`

    hbm = section.get("hbm")
    today = _num(hbm.get("hit_ratio_measured")) if isinstance(hbm, Mapping) else None
    level_num = _num(section.get("level"))
    level = f"{level_num * 100:.0f} %" if level_num is not None else "the"
    panels = [(k, t, x) for k, t, x in TIER_MODES if k in curves]
    size = (6 * len(panels), 5)
    fig, axes = plt.subplots(1, len(panels), figsize=size, sharey=True, squeeze=False)
    notes: list[str] = []
    for ax, (key, title, xlabel) in zip(axes[0], panels, strict=True):
        notes += _panel(ax, key, curves[key], title=title, xlabel=xlabel, today=today, level=level)
    axes[0][0].set_ylabel("prefix-cache hit ratio, HBM + tier")
    fig.suptitle("What a CPU tier would buy: prefix hit ratio vs CPU tier size (modelled)", y=1.04)
    if section.get("interval"):
        notes.append(str(section["interval"]))
    if section.get("engines_without"):
        notes.append("engines without a curve: " + ", ".join(map(str, section["engines_without"])))
    return fig, notes
