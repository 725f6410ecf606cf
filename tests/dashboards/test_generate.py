"""`kvscope dashboards build`: the committed files are current, output is deterministic, and
the generated dashboards and rules keep the conventions they promise (dashboards/grafana.py,
dashboards/promql.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from core import catalog
from dashboards.config import DEFAULT
from dashboards.generate import DASHBOARD_DIR, RULES_DIR, artifacts, check, write
from dashboards.grafana import DATASOURCE, SCHEMA_VERSION, Chart, Column, Query
from dashboards.recording_rules import RECORDS
from dashboards.variables import board_scope
from tests.clirun import run_kvscope

ROOT = Path(__file__).resolve().parents[2]
PARTS: tuple[catalog.Part, ...] = ("bucket", "sum", "count")


def _dashboards() -> dict[str, dict[str, Any]]:
    return {r.stem: json.loads(t) for r, t in artifacts().items() if r.parent == DASHBOARD_DIR}


def _exprs() -> list[str]:
    """Every PromQL expression generated: panel targets, recording and alerting rules."""
    out = [t["expr"] for d in _dashboards().values() for p in d["panels"]
           for t in p.get("targets", [])]  # fmt: skip

    for rel, text in artifacts().items():
        if rel.parent == RULES_DIR:
            out += [r["expr"] for g in yaml.safe_load(text)["groups"] for r in g["rules"]]
    return out


def test_build_check_committed_files_are_current() -> None:
    proc = run_kvscope("dashboards", "build", "--check", "--out", str(ROOT))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"check": "ok", "files": len(artifacts())}


def test_build_check_stale_missing_and_stray_files_fail_naming_each(tmp_path: Path) -> None:
    written = write(tmp_path)
    assert {p.relative_to(tmp_path) for p in written} == set(artifacts())
    assert check(tmp_path) == []
    edited, removed = written[0], written[-1]
    edited.write_text(edited.read_text().replace("kvscope", "kvsc0pe", 1))
    removed.unlink()
    stray = tmp_path / DASHBOARD_DIR / "hand-made.json"
    stray.write_text("{}")
    assert {(s.path, s.why) for s in check(tmp_path)} == {
        (edited, "differs"), (removed, "missing"), (stray, "not generated")
    }  # fmt: skip
    proc = run_kvscope("dashboards", "build", "--check", "--out", str(tmp_path))
    assert proc.returncode == 1 and proc.stdout == ""
    for path in (edited, removed, stray):
        assert str(path) in proc.stderr


def test_build_same_config_twice_gives_identical_bytes() -> None:
    assert artifacts() == artifacts()


def test_build_runbook_base_option_changes_only_the_alerts(tmp_path: Path) -> None:
    proc = run_kvscope("dashboards", "build", "--out", str(tmp_path),
                       "--runbook-base", "https://wiki.example/runbooks")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    stale = {s.path.name for s in check(tmp_path)}
    assert stale == {"kvscope-alerts.yml", "kvscope-rules.yaml"}  # the PrometheusRule holds them
    assert (
        "https://wiki.example/runbooks#kvscopevllmpreemptionstorm"
        in (tmp_path / RULES_DIR / "kvscope-alerts.yml").read_text()
    )


@pytest.mark.parametrize("uid", sorted(_dashboards()))
def test_dashboard_conventions_hold(uid: str) -> None:
    doc = _dashboards()[uid]
    assert doc["uid"] == uid and doc["id"] is None
    assert doc["schemaVersion"] >= SCHEMA_VERSION >= 41
    names = [v["name"] for v in doc["templating"]["list"]]
    assert names[0] == "datasource"
    if uid != "kvscope-planner":
        assert {"model_name", "instance", "engine"} <= set(names)
    others = {u for u in _dashboards() if u != uid}
    assert {link["url"].removeprefix("/d/") for link in doc["links"]} == others
    ids = [p["id"] for p in doc["panels"]]
    assert ids == list(range(1, len(ids) + 1))
    for panel in doc["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']}: no unit"
        assert panel.get("description"), f"{panel['title']}: no description"
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE
            windows = set(re.findall(r"\[([^\]]+)\]", target["expr"]))
            assert windows <= {"$__rate_interval"}, (panel["title"], windows)


def test_dashboards_hard_code_no_datasource_uid() -> None:
    text = "".join(t for r, t in artifacts().items() if r.parent == DASHBOARD_DIR)
    uids = set(re.findall(r'"uid": "([^"]*)"', text)) - set(_dashboards())
    assert uids == {"${datasource}"}
    assert "DS_PROMETHEUS" not in text and '"schemaVersion": 12' not in text


def _divisions(expr: str) -> int:
    """The division operators of a PromQL expression: every ``/`` outside a string (label
    values may hold one), however it is spaced."""
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr).count("/")


def test_division_count_sees_every_spacing_and_skips_strings() -> None:
    assert _divisions("a / b") == _divisions("a/b") == _divisions("a /b") == 1
    assert _divisions('sum(x{path="/v1/a\\"/b"}) / (y > 0)') == 1


def test_every_division_is_guarded_against_zero() -> None:
    for expr in _exprs():
        assert _divisions(expr) == expr.count(") > 0)"), expr


def test_every_quantile_sums_by_le() -> None:
    for expr in _exprs():
        for m in re.finditer(r"histogram_quantile\(([0-9.]+), (\w+) by \(([^)]*)\)", expr):
            assert m.group(2) == "sum" and "le" in m.group(3).split(", "), expr
        assert expr.count("histogram_quantile(") == expr.count(", sum by (le"), expr


def _counter_names() -> set[str]:
    out: set[str] = set()
    for sig in catalog.SIGNALS.values():
        if sig.kind == "counter":
            out.update(catalog.exposed_names(sig.name))
        elif sig.kind == "histogram":
            for part in PARTS:
                out.update(catalog.exposed_names(sig.name, part))
    return out


def test_every_counter_and_histogram_is_read_through_rate() -> None:
    counters = _counter_names()
    for expr in _exprs():
        for m in re.finditer(r'(\w*)\(\{__name__=~"([^"]+)"', expr):
            if set(m.group(2).split("|")) & counters:
                assert m.group(1) == "rate", f"{m.group(0)} in {expr}"
        for m in re.finditer(r'(?<![(\w])\{__name__=~"([^"]+)"', expr):
            assert not set(m.group(1).split("|")) & counters, f"bare counter in {expr}"


def test_every_spelling_of_every_signal_used_is_matched() -> None:
    """A signal the generated PromQL reads is read under every name the catalogue knows:
    each release's spelling, with and without the colon (the OpenMetrics rewrite)."""
    text = "\n".join(_exprs())
    used = [s for s in catalog.SIGNALS.values()
            if any(n in text for n in catalog.exposed_names(s.name))]  # fmt: skip
    assert len(used) >= 30
    for sig in used:
        parts: tuple[catalog.Part, ...] = PARTS if sig.kind == "histogram" else ("bucket",)
        if sig.kind == "histogram" and not any(
            n in text for n in catalog.exposed_names(sig.name, "sum")
        ):
            parts = ("bucket",)
        for part in parts:
            for name in catalog.exposed_names(sig.name, part):
                assert name in text, f"{sig.name}: {name} is not matched"


def test_every_panel_rate_and_ratio_is_a_recording_rule_expression() -> None:
    """A panel computing a rate or a ratio draws exactly what a recording rule records (the
    same builder in the dashboard's scope), so the alerts test what the operator sees."""
    recorded = {r.expr(board_scope(DEFAULT), DEFAULT) for r in RECORDS}
    loose = [
        f"{uid} / {p['title']}: {t['expr'][:120]}"
        for uid, d in _dashboards().items() for p in d["panels"] for t in p.get("targets", [])
        if ("rate(" in t["expr"] or " / " in t["expr"]) and t["expr"] not in recorded
    ]  # fmt: skip
    assert not loose, "panel rates/ratios without a recording rule:\n" + "\n".join(loose)


def test_planner_cpu_tier_table_joins_one_column_per_query_on_tier_and_size() -> None:
    panels = {p["title"]: p for p in _dashboards()["kvscope-planner"]["panels"]}
    table = panels["What a CPU tier would buy"]
    assert table["type"] == "table"
    assert "model-based" in table["description"]
    assert "not confidence intervals" in table["description"]
    assert "--kv-cache-metrics" in table["description"]
    targets = table["targets"]
    assert all(t["instant"] and t["format"] == "table" for t in targets)
    keys = "cluster, group, mode, size"
    assert all(t["expr"].startswith(f"max by ({keys}) (") for t in targets)
    merge, organize = table["transformations"]
    assert merge["id"] == "merge" and organize["id"] == "organize"
    renamed = organize["options"]["renameByName"]
    assert list(renamed) == [f"Value #{t['refId']}" for t in targets]
    overrides = [o["matcher"]["options"] for o in table["fieldConfig"]["overrides"]]
    assert overrides == list(renamed.values())  # each column's unit reaches its column
    order = organize["options"]["indexByName"]
    assert sorted(order, key=order.__getitem__) == [*keys.split(", "), *renamed]
    assert 'bound="lower"' in targets[1]["expr"] and 'bound="upper"' in targets[2]["expr"]
    stat = panels["Recommended CPU tier size"]
    assert stat["type"] == "stat" and stat["fieldConfig"]["defaults"]["unit"] == "bytes"


def test_chart_columns_without_one_query_each_are_refused() -> None:
    with pytest.raises(ValueError, match="one query per column"):
        Chart("t", "d", "none", (Query("up"),), kind="table",
              columns=(Column("a", "none"), Column("b", "none")))  # fmt: skip
    with pytest.raises(ValueError, match="one query per column"):
        Chart("t", "d", "none", (Query("up"),), columns=(Column("a", "none"),))
