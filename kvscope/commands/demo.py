"""`kvscope demo`: simulated cluster -> collector -> SQLite -> planner -> summary and plots."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

from core.durations import parse_duration
from kvscope.commands.options import KeepOpt

DemoDbOpt = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="store URL (a SQLite file is deleted first) [default: sqlite:///OUT/demo.db]",
    ),
]
OutOpt = Annotated[
    Path,
    typer.Option(
        "--out",
        help="directory for everything the demo writes: the database (unless --db), "
        "plots, dashboards and rules",
    ),
]
SpeedOpt = Annotated[float, typer.Option("--speed", help="simulated seconds per wall second")]
SimHoursOpt = Annotated[
    float, typer.Option("--sim-hours", help="simulated history to collect, in hours")
]
SeedOpt = Annotated[int, typer.Option("--seed", help="seed of the simulation and fits")]
ScenarioOpt = Annotated[
    str | None,
    typer.Option(
        "--scenario",
        help="scenario YAML file or bundled scenario name (kvscope simulate --list) "
        "[default: demo]",
    ),
]
HorizonOpt = Annotated[str, typer.Option("--horizon", help="forecast horizon, e.g. 1d")]
PlanJsonOpt = Annotated[
    bool, typer.Option("--json", help="print the plan JSON instead of the summary")
]


def demo_cmd(  # noqa: PLR0917 - one parameter per CLI flag
    db: DemoDbOpt = None,
    out: OutOpt = Path("out"),
    speed: SpeedOpt = 80.0,
    sim_hours: SimHoursOpt = 4.0,
    seed: SeedOpt = 1,
    scenario: ScenarioOpt = None,
    horizon: HorizonOpt = "1d",
    as_json: PlanJsonOpt = False,
    keep: KeepOpt = "used",
) -> None:
    """The main job end to end: a simulated vLLM/LMCache cluster serves live /metrics on
    127.0.0.1, the collector scrapes it on the simulated clock into SQLite, the planner
    fits, forecasts, decides and sizes, and the plan is saved in the store (what the API
    serves); summary on stdout, the database, plots, dashboards and rules in --out,
    progress on stderr. A run is reproducible for a seed (the SQLite file is recreated).

    Example: kvscope demo --sim-hours 4 --speed 80 --out out

    Example: kvscope demo --scenario diurnal_mixed_offload --sim-hours 1 --speed 200
    """
    # start-up: the demo's simulator, collector and planner only when the command runs
    from kvscope.demo import DEFAULT_SCENARIO, DemoOptions, run_demo, summary

    logging.basicConfig(level=logging.WARNING, format="kvscope: %(message)s", stream=sys.stderr)
    opts = DemoOptions(
        db=db or f"sqlite:///{out / 'demo.db'}",
        out=out,
        speed=speed,
        sim_hours=sim_hours,
        seed=seed,
        scenario=scenario or DEFAULT_SCENARIO,
        horizon_s=parse_duration(horizon, "--horizon"),
        keep=keep,
    )
    try:
        result = run_demo(opts)
    except KeyboardInterrupt:
        print("kvscope demo: stopped (Ctrl-C); servers closed", file=sys.stderr)
        raise typer.Exit(130) from None
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        typer.echo(summary(result), nl=False)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_cmd)
