"""The report's offload section: per mode, today's effects, capacity at the SLO and the
bill, as tables (the same figures as planner/report/verdict_text.py, from the plan's JSON)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from planner.report.html_parts import Html, _details, _e, _table
from planner.report.verdict_text import bill_text, capacity_text, effect_text, experiment_lines


def _mode(mode: str, m: Mapping[str, Any]) -> Html:
    u = m.get("units") or {}
    head = (
        f"<h3>{_e(mode)}: {_e(u.get('with_mode', 0))} unit(s) with it, "
        f"{_e(u.get('without_offload', 0))} without ({_e(m.get('design'))})</h3>"
    )
    rows: list[Sequence[object]] = []
    t = m.get("today")
    if t is None or not t.get("can_tell"):
        why = (t or {}).get("why") or m.get("why") or "not estimated"
        rows.append(("today", "cannot tell", why))
    else:
        rows += [("today: " + str(e["label"]), *effect_text(e)) for e in t["effects"]]
    rows.append(("capacity at the SLO", *capacity_text(m.get("capacity"))))
    rows.append(("the bill at the forecast peak", *bill_text(m.get("bill"), mode)))
    notes = [*((t or {}).get("warnings") or []), *((t or {}).get("assumptions") or [])]
    cap = m.get("capacity") or {}
    notes += [cap.get("method"), *(cap.get("assumptions") or [])]
    plan = experiment_lines(m.get("experiment"))
    proposal = "".join(f"<p>{_e(line)}</p>" for line in plan)
    return Html(
        head
        + _table(("figure", "value", "basis"), rows, (1,))
        + proposal
        + _details("method, assumptions and warnings", notes)
    )


def offload_html(d: Mapping[str, Any], anchor: str) -> Html:
    """The section, or a note that the plan has none (several model groups)."""
    section = d.get("offload")
    out = [f'<section id="{_e(anchor)}"><h2>Offload: today, capacity, the bill</h2>']
    if not section:
        out.append("<p>No offload section here: each model group has its own.</p>")
    else:
        level = (section.get("levels") or {}).get("reported", 0.9)
        out.append(
            f'<p class="small">SLO: {_e(section["slo"]["text"])}. {_e(f"{level:.0%}")} '
            f"intervals over engines or LMCache pools, never windows. "
            f"{_e(section.get('basis'))}</p>"
        )
        out += [_mode(mode, m) for mode, m in section["modes"].items()]
    out.append("</section>")
    return Html("".join(out))
