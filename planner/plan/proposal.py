"""The experiment a plan proposes when a mode's verdict cannot tell.

Never chosen by load: a switchback of the canary when one unit runs the mode, else the mode
on engines (or whole LMCache pools) drawn at random until each arm has MIN_UNITS, else
(no window near the SLO) the load that would settle it. Sized to detect a 20 % change of
TTFT p90 (an assumption) with 80 % power at a 95 % level.

Method: planner/plan/METHODS.md#proposal
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError, InsufficientHistory
from planner.fit.effects import MIN_UNITS
from planner.fit.units import engine_keys
from planner.frames.groups import text_values
from planner.plan.design import (
    period_sigma,
    periods_needed,
    random_assignment,
    switchback_period_s,
    switchback_schedule,
)

if TYPE_CHECKING:
    import pandas as pd

OUTCOME = "ttft_p90_s"
MIN_EFFECT = math.log(1.2)  # log ratio: a 20 % change of TTFT p90
LEVEL, POWER = 0.95, 0.80
MAX_PERIODS = 96


def propose(
    frame: pd.DataFrame,
    mode: str,
    *,
    switching: Sequence[str],
    units_with_mode: int,
    pools: Mapping[str, str],
    seed: int,
    why: str,
) -> dict[str, Any]:
    """The proposed experiment for ``mode`` (METHODS.md#proposal) as a JSON-ready entry."""
    keys = engine_keys(frame)
    modes = text_values(frame["offload_mode"])
    with_mode = sorted(set(keys[modes == mode].tolist()) - set(switching))
    # one engine with the mode: switch it; one pool of several engines is no canary (the
    # pool's other engines keep filling the shared L1): a second pool is needed instead
    if switching or (units_with_mode == 1 and len(with_mode) == 1):
        canary = switching[0] if switching else with_mode[0]
        return _switchback(frame, canary, mode, seed=seed, running=bool(switching), why=why)
    if units_with_mode < MIN_UNITS:
        without = sorted(set(keys[modes == "none"].tolist()))
        k = MIN_UNITS - units_with_mode
        base = {"design": "random assignment", "mode": mode, "seed": seed, "why": why}
        if len(without) < k + MIN_UNITS:
            return base | {
                "engines": [],
                "text": f"too few engines without offload ({len(without)}) to put {k} more "
                f"on {mode} and keep {MIN_UNITS} as controls: run a switchback on one engine",
            }
        picked = random_assignment(without, k, seed=seed, pools=dict(pools) or None)
        pooled = len(with_mode) > units_with_mode  # the mode's engines share pools
        where = (
            f" (on a node of their own, with its own LMCache server: engines sharing "
            f"{with_mode[0]}'s pool are one unit with it)"
            if pooled
            else ""
        )
        return base | {
            "engines": list(picked),
            "text": f"turn {mode} offload on for {', '.join(picked)}{where} (drawn at random "
            f"with seed {seed} from the {len(without)} engines without offload, never by load), "
            f"so that each arm has at least {MIN_UNITS} independent units; keep the rest as "
            "they are and re-plan after a peak",
        }
    return {
        "design": "load",
        "mode": mode,
        "seed": seed,
        "engines": [],
        "why": why,
        "text": "enough engines run each mode, but too few windows came near the SLO: re-plan "
        "after a busier period, or load-test two engines of each mode until they miss it",
    }


def _switchback(
    frame: pd.DataFrame, canary: str, mode: str, *, seed: int, running: bool, why: str
) -> dict[str, Any]:
    window_s = float(frame["window_s"].median()) if len(frame) else 60.0
    entry: dict[str, Any] = {"design": "switchback", "mode": mode, "engines": [canary],
                             "seed": seed, "why": why}  # fmt: skip
    try:
        period_s, basis = switchback_period_s(frame, canary, OUTCOME, window_s=window_s)
        sigma, n_hist = period_sigma(frame, canary, OUTCOME, period_s=period_s, window_s=window_s)
    except (InsufficientHistory, ConfigError) as exc:
        return entry | {"text": f"switch {mode} on {canary} on and off in blocks; too little "
                        f"history to size them yet ({exc})"}  # fmt: skip
    n = periods_needed(sigma, MIN_EFFECT, level=LEVEL, power=POWER, max_periods=MAX_PERIODS)
    entry |= {
        "block_s": period_s,
        "block_basis": basis,
        "sigma_block": sigma,
        "sigma_blocks_seen": n_hist,
        "assumes": f"smallest effect worth detecting: a 20 % change of TTFT p90 (log "
        f"{MIN_EFFECT:.3f}); {POWER:.0%} power at {LEVEL:.0%}",
    }
    if n == 0:
        return entry | {"blocks": None, "text": f"a switchback of {canary} cannot reach "
                        f"{POWER:.0%} power within {MAX_PERIODS} blocks of {period_s / 60:.0f} "
                        "min: the canary's noise is too large; offload more engines at random "
                        "instead"}  # fmt: skip
    schedule = switchback_schedule(n, seed=seed)
    hours = n * period_s / 3600
    verb = "continue the switchback of" if running else "run a switchback on"
    return entry | {
        "blocks": n,
        "hours": hours,
        "schedule": list(schedule),
        "text": f"{verb} {canary}: {mode} offload on and off in {n} blocks of "
        f"{period_s / 60:.0f} min ({hours:.1f} h; schedule drawn with seed {seed}, randomized "
        "pairs), each switch a restart with the new config; the plan recognises the history "
        "and compares the canary with itself",
    }
