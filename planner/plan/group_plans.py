"""The model groups of a plan: each group's plan, its windows, and how the output names it.

The groups and their rows come from planner/frames/groups.py (:func:`split_groups`).

With one group the plan is the one made on all engines together. ``--group NAME``
plans that group alone; with several groups and no ``--group``, `kvscope plan` plans each
group apart and pools only the observations (planner/plan/build.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from core.errors import ConfigError
from planner.frames.groups import GroupSlice, split_groups

__all__ = ["GroupSlice", "groups_basis", "pick_group", "split_groups"]


def pick_group(groups: Sequence[GroupSlice], name: str) -> GroupSlice:
    """The group called ``name``; ConfigError naming the known groups otherwise."""
    for g in groups:
        if g.name == name:
            return g
    known = ", ".join(repr(g.name) for g in groups) or "none (no engine windows)"
    raise ConfigError(f"--group {name!r}: no such model group; the store's groups are {known}")


def groups_basis(groups: Sequence[GroupSlice]) -> str:
    """The basis line of a cluster plan made per group."""
    parts = "; ".join(f"{g.name} ({len(g.engines)} engine(s))" for g in groups)
    shared = groups[0].shared if groups else ()
    note = f"; shared by every group (no single model): {', '.join(shared[:5])}" if shared else ""
    return (
        f"the engines form {len(groups)} model groups (served model, GPU, TP): {parts}. Each "
        "group is fitted, decided and sized apart (groups[]); this top level pools their "
        f"observations and fits nothing (fits across models are meaningless){note}"
    )
