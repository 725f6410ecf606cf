"""Every generated dashboard validates against Grafana's dashboard JSON schema
(tests/fixtures/grafana/: generated offline from @grafana/schema 13.2.3), and the schema is
strict enough to catch what grafanalib writes unnormalised."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from dashboards.generate import DASHBOARD_DIR, artifacts
from dashboards.grafana import normalise

SCHEMA = Path(__file__).resolve().parents[1] / "fixtures" / "grafana" / "dashboard.schema.json"


@cache
def _validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))


def _errors(doc: dict[str, Any]) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}"
            for e in _validator().iter_errors(doc)]  # fmt: skip


@pytest.mark.parametrize(
    "rel", sorted(r for r in artifacts() if r.parent == DASHBOARD_DIR), ids=lambda r: r.stem
)
def test_schema_generated_dashboard_validates(rel: Path) -> None:
    assert _errors(json.loads(artifacts()[rel])) == []


def _raw() -> dict[str, Any]:
    dash = g.Dashboard(
        title="t", uid="t",
        panels=[g.TimeSeries(title="p", targets=[g.Target(expr="up")],
                             gridPos=g.GridPos(h=8, w=12, x=0, y=0))],
    )  # fmt: skip
    return json.loads(json.dumps(dash.to_json_data(), cls=DashboardEncoder))  # type: ignore[no-any-return]


def test_schema_raw_grafanalib_output_is_rejected_and_normalised_accepted() -> None:
    raw = _raw()
    errors = _errors(raw)
    assert raw["schemaVersion"] == 12
    assert any("rows" in e or "style" in e for e in errors), errors
    assert _errors(normalise(raw)) == []
