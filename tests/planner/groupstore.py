"""A real SQLite store holding engines of two models (two model groups), for the group tests.

Built like tests/planner/synthstore.py (the path the plan tests use: Window records written
with Store.write_windows, engines registered with Store.upsert_engine as the collector
does), with each model's windows carrying its own ``model_name`` label and each model's
engines registered with their own model, GPU and tensor-parallel size.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from benchmarks.accuracy.fitsynth import frame_to_windows
from core.records import Window, labels_of
from store.store import Store
from tests.planner.synthstore import BLOCK_SIZE, BLOCKS, shifted_frame, with_rates

if TYPE_CHECKING:
    import pandas as pd


@dataclasses.dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model's engines: served name (the label), catalogue name, GPU, TP, source prefix."""

    served: str
    model: str
    gpu: str
    tp: int
    prefix: str

    @property
    def group(self) -> str:
        return f"{self.served}@{self.gpu}:tp{self.tp}"


SMALL = ModelSpec("llama-8b-instruct", "llama-3.1-8b", "h100-80gb", 1, "small-")
BIG = ModelSpec("llama-70b-instruct", "llama-3.1-70b", "h100-80gb", 4, "big-")


def model_windows(frame: pd.DataFrame, spec: ModelSpec) -> list[Window]:
    """The frame's windows (fitsynth), renamed to the spec's sources and model label."""
    out = []
    for w in with_rates(frame_to_windows(frame)):
        labels = labels_of({**dict(w.labels), "model_name": spec.served})
        out.append(dataclasses.replace(w, source=spec.prefix + w.source, labels=labels))
    return out


def fill_two_models(
    url: str,
    n_windows: int = 300,
    *,
    engines: tuple[int, int] = (6, 4),
    cluster: str = "synth",
) -> dict[str, pd.DataFrame]:
    """Write SMALL's and BIG's windows and register their engines; each group's frame
    (sources renamed as stored), by group name."""
    frames = {}
    with Store(url) as store:
        store.migrate()
        for spec, n, seed in ((SMALL, engines[0], 3), (BIG, engines[1], 5)):
            frame = shifted_frame(n, n_windows, seed=seed)
            store.write_windows(model_windows(frame, spec))
            for source, mode in frame.groupby("source")["offload_mode"].first().items():
                store.upsert_engine(
                    cluster,
                    spec.prefix + str(source),
                    model=spec.model,
                    gpu=spec.gpu,
                    tensor_parallel=spec.tp,
                    offload=str(mode),
                    facts={"num_gpu_blocks": BLOCKS, "block_size": BLOCK_SIZE},
                )
            frames[spec.group] = frame.assign(source=spec.prefix + frame["source"].astype(str))
    return frames
