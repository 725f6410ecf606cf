"""The model group of each engine of an analysis frame (planner/frames.py's ``group``).

An engine's group is its served model plus the GPU and tensor-parallel size its engine
record gives (:func:`group_name`): fits and decisions are made per group, since pooling an
8B model on one GPU with a 70B on four mixes throughputs and KV capacities that have
nothing in common. The served model is the ``model_name`` label most common among the
engine's series that carry an ``engine`` label (vLLM's own series; LMCache's legacy series
name the HF path instead), else among all its series, else the record's ``model``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

UNKNOWN_GROUP = "unknown"


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
    import numpy as np

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


def modes_and_groups(  # noqa: PLR0917 - the engine keys' parts, computed once
    src_names: npt.NDArray[np.object_],
    eng_names: npt.NDArray[np.object_],
    key_of_row: npt.NDArray[np.int64],
    n_eng: int,
    meta: Mapping[str, object],
    models: list[str],
    pair_u: npt.NDArray[np.int64],
    pair_model: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.object_], npt.NDArray[np.object_]]:
    """Offload mode and model group per row, from each engine key's record and model label."""
    import numpy as np

    from planner.frames import offload_mode_of

    keys, inverse = np.unique(key_of_row, return_inverse=True)
    model_code = pair_model[np.searchsorted(pair_u, keys)]
    modes, groups = [], []
    for k, code in zip(keys.tolist(), model_code.tolist(), strict=True):
        source, engine = src_names[k // n_eng], eng_names[k % n_eng]
        m = meta.get(f"{source}/{engine}", meta.get(source))
        modes.append("unknown" if m is None else offload_mode_of(m))
        model = models[code] if code >= 0 else meta_attr(m, "model")
        groups.append(group_name(model, meta_attr(m, "gpu"), meta_attr(m, "tensor_parallel")))
    return np.asarray(modes, dtype=object)[inverse], np.asarray(groups, dtype=object)[inverse]
