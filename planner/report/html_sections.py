"""The HTML report's sections of one plan (planner/report/html.py puts them on the page): the
decision and its reasons, what is happening, the fits, the forecast, the sizing and the basis
lines. Each takes the plan's ``to_dict()`` and the section's anchor and returns its markup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from planner.report.html_parts import (
    Html,
    _big,
    _details,
    _e,
    _g3,
    _hours,
    _is_num,
    _iv,
    _join,
    _level_text,
    _link,
    _num,
    _pct,
    _saturation_bound,
    _saturation_point,
    _scalar,
    _score_line,
    _table,
    _ul,
)
from planner.report.plan_text import saturation_probability

__all__: list[str] = []

# ── the decision ─────────────────────────────────────────────────────────────────────────
# In every f-string that makes Html below, each value goes through _e() (Html passes as is).


def _reason(r: Mapping[str, Any]) -> Html:
    cid, url = r.get("source_id"), r.get("source_url")
    if url:
        src = Html(f"source: {_link(url, cid or url)} ({_e(r.get('source') or '')})")
    else:
        src = _e(f"source: {r.get('source') or 'n/a'}")
    nums = ", ".join(f"{k} {_scalar(v)}" for k, v in (r.get("numbers") or {}).items())
    return Html(
        f'<li class="reason"><span class="rule">{_e(r.get("rule"))}</span> {_e(r.get("text"))}'
        f'<div class="small">{src}</div>'
        + (f'<div class="small">numbers: {_e(nums)}</div>' if nums else "")
        + "</li>"
    )


def _decision(d: Mapping[str, Any], anchor: str) -> Html:
    dec = d.get("decision")
    out = [f'<section id="{_e(anchor)}"><h2>Decision and its reasons</h2>']
    if not dec:
        out.append(f"<p>{_e(d.get('see_groups') or 'no decision')}</p></section>")
        return Html("".join(out))
    out.append(f"<p><b>{_e(str(dec['mode']).upper())}</b></p>{_score_line(dec)}")
    if dec.get("rests_on"):
        out.append(f"<h3>Rests on</h3>{_ul(dec['rests_on'])}")
    out.append("<h3>Reasons (the rules of planner/decide/DECIDER.md, in order)</h3><ol>")
    out += [_reason(r) for r in dec.get("reasons") or []]
    out.append("</ol>")
    if dec.get("unknown"):
        out.append(f"<h3>Unknown (each lowers the score)</h3>{_ul(dec['unknown'])}")
    risks = [
        Html(
            f"<b>{_e(r.get('id'))}</b>: {_e(r.get('text'))}"
            + (f" <i>advice:</i> {_e(r['advice'])}" if r.get("advice") else "")
        )
        for r in dec.get("risks") or []
    ]
    if risks:
        out.append(f"<h3>Risks</h3>{_ul(risks)}")
    out.append("</section>")
    return Html("".join(out))


# ── what is happening, the fits, the forecast, the sizing ────────────────────────────────


def _happening(d: Mapping[str, Any], anchor: str) -> Html:
    h = d["happening"]
    kv, pre, hits = h["kv_util"], h["preemptions"], h["hit_ratios"]
    ttft, tps, prompt = h["ttft"], h["tokens_per_s"], h.get("prompt_tokens") or {}
    ratio = {
        k: _pct((hits.get(k) or {}).get("ratio"), 1) for k in ("prefix", "external", "lmcache")
    }
    rows: list[Sequence[object]] = [
        (
            "KV-cache use",
            f"p50 {_pct(kv['p50'])}, p95 {_pct(kv['p95'])}, max {_pct(kv['max'])}",
            kv.get("basis", ""),
        ),
        (
            "preemptions",
            f"{_num(pre['per_1k_requests'], '{:.2f}')} per 1k requests "
            f"({_num(pre['preemptions'])} in {_num(pre['requests'])})",
            pre.get("basis", ""),
        ),
        (
            "hit ratios",
            f"prefix {ratio['prefix']}, external {ratio['external']}, LMCache {ratio['lmcache']}",
            hits.get("basis", ""),
        ),
        (
            "TTFT",
            f"p90 {_num(ttft['p90_s'], '{:.3g} s')} (worst window "
            f"{_num(ttft['worst_window_p90_s'], '{:.3g} s')}), mean "
            f"{_num(ttft['mean_s'], '{:.3g} s')}",
            ttft.get("basis", ""),
        ),
        (
            "throughput",
            f"{_num(tps['cluster_mean'])} tokens/s cluster mean, p95 {_num(tps['cluster_p95'])}",
            tps.get("basis", ""),
        ),
        (
            "prompt length",
            f"mean {_num(prompt.get('mean'))} tokens, p90 "
            f"{'≥ ' if prompt.get('p90_censored') else ''}{_num(prompt.get('p90'))}",
            prompt.get("basis", ""),
        ),
        (
            "re-prefill share",
            _pct(h["reprefill_share"]["value"], 1),
            h["reprefill_share"].get("basis", ""),
        ),
        ("offload deployed", h["current_mode"]["mode"] or "n/a", h["current_mode"]["basis"]),
    ]
    for mode, m in (h.get("by_mode") or {}).items():
        rows.append(
            (
                f"mode {mode}",
                f"{_num(m.get('engines'))} engine(s): KV p95 {_pct(m.get('kv_util_p95'))}, "
                f"{_num(m.get('tokens_per_s_per_engine'))} tok/s per engine, "
                f"{_num(m.get('preemptions_per_1k_requests'), '{:.2f}')} preemptions/1k",
                f"{_num(m.get('windows'))} windows of these engines",
            )
        )
    return Html(
        f'<section id="{_e(anchor)}"><h2>What is happening</h2>'
        '<p class="small">Observed statistics of the period\'s windows (counted, not modelled: '
        f"no interval).</p>{_table(('signal', 'value', 'from'), rows)}</section>"
    )


def _fit_row(name: str, f: Mapping[str, Any]) -> Sequence[object]:
    iv = f.get("interval") or {}
    what = str(f.get("unit") or "")
    value, interval = _g3(f.get("estimate")), _iv(iv.get("lo"), iv.get("hi"), _g3, iv.get("level"))
    extra: list[str] = []
    if name == "lmcache_hitrate":
        value, what = (
            _big(f.get("estimate"), "B"),
            "L1 size for 90 % of the hit at the largest L1 seen",
        )

        def gib(x: object) -> str:
            return _big(x, "B")

        interval = _iv(iv.get("lo"), iv.get("hi"), gib, iv.get("level"))
        top = f.get("hit_at_largest_l1") or {}
        tiv = top.get("interval") or {}
        extra.append(
            f"hit at the largest L1 seen {_pct(top.get('estimate'), 1)} "
            f"{_iv(tiv.get('lo'), tiv.get('hi'), lambda x: _pct(x, 1), tiv.get('level'))}"
        )
    if name.startswith("equal_kv_"):
        what = f"break-even {what} of tokens/s at equal KV use (a diagnostic)"
        extra.append(f"verdict {f.get('verdict')}")
        at = f.get("at_current_util")
        if at:
            riv = at.get("relative_interval") or {}
            extra.append(
                f"tokens/s at equal KV use {_num(at.get('u'), '{:.2f}')}: "
                f"{_pct(at.get('relative'), 1)} "
                f"{_iv(riv.get('lo'), riv.get('hi'), lambda x: _pct(x, 1), riv.get('level'))}"
            )
    told = (
        _e("yes")
        if f.get("can_tell")
        else Html(f'<span class="warn">cannot tell: {_e(f.get("why"))}</span>')
    )
    notes = [*(f.get("basis") or []), *(f.get("assumptions") or []), *(f.get("warnings") or [])]
    how = Html(f"{_e(f.get('method'))}{_details('basis and assumptions', notes)}")
    return (name, value, interval, _num(f.get("n")), _join([what, *extra], "<br>"), told, how)


def _fits(d: Mapping[str, Any], anchor: str) -> Html:
    rows = [_fit_row(name, f) for name, f in (d.get("fits") or {}).items()]
    head = ("fit", "estimate", "interval", "n", "what", "can tell", "method, basis")
    return Html(
        f'<section id="{_e(anchor)}"><h2>Fits</h2>{_table(head, rows, (1, 2, 3))}</section>'
    )


def _forecast_kv(
    kv: Mapping[str, Any], ev: Mapping[str, Any], fc: Mapping[str, Any]
) -> list[Sequence[object]]:
    if not kv.get("can_tell"):
        return [("KV demand", "n/a", "", f"cannot tell: {kv.get('why')}")]
    unit = kv.get("unit") or ""
    peak = ev.get("demand_peak") or {}
    backtest = (
        f"{kv.get('method')}; backtest coverage {_pct(kv.get('backtest_coverage'))} (nominal "
        f"{_level_text(kv.get('level'))}), MASE {_num(kv.get('backtest_mase'), '{:.2f}')} over "
        f"{kv.get('backtest_origins')} origins"
    )
    rows: list[Sequence[object]] = [
        (f"KV demand now ({unit})", _big(ev.get("demand_now")), "", "the latest bucket"),
        (
            f"HBM KV capacity ({unit})",
            _big(kv.get("capacity_total")),
            "",
            kv.get("capacity_basis") or "",
        ),
        (
            f"KV demand peak ({unit})",
            _big(peak.get("estimate")),
            _iv(peak.get("lo"), peak.get("hi"), _big, kv.get("level")),
            Html(f"{_e(backtest)}{_details('assumptions', kv.get('assumptions') or [])}"),
        ),
        (
            "time to HBM saturation",
            _saturation_point(kv, fc),
            f"earliest {_hours(kv.get('time_to_saturation_lo_s'))}, latest "
            f"{_saturation_bound(kv.get('time_to_saturation_hi_s'), fc)}",
            kv.get("saturation_note") or "",
        ),
    ]
    if kv.get("saturation_probability") is not None:
        rows.append(
            (
                "P(saturation within the horizon)",
                saturation_probability(kv),
                "",
                "simulated paths of the fitted model",
            )
        )
    return rows


def _forecast(d: Mapping[str, Any], anchor: str) -> Html:
    fc = d.get("forecast") or {}
    kv = fc.get("kv_demand") or {}
    asked, horizon = fc.get("horizon_asked_s"), _hours(fc.get("horizon_s"))
    if _is_num(asked) and _is_num(fc.get("horizon_s")) and asked > fc["horizon_s"] + 1e-6:
        horizon += f" ({_hours(asked)} asked)"
    rows: list[Sequence[object]] = [("horizon", horizon, "", kv.get("horizon_note") or "")]
    rows += _forecast_kv(kv, d.get("evidence") or {}, fc)
    rate = fc.get("request_rate") or {}
    if rate.get("can_tell") and rate.get("points"):
        top = max(rate["points"], key=lambda p: p[1])
        rows.append(
            (
                "request rate peak (req/s)",
                _g3(top[1]),
                _iv(top[2], top[3], _g3, rate.get("level")),
                f"{rate.get('method')}; backtest coverage {_pct(rate.get('backtest_coverage'))}"
                f", MASE {_num(rate.get('backtest_mase'), '{:.2f}')}",
            )
        )
    else:
        rows.append(("request rate", "n/a", "", f"cannot tell: {rate.get('why')}"))
    rec = fc.get("reconciled") or {}
    if rec.get("can_tell") and rec.get("implied_peak"):
        _, m, lo, hi = rec["implied_peak"]
        rows.append(
            (
                f"KV peak implied by the request rate ({kv.get('unit') or ''})",
                _big(m),
                _iv(min(lo, m), max(hi, m), _big, rec.get("level")),
                Html(
                    f"Little's law; sizing follows {_e(rec.get('driver'))}: {_e(rec.get('why'))}"
                    f"{_details('assumptions', rec.get('assumptions') or [])}"
                ),
            )
        )
    elif rec:
        rows.append(("request-rate cross-check", "n/a", "", f"cannot tell: {rec.get('why')}"))
    head = ("figure", "value", "interval", "from")
    return Html(f'<section id="{_e(anchor)}"><h2>Forecast</h2>{_table(head, rows, (2,))}</section>')


def _sizing_rows(s: Mapping[str, Any], cost: Mapping[str, Any] | None) -> list[Sequence[object]]:
    rows: list[Sequence[object]] = []
    e = s.get("engines")
    if e:
        rows.append(
            (
                f"engines for {s.get('mode')}",
                f"{_num(e.get('needed'))} (now {_num(e.get('current'))})",
                _iv(e.get("lo"), e.get("hi"), _num),
                f"a peak of {_big(e.get('peak'))} {_iv(e.get('peak_lo'), e.get('peak_hi'), _big)}"
                f" {e.get('unit')} + {_pct(e.get('headroom'))} headroom at "
                f"{_big(e.get('capacity_per_engine'))} per engine ({e.get('basis')}); "
                f"{e.get('demand_basis') or ''}",
            )
        )
        if e.get("needed_with_offload"):
            span = e.get("with_offload_range") or (None, None)
            rows.append(
                (
                    f"engines with {s.get('mode')} at its capacity ratio",
                    _num(e["needed_with_offload"]),
                    _iv(span[0], span[1], _num),
                    e.get("capacity_ratio") or "",
                )
            )
    if s.get("native_cpu_gib"):
        rows.append(
            (
                "native CPU buffer per engine",
                _num(s["native_cpu_gib"], "{:.0f} GiB"),
                "",
                "planner/deploy/sizing.py",
            )
        )
    if s.get("l1_size_gib"):
        rows.append(
            (
                "LMCache L1 per node",
                _num(s["l1_size_gib"], "{:.0f} GiB"),
                "",
                f"{s.get('l1_basis')}; eviction watermark {s.get('eviction_watermark')}",
            )
        )
    if s.get("l2"):
        l2 = s["l2"]
        rows.append(("L2", f"{l2.get('kind')} ({l2.get('scope')})", "", l2.get("reason", "")))
    if cost:
        niv = cost.get("needed_interval_per_month") or [None, None]
        rows += [
            ("GPU cost now per month", _num(cost.get("current_per_month")), "", cost.get("basis")),
            (
                "GPU cost sized per month",
                _num(cost.get("needed_per_month")),
                _iv(niv[0], niv[1], _num),
                cost.get("basis"),
            ),
        ]
    return rows


def _sizing(d: Mapping[str, Any], anchor: str) -> Html:
    s = d.get("sizing")
    out = [f'<section id="{_e(anchor)}"><h2>Sizing</h2>']
    if not s:
        out.append("<p>No sizing here: each model group is sized apart.</p>")
    elif "error" in s:
        out.append(f"<p>cannot size: {_e(s['error'])}</p>")
    else:
        rows = _sizing_rows(s, d.get("cost"))
        if rows:
            out.append(_table(("figure", "value", "interval", "from"), rows, (1, 2)))
        if s.get("unknown"):
            out.append(f"<p>unknown: {_e('; '.join(map(str, s['unknown'])))}</p>")
        configs = d.get("configs") or {}
        out.append("<h3>Configs</h3>" if configs else "<p>Configs: none needed for this mode.</p>")
        out += [f"<p><code>{_e(k)}</code></p><pre>{_e(v)}</pre>" for k, v in configs.items()]
    out.append("</section>")
    return Html("".join(out))


def _basis(d: Mapping[str, Any], anchor: str) -> Html:
    return Html(
        f'<section id="{_e(anchor)}"><h2>Where the numbers come from</h2>'
        '<p class="small">The plan\'s basis lines: what each figure rests on and what was left '
        f"unknown.</p>{_ul(d.get('basis') or [])}</section>"
    )
