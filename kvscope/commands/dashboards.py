"""`kvscope dashboards build [--out DIR] [--check]`: the Grafana dashboards and Prometheus rules."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from dashboards.config import DEFAULT


def build_cmd(
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            help="root to write under (dashboards/generated/*.json, "
            "deploy/prometheus/rules/*.yml, deploy/kubernetes/base/generated/*.yaml)",
        ),
    ] = Path("."),
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="write nothing; exit 1 when a file under --out is missing, stale or not generated",
        ),
    ] = False,
    runbook_base: Annotated[
        str | None,
        typer.Option(
            "--runbook-base",
            help="URL of docs/runbooks.md for the alerts' "
            "runbook_url (default: the repository path)",
        ),
    ] = None,
) -> None:
    """Write the three dashboards (Fleet KV overview, Offload and LMCache tiers, Planner)
    and the recording and alerting rules; JSON summary on stdout.

    Example: kvscope dashboards build

    Example: kvscope dashboards build --check

    Example: kvscope dashboards build --out ./out --runbook-base https://wiki.example/kvscope/runbooks
    """
    # start-up: the dashboard builders (grafanalib, ~170 ms) only when the command runs
    from dashboards import generate

    cfg = DEFAULT if runbook_base is None else replace(DEFAULT, runbook_base=runbook_base)
    if check:
        stale = generate.check(out, cfg)
        for s in stale:
            print(f"kvscope: stale: {s.path} ({s.why})", file=sys.stderr)
        if stale:
            print("run `kvscope dashboards build` and commit the result", file=sys.stderr)
            raise typer.Exit(1)
        print(json.dumps({"check": "ok", "files": len(generate.artifacts(cfg))}))
        return
    written = generate.write(out, cfg)
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    print(json.dumps({"written": [str(p) for p in written]}))


def register(app: typer.Typer) -> None:
    sub = typer.Typer(
        help="Grafana dashboards and Prometheus recording/alerting rules, generated from the "
        "metric catalogue.",
        no_args_is_help=True,
    )
    app.add_typer(sub, name="dashboards")
    sub.command("build")(build_cmd)
