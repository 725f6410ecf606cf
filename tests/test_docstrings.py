"""Every docstring of the product packages says what the code does in at most 10 lines.

Method write-ups go to the package's METHODS.md (planner/fit/METHODS.md, …), design prose
to its DESIGN.md, measurements to benchmarks/README.md, history to git.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.packages import PACKAGES

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 10
_Documented = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def long_docstrings(source: str, path: str) -> list[str]:
    """``path:line name: N lines`` for every module, class, function and method docstring of
    ``source`` longer than MAX_LINES (lines of ``ast.get_docstring(clean=False)``)."""
    found: list[str] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                check(child, name)
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    def check(node: _Documented, name: str) -> None:
        doc = ast.get_docstring(node, clean=False)
        if doc is None:
            return
        count = len(doc.splitlines())
        if count > MAX_LINES:
            found.append(f"{path}:{node.body[0].lineno} {name}: {count} lines")

    tree = ast.parse(source)
    check(tree, "<module>")
    visit(tree, "")
    return found


def _product_files() -> list[Path]:
    return sorted(f for p in PACKAGES for f in (ROOT / p).rglob("*.py"))


def test_docstrings_of_the_packages_are_at_most_10_lines() -> None:
    files = _product_files()
    assert len(files) > 100  # the walk reached the packages
    long = []
    for f in files:
        rel = f.relative_to(ROOT).as_posix()
        long += long_docstrings(f.read_text(encoding="utf-8"), rel)
    assert long == [], "docstrings over 10 lines (move the rest to METHODS.md / DESIGN.md):\n" + (
        "\n".join(long)
    )


def _doc(lines: int, indent: str = "") -> str:
    body = "\n".join(f"{indent}line {i}" for i in range(2, lines + 1))
    return f'{indent}"""line 1\n{body}\n{indent}"""' if lines > 1 else f'{indent}"""line 1"""'


def test_long_docstrings_finds_every_kind_and_counts_as_ast_does() -> None:
    source = "\n".join(
        [
            _doc(10),  # module: 10 lines of text, the closing quotes on a line of their own
            "class Short:",
            _doc(9, "    "),  # 9 + the indented closing line = 10: allowed
            "    def method(self) -> None:",
            _doc(10, "        "),  # 10 + the closing line = 11
            "        pass",
            "async def coro() -> None:",
            _doc(11, "    "),
            "    def inner() -> None:",
            _doc(2, "        "),
            "def one() -> None:",
            _doc(1, "    "),
        ]
    )
    assert long_docstrings(source, "x.py") == [
        "x.py:24 Short.method: 11 lines",
        "x.py:37 coro: 12 lines",
    ]
    assert long_docstrings(_doc(11), "m.py") == ["m.py:1 <module>: 11 lines"]
    assert long_docstrings('"""One line."""\n', "m.py") == []
