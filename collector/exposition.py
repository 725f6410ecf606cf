"""Lexing of the Prometheus text format (0.0.4) and OpenMetrics 1.0 text, line by line.

The hot loop in collector/parse.py splits canonical lines itself and calls into this module
only on a miss: a label string not seen before (``parse_labels``, result cached by the
caller) or a line its fast path cannot split (``split_line``, which tolerates extra blanks
and OpenMetrics exemplars and otherwise says precisely what is wrong).

Errors are raised as ``LineError(reason)``; the caller adds target and line number.
"""

from __future__ import annotations

import math
import re

from core.records import Labels

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_BLANK = "[ \t]*"
_VALUE = r'"[^"\\\n]*(?:\\[\\"n][^"\\\n]*)*"'  # a quoted value; only \\ \" \n escapes
_PAIR = rf"{_BLANK}[a-zA-Z_][a-zA-Z0-9_]*{_BLANK}={_BLANK}{_VALUE}{_BLANK}"
# A whole label string (between the braces): pairs separated by commas, optional trailing one.
_LABELS_OK = re.compile(rf"(?:{_PAIR}(?:,{_PAIR})*(?:,{_BLANK})?)?{_BLANK}")
_PAIR_FIND = re.compile(rf"([a-zA-Z_][a-zA-Z0-9_]*){_BLANK}={_BLANK}({_VALUE})")
_UNESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_GOOD_NAMES: set[str] = set()  # label names already checked (a handful per exporter)
METRIC_TYPES = frozenset(
    {"counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset",
     "gaugehistogram"}
)  # fmt: skip


class LineError(Exception):
    """One line is malformed; ``reason`` says what is wrong (no target/line yet)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _UNESCAPE.sub(lambda m: _ESCAPES[m.group(1)], value)


def parse_labels(text: str) -> tuple[tuple[str, str], ...]:
    """The (name, value) pairs of a label string, in exposition order, values unescaped.

    Accepts blanks around names, ``=`` and values and one trailing comma (as Prometheus
    does); only the escapes ``\\\\``, ``\\"`` and ``\\n`` are legal in values; a
    ``__name__`` label is refused (the name is written before the braces).
    """
    pairs = _plain_pairs(text) if "\\" not in text else None
    if pairs is None:
        if not _LABELS_OK.fullmatch(text):
            raise LineError(diagnose_labels(text))
        pairs = [(n, _unescape(v[1:-1])) for n, v in _PAIR_FIND.findall(text)]
    if len(pairs) > 1 and len({n for n, _ in pairs}) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise LineError(f"duplicate label name {name!r}")
            seen.add(name)
    if "__name__" in text and any(n == "__name__" for n, _ in pairs):
        # Prometheus 2.42 fails such a scrape: 'label name "__name__" is not unique'.
        raise LineError("label '__name__' inside the braces (the metric name goes before them)")
    return tuple(pairs)


def _plain_pairs(text: str) -> list[tuple[str, str]] | None:
    """Pairs of a canonical label string without escapes (``a="x",b="y"``), else None."""
    if not text:
        return []
    if text[-1] != '"':
        return None
    pairs = []
    for part in text[:-1].split('",'):
        name, sep, value = part.partition('="')
        if not sep or '"' in value:
            return None
        if name not in _GOOD_NAMES:
            if LABEL_NAME.fullmatch(name) is None:
                return None
            if len(_GOOD_NAMES) < 10_000:
                _GOOD_NAMES.add(name)
        pairs.append((name, value))
    return pairs


def diagnose_labels(text: str) -> str:  # noqa: PLR0912 - a scanner: a branch per token class of the label grammar
    """Why ``text`` is not a valid label string (called only after the fast check failed)."""
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t":
            i += 1
        if i >= n:
            return "malformed labels"
        m = LABEL_NAME.match(text, i)
        if m is None:
            return f"expected a label name at {text[i : i + 20]!r}"
        name = m.group()
        i = m.end()
        while i < n and text[i] in " \t":
            i += 1
        if i >= n or text[i] != "=":
            return f"expected '=' after label name {name!r}"
        i += 1
        while i < n and text[i] in " \t":
            i += 1
        if i >= n or text[i] != '"':
            return f"value of label {name!r} must be a double-quoted string"
        i += 1
        while True:
            if i >= n:
                return f"unterminated label value of {name!r}"
            c = text[i]
            if c == "\\":
                if i + 1 >= n or text[i + 1] not in '\\"n':
                    return f"bad escape {text[i : i + 2]!r} in value of label {name!r}"
                i += 2
                continue
            if c == "\n":
                return f"raw line feed in value of label {name!r}"
            i += 1
            if c == '"':
                break
        while i < n and text[i] in " \t":
            i += 1
        if i >= n:
            return "malformed labels"
        if text[i] != ",":
            return f"expected ',' or '}}' after the value of label {name!r}, got {text[i]!r}"
        i += 1


def _label_block_end(line: str, start: int) -> int:
    """Index of the '}' closing the label block opened at ``start`` (quote-aware), or -1."""
    i, n, quoted = start + 1, len(line), False
    while i < n:
        c = line[i]
        if quoted:
            if c == "\\":
                i += 2
                continue
            if c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c == "}":
            return i
        i += 1
    return -1


def split_line(line: str) -> tuple[str, str, str, str | None]:
    """(name, label string, value token, timestamp token or None) of one sample line.

    The careful path: leading blanks, blanks before the brace, OpenMetrics exemplars
    (`` # {trace_id="…"} 1.0``) are accepted; anything else gets a precise reason.
    """
    s = line.strip(" \t\r")
    m = METRIC_NAME.match(s)
    if m is None:
        if not s or s[0] in "{ \t+-.0123456789":
            raise LineError("missing metric name")
        raise LineError(f"invalid metric name at {s[:30]!r}")
    name = m.group()
    i = m.end()
    while i < len(s) and s[i] in " \t":
        i += 1
    labels = ""
    if i < len(s) and s[i] == "{":
        end = _label_block_end(s, i)
        if end < 0:
            body = s[i + 1 :]
            reason = diagnose_labels(body) if '"' in body else "malformed labels"
            if reason == "malformed labels":
                reason = "label set is not closed by '}'"
            raise LineError(reason)
        labels = s[i + 1 : end]
        parse_labels(labels)  # raises with the precise reason
        i = end + 1
    elif i == m.end() and i < len(s):
        raise LineError(f"invalid character {s[i]!r} in metric name {name + s[i]!r}")
    head, _, exemplar = s[i:].partition("#")
    tokens = head.split()
    if not tokens:
        raise LineError(f"missing value for {name!r}")
    if len(tokens) > 2:
        raise LineError(f"unexpected text after the value: {' '.join(tokens[2:])[:30]!r}")
    if exemplar and not exemplar.strip().startswith("{"):
        raise LineError(f"malformed exemplar {exemplar.strip()[:30]!r}")
    return name, labels, tokens[0], tokens[1] if len(tokens) > 1 else None


def parse_value(token: str) -> float:
    """A sample value as Go's strconv.ParseFloat reads it (NaN, ±Inf allowed, no '_')."""
    try:
        value = float(token)
    except ValueError:
        raise LineError(f"bad value {token!r}") from None
    if "_" in token:
        raise LineError(f"bad value {token!r}")
    return value


def check_timestamp(token: str) -> None:
    """The optional timestamp column: integer ms (text 0.0.4) or float s (OpenMetrics)."""
    try:
        ts = float(token)
    except ValueError:
        raise LineError(f"bad timestamp {token!r}") from None
    if "_" in token or not math.isfinite(ts):
        raise LineError(f"bad timestamp {token!r}")


def parse_type_line(line: str) -> tuple[str, str]:
    """(family, type) of a ``# TYPE`` line."""
    parts = line[7:].split()
    if len(parts) != 2:
        raise LineError("malformed TYPE line: expected '# TYPE <name> <type>'")
    name, kind = parts
    if METRIC_NAME.fullmatch(name) is None:
        raise LineError(f"invalid metric name {name!r} in TYPE line")
    if kind not in METRIC_TYPES:
        raise LineError(f"unknown metric type {kind!r} for {name!r}")
    return name, kind


def sorted_labels(pairs: tuple[tuple[str, str], ...]) -> Labels:
    return tuple(sorted(pairs))
