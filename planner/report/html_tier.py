"""The report's "What a CPU tier would buy" section: today's HBM-only hit ratio, then per tier
(vLLM native offload per engine, an LMCache L1 pool per node) a table of the sizes with the
hit ratio, the extra over today, the re-prefill avoided, the prefill GPU time it saves and
the modelled capacity at the SLO, each with its model-based interval; the recommended size.
From the plan's JSON (``cpu_tier``, planner/plan/tier.py); the plot is with the others
(planner/report/plot_tier.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from planner.report.html_parts import Html, _details, _e, _is_num, _num, _table

__all__ = ["cpu_tier_html"]

TITLE = "What a CPU tier would buy"
_TIERS = (("native", "vLLM native CPU offload"), ("lmcache", "LMCache L1 pool"))


def _points(x: object) -> str:
    return f"{x * 100:+.1f} pp" if _is_num(x) else "n/a"


def _ratio(x: object) -> str:
    return f"{x * 100:.1f} %" if _is_num(x) else "n/a"


def _times(x: object) -> str:
    return f"{x:.2f}×" if _is_num(x) else "n/a"


def _est(e: object, fmt: Callable[[object], str], tell: bool = True) -> Html:
    """The figure over its interval "[0.05, 0.11]"; one that cannot tell shows its range
    only."""
    if not isinstance(e, Mapping):
        return _e("n/a")
    lo, hi = e.get("lo"), e.get("hi")
    span = f"[{fmt(lo)}, {fmt(hi)}]" if _is_num(lo) and _is_num(hi) else ""
    head = fmt(e.get("estimate")) if tell else "range"
    if not span:
        return _e(head if tell else "n/a")
    return Html(f'{_e(head)}<br><span class="small">{_e(span)}</span>')


def _row(r: Mapping[str, Any], capacity_basis: str) -> Sequence[object]:
    tell = r.get("can_tell") is not False
    cap = r.get("capacity_ratio")
    notes = [str(r.get("why") or "")] if r.get("why") else []
    if r.get("extrapolated") and not any("extrapolated" in n for n in notes):
        notes.append("extrapolated past the HBM eviction time")
    if not tell:
        notes.insert(0, "cannot tell")
    why_cap = str(r.get("capacity_why") or "")
    if cap is None and not (why_cap and why_cap in capacity_basis):  # said once above
        notes.append(f"capacity: {why_cap or 'cannot tell'}")
    return (
        r.get("label"),
        _num(r.get("gib"), "{:,.1f}"),
        _est(r.get("hit_ratio"), _ratio, tell),
        _est(r.get("extra_hit_ratio"), _points, tell),
        _est(r.get("avoided_prefill_tokens_per_s"), _num, tell),
        _est(r.get("prefill_gpu_seconds_saved_per_hour"), _num, tell),
        _est(cap, _times, tell) if cap is not None else "n/a",
        "; ".join(notes),
    )


_HEAD = (
    "size",
    "GiB",
    "hit ratio with it",
    "over today",
    "re-prefill avoided, tokens/s",
    "prefill GPU-s saved an hour",
    "capacity at the SLO",
    "note",
)


def _tier(name: str, t: Mapping[str, Any], capacity_basis: str) -> Html:
    bound = "; a lower bound (reuse across engines is not seen)" if t.get("lower_bound") else ""
    out = [f"<h3>{_e(name)}: sizes {_e(t.get('scope') or '')}{_e(bound)}</h3>"]
    rows = [r for r in t.get("rows") or () if isinstance(r, Mapping)]
    out.append(_table(_HEAD, [_row(r, capacity_basis) for r in rows], range(7)))
    rec = t.get("recommended")
    if isinstance(rec, Mapping) and _is_num(rec.get("gib")):
        extra = " (extrapolated)" if rec.get("extrapolated") else ""
        out.append(
            f"<p>Recommended: <b>{_e(_num(rec['gib'], '{:,.0f}'))} GiB</b> "
            f"({_e(_times(rec.get('multiple')))} HBM){_e(extra)}: {_e(rec.get('why') or '')}</p>"
        )
    else:
        why = rec.get("why") if isinstance(rec, Mapping) else None
        out.append(f"<p>No recommended size{_e(f': {why}' if why else '')}.</p>")
    out.append(_details("assumptions", t.get("assumptions") or []))
    return Html("".join(out))


def cpu_tier_html(d: Mapping[str, Any], anchor: str) -> Html:
    """The section of a plan's JSON ``d``, or a note that it has none (several model groups,
    or a stored plan whose JSON has no such section)."""
    t = d.get("cpu_tier")
    out = [f'<section id="{_e(anchor)}"><h2>{_e(TITLE)}</h2>']
    if not isinstance(t, Mapping) or not t:
        out.append("<p>No CPU-tier section here: a plan of several model groups has one per "
                   "group.</p></section>")  # fmt: skip
        return Html("".join(out))
    if not t.get("can_tell"):
        out.append(f"<p>Cannot tell: {_e(t.get('why') or 'no reuse curve')}.</p>")
        out.append(f'<p class="small">To measure it: {_e(t.get("enable") or "")}</p>')
        if t.get("engines_without"):
            out.append(
                f'<p class="small">Engines without: {_e(", ".join(t["engines_without"]))}</p>'
            )
        out.append("</section>")
        return Html("".join(out))
    h = t.get("hbm") or {}
    out.append(
        f"<p>Modelled from {_e(_num(t.get('engines')))} engine(s)' KV residency histograms, "
        "before any tier is deployed. Today, HBM only "
        f"({_e(_num(h.get('gib_per_engine'), '{:,.1f}'))} GiB of KV per engine): prefix hit ratio "
        f"<b>{_e(_ratio(h.get('hit_ratio_measured')))}</b> measured, "
        f"{_e(_ratio(h.get('hit_ratio_model')))} by the model (its error "
        f"{_e(_points(h.get('reproduction_error')))} is part of every range); HBM eviction time "
        f"{_e(_num(h.get('eviction_time_s'), '{:,.0f}'))} s, past which figures are "
        "extrapolated.</p>"
    )
    out.append(f'<p class="small">{_e(t.get("interval") or "")}</p>')
    basis = str(t.get("capacity_basis") or "")
    if basis:
        out.append(f'<p class="small">Capacity at the SLO (modelled): {_e(basis)}.</p>')
    for key, name in _TIERS:
        tier = t.get(key)
        if isinstance(tier, Mapping):
            out.append(_tier(name, tier, basis))
    if t.get("engines_without"):
        out.append(
            f'<p class="small">Engines without a curve: {_e(", ".join(t["engines_without"]))}. '
            f"To measure them: {_e(t.get('enable') or '')}</p>"
        )
    out.append(_details("method and assumptions", [t.get("method"), *(t.get("assumptions") or [])]))
    out.append("</section>")
    return Html("".join(out))
