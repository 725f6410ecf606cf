"""The HTML report (`kvscope report`, and the API's report page): one self-contained page.

The decision and its score, plots inlined as data URIs, reasons with their sources linked,
observations, the CPU tier, fits, forecast and sizing with intervals and basis, the
closed-loop table. The page loads nothing (inline CSS, no script, CSP ``default-src
'none'``); its only external addresses are the reasons' http/https ``source_url`` links, and
every string from data is HTML-escaped. :func:`render_report_html` is pure;
:func:`render_report` reads a store. This module is the skeleton; html_parts, html_sections,
html_offload, html_tier and html_closed_loop (``closed_loop``, re-exported here) hold the rest.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from planner.plan import build_plan
from planner.report.html_closed_loop import NO_SCORED_PLANS, Outcome, closed_loop, closed_loop_html
from planner.report.html_offload import offload_html
from planner.report.html_parts import (
    Html,
    _e,
    _g3,
    _headline,
    _is_num,
    _iv,
    _join,
    _level_text,
    _num,
    _pct,
    _ul,
    _utc,
)
from planner.report.html_sections import _basis, _decision, _fits, _forecast, _happening, _sizing
from planner.report.html_tier import cpu_tier_html
from planner.report.plots import PLOT_FILES, plot_pngs

if TYPE_CHECKING:
    from planner.plan import Plan
    from store.store import Store

__all__ = [
    "CSP",
    "NO_SCORED_PLANS",
    "PLOT_CAPTIONS",
    "closed_loop",
    "closed_loop_html",
    "render_report",
    "render_report_html",
]

# What the page may load: images from data: URIs and its own <style>; nothing else.
CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; "
    "form-action 'none'"
)
PLOT_CAPTIONS: Mapping[str, str] = {
    "preemptions_vs_kv_util.png": "Preemptions vs KV-cache use, with the fitted hinge curve, "
    "its band and the knee's interval",
    "throughput_vs_kv_util.png": "Diagnostic: tokens/s vs KV-cache use per offload mode, the "
    "difference at equal KV use with its 95 % band, and its break-even (not a capacity gain: "
    "offload itself lowers KV use; the offload section has the capacity at the SLO)",
    "kv_demand_forecast.png": "KV demand forecast with its interval, against HBM KV capacity",
    "lmcache_hit_rate.png": "LMCache hit rate vs L1 size: the fitted curve and its predictions",
    "cpu_tier_hit_ratio.png": "What a CPU tier would buy: prefix hit ratio vs CPU tier size "
    "(native per engine, LMCache per node pool), its model-based interval (not a confidence "
    "interval), today's hit ratio at 0 GiB and the recommended size; dashed: extrapolated past "
    "the HBM eviction time",
}
# Why a plot is missing, when it is not that its fit or forecast did not run.
NOT_DRAWN: Mapping[str, str] = {
    "cpu_tier_hit_ratio.png": "no reuse curve: see What a CPU tier would buy",
}
_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1100px;
padding:1rem 1.5rem 3rem;color:#1d2330;line-height:1.45;background:#fff}
h1{font-size:1.6rem;margin:.4rem 0}h2{font-size:1.25rem;margin-top:2rem;
border-bottom:2px solid #d8dde6;padding-bottom:.2rem}h3{font-size:1.05rem;margin-top:1.4rem}
.sub,.small,figcaption{color:#505a6b;font-size:.9rem}
.headline{border:2px solid #2f6fb0;border-radius:8px;padding:.8rem 1.1rem;background:#f3f8fd}
.mode{font-size:2rem;font-weight:700;letter-spacing:.04em}
.score{font-size:1.1rem}.score b{font-size:1.3rem}
.cards{display:flex;flex-wrap:wrap;gap:.7rem;margin-top:.7rem}
.card{flex:1 1 14rem;border:1px solid #c9d3e0;border-radius:6px;padding:.5rem .7rem;background:#fff}
.card .v{font-size:1.15rem;font-weight:600}
nav a{margin-right:1rem}
table{border-collapse:collapse;width:100%;margin:.5rem 0;font-size:.92rem}
th,td{border:1px solid #d8dde6;padding:.3rem .5rem;text-align:left;vertical-align:top;
overflow-wrap:anywhere}
th{background:#eef1f6}td.n{white-space:nowrap;font-variant-numeric:tabular-nums}
figure{margin:1.2rem 0;border:1px solid #d8dde6;border-radius:6px;padding:.6rem}
figure img{max-width:100%;height:auto;display:block;margin:0 auto}
.reason{margin:.4rem 0}.rule,code{font-family:ui-monospace,monospace;font-size:.85rem;
background:#eef1f6;padding:0 .25rem;border-radius:3px}
.na{color:#8a93a3}.warn{color:#9a5b00}.bad{color:#a02020;font-weight:600}
pre{background:#f5f6f8;padding:.6rem;overflow-x:auto;font-size:.85rem;white-space:pre-wrap}
details summary{cursor:pointer;color:#2f6fb0}
"""

# ── the plots ────────────────────────────────────────────────────────────────────────────


def _fit_line(f: Mapping[str, Any] | None) -> str:
    if not f:
        return ""
    iv = f.get("interval") or {}
    head = f"{f.get('what')}: "
    if _is_num(f.get("estimate")):
        head += f"{_g3(f['estimate'])} {_iv(iv.get('lo'), iv.get('hi'), _g3, iv.get('level'))}"
        head += f" {f.get('unit') or ''}"
    else:
        head += "no estimate"
    tail = "" if f.get("can_tell") else f"; cannot tell: {f.get('why')}"
    return f"{head}; n = {f.get('n')}; {f.get('method')}{tail}"


def _plot_basis(name: str, d: Mapping[str, Any]) -> list[str]:
    fits = d.get("fits") or {}
    if name == "preemptions_vs_kv_util.png":
        return [_fit_line(fits.get("preemption_knee"))]
    if name == "throughput_vs_kv_util.png":
        return [_fit_line(fits.get(k)) for k in ("equal_kv_native", "equal_kv_lmcache")]
    if name == "lmcache_hit_rate.png":
        return [_fit_line(fits.get("lmcache_hitrate"))]
    if name == "cpu_tier_hit_ratio.png":
        tier = d.get("cpu_tier") or {}
        return [str(tier.get("method") or ""), str(tier.get("interval") or "")]
    kv = (d.get("forecast") or {}).get("kv_demand") or {}
    return [
        f"{kv.get('method')}, {_level_text(kv.get('level'))} interval; backtest coverage "
        f"{_pct(kv.get('backtest_coverage'))} over {kv.get('backtest_origins')} origins",
        f"capacity: {kv.get('capacity_basis')}",
    ]


def _plots(pngs: Mapping[str, bytes], d: Mapping[str, Any], anchor: str) -> Html:
    out = [f'<section id="{_e(anchor)}"><h2>Plots</h2>']
    if not pngs:
        out.append("<p>No plot: no fit or forecast ran on these windows.</p>")
    for name in PLOT_FILES:
        caption = PLOT_CAPTIONS[name]
        png = pngs.get(name)
        if png is None:
            why = NOT_DRAWN.get(name, "its fit or forecast did not run")
            out.append(f'<p class="small">{_e(caption)}: not drawn ({_e(why)}).</p>')
            continue
        data = base64.b64encode(png).decode("ascii")
        lines = [x for x in _plot_basis(name, d) if x]
        out.append(
            f'<figure><img src="data:image/png;base64,{data}" alt="{_e(caption)}">'
            f"<figcaption><b>{_e(caption)}</b>{_ul(lines)}</figcaption></figure>"
        )
    out.append("</section>")
    return Html("".join(out))


# ── the page ─────────────────────────────────────────────────────────────────────────────

_NAV = (
    ("plots", "Plots"),
    ("decision", "Decision"),
    ("offload", "Offload"),
    ("cpu-tier", "CPU tier"),
    ("happening", "What is happening"),
    ("fits", "Fits"),
    ("forecast", "Forecast"),
    ("sizing", "Sizing"),
    ("closed-loop", "Closed loop"),
    ("basis", "Basis"),
)


def _body(plan: Plan, d: Mapping[str, Any], seed: int, prefix: str) -> Html:
    return _join(
        [
            _plots(plot_pngs(plan, seed=seed), d, f"{prefix}plots"),
            _decision(d, f"{prefix}decision"),
            offload_html(d, f"{prefix}offload"),
            cpu_tier_html(d, f"{prefix}cpu-tier"),
            _happening(d, f"{prefix}happening"),
            _fits(d, f"{prefix}fits"),
            _forecast(d, f"{prefix}forecast"),
            _sizing(d, f"{prefix}sizing"),
        ]
    )


def _nav(links: Iterable[tuple[str, str]]) -> Html:
    return Html("<nav>" + "".join(f'<a href="#{_e(a)}">{_e(t)}</a>' for a, t in links) + "</nav>")


def render_report_html(
    plan: Plan,
    outcomes: Sequence[Outcome] = (),
    summary: Mapping[str, Any] | None = None,
    *,
    seed: int = 0,
    generated_at: float | None = None,
) -> str:
    """The page of ``plan`` (module docstring) with the closed-loop table of ``outcomes``
    (PlanOutcome-like: ``to_dict()`` or a mapping) and their ``summary``; ``seed`` draws the
    plots' subsamples; ``generated_at`` (epoch s) is printed when given."""
    d = plan.to_dict()
    w = d["window"]
    title = (
        "kvscope report"
        + (f" — cluster {d['cluster']}" if d.get("cluster") else "")
        + (f" — model group {d['group']}" if d.get("group") else "")
    )
    sub = (
        f"{_num(w.get('engines'))} engines, {_num(w.get('windows'))} windows, "
        f"{w.get('first_utc')} → {w.get('last_utc')}"
        + (f"; generated {_utc(generated_at)}" if generated_at is not None else "")
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_e(CSP)}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<link rel="icon" href="data:,">',
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>",
        f'<header><h1>{_e(title)}</h1><p class="sub">{_e(sub)}</p></header>',
        _headline(d),
    ]
    if plan.groups:
        links = [(f"g{i}", g.name) for i, g in enumerate(plan.groups)]
        parts.append(_nav([*links, ("pooled", "all groups pooled"), *_NAV[-2:]]))
        for i, (g, gd) in enumerate(zip(plan.groups, d["groups"], strict=True)):
            parts.append(
                f'<section id="g{i}"><h2>Model group {_e(g.name)}</h2>'
                f'<p class="sub">{_e(", ".join(g.engines))}</p>{_headline(gd["plan"])}'
                f"{_body(g.plan, gd['plan'], seed, f'g{i}-')}</section>"
            )
        parts.append(
            '<section id="pooled"><h2>All groups pooled (observations only: no fit, no '
            f"decision to act on)</h2>{_happening(d, 'happening')}{_forecast(d, 'forecast')}"
            "</section>"
        )
    else:
        parts += [_nav(_NAV), _body(plan, d, seed, "")]
    parts += [
        closed_loop_html(outcomes, summary),
        _basis(d, "basis"),
        '<footer class="small"><p>kvscope: a self-contained page (no script, nothing loaded '
        "from elsewhere); the only links out are the decision's cited sources.</p></footer>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def render_report(
    store: Store,
    cluster: str | None = None,
    *,
    since: float | None = None,
    horizon_s: float = 7 * 86400,
    seed: int = 0,
    forecast_seconds: float = 8.0,
    now: float | None = None,
) -> str:
    """The page of the cluster's plan built now from the store's windows (``since``: epoch s,
    None for all), with the stored plans scored against what happened (``now``: the clock
    of the closed loop and the page's date, default the current time). Raises NoData and
    ConfigError as build_plan does."""
    plan = build_plan(
        store,
        cluster=cluster,
        since=since,
        horizon_s=horizon_s,
        seed=seed,
        forecast_seconds=forecast_seconds,
    )
    outcomes, summary = closed_loop(store, cluster, now=now)
    at = time.time() if now is None else now
    return render_report_html(plan, outcomes, summary, seed=seed, generated_at=at)
