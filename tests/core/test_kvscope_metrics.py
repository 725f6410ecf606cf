"""core.kvscope_metrics: kvscope's own metric names follow Prometheus' conventions, are
spelled nowhere else in the tree, and the README's table is the module's."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from core import kvscope_metrics as sm
from core.errors import ConfigError
from dashboards.generate import DASHBOARD_DIR, K8S_DIR, RULES_DIR

ROOT = Path(__file__).resolve().parents[2]
# --------------------------------------------------------------------------- names


def test_metric_names_follow_prometheus_naming() -> None:
    names = [m.name for m in sm.ALL_METRICS]
    assert len(names) == len(set(names))
    units = {"seconds": "_seconds", "seconds since the epoch": "_timestamp_seconds",
             "KV tokens": "_tokens"}  # fmt: skip
    for m in sm.ALL_METRICS:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", m.name) and ":" not in m.name, m.name
        assert m.name.startswith(f"{sm.NAMESPACE}_"), m.name
        assert m.name.endswith("_total") == (m.type == "counter"), m.name
        assert m.name.endswith("_info") == (m.unit == "1"), m.name
        assert m.name.endswith("_ratio") == m.unit.startswith("ratio"), m.name
        if m.unit in units:
            assert m.name.endswith(units[m.unit]), m.name
        assert len(m.labels) == len(set(m.labels)) and m.help.endswith("."), m.name
        # cluster first (planner), target (collector), route (the API's requests)
        assert m.labels[:1] in ((), ("cluster",), ("target",), ("route",), ("version",)), m.name


def _metric_like(token: str) -> bool:
    """A kvscope_ token that names (or would name) a metric, not an identifier such as a
    staging table or a label: one of ours with its series suffixes, a name in one of our
    metric families, or a name with a Prometheus unit/type suffix. A token ending in "_" is
    a prefix (``…_plan_*`` in prose), not a name."""
    if token.endswith("_"):
        return False
    ours = {n for m in sm.ALL_METRICS for n in (*m.series_names, m.name)}
    ours |= {m.name.removesuffix("_total") + "_created" for m in sm.ALL_METRICS}
    families = {"_".join(m.name.split("_")[:2]) + "_" for m in sm.ALL_METRICS}
    suffixes = ("_total", "_seconds", "_bytes", "_ratio", "_info", "_tokens", "_bucket",
                "_count", "_sum", "_created")  # fmt: skip
    return token in ours or token.startswith(tuple(families)) or token.endswith(suffixes)


# Files generated from core/kvscope_metrics.py (dashboards, rules, and both as Kubernetes
# objects): they spell the names it gave them; their generators import the constants and
# their --check keeps them in step.
GENERATED = tuple(f"{d.as_posix()}/" for d in (DASHBOARD_DIR, RULES_DIR, K8S_DIR))
SKIP_DIRS = {"__pycache__", "node_modules", "build", "dist"}
TOKEN = re.compile(rf"(?<![A-Za-z0-9_]){sm.NAMESPACE}_[a-z_]+")
BLOCK = re.compile(re.escape(sm.TABLE_BEGIN) + ".*?" + re.escape(sm.TABLE_END), re.DOTALL)


def _tree() -> Iterator[Path]:
    """Our .py/.yaml/.yml/.json/.md files: not hidden directories (.venv, .git), caches,
    build output or ./out (make demo's)."""
    for top, dirs, files in os.walk(ROOT):
        here = Path(top)
        dirs[:] = sorted(
            d for d in dirs
            if not (d.startswith(".") or d in SKIP_DIRS or d.endswith(".egg-info")
                    or (here == ROOT and d == "out"))
        )  # fmt: skip
        for name in sorted(files):
            if name.endswith((".py", ".yaml", ".yml", ".json", ".md")):
                yield here / name


def test_metric_names_spelled_only_in_kvscope_metrics() -> None:
    module = Path(sm.__file__).resolve()
    stray: list[str] = []
    for path in _tree():
        rel = path.relative_to(ROOT).as_posix()
        if path.resolve() == module or rel.startswith(GENERATED):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".md":  # the generated table is the module's own words
            text = BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for n, line in enumerate(text.splitlines(), 1):
            stray += [f"{rel}:{n}: {t}" for t in TOKEN.findall(line) if _metric_like(t)]
    assert stray == [], "spell kvscope_ metric names only in core/kvscope_metrics.py " \
        "(import its constants):\n" + "\n".join(stray)  # fmt: skip


def test_metric_names_check_finds_a_stray_spelling() -> None:
    name = sm.PLAN_AGE.name
    assert TOKEN.findall(f'q = "max({name}) > 3600"') == [name] and _metric_like(name)
    identifiers = [f"{sm.NAMESPACE}_{s}" for s in ("windows_in", "write", "stat")]
    assert not any(_metric_like(t) for t in identifiers)  # the store's and PromQL's own
    assert TOKEN.findall(f"test_{name}") == []
    assert not _metric_like(name.removesuffix("age_seconds"))  # a family's prefix in prose


def test_readme_metrics_table_is_the_modules() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = BLOCK.search(readme)
    assert found is not None, "README.md has no generated metrics table"
    table = found.group(0).removeprefix(sm.TABLE_BEGIN).removesuffix(sm.TABLE_END).strip("\n")
    assert table + "\n" == sm.markdown_table(), (
        "README.md's metrics table is stale: replace it with `python -m core.kvscope_metrics`"
    )
    rows = {line.split("|")[1].strip().strip("`") for line in table.splitlines()[2:]}
    assert rows == {m.name for m in sm.ALL_METRICS}


def test_metric_selector_known_labels_gives_promql() -> None:
    assert sm.PLAN_AGE.selector(cluster="a") == f'{sm.PLAN_AGE}{{cluster="a"}}'
    assert sm.COLLECTOR_TICKS.selector() == str(sm.COLLECTOR_TICKS)
    with pytest.raises(ConfigError, match="no label"):
        sm.PLAN_AGE.selector(pod="x")
