"""`kvscope db migrate|stats`: create or upgrade the store's schema, or describe its contents."""

from __future__ import annotations

import json
from typing import Annotated

import typer

_DB_HELP = "store URL, e.g. sqlite:///kvscope.db or postgresql://user@host/db (default: KVSCOPE_DB)"


def register(app: typer.Typer) -> None:
    sub = typer.Typer(help="The SQL store: create or upgrade its schema, show what it holds.")
    app.add_typer(sub, name="db")

    @sub.command("migrate")
    def migrate_cmd(
        db: Annotated[str | None, typer.Option("--db", help=_DB_HELP)] = None,
    ) -> None:
        """Create or upgrade the schema (safe to run again); JSON on stdout.

        Example: kvscope db migrate --db sqlite:///out/kvscope.db
        """
        from collector.store import Store
        from kvscope.config import get_settings

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
        from collector.store import Store
        from kvscope.config import get_settings

        settings = get_settings(db=db)
        with Store(settings.db) as store:
            stats = store.stats()
            version = store.schema_version()
        typer.echo(json.dumps({"db": store.url, "schema_version": version, **stats}, indent=2))
