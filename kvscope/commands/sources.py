"""`kvscope sources [ID]`: the published sources kvscope cites as `[source: <id>]`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from planner.domain.citations import Citation

JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable JSON on stdout")]
IdArg = Annotated[
    str | None,
    typer.Argument(
        help="a source id as printed in a plan, e.g. gke-tiered-kv-2025", show_default=False
    ),
]


def _lines(citation: Citation) -> list[str]:
    lines = [
        f"{citation.id}",
        f"  title: {citation.title}",
        f"  owner: {citation.owner}",
        f"  date:  {citation.date}",
        f"  url:   {citation.url}",
        "  figures:",
    ]
    for f in citation.figures:
        lines.append(f"    - {f.what}: {f.value} (hardware: {f.hardware})")
    if citation.note:
        lines.append(f"  note: {citation.note}")
    return lines


def sources_cmd(source_id: IdArg = None, as_json: JsonOpt = False) -> None:
    """List the published sources kvscope cites, or show one by id.

    Every source id cited in a plan, an advice, the hardware catalogue or the docs is an
    entry here: title, owner, date, URL, the figures kvscope uses and the hardware each
    was measured on. An unknown id is an error (exit 2) naming the known ones.

    Example: kvscope sources gke-tiered-kv-2025 --json
    """
    # start-up: planner.domain.citations (~40 ms) only when the command runs
    from planner.domain.citations import get_citation, registry

    chosen = [get_citation(source_id)] if source_id is not None else list(registry().values())
    if as_json:
        payload = (
            chosen[0].to_dict()
            if source_id is not None
            else {"sources": [c.to_dict() for c in chosen]}
        )
        typer.echo(json.dumps(payload, indent=2))
        return
    if source_id is not None:
        typer.echo("\n".join(_lines(chosen[0])))
        return
    width = max(len(c.id) for c in chosen)
    typer.echo(
        "\n".join(
            f"{c.id:<{width}}  {c.title}\n{'':<{width}}  {c.owner}, {c.date}: {c.url}"
            for c in chosen
        )
    )


def register(app: typer.Typer) -> None:
    app.command("sources")(sources_cmd)
