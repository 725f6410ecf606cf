"""The direction of the whole tree, read from the AST (every import counts: module level,
inside functions, under ``if TYPE_CHECKING``), and the size of planner/'s top level.

The rules (docs/architecture.md: core <- collector -> store <- planner <- api/dashboards,
kvscope wires them):
- core (errors, records, the catalogue, durations, the kvscope_ metric names) imports
  nothing of ours but core; every room may import it;
- collector imports core, collector and store; store imports core and store; the other
  rooms import store only through its public modules (STORE_PUBLIC); nothing of core,
  collector or store imports the planner, the api or the dashboards;
- planner, api and dashboards import collector only through its public modules
  (COLLECTOR_PUBLIC); only kvscope/ imports api/;
- planner.simulate imports only planner.domain, planner.simulate, core.catalog and the
  exception tree (core.errors);
- api/ and dashboards/ import the planner through its sub-packages' faces (``planner.fit``,
  not ``planner.fit.gain``) and collector through its public modules;
- kvscope/ may import anything; nothing imports kvscope/;
- no import runs in a circle. Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__``
  first, so each import also counts as an import of the target's parent packages.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.packages import PACKAGES

ROOT = Path(__file__).resolve().parents[1]
OURS = PACKAGES
COLLECTOR_PUBLIC = frozenset(
    {
        "collector.parse",  # the exposition parser (kvscope inspect, the simulator's checks)
        "collector.rollup",
        "collector.urlguard",  # the SSRF check of POST /v1/targets
    }
)
# what the other rooms may import of store/ (the rest is its inside)
STORE_PUBLIC = frozenset({"store.store", "store.tables", "store.frame", "store.retention"})
PLANNER_TOP_LIMIT = 12


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for pkg in OURS:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            found[_module_name(path)] = path
    return found


MODULES = _modules()


def _resolve(importer: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not is_pkg:
        base = base[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imports(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported module of ours, line) for every import statement in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            mod = _resolve(name, is_pkg, node)
            if mod.split(".")[0] not in OURS:
                continue
            for alias in node.names:
                sub = f"{mod}.{alias.name}"
                # `from pkg import submodule` imports the submodule; `from mod import name`, mod
                yield (sub if sub in MODULES else mod), node.lineno


def _edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for name, path in MODULES.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        for target, _ in _imports(name, path):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                dep = ".".join(parts[:i])
                if dep in MODULES and dep != name and dep not in own:
                    graph[name].add(dep)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on:
                low[node] = min(low[node], index[child])
    return out


def _violations() -> list[str]:
    bad: list[str] = []
    for name, path in MODULES.items():
        top = name.split(".")[0]
        where = f"{path.relative_to(ROOT)}"
        for target, line in _imports(name, path):
            ttop = target.split(".")[0]
            at = f"{where}:{line} imports {target}"
            if ttop == "kvscope" and top != "kvscope":
                bad.append(f"{at}: nothing imports kvscope/ (the composition root)")
            if top == "core" and ttop != "core":
                bad.append(f"{at}: core imports nothing of ours but core")
            if top == "collector" and ttop not in ("core", "collector", "store"):
                bad.append(f"{at}: collector imports only core, collector and store")
            if top == "store" and ttop not in ("core", "store"):
                bad.append(f"{at}: store imports only core and store")
            if top in ("planner", "api", "dashboards") and ttop == "collector":
                mod = target if target in MODULES else target.rsplit(".", 1)[0]
                if mod != "collector" and mod not in COLLECTOR_PUBLIC:
                    bad.append(f"{at}: not one of collector's public modules")
            if top != "store" and ttop == "store":
                mod = target if target in MODULES else target.rsplit(".", 1)[0]
                if mod != "store" and mod not in STORE_PUBLIC:
                    bad.append(f"{at}: not one of store's public modules")
            if top in ("core", "collector", "store") and ttop in ("planner", "api", "dashboards"):
                bad.append(f"{at}: data flows collector -> store -> planner -> api/dashboards")
            if top == "planner" and ttop in ("api", "dashboards"):
                bad.append(f"{at}: the planner does not import its consumers")
            if ttop == "api" and top not in ("api", "kvscope"):
                bad.append(f"{at}: only kvscope/ wires the api (its modules are its own)")
            if name.startswith("planner.simulate"):
                allowed = ("planner.domain", "planner.simulate", "core.catalog",
                           "core.errors")  # fmt: skip
                if not any(target == a or target.startswith(a + ".") for a in allowed):
                    bad.append(f"{at}: planner.simulate imports only planner.domain and "
                               "core.catalog (and the exception tree)")  # fmt: skip
            if top in ("api", "dashboards") and ttop == "planner" and target.count(".") != 1:
                bad.append(f"{at}: use the sub-package's public face (planner.<sub>)")
    return bad


def test_layout_import_rules_hold_for_every_module() -> None:
    assert MODULES, "no modules found"
    assert _violations() == []


def test_layout_no_import_cycle_anywhere() -> None:
    cycles = _cycles(_edges())
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_layout_planner_top_level_is_small_and_packaged() -> None:
    entries = sorted(p.name for p in (ROOT / "planner").iterdir() if p.name != "__pycache__")
    assert len(entries) <= PLANNER_TOP_LIMIT, entries
    for entry in entries:
        sub = ROOT / "planner" / entry
        assert entry == "__init__.py" or (sub / "__init__.py").is_file(), entry
        if sub.is_dir():
            doc = ast.get_docstring(ast.parse((sub / "__init__.py").read_text(encoding="utf-8")))
            assert doc, f"planner/{entry}/__init__.py names no public face"


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": set()}, []),
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ],
)
def test_layout_cycle_finder_finds_known_cycles(
    graph: dict[str, set[str]], expected: list[list[str]]
) -> None:
    assert _cycles(graph) == expected


def test_layout_edges_count_function_level_and_parent_package_imports() -> None:
    graph = _edges()
    # planner.plan.build imports store.store inside a function (or under TYPE_CHECKING)
    assert "store.store" in graph["planner.plan.build"]
    # importing planner.domain.costmodel also runs planner/domain/__init__.py
    assert "planner.domain" in graph["planner.simulate.engine"]


# File names that may repeat among the product modules: mirrors of one concept seen from
# another room (docs/architecture.md#conventions). Any other repeat is a name with two meanings.
MIRRORS: dict[str, frozenset[str]] = {
    # kvscope/commands/X.py: the CLI of X; api/routes/X.py: its REST route; X.py: X itself
    "advise.py": frozenset({"api/routes/advise.py", "kvscope/commands/advise.py"}),
    "costmodel.py": frozenset(
        {"planner/domain/costmodel.py", "api/routes/costmodel.py", "kvscope/commands/costmodel.py"}
    ),
    "db.py": frozenset({"store/db.py", "kvscope/commands/db.py"}),
    "demo.py": frozenset({"kvscope/demo.py", "kvscope/commands/demo.py"}),
    "plans.py": frozenset({"store/plans.py", "api/routes/plans.py", "kvscope/commands/plans.py"}),
    "report.py": frozenset({"api/routes/report.py", "kvscope/commands/report.py"}),
    # planner/simulate/X.py: the simulator's side of what X.py elsewhere measures or reads
    "exposition.py": frozenset({"collector/exposition.py", "planner/simulate/exposition.py"}),
    "residency.py": frozenset({"planner/frames/residency.py", "planner/simulate/residency.py"}),
    "switchback.py": frozenset({"planner/fit/switchback.py", "planner/simulate/switchback.py"}),
}


def _repeated_file_names() -> dict[str, set[str]]:
    """File name -> its product modules' paths, for names more than one module has."""
    where: dict[str, set[str]] = {}
    for path in MODULES.values():
        if path.name != "__init__.py":
            where.setdefault(path.name, set()).add(path.relative_to(ROOT).as_posix())
    return {name: paths for name, paths in where.items() if len(paths) > 1}


def test_layout_file_names_repeat_only_as_listed_mirrors() -> None:
    bad = {name: sorted(paths) for name, paths in _repeated_file_names().items()
           if frozenset(paths) != MIRRORS.get(name, frozenset())}  # fmt: skip
    assert bad == {}, f"one file name, two meanings (rename one, or list a mirror): {bad}"
