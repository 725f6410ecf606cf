"""The readable summary of a plan (`kvscope plan` without --json), from ``Plan.to_dict()``.

Sections: what is happening; the decision with its reasons and score; per offload mode its
effects today, capacity at the SLO and bill (planner/report/verdict_text.py); the fits (the
equal-KV-use diagnostic with its break-even); the forecast and time to saturation; sizing;
the configs.
Every number keeps its interval or its basis; "n/a" marks what the data could not tell.
A plan of several model groups shows each group's sections, then the pooled observations;
its top level has no decision of its own ("decisions per model group below").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.durations import format_duration
from planner.report.tier_text import tier_lines
from planner.report.verdict_text import offload_lines


def _pct(x: object, digits: int = 0) -> str:
    return "n/a" if not isinstance(x, int | float) else f"{x:.{digits}%}".replace("%", " %")


def _num(x: object, fmt: str = "{:,.0f}") -> str:
    return "n/a" if not isinstance(x, int | float) else fmt.format(x)


def _big(x: object) -> str:
    if not isinstance(x, int | float):
        return "n/a"
    for div, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def _iv(iv: Mapping[str, Any] | None, fmt: str = "{:.3g}") -> str:
    if not iv or iv.get("lo") is None or iv.get("hi") is None:
        return "[n/a]"
    return f"[{fmt.format(iv['lo'])}, {fmt.format(iv['hi'])}]"


def _happening(d: Mapping[str, Any]) -> list[str]:
    h = d["happening"]
    kv, pre, hits, ttft, tps = (
        h["kv_util"],
        h["preemptions"],
        h["hit_ratios"],
        h["ttft"],
        h["tokens_per_s"],
    )
    lines = [
        "What is happening",
        f"  KV-cache use      p50 {_pct(kv['p50'])}, p95 {_pct(kv['p95'])}, max {_pct(kv['max'])}"
        f"  ({kv['windows']} engine-windows)",
        f"  preemptions       {_num(pre['per_1k_requests'], '{:.2f}')} per 1k requests "
        f"({_num(pre['preemptions'])} in {_num(pre['requests'])})",
        f"  re-prefill share  {_pct(h['reprefill_share']['value'], 1)}"
        + (
            ""
            if h["reprefill_share"]["value"] is not None
            else f"  ({h['reprefill_share']['basis']})"
        ),
        f"  hit ratios        prefix {_pct(hits['prefix']['ratio'], 1)}, external "
        f"{_pct(hits['external']['ratio'], 1)}, LMCache {_pct(hits['lmcache']['ratio'], 1)}",
        f"  TTFT              p90 {_num(ttft['p90_s'], '{:.3g} s')} (worst window "
        f"{_num(ttft['worst_window_p90_s'], '{:.3g} s')}), mean {_num(ttft['mean_s'], '{:.3g} s')}",
        f"  throughput        {_num(tps['cluster_mean'])} tokens/s cluster mean, p95 "
        f"{_num(tps['cluster_p95'])}",
        _prompt_line(h.get("prompt_tokens") or {}),
        f"  offload deployed  {h['current_mode']['mode'] or 'n/a'} ({h['current_mode']['basis']})",
    ]
    for mode, m in h["by_mode"].items():
        lines.append(
            f"  mode {mode:<12} {m['engines']} engine(s): KV p95 {_pct(m['kv_util_p95'])}, "
            f"{_num(m['tokens_per_s_per_engine'])} tok/s per engine, "
            f"{_num(m['preemptions_per_1k_requests'], '{:.2f}')} preemptions/1k, external hit "
            f"{_pct(m['external_hit_ratio'], 1)}, LMCache hit {_pct(m['lmcache_hit_ratio'], 1)}"
        )
    return lines


def _prompt_line(p: Mapping[str, Any]) -> str:
    censored = bool(p.get("p90_censored"))
    p90 = ("≥ " if censored else "") + _num(p.get("p90"))
    return f"  prompt length     mean {_num(p.get('mean'))} tokens (exact), p90 {p90}" + (
        "  (censored: beyond the histogram's top finite bucket)" if censored else ""
    )


def decision_lines(d: Mapping[str, Any]) -> list[str]:
    dec = d["decision"]
    lines = [
        f"Decision: {dec['mode'].upper()}  (decision score {dec['score']:.2f}, "
        f"{dec['score_label']}: a rule score, not a probability; DECIDER.md)"
    ]
    lines += [f"  - [{r['rule']}] {r['text']}  ({r['source']})" for r in dec["reasons"]]
    if dec["unknown"]:
        lines.append("  unknown (lowers the score): " + "; ".join(dec["unknown"]))
    lines += [f"  risk {r['id']}: {r['text']}" for r in dec["risks"]]
    return lines


def _fits(d: Mapping[str, Any]) -> list[str]:
    lines = ["Fits (95 % intervals)"]
    for name, f in d["fits"].items():
        if f["estimate"] is None:
            lines.append(f"  {name:<16} cannot tell: {f['why']}")
            continue
        text = f"{f['estimate']:.3g} {_iv(f['interval'])} {f['unit'] or ''} (n={f['n']})"
        if name.startswith("equal_kv_"):
            at = f.get("at_current_util")
            text = f"break-even KV use {text}; verdict {f.get('verdict')}"
            if at:
                text += (
                    f"; at KV use {at['u']:.2f}: tokens/s {_pct(at['relative'], 1)} "
                    f"{_iv(at['relative_interval'], '{:+.1%}')} at equal KV use (a diagnostic, "
                    "not a capacity gain)"
                )
        elif name == "lmcache_hitrate":
            iv, top = f["interval"] or {}, f.get("hit_at_largest_l1") or {}
            text = (
                f"L1 for 90 % of the hit at the largest L1 seen {_big(f['estimate'])}B "
                f"[{_big(iv.get('lo'))}B, {_big(iv.get('hi'))}B] (n={f['n']}); "
                f"hit at the largest L1 seen {_pct(top.get('estimate'), 1)} "
                f"{_iv(top.get('interval'), '{:.1%}')}"
            )
        note = "" if f["can_tell"] else f"  (cannot tell: {f['why']})"
        lines.append(f"  {name:<16} {text}{note}")
    return lines


def _forecast(d: Mapping[str, Any]) -> list[str]:
    f = d["forecast"]
    kv, ev = f["kv_demand"], d["evidence"]
    asked = f.get("horizon_asked_s")
    shortened = (
        f"; {format_duration(asked)} asked" if asked and asked > f["horizon_s"] + 1e-6 else ""
    )
    lines = [f"Forecast ({format_duration(f['horizon_s'])} horizon{shortened})"]
    if kv.get("can_tell"):
        peak = ev.get("demand_peak") or {}
        cap = kv.get("capacity_total")
        lines += [
            f"  KV demand ({kv.get('unit')}): now {_big(ev.get('demand_now'))} of "
            f"{_big(cap)} capacity; peak {_big(peak.get('estimate'))} "
            f"[{_big(peak.get('lo'))}, {_big(peak.get('hi'))}] ({kv['level']:.0%} interval)",
            f"  method {kv['method']}; backtest coverage {_pct(kv['backtest_coverage'])}, "
            f"MASE {_num(kv['backtest_mase'], '{:.2f}')} over {kv['backtest_origins']} origins",
        ]
        horizon = format_duration(f["horizon_s"])
        ts, lo, hi = (
            kv.get(k)
            for k in ("time_to_saturation_s", "time_to_saturation_lo_s", "time_to_saturation_hi_s")
        )
        if ts is None and lo is None:
            lines.append(f"  time to HBM saturation: not within {horizon}")
        else:
            point = "> " + horizon if ts is None else format_duration(ts)
            earliest = format_duration(lo)
            latest = "> " + horizon if hi is None else format_duration(hi)
            lines.append(f"  time to HBM saturation {point} (earliest {earliest}, latest {latest})")
        if kv.get("saturation_probability") is not None:
            lines.append(f"  P(saturation within {horizon}) {saturation_probability(kv)}")
        if kv.get("saturation_note"):
            lines.append(f"  note: {kv['saturation_note']}")
        lines.append(f"  capacity: {kv.get('capacity_basis')}")
        if kv.get("horizon_note"):
            lines.append(f"  note: {kv['horizon_note']}")
    else:
        lines.append(f"  KV demand: cannot tell: {kv['why']}")
    rate = f["request_rate"]
    if rate.get("can_tell") and rate.get("points"):
        top = max(rate["points"], key=lambda p: p[1])
        lines += [
            f"  request rate: peak {top[1]:.3g} req/s [{top[2]:.3g}, {top[3]:.3g}] "
            f"({rate['level']:.0%} interval)",
            f"  method {rate['method']}; backtest coverage {_pct(rate['backtest_coverage'])}, "
            f"MASE {_num(rate['backtest_mase'], '{:.2f}')} over {rate['backtest_origins']} "
            "origins",
        ]
        if rate.get("horizon_note") and rate["horizon_note"] != kv.get("horizon_note"):
            lines.append(f"  note (request rate): {rate['horizon_note']}")
    else:
        lines.append(f"  request rate: cannot tell: {rate['why']}")
    agreement = f.get("agreement") or {}
    if agreement.get("note"):
        lines.append(f"  note: {agreement['note']}")
    return lines + driver_lines(f.get("reconciled"), kv.get("unit"))


def saturation_probability(kv: Mapping[str, Any]) -> str:
    """P(saturation) with its Monte Carlo error, or its rule-of-three bound at 0 or 1."""
    p, se, paths = (kv.get(k) for k in ("saturation_probability", "saturation_probability_se",
                                         "saturation_paths"))  # fmt: skip
    bound = kv.get("saturation_probability_bound")
    if bound:
        none = bound["saturating_paths"] == 0
        value = f"< {_pct(bound['hi'], 1)}" if none else f"> {_pct(bound['lo'], 1)}"
        return (
            f"{value} ({_pct(bound['level'])} bound, rule of three: {'none' if none else 'all'}"
            f" of {bound['paths']} simulated paths saturate; Hanley & Lippman-Hand 1983)"
        )
    if isinstance(se, int | float) and paths:
        return f"{_pct(p)} ± {se * 100:.1f} (Monte Carlo SE, {paths} simulated paths)"
    if p == 1.0 and not paths:
        return f"{_pct(p)} (the last bucket is already at capacity)"
    return f"{_pct(p)} (simulated paths of the fitted model)"


def driver_lines(rec: Mapping[str, Any] | None, unit: object) -> list[str]:
    """Which forecast drove sizing and why, with the KV the request rate implies."""
    if not rec:
        return []
    if not rec.get("can_tell"):
        return [f"  request-rate cross-check (Little's law): cannot tell: {rec['why']}"]
    name = {
        "kv_demand": "the KV-demand forecast",
        "request_rate": "the KV implied by the request-rate forecast",
    }.get(rec["driver"], rec["driver"])
    _, m, lo, hi = rec["implied_peak"]
    return [
        f"  sizing follows {name}; the request rate implies a KV peak of {_big(m)} "
        f"[{_big(min(lo, m))}, {_big(max(hi, m))}] {unit or ''} ({rec['level']:.0%} interval, "
        "Little's law)",
        f"  why: {rec['why']}",
    ]


def _sizing(d: Mapping[str, Any]) -> list[str]:
    s = d["sizing"]
    if "error" in s:
        return ["Sizing", f"  cannot size: {s['error']}"]
    lines = [f"Sizing for {s['mode']}"]
    e = s.get("engines")
    if e:
        lines.append(
            f"  engines: {e['needed']} [{e['lo']}, {e['hi']}] for a peak of "
            f"{_big(e['peak'])} {e['unit']} + {e['headroom']:.0%} headroom at "
            f"{_big(e['capacity_per_engine'])} per engine (now {e['current']})"
        )
        if e.get("needed_with_offload"):
            fewest, most = e.get("with_offload_range") or (None, None)
            lines.append(
                f"  engines with {s['mode']} at its capacity ratio: {e['needed_with_offload']} "
                f"[{fewest}, {most}] ({e.get('capacity_ratio')})"
            )
    if s.get("native_cpu_gib"):
        lines.append(f"  native CPU buffer: {s['native_cpu_gib']:.0f} GiB per engine")
    if s.get("l1_size_gib"):
        lines.append(
            f"  LMCache L1: {s['l1_size_gib']:.0f} GiB per node ({s['l1_basis']}), "
            f"eviction watermark {s['eviction_watermark']}"
        )
    if s.get("l2"):
        lines.append(f"  L2: {s['l2']['kind']} ({s['l2']['scope']}): {s['l2']['reason']}")
    if s.get("unknown"):
        lines.append("  unknown: " + "; ".join(s["unknown"]))
    cost = d.get("cost")
    if cost:
        lines.append(
            f"  cost: now {_num(cost.get('current_per_month'))}/month, sized "
            f"{_num(cost.get('needed_per_month'))}/month ({cost['basis']})"
        )
    lines.append("Configs" if d["configs"] else "Configs: none needed for this mode")
    lines += [f"  {name}: {cmd}" for name, cmd in d["configs"].items()]
    return lines


def _groups(d: Mapping[str, Any]) -> list[list[str]]:
    """Each model group's own plan, then the observations pooled over the groups."""
    groups = d["groups"]
    blocks = [
        [
            f"Model groups: {len(groups)} (served model, GPU, TP); each is fitted, decided "
            "and sized apart, since fits across models mix what cannot be pooled",
            *(f"  {g['name']}: {len(g['engines'])} engine(s)" for g in groups),
            "Decisions per model group below (none for the groups pooled: no fit, decision, "
            "sizing or configs across models)",
        ]
    ]
    for g in groups:
        rule = f"━━ group {g['name']} ━━ {', '.join(g['engines'][:6])}"
        if len(g["engines"]) > 6:
            rule += f", … ({len(g['engines'])} engines)"
        p = g["plan"]
        parts = [[rule], _happening(p), decision_lines(p), offload_lines(p), tier_lines(p),
                 _fits(p), _forecast(p), _sizing(p)]  # fmt: skip
        blocks += [b for b in parts if b]
    head = "━━ all groups pooled (observations only: no fit, no decision to act on) ━━"
    return [*blocks, [head], _happening(d), _forecast(d)]


def summary_text(d: Mapping[str, Any]) -> str:
    """The readable summary of ``Plan.to_dict()`` (per model group when it has ``groups``)."""
    w = d["window"]
    head = (
        f"kvscope plan{' — cluster ' + d['cluster'] if d['cluster'] else ''}"
        f"{' — model group ' + d['group'] if d.get('group') else ''}: "
        f"{w['engines']} engines, {w['windows']} windows, {w['first_utc']} → {w['last_utc']}"
    )
    if d.get("groups"):
        blocks = [[head], *_groups(d)]
    else:
        blocks = [[head], _happening(d), decision_lines(d), offload_lines(d), tier_lines(d),
                  _fits(d), _forecast(d), _sizing(d)]  # fmt: skip
        blocks = [b for b in blocks if b]
    return "\n\n".join("\n".join(b) for b in blocks) + "\n"
