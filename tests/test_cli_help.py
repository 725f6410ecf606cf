"""Every `kvscope` command, option and argument says what it is for in --help."""

from __future__ import annotations

from typing import Any

import typer

from kvscope.cli import build_app


def _walk(cmd: Any, path: str) -> list[tuple[str, Any]]:
    """(path, command) of the command and every subcommand (typer's own click objects)."""
    out = [(path, cmd)]
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        out += _walk(sub, f"{path} {name}")
    return out


def test_every_command_option_and_argument_has_help() -> None:
    commands = _walk(typer.main.get_command(build_app()), "kvscope")
    missing, options = [], 0
    for path, cmd in commands:
        if path != "kvscope" and not (cmd.help or cmd.short_help or "").strip():
            missing.append(f"{path}: no help")
        for p in cmd.params:
            if p.param_type_name == "option" and not p.hidden:
                options += 1
                if not (p.help or "").strip():
                    missing.append(f"{path} {'/'.join(p.opts)}: no help")
            elif p.param_type_name == "argument" and not (getattr(p, "help", "") or "").strip():
                missing.append(f"{path} {p.name}: no help")
    assert options > 100 and len(commands) > 20  # the walk reached the whole tree
    assert missing == []
