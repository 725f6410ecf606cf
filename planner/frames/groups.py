"""The model group of each engine of an analysis frame (planner/frames/frames.py's ``group``).

An engine's group is its served model plus its GPU and tensor-parallel size
(:func:`group_name`): fits and decisions are made per group. :func:`split_groups` splits a
frame by group; rows of sources that name no group's model are shared by every group.

Rules: planner/frames/METHODS.md#groups
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from planner.frames.space import present

if TYPE_CHECKING:
    import numpy.typing as npt
    import pandas as pd

UNKNOWN_GROUP = "unknown"


def offload_mode_of(meta: object) -> str:
    """``none|native|lmcache`` from an engine record (``.offload`` / ``.offload_mode``)."""
    for name in ("offload", "offload_mode"):
        value = meta.get(name) if isinstance(meta, Mapping) else getattr(meta, name, None)
        if isinstance(value, str) and value:
            return value
    return meta if isinstance(meta, str) and meta else "unknown"


def group_name(model: object, gpu: object = None, tp: object = None) -> str:
    """``model@gpu:tpN`` (the parts known), or ``"unknown"`` when the model is not known."""
    if not isinstance(model, str) or not model:
        return UNKNOWN_GROUP
    name = model
    if isinstance(gpu, str) and gpu:
        name += f"@{gpu}"
    if isinstance(tp, int) and not isinstance(tp, bool) and tp > 0:
        name += f":tp{tp}"
    return name


def meta_attr(meta: object, name: str) -> object:
    return meta.get(name) if isinstance(meta, Mapping) else getattr(meta, name, None)


def pair_models(
    pair: npt.NDArray[np.int64],
    pair_u: npt.NDArray[np.int64],
    labelled: npt.NDArray[np.bool_],
    mod_c: npt.NDArray[np.int64],
    n_mod: int,
) -> npt.NDArray[np.int64]:
    """Model code per engine key of ``pair_u`` (-1: none): the most common among the key's
    windows carrying an engine label, else among all of them (ties: the lower code)."""
    out = np.full(pair_u.size, -1, dtype=np.int64)
    sel = mod_c >= 0
    if n_mod == 0 or not sel.any():
        return out
    dense = np.searchsorted(pair_u, pair[sel])
    key = (dense * 2 + labelled[sel]) * n_mod + mod_c[sel]
    size = pair_u.size * 2 * n_mod
    if size <= 4 * key.size + 1_000_000:
        counts = np.bincount(key, minlength=size)
    else:  # many engines × many models: count only the combinations present
        uniq, cnt = np.unique(key, return_counts=True)
        counts = np.zeros(size, dtype=np.int64)
        counts[uniq] = cnt
    table = counts.reshape(pair_u.size, 2, n_mod)
    use = np.where(table[:, 1, :].sum(axis=1, keepdims=True) > 0, table[:, 1, :], table[:, 0, :])
    return np.where(use.sum(axis=1) > 0, use.argmax(axis=1), out)


Coded = tuple["npt.NDArray[np.object_]", "npt.NDArray[np.int64]"]  # names, a code per row


def modes_and_groups(  # noqa: PLR0917, PLR0913 - the engine keys' parts, computed once
    src_names: npt.NDArray[np.object_],
    eng_names: npt.NDArray[np.object_],
    key_of_row: npt.NDArray[np.int64],
    n_eng: int,
    meta: Mapping[str, object],
    models: list[str],
    pair_u: npt.NDArray[np.int64],
    pair_model: npt.NDArray[np.int64],
    starts: npt.NDArray[np.float64] | None = None,
) -> tuple[Coded, Coded]:
    """Offload mode and model group per row, from each engine key's record and model label,
    each as (names, the row's code): planner.frames.frames ``coded_text`` makes it a column.

    An engine whose record holds several regimes (``changes``: a restart with offload
    switched on, store.tables.EngineChange) gets, per row, the mode of the regime in
    force at the row's ``starts``: the windows before a switch count as the old mode.
    """
    keys, inverse = np.unique(key_of_row, return_inverse=True)
    model_code = pair_model[np.searchsorted(pair_u, keys)]
    modes, groups = [], []
    switched: list[tuple[int, list[tuple[float, str]]]] = []
    for i, (k, code) in enumerate(zip(keys.tolist(), model_code.tolist(), strict=True)):
        source, engine = src_names[k // n_eng], eng_names[k % n_eng]
        m = meta.get(f"{source}/{engine}", meta.get(source))
        modes.append("unknown" if m is None else offload_mode_of(m))
        model = models[code] if code >= 0 else meta_attr(m, "model")
        groups.append(group_name(model, meta_attr(m, "gpu"), meta_attr(m, "tensor_parallel")))
        regimes = mode_regimes(meta_attr(m, "changes"))
        if len({mode for _, mode in regimes}) > 1:
            switched.append((i, regimes))
    mode_names = sorted({*modes, *(mode for _, regimes in switched for _, mode in regimes)})
    code = {mode: j for j, mode in enumerate(mode_names)}
    row_modes = np.asarray([code[mode] for mode in modes], dtype=np.int64)[inverse]
    if switched and starts is not None:
        for i, regimes in switched:
            rows = np.flatnonzero(inverse == i)
            at = np.asarray([t for t, _ in regimes], dtype=float)
            which = np.maximum(np.searchsorted(at, starts[rows], side="right") - 1, 0)
            row_modes[rows] = np.asarray([code[mode] for _, mode in regimes])[which]
    group_names, group_of_key = np.unique(np.asarray(groups, dtype=object), return_inverse=True)
    return ((np.asarray(mode_names, dtype=object), row_modes),
            (group_names, group_of_key.reshape(-1)[inverse]))  # fmt: skip


def mode_regimes(changes: object) -> list[tuple[float, str]]:
    """(since, offload mode) of an engine's recorded changes where the mode changes, oldest
    first; the first regime also covers the windows before it was first observed."""
    out: list[tuple[float, str]] = []
    for change in changes if isinstance(changes, tuple | list) else ():
        at, mode = getattr(change, "at", None), getattr(change, "offload", None)
        if not (isinstance(at, float | int) and isinstance(mode, str) and mode):
            continue
        if not out or out[-1][1] != mode:
            out.append((float(at), mode))
    return out


@dataclass(frozen=True, slots=True, eq=False)
class GroupSlice:
    """One model group: its engines, the frame rows and the sources its plan reads."""

    name: str
    engines: tuple[str, ...]  # "source/engine" (or "source" when the label is empty)
    sources: frozenset[str]  # every source whose windows the group's plan reads
    rows: npt.NDArray[np.bool_]  # the frame's rows of the group (engine rows + attached)
    shared: tuple[str, ...] = ()  # sources counted in every group


def same_model(row_group: str, group: str) -> bool:
    """True when ``group`` (model[@gpu][:tpN]) is of the model ``row_group`` names."""
    if row_group == UNKNOWN_GROUP:
        return group == UNKNOWN_GROUP
    return group == row_group or group.startswith((f"{row_group}@", f"{row_group}:tp"))


def _engine_mask(frame: pd.DataFrame) -> npt.NDArray[np.bool_]:
    """Rows of vLLM engines (as plan_observe._engine_rows): a KV or token figure."""
    out: npt.NDArray[np.bool_] = (
        frame["kv_util"].notna() | frame["tokens_per_s"].notna()
    ).to_numpy(dtype=bool)
    return out


def split_groups(frame: pd.DataFrame, table_sources: Iterable[str] = ()) -> list[GroupSlice]:
    """The frame's model groups, by name (METHODS.md#groups); [] for an empty frame.

    Values are compared as ``astype(str)`` writes them (a missing one is "nan" in the
    names, and equals no group), by their codes: no string is made or hashed per row."""
    if not len(frame):
        return []
    group, source, engine = (_Coded(frame[c]) for c in ("group", "source", "engine"))
    is_engine = _engine_mask(frame)
    if not is_engine.any():  # no vLLM engine in the period: the rows' own groups
        is_engine = np.ones(len(frame), dtype=bool)
    names = sorted(group.texts(is_engine))
    member = {n: group.rows(n, is_engine) for n in names}
    shared_rows = np.zeros(len(frame), dtype=bool)
    for g in sorted(group.texts(~is_engine)):
        rows = group.rows(g, ~is_engine)
        homes = [n for n in names if same_model(g, n)]
        if not homes:
            shared_rows |= rows
        for n in homes:
            member[n] = member[n] | rows
    in_frame = source.texts()
    shared = sorted(source.texts(shared_rows) | (set(table_sources) - in_frame))
    out = []
    for n in names:
        rows = member[n] | shared_rows
        eng = group.rows(n, is_engine)
        width = len(engine.names)
        both = np.unique((source.codes[eng] + 1) * width + engine.codes[eng] + 1).tolist()
        pairs = sorted({(source.names[c // width - 1], engine.names[c % width - 1]) for c in both})
        out.append(
            GroupSlice(
                name=n,
                engines=tuple(f"{s}/{e}" if e else s for s, e in pairs),
                sources=frozenset(source.texts(rows) | set(shared)),
                rows=rows,
                shared=tuple(shared),
            )
        )
    return out


def text_values(column: pd.Series) -> npt.NDArray[np.object_]:
    """The column's values as an object array of str, "nan" for a missing one (as
    :class:`_Coded` names it), taken by code: a categorical's names are not rebuilt as a
    million strings, as ``astype(str)`` rebuilds them."""
    coded = _Coded(column)
    out: npt.NDArray[np.object_] = np.asarray(coded.names, dtype=object)[coded.codes]
    return out


class _Coded:
    """A frame column as codes (-1: missing) and each code's ``astype(str)`` text; the
    last name is a missing value's ("nan"), so ``names[code]`` serves -1 too."""

    def __init__(self, column: pd.Series) -> None:
        values: Iterable[object]
        if column.dtype.name == "category":  # its own codes: nothing hashed
            codes, values = column.cat.codes.to_numpy(), column.cat.categories
        else:
            codes, values = column.factorize()
        self.codes: npt.NDArray[np.int64] = np.asarray(codes, dtype=np.int64)
        self.names: list[str] = [*(str(v) for v in values), "nan"]

    def texts(self, mask: npt.NDArray[np.bool_] | None = None) -> set[str]:
        """The texts of the rows ``mask`` selects (every row: None)."""
        codes = self.codes if mask is None else self.codes[mask]
        seen = present(codes + 1)[0] - 1  # codes >= -1 (missing: -1), counted, not sorted
        return {self.names[c] for c in seen.tolist()}

    def rows(self, text: str, mask: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
        """``mask`` and the rows whose value's text is ``text`` (a missing value: none)."""
        hits = [c for c, name in enumerate(self.names[:-1]) if name == text]
        out: npt.NDArray[np.bool_] = mask & np.isin(self.codes, hits)
        return out
