"""What people read: the plan and the advice as text, and the plots of the fits.

- ``plan_text``: :func:`summary_text` of a Plan; ``advise_text``: :func:`advice_text`;
- ``plots``: :func:`write_plots` (PNG files, PLOT_FILES), :func:`plot_pngs` (PNG bytes);
- ``html``: :func:`render_report` (the self-contained HTML report of a store's cluster) and
  the pure :func:`render_report_html` it wraps (a Plan and its scored past plans -> the page).
"""

from planner.report.advise_text import advice_text
from planner.report.html import render_report, render_report_html
from planner.report.plan_text import summary_text
from planner.report.plots import PLOT_FILES, plot_pngs, write_plots

__all__ = [
    "PLOT_FILES",
    "advice_text",
    "plot_pngs",
    "render_report",
    "render_report_html",
    "summary_text",
    "write_plots",
]
