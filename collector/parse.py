"""Read one exposition (Prometheus text 0.0.4 or OpenMetrics text) into canonical signals.

``read_exposition(text, target, timestamp) -> Snapshot`` makes one pass over the lines:

* every sample name is looked up in a table compiled from collector.catalog
  (collector/signal_index.py: each spelling with its colon and ``vllm_``/``lmcache_``
  rewrite, counters with and without ``_total``, histogram parts); ``_created`` samples
  are skipped;
* the steady state is one dict lookup per line: the ``name{labels}`` prefix of a canonical
  line maps to (signal target, parsed labels) after its first sight, so only the value is
  parsed again (the same prefixes recur in every scrape of every engine). Caches are bounded
  (``cache_limit`` entries, cleared when full); one reader per thread;
* histograms are assembled per series: value = ``_count`` (or the +Inf bucket when absent),
  ``sum`` = ``_sum``, cumulative buckets sorted by numeric ``le``, ending with +Inf;
* a production-stack router sample (label ``server``, no ``engine``) of a ``vllm:`` engine
  name feeds the ``router_*`` signal of that name, never the engine signal;
* where a deprecated spelling (rank > 0 in the catalogue) and the current one expose the same
  canonical series, the current one wins: no double counting;
* fact families (catalog.FACTS: cache config, KV offload config, LMCache target) become
  ``Snapshot.facts`` with all their labels;
* every other family is reported in ``unknown_families`` (sorted, never fatal) — including
  ``python_*``, ``process_*`` and ``http_*``; ``*_created`` companions are never reported.

Values: gauges may be NaN or ±Inf (kept as floats); counter values, bucket counts and
``_count`` must be finite and ≥ 0 (OpenMetrics 1.0 "Counter"/"Histogram"), ``_sum`` may be
anything. The timestamp column is validated and ignored (the snapshot has one timestamp).
Malformed input raises ParseError(target, line, reason); nothing is silently dropped.
"""

from __future__ import annotations

import math
import threading

from collector import catalog
from collector.errors import ParseError
from collector.exposition import (
    METRIC_NAME,
    LineError,
    check_timestamp,
    parse_labels,
    parse_type_line,
    parse_value,
    split_line,
)
from collector.records import Labels, SignalSample, Snapshot
from collector.signal_index import (
    BUCKET,
    CACHE_LIMIT,
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

_INF = math.inf
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_info", "_gsum", "_gcount")


class _Hist:
    __slots__ = ("buckets", "count", "line", "name", "rank", "spell", "sum")

    def __init__(self, rank: int, spell: int, line: int, name: str) -> None:
        self.name = name
        self.rank = rank
        self.spell = spell
        self.line = line
        self.buckets: list[tuple[float, float, int]] = []
        self.sum: float | None = None
        self.count: float | None = None


class _Acc:
    """What one read() accumulates besides the hot-loop locals."""

    __slots__ = ("declared", "facts", "kinds", "unknown", "unknown_names")

    def __init__(self) -> None:
        self.kinds: dict[str, str] = {}  # family -> declared type (a repeat must agree)
        # TYPE-declared family -> itself, also under its `:`->`_` spelling: OpenMetrics
        # escaping keeps `vllm:x` in TYPE lines but writes `vllm_x_total` samples.
        self.declared: dict[str, str] = {}
        self.facts: dict[str, list[dict[str, str]]] = {}
        self.unknown: dict[str, None] = {}
        self.unknown_names: dict[str, str] = {}

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
        self._limit = cache_limit

    def _type_line(self, line: str) -> tuple[str, str]:
        got = parse_type_line(line)
        if len(self._types) >= self._limit:
            self._types.clear()
        self._types[line] = got
        return got

    def _label_entry(self, text: str) -> LabelEntry:
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

    def _first_sight(self, line: str, acc: _Acc) -> tuple[Target, LabelEntry, str, float] | None:
        """A line whose name+labels prefix is not cached yet: split it (carefully if it is
        not canonical), validate it, cache the prefix when the line is canonical.
        Returns None when the line feeds no signal (blank line, unknown family)."""
        b = line.find("{")
        if b > 0:
            e = line.rfind("}")
            name, ltext, toks = line[:b], line[b + 1 : e], line[e + 1 :].split()
            slow = e < b
        elif b < 0:
            name, _, rest = line.partition(" ")
            ltext, toks, slow = "", rest.split(), False
            if not toks and not line.strip():
                return None  # a blank line
        else:
            name, ltext, toks, slow = "", "", [], True
        t = INDEX.get(name)
        if not 0 < len(toks) < 3 or (t is None and METRIC_NAME.fullmatch(name) is None):
            slow = True
        ent = None if slow else self._labels.get(ltext)
        if ent is None and not slow:
            try:
                ent = self._label_entry(ltext)
            except LineError:
                slow = True
        if slow:
            name, ltext, v0, ts = split_line(line)
            toks = [v0] if ts is None else [v0, ts]
            t = INDEX.get(name)
            ent = self._labels.get(ltext) or self._label_entry(ltext)
        assert ent is not None
        value = parse_value(toks[0])
        if len(toks) == 2:
            check_timestamp(toks[1])
        if t is not None and ent[3] and t[7]:
            t = t[6]  # a router sample of a colliding vllm: name
        sp = line.rfind(" ")
        if not slow and len(toks) == 1 and line[sp + 1 :] == toks[0]:
            if len(self._series) >= self._limit:
                self._series.clear()
            self._series[line[:sp]] = (t, ent, name)
        if t is None:
            acc.add_unknown(name)
            return None
        return t, ent, name, value

    def read(self, text: str, target: str, timestamp: float) -> Snapshot:
        series_get = self._series.get
        type_get = self._types.get
        acc = _Acc()
        values: dict[tuple[str, Labels], tuple[int, float]] = {}
        hists: dict[tuple[str, Labels], _Hist] = {}
        last_spell, last_labels, h = -1, None, None
        lines = text.split("\n")
        lineno = 0
        try:
            for lineno, line in enumerate(lines, 1):
                if not line:
                    continue
                if line[0] == "#":
                    if line.startswith("# TYPE "):
                        fam, kind = type_get(line) or self._type_line(line)
                        if acc.kinds.setdefault(fam, kind) != kind:
                            raise LineError(
                                f"TYPE {kind} for {fam!r} contradicts TYPE {acc.kinds[fam]}"
                            )
                        acc.declared[fam] = fam
                        acc.declared.setdefault(fam.replace(":", "_"), fam)
                    elif line.startswith("# EOF") and line.rstrip() == "# EOF":
                        _check_after_eof(lines, lineno, target)
                        break
                    continue
                # ---- the steady state: name+labels prefix seen before, parse the value ----
                sp = line.rfind(" ")
                hit = series_get(line[:sp]) if sp > 0 else None
                if hit is None:
                    got = self._first_sight(line, acc)
                    if got is None:
                        continue
                    t, ent, name, value = got
                else:
                    maybe_t, ent, name = hit
                    tok = line[sp + 1 :]
                    try:
                        value = float(tok)
                    except ValueError:
                        raise LineError(f"bad value {tok!r}") from None
                    if "_" in tok:
                        raise LineError(f"bad value {tok!r}")
                    if maybe_t is None:
                        acc.add_unknown(name)
                        continue
                    t = maybe_t
                part = t[0]
                if part == SKIP:
                    continue
                if part == VALUE:
                    if t[2] == COUNTER and not 0.0 <= value < _INF:
                        raise LineError(f"counter value {value} is not finite and >= 0")
                    xf = t[5]
                    key = (t[1], xf(ent[0]) if xf else ent[0])
                    prev = values.get(key)
                    if prev is None or _wins(t, prev[0], name):
                        values[key] = (t[3], value)
                    continue
                if part == FACT:
                    acc.facts.setdefault(t[1], []).append(dict(ent[0]))
                    continue
                if t[4] != last_spell or ent[1] is not last_labels:
                    last_spell, last_labels = t[4], ent[1]
                    h = _hist_for(hists, t, ent[1], name, lineno)
                if h is None:
                    continue  # a deprecated duplicate of a series the current name exposes
                if part == BUCKET:
                    if not 0.0 <= value < _INF:
                        raise LineError(f"bucket count {value} is not finite and >= 0")
                    bound = ent[4]
                    h.buckets.append(
                        (_bound(ent[2], name) if bound is None else bound, value, lineno)
                    )
                elif part == SUM:
                    if h.sum is not None:
                        raise LineError(f"duplicate sample {name!r}")
                    h.sum = value
                else:
                    if not 0.0 <= value < _INF:
                        raise LineError(f"histogram count {value} is not finite and >= 0")
                    if h.count is not None:
                        raise LineError(f"duplicate sample {name!r}")
                    h.count = value
        except LineError as exc:
            raise ParseError(target, lineno, exc.reason) from None
        for fam in set(acc.declared.values()):
            if fam not in KNOWN_FAMILIES and not fam.endswith("_created"):
                acc.unknown[fam] = None
        samples = [
            SignalSample(sig, catalog.SIGNALS[sig].kind, labels, v)
            for (sig, labels), (_, v) in values.items()
        ]
        samples += [_finish(target, key, hist) for key, hist in hists.items()]
        return Snapshot(
            target=target,
            timestamp=timestamp,
            samples=tuple(samples),
            facts={k: tuple(v) for k, v in acc.facts.items()},
            unknown_families=tuple(sorted(f for f in acc.unknown if f)),
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


def _wins(t: Target, prev_rank: int, name: str) -> bool:
    """A value series seen twice: the current spelling beats a deprecated one."""
    if t[3] == prev_rank:
        raise LineError(f"duplicate series for {name!r}")
    return t[3] < prev_rank


def _hist_for(
    hists: dict[tuple[str, Labels], _Hist], t: Target, labels: Labels, name: str, lineno: int
) -> _Hist | None:
    """The histogram series a bucket/sum/count line feeds (None: deprecated duplicate)."""
    xf = t[5]
    key = (t[1], xf(labels) if xf else labels)
    h = hists.get(key)
    if h is None:
        h = hists[key] = _Hist(t[3], t[4], lineno, name)
    elif h.spell != t[4]:
        if t[3] == h.rank:
            raise LineError(f"duplicate series for {name!r}")
        if t[3] > h.rank:
            return None
        h = hists[key] = _Hist(t[3], t[4], lineno, name)
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


def _finish(target: str, key: tuple[str, Labels], h: _Hist) -> SignalSample:
    signal, labels = key
    bs = h.buckets
    prev_bound, prev_count = -_INF, 0.0
    for bound, count, _line in bs:
        if bound <= prev_bound or count < prev_count:
            return _finish_unordered(target, key, h)
        prev_bound, prev_count = bound, count
    if prev_bound != _INF:
        raise ParseError(target, h.line, f"{_what(signal, h, labels)} has no +Inf bucket")
    count = h.count if h.count is not None else prev_count
    buckets = tuple([(b, c) for b, c, _ in bs])
    return SignalSample(signal, "histogram", labels, count, buckets=buckets, sum=h.sum)


def _what(signal: str, h: _Hist, labels: Labels) -> str:
    return f"histogram {_family(h.name)!r} {dict(labels)}"


def _finish_unordered(target: str, key: tuple[str, Labels], h: _Hist) -> SignalSample:
    """Buckets not in increasing le order: sort (stable), then report duplicates and
    non-cumulative counts at the offending line."""
    signal, labels = key
    h.buckets = sorted(h.buckets, key=lambda b: b[0])
    prev_bound, prev_count = -_INF, 0.0
    for bound, count, line in h.buckets:
        if bound == prev_bound:
            what = _what(signal, h, labels)
            raise ParseError(target, line, f"{what}: duplicate bucket le={_le(bound)}")
        if count < prev_count:
            what = _what(signal, h, labels)
            raise ParseError(
                target, line, f"{what}: bucket counts decrease at le={_le(bound)} (not cumulative)"
            )
        prev_bound, prev_count = bound, count
    return _finish(target, key, h)


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
    """Read one exposition into a Snapshot (see the module docstring for the rules), with
    this thread's reader."""
    return thread_reader().read(text, target, timestamp)
