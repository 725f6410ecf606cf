"""The HTML report's building blocks (planner/report/html.py): escaped markup, the number
formatters, tables and lists, and the headline with its cards.

:class:`Html` is markup already escaped; every other value goes through :func:`_e` where it
is inserted. The formatters return plain text ("n/a" for what the data could not tell). The
underscored helpers are shared by the report's modules (html, html_sections, html_closed_loop) only.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeGuard
from urllib.parse import urlsplit

from core.durations import format_duration
from planner.report.plan_text import saturation_probability

__all__ = ["Html"]


class Html(str):
    """Markup already escaped (or built from escaped parts): inserted as is."""

    __slots__ = ()


def _e(x: object) -> Html:
    return x if isinstance(x, Html) else Html(html.escape(str(x), quote=True))


def _join(parts: Iterable[object], sep: str = "") -> Html:
    return Html(sep.join(_e(p) for p in parts))


def _tag(name: str, body: object = "", **attrs: str) -> Html:
    at = "".join(f' {k.rstrip("_")}="{_e(v)}"' for k, v in attrs.items())
    return Html(f"<{name}{at}>{_e(body)}</{name}>")


def _is_num(x: object) -> TypeGuard[float]:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


# The formatters return plain text ("n/a" for what the data could not tell), escaped where
# they are inserted.
def _pct(x: object, digits: int = 0) -> str:
    return f"{x:.{digits}%}".replace("%", " %") if _is_num(x) else "n/a"


def _num(x: object, fmt: str = "{:,.0f}") -> str:
    return fmt.format(x) if _is_num(x) else "n/a"


def _g3(x: object) -> str:
    return _num(x, "{:.3g}")


def _big(x: object, unit: str = "") -> str:
    if not _is_num(x):
        return "n/a"
    for div, suffix in ((1e12, " T"), (1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}{unit}"
    return f"{x:.3g}{' ' + unit if unit else ''}"


def _iv(lo: object, hi: object, fmt: Callable[[object], str], level: object = None) -> str:
    """The interval as "[lo, hi] (95 % interval)"; "[n/a]" when a bound is missing."""
    if not (_is_num(lo) and _is_num(hi)):
        return "[n/a]"
    tail = f" ({_pct(level)} interval)" if _is_num(level) else ""
    return f"[{fmt(lo)}, {fmt(hi)}]{tail}"


def _utc(t: object) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t)) if _is_num(t) else "n/a"


def _hours(s: object) -> str:
    return format_duration(s) if _is_num(s) else "n/a"


def _level_text(level: object) -> str:
    return f"{level:.0%}" if _is_num(level) else "n/a"


def _link(url: object, text: object) -> Html:
    """A link to a cited source (http/https only; anything else stays text)."""
    if isinstance(url, str):
        parts = urlsplit(url)
        if parts.scheme in ("http", "https") and parts.netloc:
            return _tag("a", text, href=url, rel="noopener noreferrer")
    return _e(text)


def _table(
    head: Sequence[str], rows: Iterable[Sequence[object]], nowrap: Sequence[int] = ()
) -> Html:
    """A table; cells are escaped unless Html; the columns ``nowrap`` (indexes) hold short
    numbers, kept on one line."""
    out = ["<table><thead><tr>", *(f"<th>{_e(h)}</th>" for h in head), "</tr></thead><tbody>"]
    for row in rows:
        out.append("<tr>")
        for i, cell in enumerate(row):
            cls = ' class="n"' if i in nowrap else ""
            out.append(f"<td{cls}>{_e(cell)}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return Html("".join(out))


def _ul(items: Iterable[object], cls: str = "") -> Html:
    lis = "".join(f"<li>{_e(i)}</li>" for i in items)
    return Html(f'<ul class="{cls}">{lis}</ul>' if cls else f"<ul>{lis}</ul>")


def _details(summary: str, lines: Iterable[object]) -> Html:
    items = [x for x in lines if x]
    if not items:
        return Html("")
    return Html(f"<details><summary>{_e(summary)}</summary>{_ul(items)}</details>")


def _scalar(v: object) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float) and _is_num(v):
        return f"{v:.4g}"
    return "n/a" if v is None else str(v)


# ── the headline ─────────────────────────────────────────────────────────────────────────
# In every f-string that makes Html below, each value goes through _e() (Html passes as is).


def _score_line(dec: Mapping[str, Any]) -> Html:
    return Html(
        f'<div class="score">decision score <b>{_e(_num(dec.get("score"), "{:.2f}"))}</b> '
        f"({_e(dec.get('score_label') or '')}): <b>a rule score, not a probability</b></div>"
        f'<div class="small">{_e(dec.get("score_is") or "")}</div>'
    )


def _card(title: str, value: str, sure: str, source: object) -> Html:
    return Html(
        f'<div class="card"><div class="small">{_e(title)}</div><div class="v">{_e(value)}</div>'
        f'<div class="small">{_e(sure)}</div><div class="small">from: {_e(source)}</div></div>'
    )


def _headline(d: Mapping[str, Any]) -> Html:
    dec = d.get("decision")
    parts = ['<section class="headline">']
    if dec:
        parts.append(f'<div class="mode">Decision: {_e(str(dec["mode"]).upper())}</div>')
        parts.append(_score_line(dec))
    elif d.get("groups"):
        parts.append('<div class="mode">Decided per model group</div><ul>')
        for g in d["groups"]:
            gd = g["plan"].get("decision") or {}
            parts.append(
                f"<li><b>{_e(g['name'])}</b>: {_e(str(gd.get('mode', 'n/a')).upper())}, "
                f"decision score {_e(_num(gd.get('score'), '{:.2f}'))} "
                f"({_e(gd.get('score_label') or '')}; a rule score, not a probability)</li>"
            )
        parts.append("</ul>")
    else:
        parts.append('<div class="mode">No decision</div>')
    parts.append(f'<div class="cards">{_cards(d)}</div></section>')
    return Html("".join(parts))


def _cards(d: Mapping[str, Any]) -> Html:
    kv_use = d["happening"]["kv_util"]
    fc = d.get("forecast") or {}
    ev, kv = d.get("evidence") or {}, fc.get("kv_demand") or {}
    peak = ev.get("demand_peak") or {}
    cards = [
        _card(
            "KV-cache use now (p50 / p95)",
            f"{_pct(kv_use.get('p50'))} / {_pct(kv_use.get('p95'))}",
            f"observed over {_num(kv_use.get('windows'))} engine-windows",
            kv_use.get("basis", ""),
        )
    ]
    if kv.get("can_tell"):
        cards.append(
            _card(
                f"KV demand peak forecast ({kv.get('unit') or ''})",
                f"{_big(peak.get('estimate'))} of {_big(kv.get('capacity_total'))} capacity",
                _iv(peak.get("lo"), peak.get("hi"), _big, kv.get("level")),
                f"{kv.get('method')}; capacity: {kv.get('capacity_basis')}",
            )
        )
        cards.append(
            _card(
                "time to HBM saturation",
                _saturation_point(kv, fc),
                f"earliest {_hours(kv.get('time_to_saturation_lo_s'))}, latest "
                f"{_saturation_bound(kv.get('time_to_saturation_hi_s'), fc)}",
                f"{kv.get('method')}; P(saturation) {saturation_probability(kv)}",
            )
        )
    engines = (d.get("sizing") or {}).get("engines")
    if engines:
        cards.append(
            _card(
                "engines needed",
                f"{_num(engines.get('needed'))} (now {_num(engines.get('current'))})",
                _iv(engines.get("lo"), engines.get("hi"), _num),
                engines.get("demand_basis") or engines.get("basis") or "",
            )
        )
    return _join(cards)


def _saturation_point(kv: Mapping[str, Any], fc: Mapping[str, Any]) -> str:
    ts, lo = kv.get("time_to_saturation_s"), kv.get("time_to_saturation_lo_s")
    if ts is None and lo is None:
        return f"not within {_hours(fc.get('horizon_s'))}"
    return _saturation_bound(ts, fc)


def _saturation_bound(t: object, fc: Mapping[str, Any]) -> str:
    return _hours(t) if _is_num(t) else f"> {_hours(fc.get('horizon_s'))}"
