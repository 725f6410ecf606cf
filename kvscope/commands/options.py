"""The CLI options several commands share, typed once (no command of its own: no register)."""

from __future__ import annotations

from typing import Annotated

import typer

DbOpt = Annotated[
    str | None, typer.Option("--db", help="store URL [default: KVSCOPE_DB or sqlite]")
]
ClusterOpt = Annotated[
    str | None, typer.Option("--cluster", help="only this cluster [default: all]")
]
SinceOpt = Annotated[str, typer.Option("--since", help="history to use, e.g. 24h, 3d, or 'all'")]
HorizonOpt = Annotated[str, typer.Option("--horizon", help="forecast horizon, e.g. 7d")]
JsonOpt = Annotated[bool, typer.Option("--json", help="one JSON object on stdout")]
KeepOpt = Annotated[
    str,
    typer.Option(
        "--keep",
        metavar="used|all",
        help="signals to store: used (the ones kvscope reads back) or all (every catalogue signal)",
    ),
]
