"""The plan's "What a CPU tier would buy" as text (``Plan.to_dict()["cpu_tier"]``,
planner/plan/tier.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TITLE = "What a CPU tier would buy"


def _num(x: object, fmt: str) -> str:
    return fmt.format(x) if isinstance(x, int | float) else "n/a"


def estimate_text(e: Mapping[str, Any] | None, fmt: str, unit: str = "") -> str:
    """ "41.2 % [38.0, 45.1]" — an estimate with its (model-based) range."""
    if not e or not isinstance(e.get("estimate"), int | float):
        return "n/a"
    lo, hi = e.get("lo"), e.get("hi")
    span = ""
    if isinstance(lo, int | float) and isinstance(hi, int | float):
        span = f" [{fmt.format(lo)}, {fmt.format(hi)}]"
    return f"{fmt.format(e['estimate'])}{unit}{span}"


def _pct(e: Mapping[str, Any] | None) -> str:
    if not e or not isinstance(e.get("estimate"), int | float):
        return "n/a"
    return estimate_text({k: (v * 100 if isinstance(v, int | float) else v)
                          for k, v in e.items()}, "{:.1f}", " %")  # fmt: skip


def _row(r: Mapping[str, Any]) -> str:
    cap = r.get("capacity_ratio")
    cap_text = estimate_text(cap, "{:.2f}", "×") if cap else "cannot tell"
    head = f"    {r['label']:<10} {_num(r.get('gib'), '{:,.0f}'):>6} GiB:"
    if not r.get("can_tell"):
        return f"{head} cannot tell ({r.get('why')}); hit ratio would be {_pct(r.get('hit_ratio'))}"
    note = " (extrapolated)" if r.get("extrapolated") else ""
    return (
        f"{head} hit ratio {_pct(r.get('hit_ratio'))}, +{_pct(r.get('extra_hit_ratio'))}; "
        f"avoids {estimate_text(r.get('avoided_prefill_tokens_per_s'), '{:,.0f}')} re-prefill "
        f"tokens/s, {estimate_text(r.get('prefill_gpu_seconds_saved_per_hour'), '{:,.0f}')} "
        f"prefill GPU-s an hour; capacity {cap_text}{note}"
    )


def _tier_lines(name: str, t: Mapping[str, Any] | None) -> list[str]:
    if not t:
        return []
    bound = " — a lower bound (reuse across engines not seen)" if t.get("lower_bound") else ""
    out = [f"  {name}, {t.get('scope')}{bound}:"]
    out += [_row(r) for r in t.get("rows", [])]
    rec = t.get("recommended") or {}
    if isinstance(rec.get("gib"), int | float):
        extra = " (extrapolated)" if rec.get("extrapolated") else ""
        if rec.get("can_tell") is False:
            extra += " — cannot tell"
        out.append(
            f"    recommended: {rec['gib']:,.0f} GiB ({rec.get('multiple', 0):.1f}× HBM KV)"
            f"{extra}: {rec.get('why')}; range "
            f"{estimate_text(rec.get('interval_gib'), '{:,.0f}', ' GiB')}"
        )
    else:
        out.append(f"    recommended: none ({rec.get('why', 'no gain')})")
    return out


def tier_lines(d: Mapping[str, Any]) -> list[str]:
    """The section's lines of a plan document (nothing for a plan without the section)."""
    t = d.get("cpu_tier")
    if not t:
        return []
    if not t.get("can_tell"):
        return [f"{TITLE}: cannot tell — {t.get('why')}", f"  to measure it: {t.get('enable')}"]
    h = t.get("hbm") or {}
    out = [
        f"{TITLE} ({t.get('engines')} engine(s) with vLLM's KV residency histograms; "
        f"{t.get('interval')})",
        f"  today (HBM only, {_num(h.get('gib_per_engine'), '{:,.1f}')} GiB KV per engine): "
        f"prefix hit ratio {_num(h.get('hit_ratio_measured'), '{:.1%}')} measured, "
        f"{_num(h.get('hit_ratio_model'), '{:.1%}')} by the model (its error "
        f"{_num((h.get('reproduction_error') or 0) * 100, '{:+.1f}')} pp is part of every "
        f"range); HBM eviction time {_num(h.get('eviction_time_s'), '{:,.0f}')} s",
    ]
    basis = str(t.get("capacity_basis") or "")
    if basis.startswith("no engine"):
        out.append(f"  capacity with a tier: cannot tell — {basis}")
    elif basis:
        out.append(f"  capacity with a tier: modelled on {basis}")
    out += _tier_lines("native CPU offload", t.get("native"))
    out += _tier_lines("LMCache L1 pool", t.get("lmcache"))
    if t.get("engines_without"):
        out.append(f"  without a curve: {', '.join(t['engines_without'][:5])}")
    return out
