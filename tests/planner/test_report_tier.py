"""planner/report/plot_tier.py and html_tier.py: "What a CPU tier would buy" drawn and written
from a plan's ``cpu_tier`` section (tests/tierdoc.py, the contract's shape); the page-level
checks (the plot inlined, headless Chromium) are in test_report_html.py."""

from __future__ import annotations

import html
import itertools
from collections.abc import Iterator
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import pytest

from planner.report.html_tier import cpu_tier_html
from planner.report.plot_tier import _segments, tier_curves, tier_figure
from tests.tierdoc import CANNOT, HBM_GIB, MEASURED, POOL, section

matplotlib.use("Agg")


@pytest.fixture
def figures() -> Iterator[list[Any]]:
    """Figures the test made, closed after it."""
    made: list[Any] = []
    yield made
    for fig in made:
        plt.close(fig)


def _draw(sec: dict[str, Any] | None, figures: list[Any]) -> tuple[Any, list[str]]:
    drawn = tier_figure(sec)
    assert drawn is not None
    figures.append(drawn[0])
    return drawn


# ── which points are drawn how ───────────────────────────────────────────────────────────


@pytest.mark.parametrize("n", range(1, 8))
def test_segments_every_flag_sequence_split_into_continuous_runs(n: int) -> None:
    for flags in itertools.product((False, True), repeat=n):
        runs = _segments(flags)
        # brute force: the runs of equal flags, by walking the sequence
        expected = [(k, len(list(g))) for k, g in itertools.groupby(flags)]
        assert [(flag, last) for _, last, flag in runs] == [
            (k, sum(c for _, c in expected[: i + 1]) - 1) for i, (k, _) in enumerate(expected)
        ]
        assert runs[0][0] == 0 and runs[-1][1] == n - 1
        for (_, last, _), (first, _, _) in itertools.pairwise(runs):
            assert first == last  # each run starts at the previous one's last point
        for i, (first, last, flag) in enumerate(runs):  # its own points, past a shared one
            assert all(f == flag for f in flags[first + (i > 0) : last + 1])


def test_tier_curves_contract_section_gives_both_tiers_with_hbm_and_recommended() -> None:
    curves = tier_curves(section())
    assert list(curves) == ["native", "lmcache"]
    native, lm = curves["native"], curves["lmcache"]
    assert native.hbm_gib == HBM_GIB and lm.hbm_gib == POOL * HBM_GIB
    assert native.recommended == 62.0 and lm.recommended is None
    assert native.hit[0] == MEASURED and native.gib[0] == 0.0
    # no per-point flag: past the largest size the rows call not extrapolated (1× HBM)
    assert native.extrapolated == [g > HBM_GIB for g in native.gib]
    assert lm.extrapolated == [g > POOL * HBM_GIB for g in lm.gib]


def test_tier_curves_per_point_flag_wins_over_the_rows() -> None:
    sec = section()
    for i, p in enumerate(sec["native"]["curve"]):
        p["extrapolated"] = float(i >= 20)
    assert tier_curves(sec)["native"].extrapolated == [i >= 20 for i in range(25)]


@pytest.mark.parametrize(
    "sec",
    [None, {}, CANNOT, {**section(), "can_tell": False},
     {**section(), "native": {"curve": [{"gib": 0.0, "hit_ratio": 0.4}]}, "lmcache": None}],
    ids=["none", "older-plan", "cannot-tell", "cannot-tell-with-tiers", "one-point"],
)  # fmt: skip
def test_tier_figure_without_a_curve_draws_nothing(sec: dict[str, Any] | None) -> None:
    assert tier_curves(sec) == {} and tier_figure(sec) is None


# ── the figure ───────────────────────────────────────────────────────────────────────────


def test_tier_figure_draws_curve_band_today_hbm_and_recommended(figures: list[Any]) -> None:
    fig, notes = _draw(section(), figures)
    native_ax, lm_ax = fig.axes
    assert native_ax.get_xlabel() == "CPU tier, GiB per engine"
    assert "a lower bound" in lm_ax.get_title() and "per node pool of 2" in lm_ax.get_title()
    lines = {str(line.get_label()): line for line in native_ax.get_lines()}
    solid, dashed = lines["modelled"], lines["extrapolated past the HBM eviction time"]
    assert solid.get_linestyle() == "-" and dashed.get_linestyle() == "--"
    assert max(solid.get_xdata()) <= HBM_GIB < min(dashed.get_xdata()[1:])
    assert dashed.get_xdata()[0] == max(solid.get_xdata())  # one continuous curve
    (today,) = [v for k, v in lines.items() if k.startswith("today")]
    assert (list(today.get_xdata()), list(today.get_ydata())) == ([0.0], [MEASURED])
    assert "41.0 % (measured)" in str(today.get_label())
    (rec,) = [v for k, v in lines.items() if k.startswith("recommended")]
    assert list(rec.get_xdata()) == [62.0, 62.0] and "(extrapolated)" in str(rec.get_label())
    (hbm,) = [v for k, v in lines.items() if k.startswith("1× HBM")]
    assert list(hbm.get_xdata()) == [HBM_GIB, HBM_GIB]
    bands = [c for c in native_ax.collections if "model-based" in str(c.get_label())]
    assert len(bands) == 1 and "not a confidence interval" in str(bands[0].get_label())
    assert not [x for x in lm_ax.get_lines() if str(x.get_label()).startswith("recommended")]
    assert any("4× HBM: cannot tell" in n and "disagree widely" in n for n in notes)
    assert any("not a confidence interval" in n for n in notes)
    assert "engines without a curve: engine-4" in notes


def test_tier_figure_one_tier_with_a_curve_draws_one_panel(figures: list[Any]) -> None:
    sec = section()
    sec["lmcache"] = None
    sec["native"]["recommended"] = {"gib": None, "multiple": None, "why": "no knee <here>"}
    fig, notes = _draw(sec, figures)
    assert len(fig.axes) == 1
    assert not [x for x in fig.axes[0].get_lines() if str(x.get_label()).startswith("recom")]
    assert "vLLM native CPU offload: no recommended size (no knee <here>)" in notes


# ── the section ──────────────────────────────────────────────────────────────────────────


def test_cpu_tier_html_cannot_tell_says_why_and_how_to_measure() -> None:
    out = cpu_tier_html({"cpu_tier": CANNOT}, "cpu-tier")
    assert out.startswith('<section id="cpu-tier"><h2>What a CPU tier would buy</h2>')
    assert f"Cannot tell: {html.escape(CANNOT['why'])}" in out
    assert "To measure it: start each vLLM engine with --kv-cache-metrics" in out
    assert "Engines without: engine-0, engine-1" in out and "<table>" not in out


@pytest.mark.parametrize("d", [{}, {"cpu_tier": None}, {"cpu_tier": {}}])
def test_cpu_tier_html_plan_without_the_section_says_so(d: dict[str, Any]) -> None:
    assert "No CPU-tier section here" in cpu_tier_html(d, "cpu-tier")


def test_cpu_tier_html_data_with_markup_renders_escaped() -> None:
    sec = section()
    evil = '<img src=x onerror=alert(1)> & "q"'
    sec["native"]["rows"][0]["why"] = evil
    sec["lmcache"]["scope"] = evil
    sec["engines_without"] = [evil]
    out = cpu_tier_html({"cpu_tier": sec}, 'a"><script>')
    assert "<img" not in out and "<script" not in out
    assert out.count(html.escape(evil)) == 3
    assert 'id="a&quot;&gt;&lt;script&gt;"' in out


def test_tier_figure_recommended_past_the_curves_end_says_so(figures: list[Any]) -> None:
    sec = section()
    sec["native"]["recommended"]["gib"] = 90.0  # the curve ends at 4× HBM = 82 GiB
    _, notes = _draw(sec, figures)
    assert "vLLM native CPU offload: the recommended 90 GiB lies past the curve's end " \
        "(82.0 GiB)" in notes  # fmt: skip


def test_cpu_tier_html_capacity_that_cannot_tell_is_said_once_not_per_row() -> None:
    sec = section()
    why = "no engine has windows on both sides of the SLO"
    sec["capacity_basis"] = why + ": its capacity is unknown"
    for r in sec["native"]["rows"]:
        r["capacity_ratio"], r["capacity_why"] = None, why
    sec["native"]["rows"][0]["capacity_why"] = "another <reason>"
    out = cpu_tier_html({"cpu_tier": sec}, "cpu-tier")
    assert out.count(why) == 1 and f"Capacity at the SLO (modelled): {why}" in out
    assert "capacity: another &lt;reason&gt;" in out
