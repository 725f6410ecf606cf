"""Windows -> analysis frames: one row per engine and window, and the model groups.

- ``table``: the window table a plan reads from the store (PLAN_COLUMNS, WindowTable);
- ``frames``: the per-engine analysis frame (:func:`engine_frame`);
- ``groups``: model groups (served model, GPU, TP) and the split of a frame by group;
- ``residency``: the KV residency histograms' bucket counts summed per engine or LMCache pool.
"""

from planner.frames.frames import engine_frame
from planner.frames.groups import GroupSlice, group_name, offload_mode_of, split_groups
from planner.frames.residency import BucketCounts, residency_histograms
from planner.frames.table import PLAN_COLUMNS, WindowTable

__all__ = ["PLAN_COLUMNS", "BucketCounts", "GroupSlice", "WindowTable", "engine_frame",
           "group_name", "offload_mode_of", "residency_histograms", "split_groups"]  # fmt: skip
