"""The `kvscope` command line: wires collector, planner, dashboards and api together.

Machine output is JSON on stdout, progress goes to stderr. Each command lives in
kvscope/commands/<name>.py and registers itself here; heavy imports stay inside commands.
"""

from __future__ import annotations

import gc
import importlib
import pkgutil
import sys

import typer

import kvscope.commands as pkg
from core.errors import KvscopeError


def build_app(only: str | None = None) -> typer.Typer:
    """The command tree: every command, or only those of module ``only`` of kvscope.commands
    (``main`` builds just the one it runs: building all of them costs ~0.1 s of start-up,
    most of a small command's time)."""
    built = typer.Typer(
        name="kvscope",
        help="Observability and capacity planning for vLLM + LMCache clusters.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    names = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__))
    if only in names:
        names = [only]

        @built.callback()
        def _group() -> None:  # a group of one command stays a group: `kvscope NAME ARGS`
            pass

    for name in names:
        register = getattr(importlib.import_module(f"kvscope.commands.{name}"), "register", None)
        if register is not None:
            register(built)
    return built


def __getattr__(name: str) -> typer.Typer:
    """``kvscope.cli.app``: the whole command tree, built on first use."""
    if name != "app":
        raise AttributeError(name)
    tree = build_app()
    globals()["app"] = tree
    return tree


def main() -> None:
    """Console-script entry point: KvscopeError -> one clear line on stderr, exit 2.

    On the way out, whatever the exit, the objects still alive are frozen (``gc.freeze``):
    the interpreter's last collection at exit does not walk them (a plan of 100 engines ×
    7 days leaves ~0.45 s of it, ~0.04 s frozen; benchmarks/README.md). Nothing is skipped:
    atexit handlers run and objects are freed as before, only not searched for cycles
    (the Instagram technique, engineering blog "Dismissing Python Garbage Collection at
    Instagram", 2017; gc.freeze since Python 3.7)."""
    try:
        build_app(sys.argv[1] if len(sys.argv) > 1 else None)()
    except KvscopeError as exc:
        print(f"kvscope: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    finally:
        gc.freeze()


if __name__ == "__main__":
    main()
