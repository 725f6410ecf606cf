"""`kvscope version`: print the installed version as JSON."""

from __future__ import annotations

import json

import typer

from core.kvscope_metrics import kvscope_version


def version_cmd() -> None:
    """Print kvscope's version. Example: kvscope version"""
    typer.echo(json.dumps({"kvscope": kvscope_version()}))


def register(app: typer.Typer) -> None:
    app.command("version")(version_cmd)
