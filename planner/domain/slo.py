"""The latency target a plan measures capacity against: a TTFT quantile the collector keeps
per window, at most ``ttft_s`` seconds, and a waiting queue that does not grow.

A value of the domain (not of a fit) so that `kvscope plan` checks its flags before it
imports the fits (kvscope/commands/plan.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.errors import ConfigError

# the SLO quantiles and the analysis frame's column of each (planner/frames/frames.py)
QUANTILE_COLUMNS = {"p50": "ttft_p50_s", "p90": "ttft_p90_s", "p99": "ttft_p99_s"}


@dataclass(frozen=True, slots=True)
class Slo:
    """The latency target capacity is measured against."""

    ttft_s: float = 2.0
    quantile: str = "p90"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ttft_s) and self.ttft_s > 0):
            raise ConfigError(
                f"SLO TTFT target must be a positive number of seconds, got {self.ttft_s!r}"
            )
        if self.quantile not in QUANTILE_COLUMNS:
            raise ConfigError(
                f"SLO quantile must be one of {', '.join(QUANTILE_COLUMNS)} (the quantiles the "
                f"collector keeps per window), got {self.quantile!r}"
            )

    @property
    def column(self) -> str:
        return QUANTILE_COLUMNS[self.quantile]

    def text(self) -> str:
        return f"TTFT {self.quantile} <= {self.ttft_s:g} s and a waiting queue that does not grow"
