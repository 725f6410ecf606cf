"""Windows -> analysis frames: one row per engine and window, and the model groups.

- ``table``: the window table a plan reads from the store (PLAN_COLUMNS, WindowTable);
- ``frames``: the per-engine analysis frame (:func:`engine_frame`);
- ``groups``: model groups (served model, GPU, TP) and the split of a frame by group.
"""

from planner.frames.frames import engine_frame
from planner.frames.groups import GroupSlice, group_name, offload_mode_of, split_groups
from planner.frames.table import PLAN_COLUMNS, WindowTable

__all__ = ["PLAN_COLUMNS", "GroupSlice", "WindowTable", "engine_frame", "group_name",
           "offload_mode_of", "split_groups"]  # fmt: skip
