"""A planned A/B run on a synthetic cluster (benchmarks/accuracy/fitsynth.py): engines switched
to an offload mode from a time on, with the gain the generator's truth gives that mode.

:func:`switch_engines` takes a frame drawn with the engines' modes before the switch and
returns it with the switched engines' windows from ``since`` on in the new mode: their
throughput gains ``truth.gain_slope · (u − break_even)`` (the generator's additive gain),
and the prompt / output split keeps its share. Engine effects, load and noise are the
frame's own, so the same engine is compared with itself before and after.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from benchmarks.accuracy.fitsynth import Truth


def switch_engines(
    frame: pd.DataFrame, switch: Iterable[str], since: float, mode: str, truth: Truth
) -> pd.DataFrame:
    """``frame`` with the windows of ``switch`` that start at or after ``since`` in ``mode``."""
    out = frame.copy()
    sel = out["source"].isin(list(switch)) & (out["start"] >= since)
    if not sel.any():
        return out
    be = truth.break_even[mode]
    share = out.loc[sel, "prompt_tokens_per_s"] / out.loc[sel, "tokens_per_s"]
    tok = (out.loc[sel, "tokens_per_s"] + truth.gain_slope * (out.loc[sel, "kv_util"] - be)).clip(
        lower=50.0
    )
    out.loc[sel, "tokens_per_s"] = tok
    out.loc[sel, "prompt_tokens_per_s"] = tok * share
    out.loc[sel, "output_tokens_per_s"] = tok * (1 - share)
    out.loc[sel, "offload_mode"] = mode
    return out
