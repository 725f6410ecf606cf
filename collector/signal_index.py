"""The catalogue compiled for the exposition reader: sample name -> what it feeds.

Built once at import from core.catalog (no vendor name is spelled here): every
spelling's sample names (colon and ``vllm_``/``lmcache_`` rewrite, counters with and
without ``_total``, histogram ``_bucket``/``_sum``/``_count``, ``_created`` to skip), the
label transform of a spelling (const labels, ``transfer_type`` -> ``direction``), and for a
vLLM engine name the production-stack router signal of the same name.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from core import catalog
from core.records import Labels

VALUE, BUCKET, SUM, COUNT, SKIP, FACT = range(6)
COUNTER, GAUGE, HIST = range(3)
_KIND_CODE = {"counter": COUNTER, "gauge": GAUGE, "histogram": HIST}
INF = math.inf
CACHE_LIMIT = 50_000

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
            if len(memo) < CACHE_LIMIT:
                memo[labels] = out
        return out

    return apply


def _sample_names(kind: str, family: str) -> list[tuple[str, int]]:
    if kind == "counter":
        names = [(family + "_total", VALUE), (family, VALUE), (family + "_created", SKIP)]
    elif kind == "histogram":
        names = [(family + s, p) for s, p in (("_bucket", BUCKET), ("_sum", SUM))]
        names += [(family + "_count", COUNT), (family + "_created", SKIP)]
    else:
        names = [(family, VALUE)]
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
            index[name] = (FACT, key, GAUGE, 0, 0, None, None, False)
            families.add(name)
    return index, frozenset(families)


INDEX, KNOWN_FAMILIES = build_index()
