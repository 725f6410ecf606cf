"""`kvscope db migrate|stats|prune|seal|downsample`: create or upgrade the store's schema,
describe its contents, drop or delete old windows, seal closed hours into chunks, move old
days into the 5-minute tier."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer

from kvscope.commands.collect import retention_seconds

_DB_HELP = "store URL, e.g. sqlite:///kvscope.db or postgresql://user@host/db (default: KVSCOPE_DB)"


def migrate_cmd(
    db: Annotated[str | None, typer.Option("--db", help=_DB_HELP)] = None,
) -> None:
    """Create or upgrade the schema (safe to run again); JSON on stdout.

    Example: kvscope db migrate --db sqlite:///out/kvscope.db
    """
    # start-up: the settings (pydantic) and the store (sqlalchemy) only when the command runs
    from kvscope.cli_settings import get_settings
    from store.store import Store

    settings = get_settings(db=db)
    with Store(settings.db) as store:
        version = store.migrate()
        typer.echo(json.dumps({"db": store.url, "schema_version": version}))


def stats_cmd(
    db: Annotated[str | None, typer.Option("--db", help=_DB_HELP)] = None,
) -> None:
    """Row counts per table, the windows' time range and windows per signal; JSON on stdout.

    Example: kvscope db stats --db sqlite:///out/kvscope.db
    """
    # start-up: the settings (pydantic) and the store (sqlalchemy) only when the command runs
    from kvscope.cli_settings import get_settings
    from store.store import Store

    settings = get_settings(db=db)
    with Store(settings.db) as store:
        stats = store.stats()
        version = store.schema_version()
    typer.echo(json.dumps({"db": store.url, "schema_version": version, **stats}, indent=2))


def prune_cmd(
    older_than: Annotated[
        str,
        typer.Option("--older-than", help="delete what is older than this, e.g. 30d (>= 1h)"),
    ],
    db: Annotated[str | None, typer.Option("--db", help=_DB_HELP)] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="count what would be deleted, delete nothing")
    ] = False,
) -> None:
    """Delete windows and scrape outcomes older than --older-than (safe while collectors
    write); engines, targets and plans are kept. JSON on stdout (partitions_dropped: the
    PostgreSQL day partitions of chunks dropped whole, whose windows `windows` counts).

    PostgreSQL: whole older days detached concurrently and dropped, the rest in short batches.
    SQLite: short batches (the file shrinks only at VACUUM). `kvscope collect --retention 30d`
    prunes every hour instead (on PostgreSQL whole days only).

    Example: kvscope db prune --older-than 30d --db sqlite:///out/kvscope.db
    """
    # start-up: the settings (pydantic) and the store (sqlalchemy) only when the command runs
    from kvscope.cli_settings import get_settings
    from store.store import Store

    older_s = retention_seconds(older_than, "--older-than")
    settings = get_settings(db=db)
    with Store(settings.db) as store:
        pruned = store.prune(time.time() - older_s, dry_run=dry_run)
    typer.echo(json.dumps({"db": store.url, **pruned.summary()}))


def seal_cmd(
    db: Annotated[str | None, typer.Option("--db", help=_DB_HELP)] = None,
) -> None:
    """Seal closed hours: head rows into compressed chunks; JSON (windows_sealed).

    Moves every source's windows of hours older than its newest hour. Writers seal a
    source's hours as their writes reach a new hour; run this on a store
    whose collectors stopped mid-hour, before measuring its size. Safe while collectors
    write (PostgreSQL: under the source's lock; SQLite: one writer at a time).

    Example: kvscope db seal --db postgresql+psycopg://kvscope@db/kvscope
    """
    # start-up: the settings (pydantic) and the store (sqlalchemy) only when the command runs
    from kvscope.cli_settings import get_settings
    from store.store import Store

    settings = get_settings(db=db)
    started = time.perf_counter()
    with Store(settings.db) as store:
        sealed = store.seal_hours()
    seconds = round(time.perf_counter() - started, 3)
    typer.echo(json.dumps({"db": store.url, "windows_sealed": sealed, "seconds": seconds}))


def downsample_cmd(
    older_than: Annotated[
        str,
        typer.Option("--older-than", help="move the days wholly older than this, e.g. 7d (>= 1h)"),
    ],
    db: Annotated[str | None, typer.Option("--db", help=_DB_HELP)] = None,
) -> None:
    """Move days older than --older-than into the 5-minute tier; JSON on stdout.

    Turns the 1-minute windows of every UTC day wholly older than --older-than into
    5-minute windows (the tier the plan reads for long histories); prints windows_in,
    windows_out, days. `kvscope collect --downsample-after 7d` does it every hour.
    Quantiles of a 5-minute window are the delta-weighted mean of
    its minutes' (an approximation); every other value is exact.

    Example: kvscope db downsample --older-than 7d --db sqlite:///out/kvscope.db
    """
    # start-up: the settings (pydantic) and the store (sqlalchemy) only when the command runs
    from kvscope.cli_settings import get_settings
    from store.store import Store

    older_s = retention_seconds(older_than, "--older-than")
    settings = get_settings(db=db)
    with Store(settings.db) as store:
        done = store.downsample(time.time() - older_s)
    typer.echo(json.dumps({"db": store.url, **done.summary()}))


def register(app: typer.Typer) -> None:
    sub = typer.Typer(
        help="The SQL store: create or upgrade its schema, show what it holds, prune it."
    )
    app.add_typer(sub, name="db")
    sub.command("migrate")(migrate_cmd)
    sub.command("stats")(stats_cmd)
    sub.command("prune")(prune_cmd)
    sub.command("seal")(seal_cmd)
    sub.command("downsample")(downsample_cmd)
