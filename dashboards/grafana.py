"""Dashboards as plain data, rendered with grafanalib and normalised to current Grafana JSON.

A :class:`Board` of :class:`Row`\\ s of :class:`Chart`\\ s (with :class:`Query`\\ s, a table's
joined into :class:`Column`\\ s); :func:`render` lays them out on Grafana's 24-column grid and
:func:`normalise` turns grafanalib's schema-12 JSON into what Grafana 11.6+/12 stores
(schemaVersion 41, the ``${datasource}`` variable everywhere, legacy keys and nulls dropped,
stable ids).

Rules: dashboards/DESIGN.md#grafana
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

__all__ = [
    "DATASOURCE",
    "SCHEMA_VERSION",
    "Board",
    "Chart",
    "Column",
    "Query",
    "Row",
    "Variable",
    "normalise",
    "render",
]

SCHEMA_VERSION = 41  # Grafana 11.6 / 12.0; the backend migrator refuses below 13 (grafana#102088)
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24

Kind = Literal["timeseries", "stat", "state-timeline", "table"]


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL target: its expression and legend (``{{label}}`` templates)."""

    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True, slots=True)
class Column:
    """A table column: the value of one of the chart's queries (in query order), titled,
    with its own unit and value mappings."""

    title: str
    unit: str
    mappings: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Chart:
    """One panel. ``description`` says what the number is and where it comes from."""

    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    kind: Kind = "timeseries"
    width: int = 12
    height: int = 8
    min: float | None = None
    max: float | None = None
    stack: bool = False
    mappings: tuple[tuple[str, str], ...] = ()  # (value, text) for stat / state panels
    # a table of instant queries joined on the labels ``keys`` (shown first, in order), one
    # column per query; each query must keep exactly those labels (``max by (keys) (…)``)
    keys: tuple[str, ...] = ()
    columns: tuple[Column, ...] = ()

    def __post_init__(self) -> None:
        if self.columns and (self.kind != "table" or len(self.columns) != len(self.queries)):
            raise ValueError(f"{self.title}: columns need a table with one query per column")


@dataclass(frozen=True, slots=True)
class Row:
    title: str
    charts: tuple[Chart, ...]


@dataclass(frozen=True, slots=True)
class Variable:
    """A query variable: ``label_values(<selector>, <label>)``, multi-select with All."""

    name: str
    label: str
    selector: str
    target_label: str

    def query(self) -> str:
        return f"label_values({self.selector}, {self.target_label})"


@dataclass(frozen=True, slots=True)
class Board:
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    variables: tuple[Variable, ...]
    tags: tuple[str, ...] = field(default=("kvscope",))


def _thresholds() -> list[g.Threshold]:
    return [g.Threshold("green", 0, 0.0)]


def _targets(chart: Chart) -> list[g.Target]:
    return [
        g.Target(expr=qu.expr, legendFormat=qu.legend, refId=chr(ord("A") + i),
                 instant=qu.instant, datasource=DATASOURCE,
                 format="table" if chart.kind == "table" else "time_series")
        for i, qu in enumerate(chart.queries)
    ]  # fmt: skip


def _panel(chart: Chart, pos: g.GridPos) -> g.Panel:
    common: dict[str, Any] = {
        "title": chart.title, "description": chart.description, "gridPos": pos,
        "targets": _targets(chart), "dataSource": DATASOURCE,
    }  # fmt: skip
    if chart.kind == "stat":
        return g.Stat(format=chart.unit, reduceCalc="lastNotNull", graphMode="none",
                      thresholds=_thresholds(), **common)  # fmt: skip
    if chart.kind == "table":
        return g.Table(**common)
    if chart.kind == "state-timeline":
        return g.StateTimeline(thresholds=_thresholds(), **common)
    return g.TimeSeries(unit=chart.unit, stacking={"mode": "normal"} if chart.stack else {},
                        fillOpacity=20 if chart.stack else 0, **common)  # fmt: skip


def _layout(rows: Iterable[Row]) -> list[g.Panel | g.RowPanel]:
    out: list[g.Panel | g.RowPanel] = []
    y = 0
    for row in rows:
        out.append(g.RowPanel(title=row.title, gridPos=g.GridPos(h=1, w=GRID_WIDTH, x=0, y=y)))
        y += 1
        x, line_h = 0, 0
        for chart in row.charts:
            if x + chart.width > GRID_WIDTH:
                x, y, line_h = 0, y + line_h, 0
            out.append(_panel(chart, g.GridPos(h=chart.height, w=chart.width, x=x, y=y)))
            x += chart.width
            line_h = max(line_h, chart.height)
        y += line_h
    return out


def _template(v: Variable) -> g.Template:
    return g.Template(name=v.name, label=v.label, query=v.query(), dataSource=DATASOURCE,
                      includeAll=True, multi=True, allValue=".*", refresh=2)  # fmt: skip


def render(board: Board, links: Iterable[tuple[str, str]] = ()) -> dict[str, Any]:
    """The board as normalised Grafana dashboard JSON; ``links`` are (title, uid) of the
    other kvscope dashboards (each opens with the same time range and variables)."""
    datasource = g.Template(name="datasource", label="Data source", query="prometheus",
                            type="datasource")  # fmt: skip
    dash = g.Dashboard(
        title=board.title, uid=board.uid, description=board.description,
        tags=list(board.tags), timezone="browser", refresh="30s",
        time=g.Time("now-6h", "now"), panels=_layout(board.rows),
        templating=g.Templating(list=[datasource, *(_template(v) for v in board.variables)]),
        links=[g.DashboardLink(title=title, type="link", uri=f"/d/{uid}", icon="dashboard",
                               keepTime=True, includeVars=True) for title, uid in links],
    )  # fmt: skip
    raw = json.loads(json.dumps(dash.to_json_data(), cls=DashboardEncoder))
    return normalise(raw, charts=[c for r in board.rows for c in r.charts])


# --------------------------------------------------------------------------- normalisation

_DASHBOARD_LEGACY = ("rows", "style", "hideControls", "sharedCrosshair", "__inputs", "gnetId")
# What a panel keeps (Grafana's v1 Panel model; grafanalib also writes span, height, error,
# cacheTimeout, maxDataPoints, legacy table columns, …, which current Grafana rejects).
_PANEL_KEEP = ("type", "title", "description", "datasource", "gridPos", "id", "links",
               "targets", "fieldConfig", "options", "transformations", "repeat", "interval",
               "timeFrom", "timeShift")  # fmt: skip
_TARGET_KEEP = ("datasource", "expr", "legendFormat", "refId", "instant", "range", "format",
                "interval", "hide")  # fmt: skip
_VARIABLE_KEEP = ("name", "label", "type", "query", "datasource", "includeAll", "multi",
                  "allValue", "refresh", "sort", "hide", "current", "options", "regex")  # fmt: skip


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _target(t: dict[str, Any]) -> dict[str, Any]:
    out = {k: t[k] for k in _TARGET_KEEP if k in t}
    out["datasource"] = dict(DATASOURCE)
    out["range"] = not out.get("instant", False)
    return out


def _mappings(pairs: tuple[tuple[str, str], ...]) -> list[dict[str, Any]]:
    return [{"type": "value", "options": {v: {"text": text, "index": i}
                                          for i, (v, text) in enumerate(pairs)}}]  # fmt: skip


def _joined(panel: dict[str, Any], chart: Chart) -> None:
    """A table of columns: its queries merged on their labels, the time dropped, the values
    renamed and ordered after ``keys``, each column with its unit (overrides by name)."""
    values = {f"Value #{chr(ord('A') + i)}": c.title for i, c in enumerate(chart.columns)}
    panel["transformations"] = [
        {"id": "merge", "options": {}},
        {"id": "organize", "options": {
            "excludeByName": {"Time": True},
            "renameByName": values,
            "indexByName": {name: i for i, name in enumerate([*chart.keys, *values])},
        }},
    ]  # fmt: skip
    overrides = []
    for c in chart.columns:
        props: list[dict[str, Any]] = [{"id": "unit", "value": c.unit}]
        if c.mappings:
            props.append({"id": "mappings", "value": _mappings(c.mappings)})
        overrides.append({"matcher": {"id": "byName", "options": c.title}, "properties": props})
    panel["fieldConfig"]["overrides"] = overrides


def _field_config(panel: dict[str, Any], chart: Chart | None) -> None:
    fc = panel.setdefault("fieldConfig", {"defaults": {}, "overrides": []})
    defaults = fc.setdefault("defaults", {})
    fc.setdefault("overrides", [])
    if chart is None:
        return
    defaults["unit"] = chart.unit
    for key in ("min", "max"):
        value = getattr(chart, key)
        if value is not None:
            defaults[key] = value
    defaults["thresholds"] = {"mode": "absolute", "steps": [{"color": "green", "value": None}]}
    if chart.mappings:
        defaults["mappings"] = _mappings(chart.mappings)
    if chart.columns:
        _joined(panel, chart)


def _panel_json(panel: dict[str, Any], chart: Chart | None, pid: int) -> dict[str, Any]:
    panel = {k: panel[k] for k in _PANEL_KEEP if k in panel}
    for key in ("repeat", "interval", "timeFrom", "timeShift"):
        if not panel.get(key):
            panel.pop(key, None)
    if not panel.get("links"):
        panel["links"] = []
    panel["id"] = pid
    if panel.get("type") == "row":
        panel.pop("datasource", None)
        panel.setdefault("panels", [])
        panel["collapsed"] = bool(panel.get("collapsed"))
        return {k: panel[k] for k in ("type", "title", "id", "gridPos", "collapsed", "panels")}
    panel["datasource"] = dict(DATASOURCE)
    panel["targets"] = [_target(t) for t in panel.get("targets", [])]
    out: dict[str, Any] = _drop_nulls(panel)
    _field_config(out, chart)  # after: a threshold base step's value is null by design
    return out


def _variable(v: dict[str, Any]) -> dict[str, Any]:
    out = {k: v[k] for k in _VARIABLE_KEEP if k in v and v[k] is not None}
    if out.get("type") == "datasource":
        out.pop("datasource", None)
        out["current"] = {"text": "Prometheus", "value": "prometheus"}
        out.pop("includeAll", None)
        out.pop("multi", None)
        out.pop("allValue", None)
    else:
        out["datasource"] = dict(DATASOURCE)
        out["current"] = {"text": ["All"], "value": ["$__all"]}
    out["options"] = []
    return out


def normalise(raw: dict[str, Any], charts: list[Chart] | None = None) -> dict[str, Any]:
    """grafanalib's dashboard JSON made schema-41 clean (DESIGN.md#grafana);
    ``charts`` in panel order (rows excluded) put units, limits and mappings in place."""
    doc = {k: v for k, v in raw.items() if k not in _DASHBOARD_LEGACY}
    doc["id"] = None
    doc["schemaVersion"] = SCHEMA_VERSION
    doc["version"] = 1
    doc["editable"] = True
    doc["graphTooltip"] = 1  # shared crosshair: lines up preemptions with KV use
    doc["fiscalYearStartMonth"] = 0
    doc["timepicker"] = {"refresh_intervals": raw["timepicker"]["refresh_intervals"]}
    doc["templating"] = {"list": [_variable(v) for v in raw["templating"]["list"]]}
    doc["annotations"] = {"list": []}
    out: dict[str, Any] = _drop_nulls({k: v for k, v in doc.items() if k != "panels"})
    queue = list(charts or [])
    panels = []
    for pid, p in enumerate(raw.get("panels", []), 1):
        chart = queue.pop(0) if p.get("type") != "row" and queue else None
        panels.append(_panel_json(dict(p), chart, pid))
    out["panels"] = panels
    out["id"] = None  # the one null Grafana wants: let the instance assign it
    return out
