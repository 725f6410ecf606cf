"""docs/runbooks.md against the generated alerts: one section per alert, in ALERTS order,
each with its three parts, each alert's runbook_url landing on its section's GitHub anchor;
the severity, ``for`` and config thresholds it quotes equal to the rules', and the
dashboards, panels and plan or README sections it names existing."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from dashboards.alerts import ALERTS, Alert
from dashboards.config import DEFAULT, MixinConfig
from dashboards.generate import boards
from dashboards.rule_files import alert_rules

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = ROOT / "docs" / "runbooks.md"
LEAD_INS = ("**What it means.**", "**How to confirm.**", "**What to do.**")
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.DOTALL | re.MULTILINE)
HEADING = re.compile(r"^## (.+?)\s*$", re.MULTILINE)
ALERT_LIKE = re.compile(r"Kvscope[A-Za-z0-9]+")
QUOTED_FIELD = re.compile(r"`([a-z_]+) = ([^`]+)`")
CODE_SPAN = re.compile(r"`[^`\n]*`")
QUOTED_NAME = re.compile(r'"([A-Z][^"\n]*)"')
ITALIC = re.compile(r"(?<![*\w])\*([^*\n]+)\*(?![*\w])")
# The sections of `kvscope plan`'s text the runbooks name, and what starts each in
# planner/report/plan_text.py.
PLAN_SECTIONS = {
    "What is happening": '"What is happening"',
    "Decision": 'f"Decision: ',
    "Fits": '"Fits (',
    "Forecast": 'f"Forecast (',
    "Sizing": 'f"Sizing for ',
    "Configs": '"Configs"',
}
PROMETHEUS_PAGES = frozenset({"Targets"})


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped (letters,
    digits, '_', '-' and spaces kept), each space turned into '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _text() -> str:
    """The runbooks with fenced code blocks blanked (a '## ' line inside one is no heading)."""
    text = RUNBOOKS.read_text(encoding="utf-8")
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def _sections() -> dict[str, str]:
    """Each level-2 heading's text, mapped to the body up to the next level-2 heading."""
    text = _text()
    heads = list(HEADING.finditer(text))
    ends = [h.start() for h in heads[1:]] + [len(text)]
    return {h.group(1): text[h.end() : end] for h, end in zip(heads, ends, strict=True)}


def _runbook_urls(cfg: MixinConfig) -> dict[str, str]:
    rules: list[dict[str, Any]] = alert_rules(cfg)["groups"][0]["rules"]
    return {r["alert"]: r["annotations"]["runbook_url"] for r in rules}


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("KvscopePlanStale", "kvscopeplanstale"),
        ("What to do? (fast)", "what-to-do-fast"),
        ("R1_hbm_pressure: is HBM the bottleneck?", "r1_hbm_pressure-is-hbm-the-bottleneck"),
        ("  Set-up: two commands  ", "set-up-two-commands"),
    ],
)
def test_github_slug_heading_with_punctuation_gives_githubs_anchor(
    heading: str, anchor: str
) -> None:
    assert github_slug(heading) == anchor


def test_runbooks_every_alert_has_a_section_in_alerts_order() -> None:
    headings = [h for h in _sections() if ALERT_LIKE.fullmatch(h)]
    assert headings == [a.name for a in ALERTS]


def test_runbooks_section_of_unknown_alert_is_absent() -> None:
    known = {a.name for a in ALERTS}
    stray = [h for h in _sections() if ALERT_LIKE.search(h) and h not in known]
    assert stray == [], f"runbook sections for alerts not in ALERTS: {stray}"


@pytest.mark.parametrize("alert", [a.name for a in ALERTS])
def test_runbooks_alert_section_has_the_three_lead_ins_once_in_order(alert: str) -> None:
    section = _sections()[alert]
    assert [section.count(lead) for lead in LEAD_INS] == [1, 1, 1], alert
    positions = [section.index(lead) for lead in LEAD_INS]
    assert positions == sorted(positions), alert


@pytest.mark.parametrize("alert", ALERTS, ids=[a.name for a in ALERTS])
def test_runbooks_alert_section_quotes_its_severity_and_for(alert: Alert) -> None:
    section = _sections()[alert.name]
    assert f"Severity `{alert.severity}`, `for: {alert.for_}`." in section, alert.name


@pytest.mark.parametrize("base", [DEFAULT.runbook_base, "https://wiki.example/runbooks"])
def test_runbook_url_of_each_alert_ends_with_its_sections_anchor(base: str) -> None:
    cfg = dataclasses.replace(DEFAULT, runbook_base=base)
    urls = _runbook_urls(cfg)
    sections = _sections()
    assert list(urls) == [a.name for a in ALERTS]
    for name, url in urls.items():
        assert name in sections, name
        assert url == f"{base}#{github_slug(name)}", (name, url)


def test_runbook_url_default_base_is_this_file() -> None:
    assert (ROOT / DEFAULT.runbook_base).resolve() == RUNBOOKS.resolve()


def test_runbooks_quoted_config_values_equal_default() -> None:
    fields = {f.name for f in dataclasses.fields(MixinConfig)}
    quoted = [(n, v) for n, v in QUOTED_FIELD.findall(_text()) if n in fields]
    assert quoted, "the runbooks quote no MixinConfig threshold"
    wrong = [
        f"{name} = {value} (DEFAULT: {getattr(DEFAULT, name)!r})"
        for name, value in quoted
        if ast.literal_eval(value) != getattr(DEFAULT, name)
    ]
    assert wrong == [], "runbooks quote thresholds that are not DEFAULT's:\n" + "\n".join(wrong)


def _prose() -> str:
    """The runbooks without code blocks and inline code spans."""
    return CODE_SPAN.sub("", _text())


def _readme_sections() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    headings = re.findall(r"^#{2,4} (.+?)\s*$", readme, re.MULTILINE)
    return [re.sub(r"^\d+\.\s+", "", h) for h in headings]


def test_plan_sections_named_in_runbooks_exist_in_the_plan_text() -> None:
    source = (ROOT / "planner" / "report" / "plan_text.py").read_text(encoding="utf-8")
    missing = [name for name, start in PLAN_SECTIONS.items() if start not in source]
    assert missing == []


def test_runbooks_quoted_names_are_panels_rows_or_sections_that_exist() -> None:
    titles = {r.title for b in boards() for r in b.rows}
    titles |= {c.title for b in boards() for r in b.rows for c in r.charts}
    readme = _readme_sections()
    unknown = [
        name
        for name in QUOTED_NAME.findall(_prose())
        if name not in titles
        and name not in PLAN_SECTIONS
        and name not in PROMETHEUS_PAGES
        and not any(h.startswith(name) for h in readme)
    ]
    assert unknown == [], f"runbooks name panels or sections that do not exist: {unknown}"


def test_runbooks_italic_names_are_dashboard_titles() -> None:
    titles = {b.title for b in boards()}
    titles |= {b.title.removeprefix("kvscope / ") for b in boards()}
    named = ITALIC.findall(_prose())
    assert named, "the runbooks name no dashboard"
    assert sorted(set(named) - titles) == []
