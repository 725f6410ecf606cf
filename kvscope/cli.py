"""The `kvscope` command line: wires collector, planner, dashboards and api together.

Machine output is JSON on stdout, progress goes to stderr. Each command lives in
kvscope/commands/<name>.py and registers itself here; heavy imports stay inside commands.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer

from collector.errors import KvscopeError

app = typer.Typer(
    name="kvscope",
    help="Observability and capacity planning for vLLM + LMCache clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_commands() -> None:
    import kvscope.commands as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"kvscope.commands.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_commands()


def main() -> None:
    """Console-script entry point: KvscopeError -> one clear line on stderr, exit 2."""
    try:
        app()
    except KvscopeError as exc:
        print(f"kvscope: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc


if __name__ == "__main__":
    main()
