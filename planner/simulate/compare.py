"""Offload modes side by side, optionally over a sweep of one numeric scenario key.

For every sweep value the scenario runs once per mode (all engines in that mode, same seed,
same requests); gains are relative to `none`. A break-even of a mode is a value of the swept
key where its throughput gain crosses zero, linearly interpolated between neighbouring sweep
values, reported with its direction: the sign the gain takes as the key rises past it. A
gain can cross zero more than once (every crossing is listed); `break_even` keeps the first.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from planner.simulate.cluster import Simulation
from planner.simulate.results import SimResult
from planner.simulate.scenario import OFFLOAD_MODES, parse_scenario, resolve_dotted, set_dotted

# what each mode's row shows (summary keys of SimResult)
FIGURES = (
    "total_tokens_per_s",
    "output_tokens_per_s",
    "ttft_mean_s",
    "e2e_mean_s",
    "preemptions",
    "reprefill_tokens",
    "avoided_reprefill_tokens",
    "prefix_hit_rate",
    "external_hit_rate",
    "kv_usage_mean",
    "completed_requests",
    "async_loads",
    "load_wait_mean_s",
    "preempted_after_load",
    "max_preemptions_per_request",
    "pcie_load_busy_max",
)
CROSSING_NOTE = (
    "value of the swept key where the throughput gain vs none crosses zero, linearly "
    "interpolated between the sweep points in `between`; gain_turns = the sign of the gain "
    "just above the value as the key rises (positive: the mode starts to pay off, negative: "
    "it stops paying off)"
)


@dataclass(frozen=True, slots=True)
class Sweep:
    key: str  # full dotted key
    values: tuple[float, ...]


def parse_modes(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip().lower() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in OFFLOAD_MODES]
    if bad or not modes:
        raise ConfigError(
            f"--compare: unknown mode {bad[0] if bad else text!r}; "
            f"known: {', '.join(OFFLOAD_MODES)}"
        )
    if len(set(modes)) != len(modes):
        raise ConfigError(f"--compare: a mode is repeated in {text!r}")
    return modes if "none" in modes else ("none", *modes)


def parse_sweep(text: str) -> Sweep:
    """`key=start:stop:step` (stop included) or `key=v1,v2,…`."""
    key, sep, spec = text.partition("=")
    if not sep or not key.strip() or not spec.strip():
        raise ConfigError(f"--sweep: expected key=start:stop:step or key=v1,v2, got {text!r}")
    try:
        if ":" in spec:
            parts = [float(p) for p in spec.split(":")]
            if len(parts) != 3:
                raise ValueError
            start, stop, step = parts
            if step <= 0 or stop < start:
                raise ConfigError(f"--sweep {text!r}: need step > 0 and stop >= start")
            n = math.floor((stop - start) / step + 1e-9) + 1
            if n > 1000:
                raise ConfigError(f"--sweep {text!r}: {n} points, at most 1000")
            values = tuple(round(start + i * step, 10) for i in range(n))
        else:
            values = tuple(float(v) for v in spec.split(","))
    except ValueError as exc:
        raise ConfigError(f"--sweep: values of {text!r} must be numbers") from exc
    if all(float(v).is_integer() for v in values) and "." not in spec:
        values = tuple(int(v) for v in values)
    return Sweep(resolve_dotted(key.strip()), values)


def break_even(points: Sequence[tuple[float, float]]) -> float | None:
    """First x where y crosses zero (linear interpolation), None when it never does."""
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if y0 == 0.0:
            return x0
        if (y0 < 0.0 < y1) or (y1 < 0.0 < y0):
            return x0 + (0.0 - y0) * (x1 - x0) / (y1 - y0)
    if points and points[-1][1] == 0.0:
        return points[-1][0]
    return None


def crossings(points: Sequence[tuple[float, float]]) -> list[dict[str, Any]]:
    """Every zero crossing of y as x rises: {"value", "gain_turns", "between": [x0, x1]}.

    gain_turns is "positive" or "negative" (the sign just above the crossing), or "zero" when
    y ends the sweep at exactly zero. A run of zeros between two signs crosses at its first x;
    touching zero without changing sign is not a crossing."""
    out: list[dict[str, Any]] = []
    last: tuple[float, float, int] | None = None  # last point with y != 0
    zero_at: float | None = None  # first x of the zeros since then
    for x, y in sorted(points):
        sign = (y > 0.0) - (y < 0.0)
        if sign == 0:
            zero_at = x if zero_at is None else zero_at
            continue
        if last is None or sign != last[2]:
            if zero_at is not None:
                at, lo = zero_at, zero_at if last is None else last[0]
            elif last is not None:
                at, lo = last[0] + (0.0 - last[1]) * (x - last[0]) / (y - last[1]), last[0]
            else:
                at = None
            if at is not None:
                turns = "positive" if sign > 0 else "negative"
                out.append({"value": _round(at), "gain_turns": turns, "between": [lo, x]})
        last, zero_at = (x, y, sign), None
    if zero_at is not None and last is not None:
        out.append({"value": zero_at, "gain_turns": "zero", "between": [last[0], zero_at]})
    return out


def run_raw(raw: Mapping[str, Any], where: str, base_dir: Path | None = None) -> SimResult:
    result = Simulation(parse_scenario(raw, where=where, base_dir=base_dir)).run()
    return result


def compare(
    raw: Mapping[str, Any],
    modes: Sequence[str],
    sweep: Sweep | None = None,
    *,
    where: str = "scenario",
    base_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every (sweep value, mode); returns the JSON-ready comparison."""
    say = progress or (lambda msg: print(msg, file=sys.stderr))
    values: tuple[Any, ...] = sweep.values if sweep else (None,)
    points: list[dict[str, Any]] = []
    for value in values:
        base = set_dotted(raw, sweep.key, value) if sweep else dict(raw)
        rows: dict[str, dict[str, Any]] = {}
        label = f"{sweep.key}={value} " if sweep else ""
        try:
            for mode in modes:
                run = set_dotted(base, "cluster.offload", mode)
                run = set_dotted(run, "cluster.engines_offload", None)
                if isinstance(run.get("cluster"), dict) and "switchback" in run["cluster"]:
                    run = set_dotted(run, "cluster.switchback", None)  # one mode throughout
                say(f"kvscope simulate: {label}offload={mode} …")
                res = run_raw(run, where, base_dir)
                rows[mode] = {k: res.summary[k] for k in FIGURES}
        except ConfigError as exc:
            if not sweep:
                raise
            say(f"kvscope simulate: {label}skipped: {exc}")
            points.append({"value": value, "error": str(exc), "modes": {}})
            continue
        base_tp = rows["none"]["total_tokens_per_s"] or 0.0
        for row in rows.values():
            tp = row["total_tokens_per_s"] or 0.0
            row["throughput_gain"] = round(tp / base_tp - 1.0, 6) if base_tp else None
        points.append({"value": value, "modes": rows})
    summary: dict[str, Any] = {"modes": list(modes), "sweep_key": sweep.key if sweep else None}
    summary["points"] = points
    summary["break_even"] = {}
    summary["break_even_crossings"] = {}
    summary["break_even_note"] = CROSSING_NOTE
    for mode in modes:
        if mode == "none":
            continue
        curve = [
            (float(p["value"]), p["modes"][mode]["throughput_gain"])
            for p in points
            if sweep and p["modes"] and p["modes"][mode]["throughput_gain"] is not None
        ]
        several = len(curve) > 1
        summary["break_even"][mode] = _round(break_even(sorted(curve))) if several else None
        summary["break_even_crossings"][mode] = crossings(curve) if several else []
    return summary


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def render_table(result: Mapping[str, Any]) -> str:
    """The comparison as fixed-width text (one block per sweep value)."""
    modes = result["modes"]
    lines: list[str] = []
    header = f"{'':28}" + "".join(f"{m:>16}" for m in modes)
    rows = (
        ("total_tokens_per_s", "throughput tok/s", "{:.0f}"),
        ("throughput_gain", "gain vs none", "{:+.1%}"),
        ("avoided_reprefill_tokens", "avoided re-prefill tok", "{:.0f}"),
        ("reprefill_tokens", "re-prefill tok", "{:.0f}"),
        ("preemptions", "preemptions", "{:.0f}"),
        ("ttft_mean_s", "TTFT mean s", "{:.3f}"),
        ("external_hit_rate", "external hit rate", "{:.1%}"),
        ("prefix_hit_rate", "GPU prefix hit rate", "{:.1%}"),
        ("preempted_after_load", "re-preempted after load", "{:.0f}"),
        ("max_preemptions_per_request", "max preemptions/request", "{:.0f}"),
        ("pcie_load_busy_max", "PCIe load busy (max)", "{:.1%}"),
    )
    for point in result["points"]:
        if result["sweep_key"]:
            lines.append(f"{result['sweep_key']} = {point['value']}")
        if point.get("error"):
            lines.extend([f"  skipped: {point['error']}", ""])
            continue
        lines.append(header)
        for key, label, fmt in rows:
            cells = []
            for m in modes:
                v = point["modes"][m].get(key)
                cells.append(f"{'-' if v is None else fmt.format(v):>16}")
            lines.append(f"  {label:26}" + "".join(cells))
        lines.append("")
    if result["sweep_key"]:
        for mode in result["break_even"]:
            lines.append(f"break-even {result['sweep_key']} for {mode}: {_describe(result, mode)}")
    return "\n".join(lines).rstrip() + "\n"


def _describe(result: Mapping[str, Any], mode: str) -> str:
    found = result.get("break_even_crossings", {}).get(mode) or []
    if not found:
        gains = [
            p["modes"][mode]["throughput_gain"]
            for p in result["points"]
            if p["modes"] and p["modes"][mode]["throughput_gain"] is not None
        ]
        if gains and all(g > 0 for g in gains):
            return "never crosses zero in the sweep (gain positive throughout)"
        if gains and all(g < 0 for g in gains):
            return "never crosses zero in the sweep (gain negative throughout)"
        return "never crosses zero in the sweep"
    parts = []
    for c in found:
        lo, hi = c["between"]
        if c["gain_turns"] == "zero":
            parts.append(f"gain reaches zero at {c['value']:.4g}")
        else:
            parts.append(
                f"gain turns {c['gain_turns']} above {c['value']:.4g} "
                f"(interpolated between {lo:g} and {hi:g})"
            )
    return "; ".join(parts)
