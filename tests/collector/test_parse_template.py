"""The reader's fast path (collector/parse_template.py) answers exactly what the full reader
answers, or leaves the exposition to it.

Each case reads a base exposition once (which leaves its template), then a changed one with
that warm reader, and compares the answer with a fresh reader's (which has no template):
equal snapshots, or the same ParseError. ``fast`` says whether the template itself must
answer (values moved only) or must decline (anything else), so a fast path that never
answers, or one that answers where the full reader would differ, fails here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from collector.parse import ExpositionReader
from collector.signal_index import INDEX, SKIP
from core.errors import ParseError
from core.records import Snapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
BASE = (FIXTURES / "vllm-0.33.0-metrics-default.txt").read_text()
TARGET = "engine-a"


def _read(reader: ExpositionReader, text: str) -> Snapshot | ParseError:
    try:
        return reader.read(text, TARGET, 2.0)
    except ParseError as exc:
        return exc


def _types(text: str) -> dict[str, str]:
    return dict(re.findall(r"(?m)^# TYPE (\S+) (\S+)$", text))


def _line_of(text: str, kind: str, suffix: str = "", nth: int = 0) -> int:
    """Index of the nth sample line of a family kvscope reads (in the catalogue) of TYPE
    ``kind``, the sample name ending ``suffix``."""
    fams = {f for f, k in _types(text).items() if k == kind}
    found = []
    for i, line in enumerate(text.split("\n")):
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        t = INDEX.get(name)
        if line and line[0] != "#" and t and t[0] != SKIP and name.endswith(suffix):
            base = name[: len(name) - len(suffix)] if suffix else name
            if name in fams or base in fams:
                found.append(i)
    return found[nth]


def _set(kind: str, suffix: str, value: str, nth: int = 0) -> Callable[[str], str]:
    def change(text: str) -> str:
        lines = text.split("\n")
        i = _line_of(text, kind, suffix, nth)
        lines[i] = lines[i].rpartition(" ")[0] + " " + value
        return "\n".join(lines)

    return change


def _moved(text: str) -> str:
    """Every counter, bucket, _count and _sum +7, every gauge x 1.5: still clean."""
    kinds = _types(text)
    out = []
    for line in text.split("\n"):
        if line and line[0] != "#":
            prefix, _, tok = line.rpartition(" ")
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            fam = re.sub(r"_(bucket|sum|count|total)$", "", name)
            v = float(tok)
            if kinds.get(fam) in ("counter", "histogram") or kinds.get(name) == "counter":
                v += 7
            elif kinds.get(name) == "gauge":
                v *= 1.5
            out.append(f"{prefix} {v!r}")
        else:
            out.append(line)
    return "\n".join(out)


def _edit(i: int, new: str | None) -> Callable[[str], str]:
    def change(text: str) -> str:
        lines = text.split("\n")
        if new is None:
            del lines[i]
        else:
            lines[i] = new
        return "\n".join(lines)

    return change


def _dup_line(kind: str, suffix: str = "") -> Callable[[str], str]:
    def change(text: str) -> str:
        lines = text.split("\n")
        i = _line_of(text, kind, suffix)
        return "\n".join([*lines[: i + 1], lines[i], *lines[i + 1 :]])

    return change


def _first_type_line(text: str) -> int:
    return next(i for i, line in enumerate(text.split("\n")) if line.startswith("# TYPE "))


CASES: list[tuple[str, Callable[[str], str], bool]] = [
    ("same text", lambda t: t, True),
    ("values moved", _moved, True),
    ("counter NaN", _set("counter", "_total", "NaN"), False),
    ("counter negative", _set("counter", "_total", "-1"), False),
    ("counter +Inf", _set("counter", "_total", "+Inf"), False),
    ("gauge NaN", _set("gauge", "", "NaN"), False),
    ("gauge -Inf", _set("gauge", "", "-Inf"), False),
    ("gauge huge but finite", _set("gauge", "", "1e308"), True),
    ("bucket NaN", _set("histogram", "_bucket", "NaN"), False),
    ("bucket not cumulative", _set("histogram", "_bucket", "1e9", nth=0), False),
    ("sum NaN", _set("histogram", "_sum", "NaN"), False),
    ("sum negative (allowed)", _set("histogram", "_sum", "-3.5"), True),
    ("count negative", _set("histogram", "_count", "-2"), False),
    ("value with underscore", _set("counter", "_total", "1_000"), False),
    ("value not a number", _set("gauge", "", "abc"), False),
    ("value empty", _set("gauge", "", ""), False),
    ("value hex", _set("gauge", "", "0x10"), False),
    ("value spelled Infinity", _set("histogram", "_sum", "Infinity"), False),
    ("value with a timestamp", _set("gauge", "", "1.0 1700000000000"), False),
    ("line removed", lambda t: _edit(_line_of(t, "gauge"), None)(t), False),
    ("series repeated", _dup_line("gauge"), False),
    ("bucket repeated", _dup_line("histogram", "_bucket"), False),
    ("blank line added", lambda t: _edit(_first_type_line(t), "\n" + t.split("\n")[0])(t), False),
    ("type changed", lambda t: _edit(_first_type_line(t), "# TYPE x_y gauge")(t), False),
    ("HELP changed", lambda t: t.replace("# HELP ", "# HELP  ", 1), False),
    ("content after EOF", lambda t: t + "# EOF\nx 1\n", False),
    ("EOF added", lambda t: t + "# EOF\n", False),
    ("new series", lambda t: t + 'brand_new_metric{a="b"} 1\n', False),
    ("labels changed", lambda t: t.replace('engine="0"', 'engine="1"', 1), False),
    ("not a line", lambda t: t + "}{ 1\n", False),
]


@pytest.mark.parametrize(("case", "change", "fast"), CASES, ids=[c[0] for c in CASES])
def test_warm_reader_answers_as_a_fresh_one(
    case: str, change: Callable[[str], str], fast: bool
) -> None:
    text = change(BASE)
    assert text != BASE or case == "same text"
    warm = ExpositionReader()
    first = warm.read(BASE, TARGET, 1.0)
    assert not first.anomalies
    template = warm._templates[TARGET]
    answered = template.read(text, TARGET, 2.0)
    assert (answered is not None) == fast, case
    got, want = _read(warm, text), _read(ExpositionReader(), text)
    if isinstance(want, ParseError):
        assert isinstance(got, ParseError) and (got.line, got.reason) == (want.line, want.reason)
    else:  # repr: NaN values (kept on a gauge) are equal there, and every float exact
        assert repr(got) == repr(want)
        if answered is not None:
            assert repr(answered) == repr(want)


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.txt")), ids=lambda p: p.name)
def test_every_fixture_moved_reads_the_same_warm_and_fresh(path: Path) -> None:
    base = path.read_text()
    moved = _moved(base)
    warm = ExpositionReader()
    first = warm.read(base, TARGET, 1.0)
    want = ExpositionReader().read(moved, TARGET, 2.0)
    assert warm.read(moved, TARGET, 2.0) == want
    if not first.anomalies and not want.anomalies:
        # a clean exposition leaves a template, and the template answers its next one
        assert warm._templates[TARGET].read(moved, TARGET, 2.0) == want


def test_no_template_after_an_anomaly_and_templates_are_per_target() -> None:
    reader = ExpositionReader()
    reader.read(_set("gauge", "", "NaN")(BASE), "a", 1.0)
    assert "a" not in reader._templates
    reader.read(BASE, "b", 1.0)
    assert set(reader._templates) == {"b"}
    other = BASE.replace('engine="0"', 'engine="9"')
    assert reader._templates["b"].read(other, "b", 2.0) is None
    assert reader.read(other, "c", 2.0) == ExpositionReader().read(other, "c", 2.0)
    # a target whose exposition changes shape gets the new shape's template
    reader.read(other, "b", 3.0)
    assert reader._templates["b"].read(other, "b", 4.0) is not None


def test_facts_are_fresh_copies() -> None:
    reader = ExpositionReader()
    reader.read(BASE, TARGET, 1.0)
    a = reader.read(BASE, TARGET, 2.0)
    b = reader.read(BASE, TARGET, 3.0)
    assert a.facts and a.facts == b.facts
    first = next(iter(a.facts.values()))[0]
    assert first is not next(iter(b.facts.values()))[0]
