"""`kvscope version`: print the installed version as JSON."""

from __future__ import annotations

import json
from importlib.metadata import version as dist_version

import typer


def register(app: typer.Typer) -> None:
    @app.command("version")
    def version_cmd() -> None:
        """Print kvscope's version. Example: kvscope version"""
        typer.echo(json.dumps({"kvscope": dist_version("kvscope")}))
