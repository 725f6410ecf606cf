"""`kvscope plan`: what is happening, none/native/lmcache, forecast, sizing and configs."""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from core.errors import ConfigError
from kvscope.commands.options import ClusterOpt, DbOpt, HorizonOpt, SinceOpt

if TYPE_CHECKING:
    from planner.plan import Plan
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


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(  # noqa: PLR0917 - one parameter per CLI flag
        db: DbOpt = None,
        cluster: ClusterOpt = None,
        since: SinceOpt = "24h",
        horizon: HorizonOpt = "7d",
        gpu_price: Annotated[
            float | None, typer.Option("--gpu-price", help="price per GPU-hour, for costs")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="one JSON object on stdout")] = False,
        plots: Annotated[
            Path | None, typer.Option("--plots", help="write PNG plots of the fits here")
        ] = None,
        seed: Annotated[int, typer.Option("--seed", help="seed of every random draw")] = 0,
        forecast_seconds: Annotated[
            float, typer.Option("--forecast-seconds", help="time budget of each forecast")
        ] = 8.0,
        group: Annotated[
            str | None,
            typer.Option(
                "--group",
                help="plan only this model group (served model@gpu:tpN, as the output names "
                "them) [default: each group apart]",
            ),
        ] = None,
        save: Annotated[
            bool,
            typer.Option(
                "--save",
                help="keep the plan in the store (`kvscope plans list`); the cluster is "
                "--cluster or the store's only one",
            ),
        ] = False,
        slo_ttft: Annotated[
            str,
            typer.Option(
                "--slo-ttft",
                help="the TTFT target capacity is measured against (per window quantile "
                "--slo-quantile), e.g. 2s or 500ms",
            ),
        ] = "2s",
        slo_quantile: Annotated[
            str,
            typer.Option(
                "--slo-quantile",
                help="the TTFT quantile of the SLO: p50, p90 or p99 (the quantiles the "
                "collector keeps per window)",
            ),
        ] = "p90",
        every: Annotated[
            str | None,
            typer.Option(
                "--every",
                help="re-plan every interval (e.g. 15m) until SIGINT/SIGTERM, each cluster of "
                "the store or --cluster; implies --save; JSON summary at exit",
            ),
        ] = None,
    ) -> None:
        """Decide none / native / lmcache from the store's history, forecast KV demand and size.

        Planned per model group (model, GPU, TP; --group picks one). --save keeps the plan in the
        store; --every re-plans on a clock until SIGTERM (a failing round is logged and counted).

        Example: kvscope plan --db sqlite:///kvscope.db --cluster prod --since 3d --horizon 7d
        --gpu-price 3.0 --json --plots plots/ --group 'llama-3.1-8b@h100:tp1'
        Example: kvscope plan --db sqlite:///kvscope.db --cluster prod --save
        Example: kvscope plan --slo-ttft 1s --slo-quantile p99 --json
        Example: kvscope plan --every 15m --db postgresql+psycopg://kvscope@db/kvscope"""
        from pydantic import ValidationError

        from core.durations import parse_duration
        from kvscope.config import get_settings
        from kvscope.heap import reuse_freed_memory
        from planner.fit.capacity import Slo
        from planner.plan import build_plan
        from planner.report.plan_text import summary_text
        from store.store import Store

        try:
            url = get_settings(db=db).db
        except ValidationError as exc:
            raise ConfigError(f"--db (or KVSCOPE_DB): {exc.errors()[0]['msg']}") from exc
        since_d = None if since.strip() == "all" else parse_duration(since, "--since")
        since_s = None if since_d is None else time.time() - since_d
        horizon_s = parse_duration(horizon, "--horizon")
        try:
            slo = Slo(parse_duration(slo_ttft, "--slo-ttft"), slo_quantile)
        except ConfigError as exc:
            raise ConfigError(f"--slo-quantile: {exc}") from None
        if every is not None:
            every_s = parse_duration(every, "--every")
            if plots is not None:
                raise ConfigError("--plots cannot be used with --every (one plan, one set)")
        check_sqlite_exists(url)
        if every is not None:
            from kvscope.replan import run_every

            def make_plan(store: Store, name: str, since_at: float | None) -> Plan:
                with reuse_freed_memory():  # the peak is handed back between rounds
                    return build_plan(store, cluster=name, since=since_at,
                                      horizon_s=horizon_s, gpu_price_per_hour=gpu_price,
                                      seed=seed, forecast_seconds=forecast_seconds,
                                      group=group, slo=slo)  # fmt: skip

            logging.basicConfig(level=logging.WARNING, format="kvscope: %(message)s")
            with Store(url) as store:
                store.clusters()  # the schema is current: else exit 2 now, not every round
                stats = run_every(
                    store, every_s=every_s, cluster=cluster, since_s=since_d, make_plan=make_plan
                )
            typer.echo(json.dumps({**stats.summary(), "cluster": cluster, "db": store.url}))
            return
        print(f"kvscope plan: reading {url} …", file=sys.stderr)
        with Store(url) as store:
            saved_as = None
            if save:
                from kvscope.replan import resolve_cluster

                saved_as = cluster = resolve_cluster(store, cluster)
            with reuse_freed_memory():
                plan = build_plan(
                    store,
                    cluster=cluster,
                    since=since_s,
                    horizon_s=horizon_s,
                    gpu_price_per_hour=gpu_price,
                    seed=seed,
                    forecast_seconds=forecast_seconds,
                    group=group,
                    slo=slo,
                )
            if saved_as is not None:
                from kvscope.replan import save_plan

                ids = save_plan(store, plan, saved_as, created_at=time.time())
                print(
                    f"kvscope plan: saved {len(ids)} plan(s) of cluster {saved_as} "
                    f"(id {', '.join(map(str, ids))})",
                    file=sys.stderr,
                )
        if plots is not None:
            from planner.report.plots import write_plots

            for path in write_plots(plan, plots, seed=seed):
                print(f"kvscope plan: wrote {path}", file=sys.stderr)
            for g in plan.groups:  # each model group's fits in a folder of its own
                for path in write_plots(g.plan, plots / group_dir(g.name), seed=seed):
                    print(f"kvscope plan: wrote {path}", file=sys.stderr)
        payload = plan.to_dict()
        if as_json:
            typer.echo(json.dumps(payload, indent=2))
        else:
            typer.echo(summary_text(payload), nl=False)
