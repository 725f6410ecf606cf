"""`kvscope db migrate|stats|prune|pack`: create or upgrade the store's schema, describe its
contents, drop or delete old windows, pack complete hours for the plan's read."""

from __future__ import annotations

import json
from typing import Annotated

import typer

_DB_HELP = "store URL, e.g. sqlite:///kvscope.db or postgresql://user@host/db (default: KVSCOPE_DB)"


def register(app: typer.Typer) -> None:
    sub = typer.Typer(
        help="The SQL store: create or upgrade its schema, show what it holds, prune it."
    )
    app.add_typer(sub, name="db")

    @sub.command("migrate")
    def migrate_cmd(
        db: Annotated[str | None, typer.Option("--db", help=_DB_HELP)] = None,
    ) -> None:
        """Create or upgrade the schema (safe to run again); JSON on stdout.

        Example: kvscope db migrate --db sqlite:///out/kvscope.db
        """
        from kvscope.config import get_settings
        from store.store import Store

        settings = get_settings(db=db)
        with Store(settings.db) as store:
            version = store.migrate()
            typer.echo(json.dumps({"db": store.url, "schema_version": version}))

    @sub.command("stats")
    def stats_cmd(
        db: Annotated[str | None, typer.Option("--db", help=_DB_HELP)] = None,
    ) -> None:
        """Row counts per table, the windows' time range and windows per signal; JSON on stdout.

        Example: kvscope db stats --db sqlite:///out/kvscope.db
        """
        from kvscope.config import get_settings
        from store.store import Store

        settings = get_settings(db=db)
        with Store(settings.db) as store:
            stats = store.stats()
            version = store.schema_version()
        typer.echo(json.dumps({"db": store.url, "schema_version": version, **stats}, indent=2))

    @sub.command("prune")
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
        PostgreSQL day partitions of windows dropped whole, whose rows `windows` counts).

        PostgreSQL: the days wholly older are detached concurrently and dropped, the rest of
        the day at the cutoff deleted in short batches. SQLite: short batches; it reuses the
        freed pages (the file does not shrink until VACUUM). `kvscope collect --retention 30d`
        prunes every hour instead (on PostgreSQL whole days only).

        Example: kvscope db prune --older-than 30d --db sqlite:///out/kvscope.db
        """
        import time

        from kvscope.commands.collect import retention_seconds
        from kvscope.config import get_settings
        from store.store import Store

        older_s = retention_seconds(older_than, "--older-than")
        settings = get_settings(db=db)
        with Store(settings.db) as store:
            pruned = store.prune(time.time() - older_s, dry_run=dry_run)
        typer.echo(json.dumps({"db": store.url, **pruned.summary()}))

    @sub.command("pack")
    def pack_cmd(
        db: Annotated[str | None, typer.Option("--db", help=_DB_HELP)] = None,
    ) -> None:
        """Pack every complete source-hour not packed yet (the plan reads a packed hour as one
        block per series instead of a row per window); JSON on stdout (windows_packed).

        Collectors pack each source's hours as their writes reach a new hour, 48 hours back;
        run this after re-writing older hours (a back-fill run again, a restored dump). Safe
        while collectors write: PostgreSQL packs a source's hours a transaction at a time under
        their locks; SQLite in one write transaction.

        Example: kvscope db pack --db postgresql+psycopg://kvscope@db/kvscope
        """
        import time

        from kvscope.config import get_settings
        from store.store import Store

        settings = get_settings(db=db)
        started = time.perf_counter()
        with Store(settings.db) as store:
            packed = store.pack_windows()
        seconds = round(time.perf_counter() - started, 3)
        typer.echo(json.dumps({"db": store.url, "windows_packed": packed, "seconds": seconds}))
