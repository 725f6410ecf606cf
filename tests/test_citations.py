"""The citation registry (planner/domain/data/sources.yaml) and the citations that point into it.

Every published figure is cited as ``[source: <id>]``; these tests keep each id resolvable,
every registered source cited and complete, the shipped files free of paths outside the
repository, the repository paths they mention existing, and the reasons of a plan and of an
advice carrying the URL of their source (null for a measurement or the cost model).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.errors import ConfigError
from planner.advise.whatif import WhatIf, advise
from planner.decide.decision import decide
from planner.decide.evidence import Evidence
from planner.decide.rulestate import SRC_GKE, Cited
from planner.domain import citations
from planner.domain.citations import citation_url, cited_ids, get_citation, parse_registry, registry
from planner.plan.build import build_plan
from store.store import Store
from tests.packages import PACKAGES
from tests.planner.synthstore import fill_store, shifted_frame, sqlite_url

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = PACKAGES
TEXT_SUFFIXES = (".py", ".md", ".yaml")
# Citations of an out-of-repo reference file or a machine path an operator cannot open.
FORBIDDEN = {
    "numbers.md": re.compile(r"numbers\.md"),
    "../shared": re.compile(r"\.\./shared|shared/reference"),
    "/work/": re.compile(r"/work/"),
    "/tmp/": re.compile(r"(?<![\w.])/tmp/"),
    "home directory": re.compile(r"/home/\w|/Users/\w|(?<![\w.])~/"),
}
# A repository-relative path: starts at a top-level directory of the repository, not inside
# a URL or a longer path (the look-behind), and ends on a name character or a slash.
REPO_PATH = re.compile(
    r"(?<![\w./<>:-])((?:collector|planner|dashboards|api|kvscope|examples|benchmarks|docs|tests)"
    r"/[\w./-]*[\w/])"
)


def repo_paths(text: str) -> list[str]:
    """The repository-relative paths `text` mentions."""
    return [m.group(1).rstrip(".") for m in REPO_PATH.finditer(text)]


def _files(dirs: tuple[str, ...], suffixes: tuple[str, ...]) -> list[Path]:
    out: list[Path] = []
    for d in dirs:
        out += [
            p
            for p in sorted((ROOT / d).rglob("*"))
            if p.is_file()
            and p.suffix in suffixes
            and "__pycache__" not in p.parts
            and "generated" not in p.parts
        ]
    return out


def _docs() -> list[Path]:
    """README and the docs markdown (the repository's top-level markdown and docs/)."""
    return sorted(ROOT.glob("*.md")) + sorted((ROOT / "docs").rglob("*.md"))


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# (a) the registry itself


def test_registry_builtin_every_entry_complete_with_https_url() -> None:
    reg = registry()
    assert len(reg) >= 10
    for sid, s in reg.items():
        assert s.id == sid and citations.ID_RE.fullmatch(sid), sid
        assert s.title and s.owner and s.date, sid
        assert s.url.startswith("https://") and " " not in s.url, sid
        assert s.figures, sid
        for f in s.figures:
            assert f.what and f.value and f.hardware, sid


def test_registry_yaml_ids_unique_in_the_file() -> None:
    # yaml.safe_load keeps the last of two equal keys silently: count them in the node tree.
    text = (ROOT / "planner/domain/data/sources.yaml").read_text(encoding="utf-8")
    node = yaml.compose(text)
    assert isinstance(node, yaml.MappingNode)
    ids = [key.value for key, _ in node.value]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    assert set(ids) == set(registry())


def test_get_citation_unknown_id_raises_config_error_naming_known_ids() -> None:
    with pytest.raises(ConfigError, match=r"unknown source 'no-such-source'; known: .*gke-"):
        get_citation("no-such-source")


def test_citation_url_none_is_none_and_known_id_is_its_url() -> None:
    assert citation_url(None) is None
    assert citation_url("gke-tiered-kv-2025") == get_citation("gke-tiered-kv-2025").url


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ({"title": "t", "owner": "o", "date": "2025", "figures": []}, "missing url"),
        (
            {"title": "t", "owner": "o", "date": "2025", "url": "http://x", "figures": []},
            "https",
        ),
        (
            {"title": "t", "owner": "o", "date": "2025", "url": "https://x", "figures": []},
            "non-empty list",
        ),
        (
            {"title": "t", "owner": "o", "date": "2025", "url": "https://x",
             "figures": [{"what": "w", "value": "v"}]},
            "missing hardware",
        ),
        (
            {"title": "", "owner": "o", "date": "2025", "url": "https://x",
             "figures": [{"what": "w", "value": "v", "hardware": "h"}]},
            "title must be a non-empty string",
        ),
        (
            {"title": "t", "owner": "o", "date": "2025", "url": "https://x", "link": "y",
             "figures": [{"what": "w", "value": "v", "hardware": "h"}]},
            "unknown key",
        ),
    ],
)  # fmt: skip
def test_parse_registry_incomplete_entry_raises_naming_it(
    entry: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=f"sources.yaml: some-src.*{match}"):
        parse_registry({"some-src": entry})


def test_parse_registry_id_not_kebab_case_raises() -> None:
    good = {"title": "t", "owner": "o", "date": "d", "url": "https://x",
            "figures": [{"what": "w", "value": "v", "hardware": "h"}]}  # fmt: skip
    assert parse_registry({"ok-1.2": good})["ok-1.2"].url == "https://x"
    with pytest.raises(ConfigError, match="kebab-case"):
        parse_registry({"Not_Kebab": good})


def test_cited_ids_text_with_tags_returns_ids_in_order_once() -> None:
    a, b = citations.tag("alpha-1"), citations.tag("beta.2")
    assert cited_ids(f"x {a} y {b} z {a}") == ["alpha-1", "beta.2"]
    assert cited_ids("source: alpha-1 without brackets") == []


# (b) every citation resolves, every source is cited


def _citations() -> dict[str, list[str]]:
    files = _files((*SHIPPED, "benchmarks", "tests"), TEXT_SUFFIXES) + _docs()
    out: dict[str, list[str]] = {}
    for path in files:
        for sid in cited_ids(path.read_text(encoding="utf-8")):
            out.setdefault(sid, []).append(_rel(path))
    return out


def test_citations_in_repository_every_source_id_resolves() -> None:
    cited = _citations()
    unknown = {sid: where for sid, where in cited.items() if sid not in registry()}
    assert not unknown, f"cited but not in planner/domain/data/sources.yaml: {unknown}"


def test_citations_in_shipped_packages_cite_every_registered_source() -> None:
    shipped = {
        sid
        for path in _files(SHIPPED, TEXT_SUFFIXES)
        for sid in cited_ids(path.read_text(encoding="utf-8"))
    }
    assert shipped, "no [source: <id>] citation found in the shipped packages"
    uncited = sorted(set(registry()) - shipped)
    assert not uncited, f"registered but cited nowhere in the shipped packages: {uncited}"


def test_decider_cited_figure_records_its_id_and_text_tag() -> None:
    assert isinstance(SRC_GKE, Cited) and SRC_GKE.citation_id in registry()
    assert str(SRC_GKE).endswith(citations.tag(SRC_GKE.citation_id))
    d = decide(Evidence(kv_util_p95=0.5, model="llama-3.1-8b", gpu="h100", tp=1))
    r1 = next(r for r in d.to_dict()["reasons"] if r["rule"] == "R1_hbm_pressure")
    assert r1["source_id"] == "gke-tiered-kv-2025"
    assert r1["source_url"] == get_citation("gke-tiered-kv-2025").url
    assert "[source: gke-tiered-kv-2025]" in r1["source"]


# (c) no out-of-repo references in shipped files and docs


def test_shipped_files_and_docs_name_no_out_of_repo_path() -> None:
    files = _files(SHIPPED, (*TEXT_SUFFIXES, ".json", ".toml", ".txt")) + _docs()
    found = [
        f"{_rel(path)}:{n}: {what}"
        for path in files
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for what, pattern in FORBIDDEN.items()
        if pattern.search(line)
    ]
    assert not found, "\n".join(found)


def test_forbidden_patterns_catch_reference_and_machine_paths() -> None:
    hits = {
        what
        for text in (
            "see numbers.md",
            "../shared/reference/x",
            "/work/main/x.py",
            "open /tmp/x",
            "/home/alice",
            "in ~/notes",
        )
        for what, pattern in FORBIDDEN.items()
        if pattern.search(text)
    }
    assert hits == set(FORBIDDEN)
    assert not any(
        p.search("sqlite:///kvscope.db, planner/x.py, /dev/shm") for p in FORBIDDEN.values()
    )


# (d) repository paths mentioned in shipped files and README exist


def test_repo_paths_in_shipped_files_and_readme_exist() -> None:
    missing: dict[str, set[str]] = {}
    for path in _files(SHIPPED, TEXT_SUFFIXES) + _docs():
        for rel in repo_paths(path.read_text(encoding="utf-8")):
            if not (ROOT / rel).exists():
                missing.setdefault(rel, set()).add(_rel(path))
    assert not missing, "\n".join(f"{p} (in {', '.join(sorted(w))})" for p, w in missing.items())


def test_repo_path_pattern_finds_paths_not_urls_or_modules() -> None:
    text = (
        "see planner/decide/DECIDER.md and `benchmarks/calibrate_sim.py`; "
        "https://github.com/x/y/tree/main/benchmarks/multi_turn, planner.domain.citations, "
        "kvscope/commands/<name>.py, examples/new.yaml."
    )
    assert repo_paths(text) == [
        "planner/decide/DECIDER.md",
        "benchmarks/calibrate_sim.py",
        "kvscope/commands/",
        "examples/new.yaml",
    ]


# (e) plan and advise JSON: every reason carries a resolvable source_url, or null


def _check_reasons(decision: dict[str, Any]) -> int:
    """Assert every reason's source_id / source_url; return how many cite a publication."""
    published = 0
    for r in decision["reasons"]:
        assert {"source", "source_id", "source_url"} <= set(r), r
        sid = r["source_id"]
        if sid is None:
            assert r["source_url"] is None, r
            continue
        assert r["source_url"] == get_citation(sid).url, r
        assert citations.tag(sid) in r["source"], r
        published += 1
    for r in decision["reasons"]:
        if r["source"].startswith(("measured", "simulated", "cost model", "evidence")):
            assert r["source_id"] is None and r["source_url"] is None, r
    return published


def _no_out_of_repo_path(text: str) -> None:
    found = [what for what, pattern in FORBIDDEN.items() if pattern.search(text)]
    assert not found, found


@pytest.fixture(scope="module")
def plan_json(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    url = sqlite_url(tmp_path_factory.mktemp("sources") / "synth.db")
    fill_store(url, shifted_frame(n_engines=4, n_windows=120))
    with Store(url) as store:
        plan = build_plan(store, cluster="synth", forecast_seconds=1)
    return plan.to_dict(), url


def test_plan_json_reasons_carry_source_url_or_null(plan_json: tuple[dict[str, Any], str]) -> None:
    d, _ = plan_json
    assert d["decision"] is not None and d["decision"]["reasons"]
    assert _check_reasons(d["decision"]) >= 1
    assert any(r["source_id"] is None for r in d["decision"]["reasons"])  # R1: measured


def test_plan_json_names_no_out_of_repo_path(plan_json: tuple[dict[str, Any], str]) -> None:
    d, url = plan_json
    # The store's own URL (a temporary file of this test) is the operator's input, not a citation.
    _no_out_of_repo_path(json.dumps(d, allow_nan=False).replace(url, "<store>"))


def test_advise_json_reasons_carry_source_url_and_name_no_out_of_repo_path() -> None:
    w = WhatIf("llama-3.1-8b", "h100", 1, 1000, 128, 4.0, 0.5, engines=2, duration_s=30.0)
    d = advise(w).to_dict()
    assert _check_reasons(d["decision"]) >= 1  # R2: short prompts, the GKE tests
    r7 = [r for r in d["decision"]["reasons"] if r["rule"] == "R7_capacity"]
    assert r7 and all(r["source_url"] is None for r in r7)  # simulated, not published
    _no_out_of_repo_path(json.dumps(d, allow_nan=False))
