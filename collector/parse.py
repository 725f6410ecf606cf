"""Read one exposition (Prometheus text 0.0.4 or OpenMetrics text) into canonical signals.

``read_exposition(text, target, timestamp) -> Snapshot`` makes one pass over the lines:

* every sample name is looked up in a table precomputed from collector.catalog (each
  spelling: colon and ``vllm_``/``lmcache_`` rewrite, counters with and without ``_total``,
  histogram ``_bucket``/``_sum``/``_count``); ``_created`` samples are skipped;
* label strings are parsed once and cached (the same strings recur in every scrape of every
  engine), so the steady state does a dict lookup per line;
* histograms are assembled per series: value = ``_count`` (or the +Inf bucket when absent),
  ``sum`` = ``_sum``, cumulative buckets sorted by numeric ``le``, ending with +Inf;
* a production-stack router sample (label ``server``, no ``engine``) of a ``vllm:`` engine
  name feeds the ``router_*`` signal of that name, never the engine signal;
* where a deprecated spelling (rank > 0 in the catalogue) and the current one expose the same
  canonical series, the current one wins: no double counting;
* fact families (``vllm:cache_config_info`` …) become ``Snapshot.facts`` with all labels;
* every other family is reported in ``unknown_families`` (sorted, never fatal) — including
  ``python_*``, ``process_*`` and ``http_*``; ``*_created`` companions are never reported.

Values: gauges may be NaN or ±Inf (kept as floats); counter values, bucket counts and
``_count`` must be finite and ≥ 0 (OpenMetrics 1.0 "Counter"/"Histogram"), ``_sum`` may be
anything. The timestamp column is validated and ignored (the snapshot has one timestamp).
Malformed input raises ParseError(target, line, reason); nothing is silently dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable

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

_VALUE, _BUCKET, _SUM, _COUNT, _SKIP, _FACT = range(6)
_COUNTER, _GAUGE, _HIST = range(3)
_KIND_CODE = {"counter": _COUNTER, "gauge": _GAUGE, "histogram": _HIST}
_INF = math.inf
_CACHE_LIMIT = 50_000

Xform = Callable[[Labels], Labels]
# (part, signal, kind code, rank, spelling id, label transform, router alternative or None,
#  engine_side: the name is a vLLM engine spelling that router samples must not feed)
Target = tuple[int, str, int, int, int, Xform | None, "Target | None", bool]
# cached per label string: (all labels sorted, labels without le sorted, le or None, router?,
# numeric le or None). Equal label tuples are interned so the hot loop compares identities.
LabelEntry = tuple[Labels, Labels, str | None, bool, float | None]


def _xform(spelling: catalog.Spelling) -> Xform | None:
    if not spelling.const_labels and not spelling.rename:
        return None
    consts = spelling.const_labels
    rename = dict(spelling.rename)
    values = dict(spelling.values)
    memo: dict[Labels, Labels] = {}

    def apply(labels: Labels) -> Labels:
        out = memo.get(labels)
        if out is None:
            pairs = [(rename[k], values.get(v, v)) if k in rename else (k, v) for k, v in labels]
            out = tuple(sorted(dict([*pairs, *consts]).items()))
            if len(memo) < _CACHE_LIMIT:
                memo[labels] = out
        return out

    return apply


def _sample_names(kind: str, family: str) -> list[tuple[str, int]]:
    if kind == "counter":
        names = [(family + "_total", _VALUE), (family, _VALUE), (family + "_created", _SKIP)]
    elif kind == "histogram":
        names = [(family + s, p) for s, p in (("_bucket", _BUCKET), ("_sum", _SUM))]
        names += [(family + "_count", _COUNT), (family + "_created", _SKIP)]
    else:
        names = [(family, _VALUE)]
    return names + [(n.replace(":", "_"), p) for n, p in names if ":" in n]


def build_index() -> tuple[dict[str, Target], frozenset[str]]:
    """Sample name -> Target for every spelling in the catalogue, and all known family names."""
    index: dict[str, Target] = {}
    routers: dict[str, Target] = {}
    families: set[str] = set()
    spell_id = 0
    for sig in catalog.SIGNALS.values():
        for sp in sig.spellings:
            spell_id += 1
            engine_side = sig.source == "vllm"
            families.update((sp.family, sp.family.replace(":", "_")))
            for name, part in _sample_names(sig.kind, sp.family):
                t: Target = (part, sig.name, _KIND_CODE[sig.kind], sp.rank, spell_id,
                             _xform(sp), None, engine_side)  # fmt: skip
                families.add(name)
                if sig.source == "router":
                    routers[name] = t
                elif name in index and index[name][1] != sig.name:
                    raise RuntimeError(f"catalogue: {name} spelled by two signals")
                else:
                    index[name] = t
    for name, t in routers.items():
        if name in index:  # collides with an engine name: only router-labelled samples
            e = index[name]
            index[name] = (e[0], e[1], e[2], e[3], e[4], e[5], t, e[7])
        else:
            index[name] = t
    for key, family in catalog.FACTS.items():
        for name in {family, family.replace(":", "_")}:
            index[name] = (_FACT, key, _GAUGE, 0, 0, None, None, False)
            families.add(name)
    return index, frozenset(families)


_INDEX, _KNOWN_FAMILIES = build_index()
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

    __slots__ = ("declared", "facts", "unknown", "unknown_names")

    def __init__(self) -> None:
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

    One reader per thread (the cache is a plain dict); ``read_exposition`` uses a shared one.
    """

    def __init__(self, cache_limit: int = _CACHE_LIMIT) -> None:
        self._labels: dict[str, LabelEntry] = {}
        self._interned: dict[Labels, Labels] = {}
        self._limit = cache_limit

    def _label_entry(self, text: str) -> LabelEntry:
        pairs = parse_labels(text)
        full = tuple(sorted(pairs))
        names = {k for k, _ in pairs}
        le: str | None = None
        no_le = full
        if "le" in names:
            le = next(v for k, v in pairs if k == "le")
            no_le = tuple(p for p in full if p[0] != "le")
        router = catalog.ROUTER_LABEL in names and catalog.ENGINE_LABEL not in names
        bound = None
        if le is not None:
            try:
                bound = _bound(le, "")
            except LineError:
                bound = None  # reported (with the sample name) if a bucket line uses it
        if len(self._labels) >= self._limit:
            self._labels.clear()
            self._interned.clear()
        full = self._interned.setdefault(full, full)
        no_le = self._interned.setdefault(no_le, no_le)
        entry = self._labels[text] = (full, no_le, le, router, bound)
        return entry

    def _careful(
        self, line: str, name: str, ltext: str, toks: list[str], *, broken: bool, acc: _Acc
    ) -> tuple[Target, LabelEntry, float] | None:
        """Everything the hot loop does not: odd spacing, timestamps, new label strings,
        unknown names. Returns None when the line feeds no signal."""
        t = _INDEX.get(name)
        slow = broken or not 0 < len(toks) < 3
        if not slow and t is None and name not in acc.unknown_names:
            slow = METRIC_NAME.fullmatch(name) is None
        ent = None if slow else self._labels.get(ltext)
        if ent is None and not slow:
            try:
                ent = self._label_entry(ltext)
            except LineError:
                slow = True
        if slow:
            if not line.strip():
                return None
            name, ltext, v0, ts = split_line(line)
            toks = [v0] if ts is None else [v0, ts]
            t = _INDEX.get(name)
            ent = self._labels.get(ltext) or self._label_entry(ltext)
        assert ent is not None
        value = parse_value(toks[0])
        if len(toks) == 2:
            check_timestamp(toks[1])
        if t is not None and ent[3] and t[7]:
            t = t[6]
        if t is None:
            acc.add_unknown(name)
            return None
        return t, ent, value

    def read(self, text: str, target: str, timestamp: float) -> Snapshot:
        index_get = _INDEX.get
        lcache_get = self._labels.get
        acc = _Acc()
        unknown_names = acc.unknown_names
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
                        fam, _kind = parse_type_line(line)
                        if acc.declared.get(fam) == fam:
                            raise LineError(f"second TYPE line for {fam!r}")
                        acc.declared[fam] = fam
                        acc.declared.setdefault(fam.replace(":", "_"), fam)
                    elif line.startswith("# EOF") and line.rstrip() == "# EOF":
                        _check_after_eof(lines, lineno, target)
                        break
                    continue
                # ---- fast split of a canonical line; anything odd goes to _careful() ----
                b = line.find("{")
                if b > 0:
                    e = line.rfind("}")
                    name = line[:b]
                    ltext = line[b + 1 : e]
                    toks = line[e + 1 :].split()
                else:
                    e = 0
                    name, _, rest = line.partition(" ")
                    ltext = ""
                    toks = rest.split()
                t = index_get(name)
                ent = lcache_get(ltext)
                if t is None and ent and e > b and name in unknown_names and len(toks) == 1:
                    parse_value(toks[0])
                    acc.unknown[unknown_names[name]] = None
                    continue
                if t is None or ent is None or len(toks) != 1 or e <= b:
                    got = self._careful(line, name, ltext, toks, broken=e <= b, acc=acc)
                    if got is None:
                        continue
                    t, ent, value = got
                else:
                    tok = toks[0]
                    try:
                        value = float(tok)
                    except ValueError:
                        raise LineError(f"bad value {tok!r}") from None
                    if "_" in tok:
                        raise LineError(f"bad value {tok!r}")
                    if ent[3] and t[7]:
                        t = t[6]
                        if t is None:
                            acc.add_unknown(name)
                            continue
                part = t[0]
                if part == _SKIP:
                    continue
                if part == _VALUE:
                    if t[2] == _COUNTER and not 0.0 <= value < _INF:
                        raise LineError(f"counter value {value} is not finite and >= 0")
                    xf = t[5]
                    key = (t[1], xf(ent[0]) if xf else ent[0])
                    prev = values.get(key)
                    if prev is None or _wins(t, prev[0], name):
                        values[key] = (t[3], value)
                    continue
                if part == _FACT:
                    acc.facts.setdefault(t[1], []).append(dict(ent[0]))
                    continue
                if t[4] != last_spell or ent[1] is not last_labels:
                    last_spell, last_labels = t[4], ent[1]
                    h = _hist_for(hists, t, ent[1], name, lineno)
                if h is None:
                    continue  # a deprecated duplicate of a series the current name exposes
                if part == _BUCKET:
                    if not 0.0 <= value < _INF:
                        raise LineError(f"bucket count {value} is not finite and >= 0")
                    bound = ent[4]
                    h.buckets.append(
                        (_bound(ent[2], name) if bound is None else bound, value, lineno)
                    )
                elif part == _SUM:
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
            if fam not in _KNOWN_FAMILIES and not fam.endswith("_created"):
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
    if any(bs[i][0] >= bs[i + 1][0] for i in range(len(bs) - 1)):
        bs = sorted(bs, key=lambda b: b[0])  # stable: duplicates keep exposition order
    what = f"histogram {_family(h.name)!r} {dict(labels)}"
    prev_bound, prev_count = -_INF, 0.0
    for bound, count, line in bs:
        if bound == prev_bound:
            raise ParseError(target, line, f"{what}: duplicate bucket le={_le(bound)}")
        if count < prev_count:
            raise ParseError(
                target, line, f"{what}: bucket counts decrease at le={_le(bound)} (not cumulative)"
            )
        prev_bound, prev_count = bound, count
    if not bs or bs[-1][0] != _INF:
        raise ParseError(target, h.line, f"{what} has no +Inf bucket")
    count = h.count if h.count is not None else bs[-1][1]
    buckets = tuple([(b, c) for b, c, _ in bs])
    return SignalSample(signal, "histogram", labels, count, buckets=buckets, sum=h.sum)


_READER = ExpositionReader()


def read_exposition(text: str, target: str, timestamp: float) -> Snapshot:
    """Read one exposition into a Snapshot (see the module docstring for the rules)."""
    return _READER.read(text, target, timestamp)
