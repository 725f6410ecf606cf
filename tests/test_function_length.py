"""No product function is longer than 120 lines unless a ``# long: <reason>`` comment sits
directly above it (above its decorators, if any) saying why it stays whole."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.packages import PACKAGES

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 120
REASON = "# long:"


def long_functions(source: str, path: str) -> list[str]:
    """``path:line name: N lines`` for each function of ``source`` over MAX_LINES lines
    (``def`` to its last line) without a REASON comment on the line above it."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        count = (node.end_lineno or node.lineno) - node.lineno + 1
        if count <= MAX_LINES:
            continue
        top = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        above = top - 2  # 0-based index of the line above the def or its first decorator
        while above >= 0 and lines[above].strip().startswith("#"):
            if lines[above].strip().startswith(REASON) and len(lines[above].strip()) > 12:
                break
            above -= 1
        else:
            found.append(f"{path}:{node.lineno} {node.name}: {count} lines")
    return found


def test_no_product_function_is_long_without_a_reason() -> None:
    found: list[str] = []
    for package in PACKAGES:
        for file in sorted((ROOT / package).rglob("*.py")):
            rel = str(file.relative_to(ROOT))
            found += long_functions(file.read_text(encoding="utf-8"), rel)
    assert not found, "functions over 120 lines without a `# long:` reason:\n" + "\n".join(found)


_BODY = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        (f"def f():\n{_BODY}\n", True),  # 121 lines, no reason
        (f"# long: the hot loop, measured slower split\ndef f():\n{_BODY}\n", False),
        (f"# long: a reason\n# more of it\n@dec\ndef f():\n{_BODY}\n", False),
        (f"# long:\ndef f():\n{_BODY}\n", True),  # a reason must say something
        (f"# just a comment\ndef f():\n{_BODY}\n", True),
        (f"# long: a reason\n\ndef f():\n{_BODY}\n", True),  # not directly above
        ("def f():\n" + "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES - 1)), False),
        (f"class C:\n    def m(self):\n    {_BODY.replace(chr(10), chr(10) + '    ')}\n", True),
    ],
)
def test_long_functions_finds_what_it_should(source: str, flagged: bool) -> None:
    assert bool(long_functions(source, "x.py")) is flagged
