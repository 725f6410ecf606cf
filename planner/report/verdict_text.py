"""The plan's offload section as text: per mode, today's effects, capacity at the SLO and
the bill, each with its interval and the units behind it (``Plan.to_dict()["offload"]``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# the today outcomes printed, in order (the JSON holds every one)
_TODAY = ("ttft_p50_s", "ttft_p90_s", "e2e_mean_s", "preemptions_per_1k")


def _ratio_text(est: object, iv: Mapping[str, Any] | None) -> str:
    """ "0.42× [0.31×, 0.57×]" as a ratio."""
    if not isinstance(est, int | float):
        return "n/a"
    lo = (iv or {}).get("lo")
    hi = (iv or {}).get("hi")
    span = ""
    if isinstance(lo, int | float) and isinstance(hi, int | float):
        span = f" [{lo:.2f}×, {hi:.2f}×]"
    return f"{est:.2f}×{span}"


def _diff_text(est: object, iv: Mapping[str, Any] | None) -> str:
    if not isinstance(est, int | float):
        return "n/a"
    lo, hi = (iv or {}).get("lo"), (iv or {}).get("hi")
    span = ""
    if isinstance(lo, int | float) and isinstance(hi, int | float):
        span = f" [{lo:+.3g}, {hi:+.3g}]"
    return f"{est:+.3g}{span}"


def effect_text(e: Mapping[str, Any]) -> tuple[str, str]:
    """(the effect with its interval, against what) of one today outcome."""
    if not e.get("can_tell"):
        return "cannot tell", str(e.get("why"))
    base = e.get("without_offload")
    base_text = f"{base:.3g} {e['unit']}" if isinstance(base, int | float) else "n/a"
    if e["scale"] == "ratio":
        change = _ratio_text(e["estimate"], e.get("interval"))
    else:
        change = _diff_text(e["estimate"], e.get("interval"))
    return change, f"without offload {base_text}"


def _effect_line(e: Mapping[str, Any]) -> str:
    change, basis = effect_text(e)
    if change == "cannot tell":
        return f"    {e['label']}: cannot tell: {basis}"
    return f"    {e['label']}: {change} ({basis})"


def capacity_text(c: Mapping[str, Any] | None) -> tuple[str, str]:
    """(the capacity ratio, its basis) of a mode."""
    if not c:
        return "not estimated", ""
    if not c.get("can_tell"):
        settle = f"; would settle it: {c['settle']}" if c.get("settle") else ""
        return "cannot tell", f"{c.get('why')}{settle}"
    iv = c.get("interval") or {}
    ratio, lo = c.get("ratio"), iv.get("lo")
    level = iv.get("level") or 0.9
    if c.get("lower_bound"):
        text = f"at least {lo:.2f}× ({level:.0%} lower bound: the offload units never missed it)"
    else:
        text = f"{_ratio_text(ratio, iv)} ({level:.0%})"
    without, with_ = c.get("without_offload_tokens_per_s"), c.get("with_mode_tokens_per_s")
    per = ""
    if isinstance(without, int | float) and isinstance(with_, int | float):
        bound = "≥ " if c.get("lower_bound") else ""
        per = f"{bound}{with_:,.0f} against {without:,.0f} tokens/s per engine; "
    return text, f"{per}{c.get('method')}"


def _capacity_lines(c: Mapping[str, Any] | None) -> list[str]:
    value, basis = capacity_text(c)
    if value == "cannot tell":
        return [f"  capacity at the SLO: cannot tell: {basis}"]
    per = basis.split("; ")[0] if "tokens/s per engine" in basis else ""
    return [f"  capacity at the SLO: {value}" + (f"; {per}" if per else "")]


def bill_text(b: Mapping[str, Any] | None, mode: str) -> tuple[str, str]:
    """(engines and GPU-hours, the peak they are for) of a mode."""
    if not b:
        return "not computed", ""
    if not b.get("can_tell"):
        return "cannot tell", str(b.get("why"))
    fewest, most = b.get("engines_with_mode_range") or (None, None)
    lo, hi = b.get("gpu_hours_saved_range") or (None, None)
    saved = b.get("gpu_hours_saved_per_day")
    span = f"[{lo:,.0f}, {hi:,.0f}]" if hi is not None else f"(at least {lo:,.0f})"
    value = (
        f"{b['engines_without_offload']} engines without offload, {b['engines_with_mode']} "
        f"[{fewest}, {most}] with {mode}; {saved:,.0f} GPU-hours a day saved {span}"
    )
    return value, (
        f"forecast peak {b['peak']:,.0f} {b['peak_unit']}, +{b['headroom']:.0%} headroom; "
        f"{b['rests_on']}"
    )


def _bill_lines(b: Mapping[str, Any] | None, mode: str) -> list[str]:
    value, basis = bill_text(b, mode)
    if not b:
        return []
    if value == "cannot tell":
        return [f"  the bill: cannot tell: {basis}"]
    return [f"  the bill: {value} (at the {basis.split(';')[0]})"]


def offload_lines(d: Mapping[str, Any]) -> list[str]:
    """The ``offload`` section of a plan's JSON as text (empty when absent)."""
    section = d.get("offload")
    if not section:
        return []
    levels = section.get("levels") or {}
    lines = [
        f"Offload, per mode against engines without offload (SLO: {section['slo']['text']}; "
        f"{levels.get('reported', 0.9):.0%} intervals over engines or LMCache pools, never "
        "windows)"
    ]
    for mode, m in section["modes"].items():
        u = m.get("units") or {}
        lines.append(
            f"  {mode}: {u.get('with_mode', 0)} unit(s) with it, {u.get('without_offload', 0)} "
            f"without ({m.get('design')})"
        )
        t = m.get("today")
        if t is None:
            lines.append(f"  today: not estimated: {m.get('why') or 'no data'}")
        elif not t.get("can_tell"):
            lines.append(f"  today: cannot tell: {t.get('why')}")
        else:
            lines.append("  today, at the load each engine carried (adjusted for traffic mix):")
            by = {e["outcome"]: e for e in t["effects"]}
            lines += [_effect_line(by[name]) for name in _TODAY if name in by]
            lines += [f"    warning: {w}" for w in t.get("warnings", [])]
        lines += _capacity_lines(m.get("capacity"))
        lines += _bill_lines(m.get("bill"), mode)
        lines += [f"    {x}" for x in experiment_lines(m.get("experiment"))]
    return lines


def experiment_lines(x: Mapping[str, Any] | None) -> list[str]:
    """The experiment the plan proposes for a mode that cannot tell (planner/plan/proposal.py)."""
    if not x:
        return []
    out = [f"the experiment that would settle it ({x['design']}): {x['text']}"]
    if x.get("block_basis"):
        out.append(f"  block length: {x['block_basis']}")
    if x.get("assumes"):
        out.append(f"  assumes: {x['assumes']}")
    if x.get("schedule"):
        out.append(f"  schedule: {' '.join(x['schedule'])}")
    return out
