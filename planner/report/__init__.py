"""What people read: the plan and the advice as text, and the plots of the fits.

- ``plan_text``: :func:`summary_text` of a Plan; ``advise_text``: :func:`advice_text`;
- ``plots``: :func:`write_plots` (PNG files, PLOT_FILES).
"""

from planner.report.advise_text import advice_text
from planner.report.plan_text import summary_text
from planner.report.plots import PLOT_FILES, write_plots

__all__ = ["PLOT_FILES", "advice_text", "summary_text", "write_plots"]
