"""The CLI composition root: help works and lists the commands."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

from typer.testing import CliRunner

import kvscope.commands as pkg
from kvscope.cli import app, build_app


def test_cli_help_no_args_exits_cleanly() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvscope.cli", "--help"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "kvscope" in proc.stdout.lower()


def _help(app: object, args: list[str]) -> tuple[int, str]:
    got = CliRunner().invoke(app, args)  # type: ignore[arg-type]
    return got.exit_code, got.output


def test_cli_built_for_one_command_answers_as_the_whole_tree() -> None:
    """`main` builds only the module of the command it runs: each command's help is that of
    the whole tree, usage errors too, and a name that is no module builds everything."""
    names = [m.name for m in pkgutil.iter_modules(pkg.__path__)]
    assert {"inspect", "db", "plan", "serve", "collect"} <= set(names)
    built = 0
    for name in names:
        one = build_app(name)
        if not one.registered_commands and not one.registered_groups:
            continue  # a helper module (options): nothing registered
        built += 1
        assert _help(one, [name, "--help"]) == _help(app, [name, "--help"]), name
    assert built >= 10
    for args in (["inspect"], ["db", "prune"], ["plan", "--no-such-flag"]):
        code, text = _help(build_app(args[0]), args)
        assert code == 2 and (code, text) == _help(app, args), args
    whole = build_app("openapi")  # registered by serve.py: not a module name
    assert len(whole.registered_commands) == len(app.registered_commands)
