"""The HTML report's closed-loop section (planner/report/html.py puts it on the page): the
stored plans scored against what happened since, and their pooled accuracy summary.

- :func:`closed_loop_html` renders the section (pure: outcomes and their summary -> markup);
- :func:`closed_loop` reads a store: scores its stored plans (planner.plan.outcome).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from core.errors import ConfigError
from planner.plan import accuracy_summary, score_plans
from planner.report.html_parts import (
    Html,
    _e,
    _is_num,
    _iv,
    _join,
    _num,
    _pct,
    _scalar,
    _table,
    _utc,
)

if TYPE_CHECKING:
    from planner.plan import PlanOutcome
    from store.store import Store

__all__ = ["NO_SCORED_PLANS", "Outcome", "closed_loop", "closed_loop_html"]

NO_SCORED_PLANS = "closed loop: no scored plans yet"


class _HasToDict(Protocol):
    def to_dict(self) -> Mapping[str, Any]: ...


Outcome = Mapping[str, Any] | _HasToDict


# The contract of planner.plan.outcome: PlanOutcome.to_dict() (plan_id, cluster, group,
# created_at, horizon_end, level, kv_points, kv_covered, coverage, saturation: a verdict of
# SATURATION_VERDICTS, saturated_at, capacity: [{mode, predicted, lo, hi, measured, inside}],
# pending) and accuracy_summary() (plans, scored, pending, kv_demand, saturation, capacity).

_VERDICT_KEYS = ("verdict", "outcome", "status", "inside")


def _outcome_dict(o: Outcome) -> Mapping[str, Any]:
    if isinstance(o, Mapping):
        return o
    to_dict = getattr(o, "to_dict", None)
    d = to_dict() if callable(to_dict) else None
    if not isinstance(d, Mapping):
        raise ConfigError(f"closed loop: an outcome must be a mapping or have to_dict(), got {o!r}")
    return d


def _first(d: Mapping[str, Any], *keys: str) -> Any:
    return next((d[k] for k in keys if d.get(k) is not None), None)


def _brief(value: object) -> Html:
    """Anything else for people: a scalar; a mapping with its verdict first and its other
    scalars after it; a mapping of such by name, or a list of them (one per line)."""
    if value is None:
        return _e("n/a")
    if isinstance(value, list | tuple):
        return _join((_brief(v) for v in value), "<br>") if value else _e("none")
    if not isinstance(value, Mapping):
        return _e(_scalar(value))
    head = _first(value, *_VERDICT_KEYS)
    rest = [
        f"{k} {_scalar(v)}"
        for k, v in value.items()
        if k not in _VERDICT_KEYS and not isinstance(v, Mapping | list | tuple)
    ]
    nested = [(k, v) for k, v in value.items() if isinstance(v, Mapping)]
    if head is None and nested and not rest:  # {name: check, …}
        return _join((Html(f"<b>{_e(k)}</b>: {_brief(v)}") for k, v in nested), "<br>")
    text = Html(f"<b>{_e(_scalar(head))}</b>") if head is not None else Html("")
    return Html(text + (f" ({_e(', '.join(rest))})" if rest else ""))


def _pct1(x: object) -> str:
    return _pct(x, 1)


def _ratio2(x: object) -> str:
    return f"{x:.2f}" if _is_num(x) else "n/a"


def _capacity_check(g: Mapping[str, Any]) -> Html:
    """One CapacityCheck: the plan's capacity-ratio interval and whether the later plan's
    estimate is inside."""
    inside = g.get("inside")
    verdict = "inside" if inside is True else "outside" if inside is False else "cannot tell"
    measured = g.get("measured")
    later = _ratio2(measured) if _is_num(measured) else "n/a (the later windows cannot tell)"
    text = _e(verdict) if inside is not False else Html(f'<span class="bad">{_e(verdict)}</span>')
    return Html(
        f"<b>{_e(g.get('mode'))}</b>: {text}: predicted {_e(_ratio2(g.get('predicted')))} "
        f"{_e(_iv(g.get('lo'), g.get('hi'), _ratio2))}, measured {_e(later)}"
    )


def _capacity_cell(gains: object) -> Html:
    if isinstance(gains, list | tuple) and all(
        isinstance(g, Mapping) and "mode" in g for g in gains
    ):
        if not gains:
            return _e("no capacity interval in the plan")
        return _join((_capacity_check(g) for g in gains), "<br>")
    return _brief(gains)


def _saturation_cell(o: Mapping[str, Any]) -> Html:
    verdict = _first(o, "saturation", "saturation_verdict")
    if isinstance(verdict, str):
        at = o.get("saturated_at")
        cls = "bad" if verdict in ("earlier", "reached_unpredicted") else ""
        text = Html(f'<span class="{cls}">{_e(verdict)}</span>') if cls else _e(verdict)
        return Html(f"{text} (saturated {_e(_utc(at))})" if _is_num(at) else text)
    return _brief(verdict)


def _coverage(o: Mapping[str, Any]) -> Html:
    cov, level = o.get("coverage"), o.get("level")
    if not _is_num(cov):
        none_yet = not o.get("kv_points")
        return _e("n/a: no realised point to compare" if none_yet else "n/a")
    text = _e(_pct(cov, 1))
    if _is_num(level) and cov < level:
        text = Html(f'<span class="bad">{text}</span>')
    return Html(
        f"{text} ({_e(_num(o.get('kv_covered')))} of {_e(_num(o.get('kv_points')))} points "
        f"inside; nominal {_e(_pct(level))})"
    )


def _share(d: Mapping[str, Any], key: str = "share") -> tuple[str, str]:
    """(share, its interval) of a summary entry (accuracy_summary's Wilson intervals)."""
    iv = d.get("interval") or {}
    interval = _iv(iv.get("lo"), iv.get("hi"), _pct1, iv.get("level"))
    if iv.get("method") and interval.endswith(" interval)"):
        interval = f"{interval[:-1]}, {iv['method']})"
    return _pct1(d.get(key)), interval


def _summary_rows(s: Mapping[str, Any]) -> list[Sequence[object]]:
    rows: list[Sequence[object]] = []
    known = {"plans", "scored", "pending", "kv_demand", "saturation", "capacity"}
    if "plans" in s:
        rows.append(("plans", f"{_num(s.get('plans'))} stored: {_num(s.get('scored'))} scored, "
                     f"{_num(s.get('pending'))} pending (horizon not passed)", "", ""))  # fmt: skip
    kv = s.get("kv_demand")
    if isinstance(kv, Mapping):
        share, interval = _share(kv, "coverage")
        nominal = f"nominal {_pct1(kv.get('nominal'))}"
        if isinstance(kv.get("nominal_inside"), bool):
            nominal += " (inside the interval)" if kv["nominal_inside"] else " (outside it)"
        rows.append(
            (
                "KV demand inside the forecast intervals",
                f"{share}: {_num(kv.get('covered'))} of {_num(kv.get('points'))} points, "
                f"{_num(kv.get('plans'))} plan(s); {nominal}",
                interval,
                kv.get("note") or "",
            )
        )
    sat = s.get("saturation")
    if isinstance(sat, Mapping):
        seen = [f"{k} {v}" for k, v in sat.items() if v]
        rows.append(("saturation verdicts", ", ".join(seen) or "none scored", "", ""))
    gains = s.get("capacity")
    if isinstance(gains, Mapping):
        share, interval = _share(gains)
        per_mode = [
            f"{m} {_num(g.get('inside'))}/{_num(g.get('checks'))} inside"
            for m, g in (gains.get("by_mode") or {}).items()
            if isinstance(g, Mapping) and g.get("checks")
        ]
        rows.append(
            (
                "capacity ratios inside their intervals",
                f"{share}: {_num(gains.get('inside'))} inside, {_num(gains.get('outside'))} "
                f"outside, {_num(gains.get('cannot_tell'))} cannot tell"
                + (f" ({'; '.join(per_mode)})" if per_mode else ""),
                interval,
                gains.get("note") or "",
            )
        )
    rows += [(k, _brief(v), "", "") for k, v in s.items() if k not in known]
    return rows


def closed_loop_html(outcomes: Sequence[Outcome], summary: Mapping[str, Any] | None) -> Html:
    """The closed-loop section: the summary of accuracy_summary() and one row per stored
    plan (planner.plan.outcome's PlanOutcome, or a mapping of its to_dict() keys)."""
    out = ['<section id="closed-loop"><h2>Closed loop: past plans against what happened</h2>']
    rows = [_outcome_dict(o) for o in outcomes]
    if not rows:
        out.append(
            f"<p><b>{_e(NO_SCORED_PLANS)}</b>: a stored plan (<code>kvscope plan --save</code>) "
            "is scored once its horizon has passed and the windows after it have arrived.</p>"
        )
        return Html("".join(out) + "</section>")
    if summary:
        summary_head = ("pooled over the plans", "value", "interval", "note")
        out.append(f"<h3>Summary</h3>{_table(summary_head, _summary_rows(summary), (2,))}")
    table_rows = []
    for o in rows:
        ident = (
            f"#{o.get('plan_id')}",
            _join([o.get("cluster") or "n/a", o.get("group") or "whole cluster"], "<br>"),
            _utc(o.get("created_at")),
            _utc(o.get("horizon_end")),
        )
        if o.get("pending"):
            wait = f"pending: the horizon ends {_utc(o.get('horizon_end'))}"
            table_rows.append((*ident, wait, "", ""))
            continue
        table_rows.append(
            (
                *ident,
                _coverage(o),
                _saturation_cell(o),
                _capacity_cell(_first(o, "capacity", "gains")),
            )
        )
    kv_column = "KV demand inside the forecast interval"
    columns = ("plan", "cluster / group", "made", "horizon end", kv_column, "saturation",
               "capacity ratio at the SLO")  # fmt: skip
    out.append(f"<h3>Plans</h3>{_table(columns, table_rows, (0, 2, 3))}")
    return Html("".join(out) + "</section>")


def closed_loop(
    store: Store, cluster: str | None = None, *, now: float | None = None
) -> tuple[list[PlanOutcome], dict[str, Any]]:
    """The stored plans scored against what happened (planner.plan.outcome's score_plans) and
    their accuracy_summary; none when the store holds no plan."""
    outcomes = score_plans(store, cluster, now=now)
    return outcomes, (accuracy_summary(outcomes) if outcomes else {})
