"""Every container of the manifests runs a valid kvscope invocation: the image's ENTRYPOINT is
`kvscope`, no container overrides it, and each container's args (with $(VAR) expanded from its
env and ConfigMaps, as the kubelet does) parse with the CLI's own parser, durations included;
`kvscope <cmd> --help` answers for each command used."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import typer

from core.durations import parse_duration
from kvscope.cli import build_app
from tests.clirun import run_kvscope
from tests.kubernetes.render import OVERLAYS, ROOT, Obj, containers, name_of, pod_spec, render

DURATIONS = ("interval", "window", "every", "settle")  # options holding a duration


def _entrypoint() -> list[str]:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    (line,) = [ln for ln in lines if ln.startswith("ENTRYPOINT")]
    return list(json.loads(line.removeprefix("ENTRYPOINT")))


def parse(argv: list[str]) -> tuple[str, dict[str, Any]]:
    """(command path, parameters) of ``kvscope ARGV`` parsed by the CLI's parser, not run.
    A wrong command, option or value raises the parser's usage error (exit code 2)."""
    cmd: Any = typer.main.get_command(build_app())
    ctx = cmd.make_context("kvscope", list(argv))
    while hasattr(cmd, "resolve_command"):  # a group: descend into the sub-command
        name, cmd, rest = cmd.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        ctx = cmd.make_context(name, rest, parent=ctx)
    for key in DURATIONS:
        if isinstance(ctx.params.get(key), str):
            parse_duration(ctx.params[key], key)
    return ctx.command_path, dict(ctx.params)


def _env(objs: tuple[Obj, ...], c: Obj) -> dict[str, str]:
    maps = {o["metadata"]["name"]: o.get("data", {}) for o in objs if o["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for ref in c.get("envFrom") or []:
        env |= maps[ref["configMapRef"]["name"]]
    for e in c.get("env") or []:
        env[e["name"]] = e.get("value", "<from a Secret>")
    return env


def _expand(arg: str, env: dict[str, str]) -> str:
    """$(VAR) replaced by the container's VAR, as the kubelet expands args."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m.group(1)], arg)


def _invocations() -> list[tuple[str, list[str]]]:
    out = []
    for overlay in OVERLAYS:
        objs = render(f"overlays/{overlay}")
        for obj in objs:
            for label, c in containers(pod_spec(obj) or {}):
                assert "command" not in c, f"{name_of(obj)} {label} overrides the ENTRYPOINT"
                env = _env(objs, c)
                args = [_expand(a, env) for a in c["args"]]
                out.append((f"{overlay}:{name_of(obj)} {label}", args))
    return out


def test_image_entrypoint_is_the_kvscope_console_script() -> None:
    assert _entrypoint() == ["kvscope"]
    assert 'kvscope = "kvscope.cli:main"' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.parametrize(("where", "args"), _invocations(), ids=[w for w, _ in _invocations()])
def test_every_container_runs_a_valid_kvscope_invocation(where: str, args: list[str]) -> None:
    assert not any("$(" in a for a in args), args
    path, _ = parse(args)
    assert path.split()[1] in {"collect", "plan", "serve", "db"}, path


def test_the_planner_and_collector_run_as_the_issue_says() -> None:
    got = {where.rsplit(" ", 1)[-1]: parse(args) for where, args in _invocations()
           if where.startswith("prometheus-mode-postgres")}  # fmt: skip
    assert got["planner"][0] == "kvscope plan"
    assert got["planner"][1]["every"] == "15m" and got["planner"][1]["save"] is True
    assert got["collector"][0] == "kvscope collect" and got["collector"][1]["prometheus"]
    assert got["collector"][1]["metrics_addr"] == "0.0.0.0:9464"
    assert got["api"][0] == "kvscope serve" and got["migrate"][0] == "kvscope db migrate"


@pytest.mark.parametrize(
    "args",
    [["serve", "--hostname", "0.0.0.0"], ["plan", "--every"], ["serve", "--port", "http"],
     ["colect"], ["plan", "--every", "15 minutes"]],
)  # fmt: skip
def test_a_renamed_flag_or_bad_value_fails_the_parse(args: list[str]) -> None:
    with pytest.raises(Exception) as info:  # click's usage errors and kvscope's
        parse(args)
    assert getattr(info.value, "exit_code", 2) == 2


def test_kvscope_help_answers_for_every_command_used() -> None:
    commands = sorted({tuple(parse(a)[0].split()[1:]) for _, a in _invocations()})
    for command in commands:
        proc = run_kvscope(*command, "--help")
        assert proc.returncode == 0, (command, proc.stderr)
        assert "kvscope.cli " + " ".join(command) + " [OPTIONS]" in " ".join(proc.stdout.split())
