"""`kvscope plan`: what is happening, none/native/lmcache, forecast, sizing and configs."""

from __future__ import annotations

import functools
import json
import logging
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from core.durations import parse_duration
from core.errors import ConfigError
from kvscope.commands.options import ClusterOpt, DbOpt, HorizonOpt, JsonOpt, SinceOpt

if TYPE_CHECKING:
    from collections.abc import Iterable

    from kvscope.replan import ReplanConfig
    from planner.domain.slo import Slo
    from planner.plan import Plan
    from planner.plan.windows import SignalPart
    from store.store import Store


def check_sqlite_exists(url: str) -> None:
    """A SQLite file that does not exist is a typo, not an empty store to create."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # Store() names the bad URL
    db = parsed.database or ""
    is_file = parsed.get_backend_name() == "sqlite" and db not in ("", ":memory:")
    if is_file and "mode=" not in db and not Path(db).expanduser().exists():
        raise ConfigError(f"--db {url}: no such SQLite file (collect into it first)")


def group_dir(name: str) -> str:
    """A folder name for a model group (``/``, ``@``, ``:`` and spaces become ``_``)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")
    return f"group-{safe or 'unnamed'}"


GpuPriceOpt = Annotated[
    float | None, typer.Option("--gpu-price", help="price per GPU-hour, for costs")
]
PlotsOpt = Annotated[Path | None, typer.Option("--plots", help="write PNG plots of the fits here")]
SeedOpt = Annotated[int, typer.Option("--seed", help="seed of every random draw")]
ForecastSecondsOpt = Annotated[
    float, typer.Option("--forecast-seconds", help="time budget of each forecast")
]
GroupOpt = Annotated[
    str | None,
    typer.Option(
        "--group",
        help="plan only this model group (served model@gpu:tpN, as the output names "
        "them) [default: each group apart]",
    ),
]
SaveOpt = Annotated[
    bool,
    typer.Option(
        "--save",
        help="keep the plan in the store (`kvscope plans list`); the cluster is "
        "--cluster or the store's only one",
    ),
]
SloTtftOpt = Annotated[
    str,
    typer.Option(
        "--slo-ttft",
        help="the TTFT target capacity is measured against (per window quantile "
        "--slo-quantile), e.g. 2s or 500ms",
    ),
]
SloQuantileOpt = Annotated[
    str,
    typer.Option(
        "--slo-quantile",
        help="the TTFT quantile of the SLO: p50, p90 or p99 (the quantiles the "
        "collector keeps per window)",
    ),
]
EveryOpt = Annotated[
    str | None,
    typer.Option(
        "--every",
        help="re-plan every interval (e.g. 15m) until SIGINT/SIGTERM, each cluster of "
        "the store or --cluster; implies --save; JSON summary at exit",
    ),
]


@dataclass(frozen=True, slots=True)
class PlanFlags:
    """The flags of `kvscope plan` as given (unchecked: plan_config checks them)."""

    db: str | None = None
    cluster: str | None = None
    since: str = "24h"
    horizon: str = "7d"
    gpu_price: float | None = None
    as_json: bool = False
    plots: Path | None = None
    seed: int = 0
    forecast_seconds: float = 8.0
    group: str | None = None
    save: bool = False
    slo_ttft: str = "2s"
    slo_quantile: str = "p90"
    every: str | None = None


@dataclass(frozen=True, slots=True)
class PlanConfig:
    """A `kvscope plan` run, checked once: the store, what is planned and how, the output;
    ``every``: the --every loop (None: one plan). ``since_s``: the history's length (None:
    all of it)."""

    db: str
    cluster: str | None
    since_s: float | None
    horizon_s: float
    slo: Slo
    gpu_price: float | None = None
    seed: int = 0
    forecast_seconds: float = 8.0
    group: str | None = None
    plots: Path | None = None
    save: bool = False
    as_json: bool = False
    every: ReplanConfig | None = None


def plan_cmd(  # noqa: PLR0917 - one parameter per CLI flag
    db: DbOpt = None,
    cluster: ClusterOpt = None,
    since: SinceOpt = "24h",
    horizon: HorizonOpt = "7d",
    gpu_price: GpuPriceOpt = None,
    as_json: JsonOpt = False,
    plots: PlotsOpt = None,
    seed: SeedOpt = 0,
    forecast_seconds: ForecastSecondsOpt = 8.0,
    group: GroupOpt = None,
    save: SaveOpt = False,
    slo_ttft: SloTtftOpt = "2s",
    slo_quantile: SloQuantileOpt = "p90",
    every: EveryOpt = None,
) -> None:
    """Decide none / native / lmcache from the store's history, forecast KV demand and size.

    Planned per model group (model, GPU, TP; --group picks one). --save keeps the plan in the
    store; --every re-plans on a clock until SIGTERM (a failing round is logged and counted).

    Example: kvscope plan --db sqlite:///kvscope.db --cluster prod --since 3d --horizon 7d
    --gpu-price 3.0 --json --plots plots/ --group 'llama-3.1-8b@h100:tp1'
    Example: kvscope plan --db sqlite:///kvscope.db --cluster prod --save
    Example: kvscope plan --slo-ttft 1s --slo-quantile p99 --json
    Example: kvscope plan --every 15m --db postgresql+psycopg://kvscope@db/kvscope"""
    config = plan_config(
        PlanFlags(
            db=db, cluster=cluster, since=since, horizon=horizon, gpu_price=gpu_price,
            as_json=as_json, plots=plots, seed=seed, forecast_seconds=forecast_seconds,
            group=group, save=save, slo_ttft=slo_ttft, slo_quantile=slo_quantile, every=every,
        )
    )  # fmt: skip
    if config.every is not None:
        run_replan(config, config.every)
    else:
        run_plan(config)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_cmd)


def plan_config(flags: PlanFlags) -> PlanConfig:
    """The run's config from the flags and the settings, checked once (ConfigError naming the
    flag); a SQLite file that does not exist is refused here too."""
    from pydantic import ValidationError

    from kvscope.cli_settings import get_settings
    from planner.domain.slo import Slo

    try:
        url = get_settings(db=flags.db).db
    except ValidationError as exc:
        raise ConfigError(f"--db (or KVSCOPE_DB): {exc.errors()[0]['msg']}") from exc
    since_s = None if flags.since.strip() == "all" else parse_duration(flags.since, "--since")
    horizon_s = parse_duration(flags.horizon, "--horizon")
    try:
        slo = Slo(parse_duration(flags.slo_ttft, "--slo-ttft"), flags.slo_quantile)
    except ConfigError as exc:
        raise ConfigError(f"--slo-quantile: {exc}") from None
    every = None
    if flags.every is not None:
        from kvscope.replan import ReplanConfig  # the loop's modules: not for one plan

        every = ReplanConfig(parse_duration(flags.every, "--every"), flags.cluster, since_s)
        if flags.plots is not None:
            raise ConfigError("--plots cannot be used with --every (one plan, one set)")
    check_sqlite_exists(url)
    return PlanConfig(
        db=url, cluster=flags.cluster, since_s=since_s, horizon_s=horizon_s, slo=slo,
        gpu_price=flags.gpu_price, seed=flags.seed, forecast_seconds=flags.forecast_seconds,
        group=flags.group, plots=flags.plots, save=flags.save, as_json=flags.as_json,
        every=every,
    )  # fmt: skip


def make_plan(
    config: PlanConfig,
    store: Store,
    cluster: str | None,
    since: float | None,
    parts: Iterable[SignalPart] | None = None,
) -> Plan:
    """A plan of ``cluster`` (None: every cluster) over the windows since ``since`` (an epoch
    time; None: all), as ``config`` says, of ``parts`` when read ahead; the memory's peak is
    handed back afterwards."""
    from kvscope.heap import reuse_freed_memory
    from planner.plan import build_plan

    with reuse_freed_memory():
        return build_plan(
            store,
            cluster=cluster,
            since=since,
            horizon_s=config.horizon_s,
            gpu_price_per_hour=config.gpu_price,
            seed=config.seed,
            forecast_seconds=config.forecast_seconds,
            group=config.group,
            slo=config.slo,
            parts=parts,
        )


def run_replan(config: PlanConfig, every: ReplanConfig) -> None:
    """--every: re-plan and save until SIGINT / SIGTERM; the JSON summary on stdout."""
    from kvscope.replan import run_every
    from store.store import Store

    logging.basicConfig(level=logging.WARNING, format="kvscope: %(message)s")
    with Store(config.db) as store:
        store.clusters()  # the schema is current: else exit 2 now, not every round
        stats = run_every(store, every, functools.partial(make_plan, config))
    typer.echo(json.dumps({**stats.summary(), "cluster": config.cluster, "db": store.url}))


def run_plan(config: PlanConfig) -> None:
    """One plan: made (and with --save kept in the store), plotted, printed."""
    # only the reading path before the child starts: the fits load here while it reads
    from kvscope.heap import reuse_freed_memory
    from planner.plan.readahead import read_ahead
    from store.store import Store

    since_at = None if config.since_s is None else time.time() - config.since_s
    print(f"kvscope plan: reading {config.db} …", file=sys.stderr)

    def cluster_of(store: Store) -> str | None:
        if not config.save:
            return config.cluster
        from kvscope.replan import resolve_cluster

        return resolve_cluster(store, config.cluster)

    # the windows read by a child, started before this process opens the store
    ahead = read_ahead(config.db, cluster_of, since=since_at, until=None, around=reuse_freed_memory)
    from planner.report.plan_text import summary_text

    try:
        with Store(config.db) as store:
            cluster = cluster_of(store)
            saved_as = cluster if config.save else None
            plan = make_plan(config, store, cluster, since_at, ahead)
            if saved_as is not None:
                from kvscope.replan import save_plan

                ids = save_plan(store, plan, saved_as, created_at=time.time())
                print(
                    f"kvscope plan: saved {len(ids)} plan(s) of cluster {saved_as} "
                    f"(id {', '.join(map(str, ids))})",
                    file=sys.stderr,
                )
    finally:
        if ahead is not None:
            ahead.close()
    if config.plots is not None:
        _write_plots(plan, config.plots, config.seed)
    payload = plan.to_dict()
    if config.as_json:
        typer.echo(json.dumps(payload, indent=2))
    else:
        typer.echo(summary_text(payload), nl=False)


def _write_plots(plan: Plan, plots: Path, seed: int) -> None:
    """The fits' plots in ``plots``, each model group's in a folder of its own."""
    from planner.report.plots import write_plots

    for path in write_plots(plan, plots, seed=seed):
        print(f"kvscope plan: wrote {path}", file=sys.stderr)
    for g in plan.groups:
        for path in write_plots(g.plan, plots / group_dir(g.name), seed=seed):
            print(f"kvscope plan: wrote {path}", file=sys.stderr)
