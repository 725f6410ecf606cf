"""The analysis frame of planner/frames/frames.py built one signal at a time.

:class:`FrameBuilder` takes each signal's windows (a ``Store.read_frame`` frame of one
signal with categorical ``source``/``engine``/``model_name``) and turns them at once into
that signal's frame columns (NaN: no window), so only one signal's windows are held. Rows
are keyed by (source, engine, start); windows without an engine label have rows of their
own until :meth:`finish` joins them to their source's only engine, as engine_frame does.
``finish`` returns the frame (equal to engine_frame's of all the windows) and the sources
it cannot make exactly so (windows of one signal with and without an engine label, or of
unequal lengths in one row): their rows must be rebuilt by engine_frame.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from planner.frames.frames import COLUMNS, _dtype, coded_text
from planner.frames.groups import modes_and_groups
from planner.frames.space import Space, mean_lengths, present
from planner.frames.stream_columns import DERIVED, fields_of, final_columns, signal_columns

if TYPE_CHECKING:
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float64]
    IntArray = npt.NDArray[np.int64]

__all__ = ["DERIVED", "FrameBuilder", "fields_of"]
_SHIFT = 32  # row key: pair id << _SHIFT | start id


class FrameBuilder:
    """The frame's columns, filled signal by signal (module docstring)."""

    def __init__(self) -> None:
        self.sources: dict[str, int] = {}
        self.engines: dict[str, int] = {}
        self.models: dict[str, int] = {}
        self.pairs: dict[tuple[int, int], int] = {}  # (source id, engine id or -1) -> pair
        self.starts = pd.Index(np.zeros(0, dtype=np.float64))
        self.labelled, self.unlabelled = Space(), Space()
        self.mixed: set[int] = set()  # sources with one signal's windows in both spaces
        self.model_counts: Counter[tuple[int, bool, int]] = Counter()
        self.done: set[str] = set()
        self._last_starts: tuple[FloatArray, IntArray] | None = None  # starts -> start ids

    def _ids(self, table: dict[str, int], values: object) -> IntArray:
        names = [str(v) for v in values]  # type: ignore[attr-defined]
        return np.asarray([table.setdefault(v, len(table)) for v in names], dtype=np.int64)

    def _keys(self, part: pd.DataFrame) -> tuple[IntArray, IntArray, npt.NDArray[np.bool_]]:
        """(row key, pair id, engine-labelled) of each window; pairs and starts numbered
        as first seen."""
        src, eng = part["source"].cat, part["engine"].cat
        s_id = self._ids(self.sources, src.categories)
        e_id = np.append(self._ids(self.engines, eng.categories), -1)
        width = len(e_id)
        e_code = eng.codes.to_numpy().astype(np.int64)
        labelled = e_code >= 0
        combo = src.codes.to_numpy().astype(np.int64) * width + np.where(
            labelled, e_code, width - 1
        )
        lut = np.zeros(len(s_id) * width, dtype=np.int64)
        for c in present(combo)[0].tolist():
            s, e = int(s_id[c // width]), int(e_id[c % width])
            lut[c] = self.pairs.setdefault((s, e), len(self.pairs))
        pair = lut[combo]
        start = part["start"].to_numpy(dtype=np.float64)
        last = self._last_starts
        if last is not None and np.array_equal(start, last[0]):
            at = last[1]  # the previous signal's windows started at the same times
        else:
            at = self.starts.get_indexer(pd.Index(start))
            if (at < 0).any():
                self.starts = self.starts.append(pd.Index(pd.unique(start[at < 0])))
                at = self.starts.get_indexer(pd.Index(start))
            at = at.astype(np.int64)
            self._last_starts = (start, at)
        return (pair << _SHIFT) | at, pair, labelled

    def add(self, signal: str, part: pd.DataFrame) -> None:
        """Turn one signal's windows (all of them, read_windows' order) into its columns."""
        if signal in self.done:
            raise ValueError(f"signal {signal!r} added twice")
        self.done.add(signal)
        if not len(part):
            return
        key, pair, labelled = self._keys(part)
        self._count_models(part, pair, labelled)
        fields = {c: part[c].to_numpy(dtype=np.float64) for c in fields_of(signal) if c in part}
        sides = [(self.labelled, labelled), (self.unlabelled, ~labelled)]
        if labelled.all() or not labelled.any():
            sides = [sides[0] if labelled.all() else sides[1]]
        else:  # the sources with this signal's windows both with and without an engine
            source_of = {p: s for (s, _), p in self.pairs.items()}
            by_source = [{source_of[p] for p in present(pair[m])[0].tolist()}
                         for m in (labelled, ~labelled)]  # fmt: skip
            self.mixed |= by_source[0] & by_source[1]
        for space, mask in sides:
            pick = slice(None) if mask.all() else np.flatnonzero(mask)
            row = space.rows(key[pick], fields["length_s"][pick])
            sub = {c: v[pick] for c, v in fields.items()}
            space.values |= signal_columns(signal, row, len(space.keys), sub)

    def _count_models(
        self, part: pd.DataFrame, pair: IntArray, labelled: npt.NDArray[np.bool_]
    ) -> None:
        """Windows per (pair, engine-labelled, model) for the group of each engine."""
        if "model_name" not in part.columns:
            return
        model = part["model_name"].cat
        m_id = self._ids(self.models, model.categories)
        m_code = model.codes.to_numpy().astype(np.int64)
        sel = m_code >= 0
        width = max(len(m_id), 1)
        keys, counts = present((pair[sel] * 2 + labelled[sel]) * width + m_code[sel])
        for k, c in zip(keys.tolist(), counts.tolist(), strict=True):
            p, m = divmod(k, width)
            self.model_counts[(p // 2, bool(p % 2), int(m_id[m]))] += c

    def finish(self, meta: Mapping[str, object]) -> tuple[pd.DataFrame, set[str]]:
        """(the frame, the sources whose rows need engine_frame) (module docstring);
        ``meta`` maps a source (or ``"source/engine"``) to its engine record."""
        lab, unl = self.labelled, self.unlabelled
        if not len(lab.keys) and not len(unl.keys):
            return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in COLUMNS}), set()
        p_src, p_eng = np.zeros(len(self.pairs), np.int64), np.zeros(len(self.pairs), np.int64)
        for (s, e), p in self.pairs.items():
            p_src[p], p_eng[p] = s, e
        # A series without an engine label joins its source's only engine.
        engines_of: dict[int, list[int]] = {}
        for p in present(lab.keys.to_numpy() >> _SHIFT)[0].tolist():
            engines_of.setdefault(int(p_src[p]), []).append(p)
        target = np.arange(len(self.pairs), dtype=np.int64)
        for p in present(unl.keys.to_numpy() >> _SHIFT)[0].tolist():
            only = engines_of.get(int(p_src[p]), [])
            if len(only) == 1:
                target[p] = only[0]
        u_key = unl.keys.to_numpy()
        u_key = (target[u_key >> _SHIFT] << _SHIFT) | (u_key & ((1 << _SHIFT) - 1))
        into = lab.keys.get_indexer(pd.Index(u_key))  # the labelled row each joins, or -1
        new, new_keys = pd.factorize(u_key[into < 0])
        n_lab = len(lab.keys)
        into[into < 0] = n_lab + new
        n = n_lab + len(new_keys)
        final_key = np.concatenate([lab.keys.to_numpy(), np.asarray(new_keys, dtype=np.int64)])
        fp = final_key >> _SHIFT
        inexact = {int(s) for s in self.mixed if target[self._none_pair(s)] != self._none_pair(s)}
        window_s, uneven = mean_lengths(lab, unl, into, n)
        inexact |= {int(s) for s in np.unique(p_src[fp[uneven]]).tolist()}
        starts = self.starts.to_numpy()[final_key & ((1 << _SHIFT) - 1)]
        src_names = np.asarray([*self.sources, ""], dtype=object)
        eng_names = np.asarray([*self.engines, ""], dtype=object)
        n_eng = len(eng_names)
        eng_idx = np.where(p_eng[fp] < 0, n_eng - 1, p_eng[fp])
        order = np.lexsort((starts, _ranks(eng_names)[eng_idx], _ranks(src_names)[p_src[fp]]))
        pair_u, pair_model, models = self._pair_models(target, p_src, p_eng, n_eng)
        mode, group = modes_and_groups(src_names, eng_names, p_src[fp] * n_eng + eng_idx, n_eng,
                                       meta, models, pair_u, pair_model, starts)  # fmt: skip
        data: dict[str, object] = {
            "source": coded_text(src_names, p_src[fp][order]),
            "engine": coded_text(eng_names, eng_idx[order]),
            "start": starts[order],
            "window_s": window_s[order],
            "offload_mode": coded_text(mode[0], mode[1][order]),
            "group": coded_text(group[0], group[1][order]),
        }
        data |= final_columns(lab, unl, into, n, order)
        bad = {str(src_names[s]) for s in inexact}
        return pd.DataFrame({c: data[c] for c in COLUMNS}, copy=False), bad

    def _none_pair(self, source: int) -> int:
        return self.pairs.get((source, -1), -1)

    def _pair_models(
        self, target: IntArray, p_src: IntArray, p_eng: IntArray, n_eng: int
    ) -> tuple[IntArray, IntArray, list[str]]:
        """(engine keys, model code of each (-1: none), the model names by code): the most
        common model among a key's engine-labelled windows, else among all (ties: the first
        name), as frames.pair_models."""
        models = sorted(self.models)
        rank = {self.models[m]: i for i, m in enumerate(models)}

        def key(p: int) -> int:
            return int(p_src[p]) * n_eng + (n_eng - 1 if p_eng[p] < 0 else int(p_eng[p]))

        counts: dict[int, tuple[Counter[int], Counter[int]]] = {}
        for (p, labelled, m), c in self.model_counts.items():
            counts.setdefault(key(int(target[p])), (Counter(), Counter()))[labelled][rank[m]] += c
        pair_u = np.asarray(sorted({key(p) for p in np.unique(target).tolist()}), dtype=np.int64)
        best = []
        for k in pair_u.tolist():
            unl, lab = counts.get(k, (Counter(), Counter()))
            use = lab or unl
            top = max(use.values(), default=0)
            best.append(min((m for m, c in use.items() if c == top), default=-1))
        return pair_u, np.asarray(best, dtype=np.int64), models


def _ranks(names: npt.NDArray[np.object_]) -> IntArray:
    """Each name's rank in sorted order (the frame is sorted by source, engine, start)."""
    order = sorted(range(len(names)), key=lambda i: str(names[i]))
    out = np.empty(len(names), dtype=np.int64)
    out[order] = np.arange(len(names))
    return out
