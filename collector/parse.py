"""Read one exposition (Prometheus text 0.0.4 or OpenMetrics text) into canonical signals.

``read_exposition(text, target, timestamp) -> Snapshot`` makes one pass over the lines,
looking each sample name up in a table compiled from core.catalog (one dict lookup per
line once a ``name{labels}`` prefix has been seen). As Prometheus does, a syntax error fails
the whole exposition (``ParseError(target, line, reason)``) while value anomalies never do:
each is recorded in ``Snapshot.anomalies``, dropped or kept by its kind. Fact families become
``Snapshot.facts``; other families are listed in ``unknown_families``.

Rules, per anomaly kind: collector/DESIGN.md#parse
"""

from __future__ import annotations

import math
import re
import threading

from collector.exposition import (
    METRIC_NAME,
    LineError,
    check_timestamp,
    parse_labels,
    parse_type_line,
    split_line,
)
from collector.parse_template import FINITE, NO_CHECK, NON_NEGATIVE, Template
from collector.signal_index import (
    BUCKET,
    CACHE_LIMIT,
    COUNT,
    COUNTER,
    FACT,
    INDEX,
    KNOWN_FAMILIES,
    SKIP,
    SUM,
    VALUE,
    LabelEntry,
    Target,
)
from core import catalog
from core.errors import ParseError
from core.records import Anomaly, AnomalyKind, Labels, SignalSample, Snapshot

_INF = math.inf
TEMPLATE_LIMIT = 10_000  # targets whose last exposition a reader keeps as a template
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_info", "_gsum", "_gcount")
# "#", blanks, HELP or TYPE, blanks: the metadata lines Prometheus' lexer reads (promlex.l).
_META = re.compile(r"#[ \t]+(HELP|TYPE)[ \t]+")


class _Hist:
    __slots__ = ("bad", "buckets", "count", "count_line", "labels", "line", "name", "rank",
                 "spell", "sum", "sum_line")  # fmt: skip

    def __init__(self, rank: int, spell: int, line: int, name: str) -> None:
        self.name = name
        self.rank = rank
        self.spell = spell
        self.line = line
        self.labels: Labels = ()  # as written (less le) by the first line, for anomalies
        # (bound, count, line, labels as written)
        self.buckets: list[tuple[float, float, int, Labels]] = []
        self.sum: float | None = None
        self.count: float | None = None
        self.sum_line = self.count_line = 0  # the lines sum and count came from (1-based)
        self.bad = False  # a bucket was dropped for its value: the series is left out


# _hist_for's answer for a line that repeats a series another spelling of equal rank feeds.
_DUPLICATE = _Hist(-1, -1, 0, "")


class _ReadState:
    """What one read() accumulates besides the hot-loop locals."""

    __slots__ = ("anomalies", "declared", "facts", "kinds", "unknown", "unknown_names")

    def __init__(self) -> None:
        self.kinds: dict[str, str] = {}  # family -> first declared type
        # TYPE-declared family -> itself, also under its `:`->`_` spelling: OpenMetrics
        # escaping keeps `vllm:x` in TYPE lines but writes `vllm_x_total` samples.
        self.declared: dict[str, str] = {}
        self.facts: dict[str, list[dict[str, str]]] = {}
        self.unknown: dict[str, None] = {}
        self.unknown_names: dict[str, str] = {}
        self.anomalies: list[Anomaly] = []

    def anomaly(
        self, kind: AnomalyKind, name: str, labels: Labels, line: int, *, dropped: bool, detail: str
    ) -> None:
        self.anomalies.append(Anomaly(kind, name, labels, line, dropped, detail))

    def duplicate(self, name: str, labels: Labels, line: int, detail: str) -> None:
        self.anomaly("duplicate_series", name, labels, line, dropped=True, detail=detail)

    def non_finite(self, name: str, labels: Labels, line: int, value: float, what: str) -> None:
        """A gauge (kept) or a _sum (dropped) that is NaN or ±Inf."""
        kind: AnomalyKind = "nan" if math.isnan(value) else "inf"
        kept = what == "gauge value"
        verb = "kept" if kept else "dropped"
        self.anomaly(kind, name, labels, line, dropped=not kept, detail=f"{what} {value} {verb}")

    def bad_value(self, name: str, labels: Labels, line: int, value: float, what: str) -> None:
        """A counter-like sample (counter, bucket, _count) that is not finite and >= 0."""
        kind: AnomalyKind = (
            "nan" if math.isnan(value) else "inf" if math.isinf(value) else "negative_counter"
        )
        self.anomaly(kind, name, labels, line, dropped=True, detail=f"{what} {value} dropped")

    def add_unknown(self, name: str) -> None:
        fam = self.unknown_names.get(name)
        if fam is None:
            fam = self.unknown_names[name] = _family_of(name, self.declared)
        self.unknown[fam] = None


class ExpositionReader:
    """Reads expositions; keeps a bounded cache of parsed label strings between calls.

    One reader per thread (the cache is a plain dict); ``read_exposition`` uses this
    thread's (:func:`thread_reader`).
    """

    def __init__(self, cache_limit: int = CACHE_LIMIT) -> None:
        self._labels: dict[str, LabelEntry] = {}
        # line prefix (name + label block, as written) -> (target or None, labels, name)
        self._series: dict[str, tuple[Target | None, LabelEntry, str]] = {}
        self._interned: dict[Labels, Labels] = {}
        self._types: dict[str, tuple[str, str]] = {}  # "# TYPE" line -> (family, type)
        self._names: set[str] = set()  # sample names outside the index, checked valid
        # target -> its last exposition with the values taken out (collector.parse_template)
        self._templates: dict[str, Template] = {}
        self._limit = cache_limit

    def _type_line(self, line: str) -> tuple[str, str]:
        got = parse_type_line(line)
        if len(self._types) >= self._limit:
            self._types.clear()
        self._types[line] = got
        return got

    def _label_entry(self, text: str) -> LabelEntry:
        i = text.find('le="')
        if i >= 0 and (i == 0 or text[i - 1] == ",") and "\\" not in text:
            entry = self._bucket_entry(text, i)
            if entry is not None:
                return entry
        pairs = parse_labels(text)
        full = tuple(sorted(pairs))
        le: str | None = None
        bound: float | None = None
        no_le = full
        names = [k for k, _ in full]
        if "le" in names:
            le = full[names.index("le")][1]
            no_le = tuple(p for p in full if p[0] != "le")
            try:
                bound = _bound(le, "")
            except LineError:
                bound = None  # reported (with the sample name) if a bucket line uses it
        router = catalog.ROUTER_LABEL in names and catalog.ENGINE_LABEL not in names
        if len(self._labels) >= self._limit:
            self._labels.clear()
            self._interned.clear()
        interned = self._interned
        full = interned.setdefault(full, full)
        no_le = interned.setdefault(no_le, no_le)
        entry = self._labels[text] = (full, no_le, le, router, bound)
        return entry

    def _bucket_entry(self, text: str, i: int) -> LabelEntry | None:  # noqa: PLR0912 - the parser's per-line path, branches in line (bench_parse)
        """The entry of a bucket's label string whose ``le="…"`` pair starts at ``i`` (after
        a comma or at the start), made from the entry of the string without that pair: a
        histogram's buckets differ only in ``le``, so a cold read parses each series' labels
        once, not once per bucket. None when the pair is not cleanly delimited or the rest
        is malformed: the full parse then decides, and says what is wrong."""
        j = text.find('"', i + 4)
        if j < 0:
            return None
        if j + 1 == len(text):  # the last pair: the comma before it goes too
            rest = text[: i - 1] if i else ""
            if i and (not rest or rest.rstrip(" \t").endswith(",")):
                return None  # ',le="…"' alone, or two commas before it
        elif text[j + 1] == ",":
            rest = text[:i] + text[j + 2 :]
        else:
            return None
        base = self._labels.get(rest)
        if base is None:
            try:
                base = self._label_entry(rest)
            except LineError:
                return None
        if base[2] is not None:
            return None  # a second le pair: the full parse says so
        no_le = base[0]
        le = text[i + 4 : j]
        k = 0
        for name, _ in no_le:
            if name > "le":
                break
            k += 1
        full = (*no_le[:k], ("le", le), *no_le[k:])
        bound = _BOUNDS.get(le)
        if bound is None:
            try:
                bound = _bound(le, "")
            except LineError:
                bound = None  # reported (with the sample name) if a bucket line uses it
        if len(self._labels) >= self._limit:
            self._labels.clear()
            self._interned.clear()
        full = self._interned.setdefault(full, full)
        no_le = self._interned.setdefault(no_le, no_le)
        entry = self._labels[text] = (full, no_le, le, base[3], bound)
        return entry

    def _meta(self, line: str, acc: _ReadState, lineno: int) -> bool:
        """A line starting with ``#`` (leading blanks removed): record a TYPE, skip HELP and
        comments; True at ``# EOF``."""
        if not line.startswith("# TYPE "):
            if line.startswith("# HELP "):
                return False
            if line.startswith("# EOF") and line.rstrip() == "# EOF":
                return True
            m = _META.match(line)
            if m is None or m.group(1) != "TYPE":
                return False  # a comment (or an unusually spaced HELP)
            line = "# TYPE " + line[m.end() :]
        fam, kind = self._types.get(line) or self._type_line(line)
        first = acc.kinds.setdefault(fam, kind)
        if first != kind:
            acc.anomaly(
                "type_conflict",
                fam,
                (),
                lineno,
                dropped=False,
                detail=f"TYPE {kind} contradicts TYPE {first} (the first stands)",
            )
        acc.declared[fam] = fam
        acc.declared.setdefault(fam.replace(":", "_"), fam)
        return False

    def _first_sight(  # noqa: PLR0912 - the parser's per-line path, branches in line (bench_parse)
        self, line: str, sp: int, cache: bool
    ) -> tuple[Target | None, LabelEntry, str, str] | None:
        """A line whose name+labels prefix is not cached yet (``sp``: its last blank, -1 if
        none): split it (carefully if it is not canonical), validate all but its value, and
        cache the prefix when the line is canonical and ``cache`` is set. Returns what a
        cached prefix gives and the value token; None for a blank line."""
        # canonical: name{labels} value, one blank before the value, no timestamp
        b = line.find("{", 0, sp)
        if b > 0:
            name = line[:b]
            slow = sp <= 0 or line[sp - 1] != "}"
            ltext = line[b + 1 : sp - 1]
        else:
            name, ltext, slow = line[:sp], "", b == 0 or sp <= 0
        tok = line[sp + 1 :]
        t = INDEX.get(name)
        if slow or "\t" in tok:
            slow = True
        elif t is None and name not in self._names:
            if METRIC_NAME.fullmatch(name) is None:
                slow = True
            elif len(self._names) < self._limit:
                self._names.add(name)
        ent = None if slow else self._labels.get(ltext)
        if ent is None and not slow:
            try:
                ent = self._label_entry(ltext)
            except LineError:
                slow = True
        if slow:
            if not line.strip():
                return None  # a blank line
            name, ltext, tok, ts = split_line(line)
            t = INDEX.get(name)
            ent = self._labels.get(ltext) or self._label_entry(ltext)
            if ts is not None:
                check_timestamp(ts)
        assert ent is not None
        if t is not None and ent[3] and t[7]:
            t = t[6]  # a router sample of a colliding vllm: name
        if cache and not slow:
            if len(self._series) >= self._limit:
                self._series.clear()
            self._series[line[:sp]] = (t, ent, name)
        return t, ent, name, tok

    def read(self, text: str, target: str, timestamp: float) -> Snapshot:
        template = self._templates.get(target)
        if template is not None:
            snapshot = template.read(text, target, timestamp)
            if snapshot is not None:
                return snapshot
        return self._read(text, target, timestamp)

    # long: the per-line hot loop of every scrape: a helper for its histogram or uncached
    # lines adds a call per line (bench_parse: warm reads ~2 % slower, cold up to ~5 %)
    def _read(self, text: str, target: str, timestamp: float) -> Snapshot:  # noqa: PLR0912, PLR0915 - the per-line hot loop (see # long above)
        series = self._series
        series_get = series.get
        labels_get = self._labels.get
        index_get = INDEX.get
        names_ok = self._names
        limit = self._limit
        acc = _ReadState()
        values: dict[tuple[str, Labels], tuple[int, float, int]] = {}  # (rank, value, line)
        hists: dict[tuple[str, Labels], _Hist] = {}
        last_spell, last_labels, h = -1, None, None
        lines = text.split("\n")
        # A prefix cache smaller than the exposition is cleared by the exposition itself
        # before its next read (a federation endpoint): its lines are not cached at all.
        cache = len(lines) < self._limit
        last_unknown = ""
        lineno = 0
        try:
            for lineno, line in enumerate(lines, 1):
                if not line:
                    continue
                if line[0] == "#":
                    if line.startswith("# HELP "):
                        continue
                    if self._meta(line, acc, lineno):
                        _check_after_eof(lines, lineno, target)
                        break
                    continue
                # ---- the steady state: name+labels prefix seen before, parse the value ----
                sp = line.rfind(" ")
                hit = series_get(line[:sp]) if cache and sp > 0 else None
                if hit is None:
                    if line[0] in " \t":
                        stripped = line.lstrip(" \t")
                        if stripped[:1] == "#":
                            if self._meta(stripped, acc, lineno):
                                _check_after_eof(lines, lineno, target)
                                break
                            continue
                    # a canonical line whose name and label string were seen before (a
                    # federation's engines share them); anything else: _first_sight
                    b = line.find("{", 0, sp)
                    ent = None
                    if b > 0 and line[sp - 1] == "}":
                        name = line[:b]
                        maybe_t = index_get(name)
                        if maybe_t is not None or name in names_ok:
                            ent = labels_get(line[b + 1 : sp - 1])
                            tok = line[sp + 1 :]
                            if ent is not None and "\t" in tok:
                                ent = None
                    if ent is None:
                        got = self._first_sight(line, sp, cache)
                        if got is None:
                            continue
                        maybe_t, ent, name, tok = got
                    else:
                        if maybe_t is not None and ent[3] and maybe_t[7]:
                            maybe_t = maybe_t[6]  # a router sample (as in _first_sight)
                        if cache:
                            if len(series) >= limit:
                                series.clear()
                            series[line[:sp]] = (maybe_t, ent, name)
                else:
                    maybe_t, ent, name = hit
                    tok = line[sp + 1 :]
                try:
                    value = float(tok)
                except ValueError:
                    if not tok:  # as a first sight says it (exposition.split_line)
                        raise LineError(f"missing value for {name!r}") from None
                    raise LineError(f"bad value {tok!r}") from None
                if "_" in tok:
                    raise LineError(f"bad value {tok!r}")
                if maybe_t is None:
                    if name != last_unknown:
                        last_unknown = name
                        acc.add_unknown(name)
                    continue
                t = maybe_t
                part = t[0]
                if part == SKIP:
                    continue
                if part == VALUE:
                    if t[2] == COUNTER:
                        if not 0.0 <= value < _INF:
                            acc.bad_value(name, ent[0], lineno, value, "counter value")
                            continue
                    elif value - value:  # a gauge NaN or ±Inf: kept, as Prometheus keeps it
                        acc.non_finite(name, ent[0], lineno, value, "gauge value")
                    xf = t[5]
                    key = (t[1], xf(ent[0]) if xf else ent[0])
                    prev = values.get(key)
                    if prev is None or t[3] < prev[0]:
                        values[key] = (t[3], value, lineno)
                    elif t[3] == prev[0]:
                        acc.duplicate(name, ent[0], lineno, f"the first value {prev[1]} stands")
                    continue
                if part == FACT:
                    acc.facts.setdefault(t[1], []).append(dict(ent[0]))
                    continue
                if t[4] != last_spell or ent[1] is not last_labels:
                    last_spell, last_labels = t[4], ent[1]
                    h = _hist_for(hists, t, ent[1], name, lineno)
                if h is None:
                    continue  # a deprecated duplicate of a series the current name exposes
                if h is _DUPLICATE:
                    acc.duplicate(name, ent[0], lineno, "another spelling exposed it first")
                    continue
                if part == BUCKET:
                    if not 0.0 <= value < _INF:
                        acc.bad_value(name, ent[0], lineno, value, "bucket count")
                        h.bad = True
                        continue
                    bound = ent[4]
                    if bound is None:
                        try:
                            bound = _bound(ent[2], name)
                        except LineError as exc:
                            acc.anomaly(
                                "bad_bucket",
                                name,
                                ent[0],
                                lineno,
                                dropped=True,
                                detail=f"{exc.reason}: bucket dropped",
                            )
                            continue
                    h.buckets.append((bound, value, lineno, ent[0]))
                elif part == SUM:
                    if h.sum is not None:
                        acc.duplicate(name, ent[0], lineno, f"the first sum {h.sum} stands")
                    elif value - value:  # NaN or ±Inf: the sum only is dropped
                        acc.non_finite(name, ent[0], lineno, value, "sum")
                    else:
                        h.sum, h.sum_line = value, lineno
                elif h.count is not None:
                    acc.duplicate(name, ent[0], lineno, f"the first count {h.count} stands")
                elif not 0.0 <= value < _INF:
                    acc.bad_value(name, ent[0], lineno, value, "histogram count")
                else:
                    h.count, h.count_line = value, lineno
        except LineError as exc:
            raise ParseError(target, lineno, exc.reason) from None
        for fam in set(acc.declared.values()):
            if fam not in KNOWN_FAMILIES and not fam.endswith("_created"):
                acc.unknown[fam] = None
        samples = [
            SignalSample(sig, catalog.SIGNALS[sig].kind, labels, v)
            for (sig, labels), (_, v, _) in values.items()
        ]
        for key, hist in hists.items():
            sample = _finish(key, hist, acc)
            if sample is not None:
                samples.append(sample)
        anomalies = acc.anomalies
        if anomalies:
            anomalies.sort(key=lambda a: a.line)  # stable: a line's own order is kept
        snapshot = Snapshot(
            target=target,
            timestamp=timestamp,
            samples=tuple(samples),
            facts={k: tuple(v) for k, v in acc.facts.items()},
            unknown_families=tuple(sorted(f for f in acc.unknown if f)),
            anomalies=tuple(anomalies),
        )
        template = None if anomalies else self._template(lines, values, hists, snapshot)
        if template is None:
            self._templates.pop(target, None)
        else:
            if len(self._templates) >= TEMPLATE_LIMIT:
                self._templates.clear()
            self._templates[target] = template
        return snapshot

    def _template(
        self,
        lines: list[str],
        values: dict[tuple[str, Labels], tuple[int, float, int]],
        hists: dict[tuple[str, Labels], _Hist],
        snapshot: Snapshot,
    ) -> Template | None:
        """The template of an exposition just read with no anomaly (None when one of its
        sample lines is not in the prefix cache: a timestamp, unusual blanks, a cache that
        was cleared while reading)."""
        sample_lines: list[int] = []
        prefixes: list[str] = []
        checks: list[int] = []
        position: dict[int, int] = {}  # 1-based line number -> sample position
        series_get = self._series.get
        for i, line in enumerate(lines):
            if not line.strip() or line.lstrip(" \t")[:1] == "#":
                continue  # kept whole: blank, HELP, TYPE, comment, EOF
            sp = line.rfind(" ")
            hit = series_get(line[:sp]) if sp > 0 else None
            if hit is None:
                return None
            t = hit[0]
            check = NO_CHECK
            if t is not None:
                part = t[0]
                if part in (BUCKET, COUNT) or (part == VALUE and t[2] == COUNTER):
                    check = NON_NEGATIVE
                elif part in (SUM, VALUE):
                    check = FINITE
            position[i + 1] = len(sample_lines)
            sample_lines.append(i)
            prefixes.append(line[:sp])
            checks.append(check)
        scalars = [
            (sig, catalog.SIGNALS[sig].kind, labels, position[line])
            for (sig, labels), (_, _, line) in values.items()
        ]
        hist_rows = []
        for (sig, labels), h in hists.items():
            hist_rows.append(
                (
                    sig,
                    labels,
                    tuple(b for b, _, _, _ in h.buckets),
                    tuple(position[line] for _, _, line, _ in h.buckets),
                    position[h.sum_line] if h.sum is not None else -1,
                    position[h.count_line] if h.count is not None else -1,
                )
            )
        return Template(
            lines,
            sample_lines=sample_lines,
            prefixes=prefixes,
            checks=checks,
            scalars=scalars,
            hists=hist_rows,
            facts=snapshot.facts,
            unknown=snapshot.unknown_families,
        )


_BOUNDS: dict[str, float] = {}


def _bound(le: str | None, name: str) -> float:
    """The numeric upper bound of a bucket ("120.0", "1e+06", "5.0", "+Inf" …)."""
    if le is None:
        raise LineError(f"bucket sample {name!r} without 'le' label")
    bound = _BOUNDS.get(le)
    if bound is None:
        try:
            bound = float(le)
        except ValueError:
            raise LineError(f"non-numeric le={le!r}") from None
        if math.isnan(bound) or "_" in le:
            raise LineError(f"le={le!r} is not a bucket bound")
        if len(_BOUNDS) < 10_000:
            _BOUNDS[le] = bound
    return bound


def _check_after_eof(lines: list[str], eof_line: int, target: str) -> None:
    for j in range(eof_line, len(lines)):
        if lines[j].strip():
            raise ParseError(target, j + 1, f"content after '# EOF' (line {eof_line})")


def _hist_for(
    hists: dict[tuple[str, Labels], _Hist], t: Target, labels: Labels, name: str, lineno: int
) -> _Hist | None:
    """The histogram series a bucket/sum/count line feeds (None: a deprecated duplicate;
    _DUPLICATE: another spelling of the same rank fed it first)."""
    xf = t[5]
    key = (t[1], xf(labels) if xf else labels)
    h = hists.get(key)
    if h is None:
        h = hists[key] = _Hist(t[3], t[4], lineno, name)
        h.labels = labels
    elif h.spell != t[4]:
        if t[3] == h.rank:
            return _DUPLICATE
        if t[3] > h.rank:
            return None
        h = hists[key] = _Hist(t[3], t[4], lineno, name)
        h.labels = labels
    return h


def _family_of(name: str, declared: dict[str, str]) -> str:
    """The family an unknown sample belongs to ('' for ``_created`` companions)."""
    if name.endswith("_created"):
        return ""
    if name in declared:
        return declared[name]
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in declared:
            return declared[name[: -len(suffix)]]
    if METRIC_NAME.fullmatch(name) is None:
        raise LineError(f"invalid metric name {name!r}")
    return name


def _family(name: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _le(bound: float) -> str:
    return "+Inf" if bound == _INF else repr(bound)


def _finish(key: tuple[str, Labels], h: _Hist, acc: _ReadState) -> SignalSample | None:
    """The histogram sample of one series, or None when it is dropped (a bucket value was
    dropped, or no +Inf bucket); anomalies found here go to ``acc``."""
    signal, labels = key
    if h.bad:
        return None  # the bucket's own anomaly says why
    bs = h.buckets
    prev_bound, prev_count = -_INF, 0.0
    for bound, count, _line, _labels in bs:
        if bound <= prev_bound or count < prev_count:
            bs = _repair(h, acc)
            break
        prev_bound, prev_count = bound, count
    if not bs or bs[-1][0] != _INF:
        acc.anomaly(
            "histogram_no_inf_bucket",
            _family(h.name),
            h.labels,
            h.line,
            dropped=True,
            detail='no le="+Inf" bucket: histogram dropped',
        )
        return None
    count = h.count if h.count is not None else bs[-1][1]
    bounds = tuple([b for b, _, _, _ in bs])
    counts = tuple([c for _, c, _, _ in bs])
    return SignalSample(signal, "histogram", labels, count, bounds, counts, h.sum)


def _repair(h: _Hist, acc: _ReadState) -> list[tuple[float, float, int, Labels]]:
    """Buckets not in increasing le order: sort (stable: line order among equal bounds), drop
    a repeated bound (the first line stands), note non-cumulative counts (kept)."""
    kept: list[tuple[float, float, int, Labels]] = []
    decreasing: tuple[float, int, Labels] | None = None
    for b in sorted(h.buckets, key=lambda b: b[0]):
        if kept and b[0] == kept[-1][0]:
            first = kept[-1][1]
            acc.duplicate(
                _family(h.name) + "_bucket",
                b[3],
                b[2],
                f"bucket le={_le(b[0])} again; the first count {first} stands",
            )
            continue
        if kept and b[1] < kept[-1][1] and decreasing is None:
            decreasing = (b[0], b[2], b[3])
        kept.append(b)
    if decreasing is not None:
        bound, line, labels = decreasing
        acc.anomaly(
            "histogram_not_cumulative",
            _family(h.name) + "_bucket",
            labels,
            line,
            dropped=False,
            detail=f"counts decrease at le={_le(bound)}: kept",
        )
    h.buckets = kept
    return kept


# One reader per thread: the collector reads expositions in asyncio.to_thread workers, many
# at once, and a reader's caches are plain dicts that one read fills while another clears.
_LOCAL = threading.local()


def thread_reader() -> ExpositionReader:
    """This thread's reader (made on its first read; its caches warm across that thread's
    reads)."""
    reader: ExpositionReader | None = getattr(_LOCAL, "reader", None)
    if reader is None:
        reader = _LOCAL.reader = ExpositionReader()
    return reader


def read_exposition(text: str, target: str, timestamp: float) -> Snapshot:
    """Read one exposition into a Snapshot (rules: DESIGN.md#parse), with
    this thread's reader."""
    return thread_reader().read(text, target, timestamp)
