"""A real SQLite store filled with windows of a known process (benchmarks/accuracy/fitsynth.py).

Shared by tests/planner/test_plan.py and tests/test_plan_cli.py. The synthetic cluster is
shifted so its last window ends a minute ago (`kvscope plan --since 24h` sees it) on a
whole-hour offset (the forecast buckets stay UTC-aligned). Counter windows get their rate
as the collector's rollup writes them (delta / length).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.accuracy.fitsynth import frame_to_windows, synthetic_frame
from core.records import Window
from store.store import Store

if TYPE_CHECKING:
    import pandas as pd

BLOCKS, BLOCK_SIZE = 28_000, 16  # facts as vllm:cache_config_info reports them
MODEL, GPU, TP = "llama-3.1-8b", "h100", 1


def shifted_frame(
    n_engines: int = 6,
    n_windows: int = 300,
    *,
    seed: int = 3,
    modes: tuple[str, ...] = ("none", "native", "lmcache"),
) -> pd.DataFrame:
    frame = synthetic_frame(n_engines, n_windows, seed=seed, modes=modes)
    end = float(frame["start"].max()) + 60.0
    offset = math.floor((time.time() - 60.0 - end) / 3600.0) * 3600.0
    frame["start"] = frame["start"] + offset
    return frame


def with_rates(windows: list[Window]) -> list[Window]:
    """Counter windows carry rate = delta / length, as collector.rollup writes them."""
    return [
        dataclasses.replace(w, rate=w.delta / w.length_s)
        if w.kind == "counter" and w.rate is None and w.delta is not None
        else w
        for w in windows
    ]


def fill_store(
    url: str,
    frame: pd.DataFrame,
    *,
    cluster: str = "synth",
    facts: bool = True,
    model: str | None = MODEL,
    register: bool = True,
) -> list[Window]:
    """Migrate, write the frame's windows, register each engine with its offload mode."""
    windows = with_rates(frame_to_windows(frame))
    with Store(url) as store:
        store.migrate()
        store.write_windows(windows)
        if register:
            for source, mode in frame.groupby("source")["offload_mode"].first().items():
                store.upsert_engine(
                    cluster,
                    str(source),
                    model=model,
                    gpu=GPU,
                    tensor_parallel=TP,
                    offload=str(mode),
                    facts={"num_gpu_blocks": BLOCKS, "block_size": BLOCK_SIZE} if facts else {},
                )
    return windows


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def without_timings(obj: Any) -> Any:
    """A plan's dict without its wall-clock fields (they differ between runs)."""
    if isinstance(obj, dict):
        return {
            k: without_timings(v) for k, v in obj.items() if k not in ("seconds", "fit_seconds")
        }
    if isinstance(obj, list):
        return [without_timings(v) for v in obj]
    return obj
