"""`kvscope report`: the self-contained HTML report of a cluster (planner/report/html.py)."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from core.durations import parse_duration
from core.errors import ConfigError
from kvscope.commands.options import ClusterOpt, DbOpt, HorizonOpt, SinceOpt
from kvscope.commands.plan import check_sqlite_exists


def check_out(path: Path) -> None:
    """Fail before the work when the page could not be written there."""
    if path.is_dir():
        raise ConfigError(f"--out {path}: is a directory (name the HTML file)")
    if not path.parent.is_dir():
        raise ConfigError(f"--out {path}: no such directory {str(path.parent)!r}")


def write_page(path: Path, page: str) -> None:
    """Write ``page`` to ``path`` whole or not at all (a temp file beside it, then renamed)."""
    check_out(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(page)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise ConfigError(f"--out {path}: cannot write: {exc}") from exc


def report_cmd(  # noqa: PLR0917 - one parameter per CLI flag
    out: Annotated[Path, typer.Option("--out", help="the HTML file to write")],
    db: DbOpt = None,
    cluster: ClusterOpt = None,
    since: SinceOpt = "24h",
    horizon: HorizonOpt = "7d",
    seed: Annotated[int, typer.Option("--seed", help="seed of every random draw")] = 0,
    forecast_seconds: Annotated[
        float, typer.Option("--forecast-seconds", help="time budget of each forecast")
    ] = 8.0,
) -> None:
    """Write one self-contained HTML page: the decision and its linked sources, the plots
    of the fits and the forecast, the numbers with their intervals, and the closed loop
    (stored plans scored against what happened). Images are inline; the page loads
    nothing. Prints the file's path on stderr.

    Example: kvscope report --db sqlite:///kvscope.db --cluster prod --since 3d
    --out report.html
    """
    # start-up: pydantic, the planner and the store (~1 s) only when the command runs
    from pydantic import ValidationError

    from kvscope.cli_settings import get_settings
    from planner.report import render_report
    from store.store import Store

    try:
        url = get_settings(db=db).db
    except ValidationError as exc:
        raise ConfigError(f"--db (or KVSCOPE_DB): {exc.errors()[0]['msg']}") from exc
    since_s = None if since.strip() == "all" else time.time() - parse_duration(since, "--since")
    horizon_s = parse_duration(horizon, "--horizon")
    check_sqlite_exists(url)
    check_out(out)
    print(f"kvscope report: reading {url} …", file=sys.stderr)
    with Store(url) as store:
        page = render_report(
            store,
            cluster,
            since=since_s,
            horizon_s=horizon_s,
            seed=seed,
            forecast_seconds=forecast_seconds,
        )
    write_page(out, page)
    print(f"kvscope report: wrote {out}", file=sys.stderr)


def register(app: typer.Typer) -> None:
    app.command("report")(report_cmd)
