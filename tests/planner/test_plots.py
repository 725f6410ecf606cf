"""Plot helpers: a long "cannot tell" reason stays inside the figure's width, in a note."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest
from PIL import Image

from planner.report.plots import _note, _title

REASON = (
    "the knee's lower end is not bounded by the data (the likelihood-ratio cut is not reached "
    "inside [0.211, 0.651]); the break-even interval reaches the edge of the common support "
    "[0.251, 0.556]: u* may lie outside the observed range"
)


@pytest.mark.parametrize("width_in", [6.0, 8.0, 12.0])
def test_note_wraps_a_long_reason_to_the_figure_width(width_in: float, tmp_path: Path) -> None:
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - import order: the Agg backend is chosen before pyplot loads

    fig, ax = plt.subplots(figsize=(width_in, 4))
    ax.plot([0, 1], [0, 1])
    ax.set_title(_title("Preemptions vs KV-cache utilization", False))
    _note(fig, [f"Knee: cannot tell: {REASON}", f"lmcache gain: cannot tell: {REASON}"])
    fig.canvas.draw()
    (note,) = fig.texts
    box = note.get_window_extent(fig.canvas.get_renderer())  # type: ignore[attr-defined]
    assert box.width <= fig.bbox.width
    assert note.get_text().count("\n") >= 2  # wrapped, not one long line
    assert "see the note below" in ax.get_title()
    path = tmp_path / "p.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    with Image.open(path) as img:
        w, h = img.size
    assert w <= width_in * 100 * 1.15  # the note did not widen the figure
    assert h > 4 * 100 * 0.9  # and it was kept (below the axes), not cut off


def test_title_without_a_reason_is_the_plain_title() -> None:
    assert _title("LMCache hit rate vs L1 size", True) == "LMCache hit rate vs L1 size"
