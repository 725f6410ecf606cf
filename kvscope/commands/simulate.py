"""`kvscope simulate SCENARIO`: run the discrete-event cluster simulator.

SCENARIO is a YAML file or the name of a bundled scenario (planner/simulate/scenarios/;
`kvscope simulate --list`).

Machine output (--json) is one JSON object on stdout; progress goes to stderr. The simulator's
imports stay inside the command so `kvscope --help` stays fast.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from core.errors import ConfigError
from planner.simulate.scenarios import bundled_directory, bundled_names, scenario_file

SUMMARY_ROWS = (
    ("completed_requests", "completed requests", "{:.0f}"),
    ("total_tokens_per_s", "total tokens/s", "{:.0f}"),
    ("output_tokens_per_s", "output tokens/s", "{:.0f}"),
    ("ttft_mean_s", "TTFT mean s", "{:.3f}"),
    ("ttft_p90_s", "TTFT p90 s", "{:.3f}"),
    ("e2e_mean_s", "E2E mean s", "{:.3f}"),
    ("e2e_p90_s", "E2E p90 s", "{:.3f}"),
    ("preemptions", "preemptions", "{:.0f}"),
    ("reprefill_tokens", "re-prefill tokens", "{:.0f}"),
    ("avoided_reprefill_tokens", "avoided re-prefill tokens", "{:.0f}"),
    ("prefix_hit_rate", "GPU prefix hit rate", "{:.1%}"),
    ("external_hit_rate", "external hit rate", "{:.1%}"),
    ("kv_usage_mean", "KV usage mean", "{:.1%}"),
)


def _apply_sets(raw: dict[str, Any], sets: list[str]) -> dict[str, Any]:
    # start-up: yaml and the scenario reader (~60 ms) only when the command runs
    import yaml

    from planner.simulate.scenario import resolve_dotted, set_dotted

    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set: expected key=value, got {item!r}")
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: value is not valid YAML") from exc
        raw = set_dotted(raw, resolve_dotted(key.strip()), parsed)
    return raw


def _summary_text(result: dict[str, Any]) -> str:
    lines = [
        f"scenario {result['scenario']}: {result['num_engines']} engines, "
        f"offload {result['offload']}, {result['measured_window_s']:.0f} s simulated"
    ]
    for key, label, fmt in SUMMARY_ROWS:
        value = result.get(key)
        lines.append(f"  {label:28}{'-' if value is None else fmt.format(value):>14}")
    stages = result.get("stages") or []
    if stages:  # a rate ramp: inference-perf's per-stage report
        lines.append(
            f"  {'stage':>5}{'qps':>8}{'requests':>10}{'span s':>9}{'tokens/s':>12}"
            f"{'TTFT mean s':>13}{'E2E mean s':>12}"
        )
        for st in stages:
            cells = [
                "-" if st[k] is None else fmt.format(st[k])
                for k, fmt in (
                    ("span_s", "{:.1f}"),
                    ("total_tokens_per_s", "{:,.0f}"),
                    ("ttft_mean_s", "{:.3f}"),
                    ("e2e_mean_s", "{:.2f}"),
                )
            ]
            lines.append(
                f"  {st['stage']:>5}{st['qps']:>8g}{st['completed_requests']:>10}"
                f"{cells[0]:>9}{cells[1]:>12}{cells[2]:>13}{cells[3]:>12}"
            )
    return "\n".join(lines)


def _bundled() -> str:
    """The bundled scenario names, for the help and the errors (planner/simulate/scenarios/)."""
    return ", ".join(bundled_names())


ScenarioArg = Annotated[
    str | None,
    typer.Argument(
        metavar="SCENARIO",
        show_default=False,
        help=f"scenario YAML file, or a bundled scenario: {_bundled()}",
    ),
]
ListOpt = Annotated[
    bool, typer.Option("--list", help="print the bundled scenarios (name, file) and exit")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="one JSON object on stdout")]
CompareOpt = Annotated[
    str | None,
    typer.Option("--compare", help="offload modes side by side, e.g. none,native,lmcache"),
]
SweepOpt = Annotated[
    str | None,
    typer.Option(
        "--sweep",
        help="with --compare: key=start:stop:step (or key=v1,v2) of any numeric "
        "scenario key, dotted (cluster.gpu_memory_utilization) or bare",
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="override a scenario key: key=value (repeatable)"),
]
ServeOpt = Annotated[
    str | None,
    typer.Option(
        "--serve",
        help="HOST:PORT: serve live /metrics per engine and "
        "LMCache pool on consecutive ports (0: any free ports)",
    ),
]
SpeedOpt = Annotated[
    float, typer.Option("--speed", help="with --serve: simulated seconds per second")
]
LoopOpt = Annotated[
    bool,
    typer.Option(
        "--loop",
        help="with --serve: repeat the workload every duration_s (fresh arrivals each "
        "loop, counters keep growing) until stopped, instead of serving the final values",
    ),
]
PortsFileOpt = Annotated[
    Path | None,
    typer.Option("--ports-file", help="with --serve: write the endpoints JSON here"),
]
TargetsFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--targets-file",
        help="with --serve: write a `kvscope collect --targets` file for the endpoints",
    ),
]
FileSdFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--file-sd-file",
        help="with --serve: write a Prometheus file_sd JSON file for the endpoints "
        "(`kvscope collect --file-sd` reads it too)",
    ),
]


@dataclass(frozen=True, slots=True)
class LiveFlags:
    """--serve HOST:PORT and the flags that go with it (planner.simulate.metrics_server)."""

    address: str
    speed: float = 1.0
    loop: bool = False
    ports_file: Path | None = None
    targets_file: Path | None = None
    file_sd_file: Path | None = None


def simulate_cmd(
    ctx: typer.Context,
    scenario_arg: ScenarioArg = None,
    *,
    list_bundled: ListOpt = False,
    as_json: JsonOpt = False,
    compare_modes: CompareOpt = None,
    sweep: SweepOpt = None,
    sets: SetOpt = None,
    serve: ServeOpt = None,
    speed: SpeedOpt = 1.0,
    loop: LoopOpt = False,
    ports_file: PortsFileOpt = None,
    targets_file: TargetsFileOpt = None,
    file_sd_file: FileSdFileOpt = None,
) -> None:
    """Simulate a vLLM (+ native offload / LMCache) cluster from a scenario file or a
    bundled scenario (a file path wins over a bundled name; --list prints them).

    Example: kvscope simulate shared_prefix --json
    Example: kvscope simulate shared_prefix
    --compare none,native,lmcache --sweep gpu_memory_utilization=0.3:0.9:0.1 --json
    Example: kvscope simulate shared_prefix
    --serve 127.0.0.1:9100 --speed 30 --ports-file ports.json
    Example (repeats demo's 4 simulated hours until stopped):
    kvscope simulate demo --serve 0.0.0.0:9100 --speed 4 --loop"""
    # start-up: the scenario reader (~50 ms) only when the command runs
    from planner.simulate.scenario import read_scenario_file

    if list_bundled:
        _list_bundled()
        return
    if scenario_arg is None:
        raise ConfigError(f"missing SCENARIO: a scenario YAML file or one of {_bundled()}")
    # open for the whole command: compare() re-reads relative paths (a trace) per run
    scenario = ctx.with_resource(scenario_file(scenario_arg))
    raw = _apply_sets(read_scenario_file(scenario), sets or [])
    if loop and serve is None:
        raise ConfigError(
            "--loop needs --serve HOST:PORT: it repeats a served simulation forever "
            "(a --json summary needs a run that ends)"
        )
    if serve is not None:  # live metrics: planner/simulate/metrics_server.py
        if compare_modes is not None or sweep is not None:
            raise ConfigError("--serve runs one scenario live; drop --compare/--sweep")
        live = LiveFlags(serve, speed, loop, ports_file, targets_file, file_sd_file)
        raise typer.Exit(_serve_live(raw, scenario, live))
    if compare_modes is None:
        if sweep is not None:
            raise ConfigError("--sweep needs --compare (the modes to sweep)")
        _run_one(raw, scenario, as_json)
    else:
        _run_compare(raw, scenario, compare_modes, sweep, as_json)


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_cmd)


def _list_bundled() -> None:
    """--list: one line per bundled scenario, its name and its file."""
    with bundled_directory() as directory:
        for name in bundled_names():
            typer.echo(f"{name:24}{directory / f'{name}.yaml'}")


def _serve_live(raw: dict[str, Any], scenario: Path, live: LiveFlags) -> int:
    """--serve: the scenario served live until stopped; the exit status."""
    # start-up: the simulator and its HTTP servers (~140 ms) only with --serve
    from planner.simulate.metrics_server import serve_scenario
    from planner.simulate.scenario import parse_scenario

    sc = parse_scenario(raw, where=str(scenario), base_dir=scenario.parent)
    return serve_scenario(sc, live.address, speed=live.speed, loop=live.loop,
                          ports_file=live.ports_file, targets_file=live.targets_file,
                          file_sd_file=live.file_sd_file)  # fmt: skip


def _run_one(raw: dict[str, Any], scenario: Path, as_json: bool) -> None:
    """One simulation of the scenario; its summary (or its JSON) on stdout."""
    # start-up: the simulator (~100 ms) only when the command runs
    from planner.simulate.cluster import Simulation
    from planner.simulate.scenario import parse_scenario

    sc = parse_scenario(raw, where=str(scenario), base_dir=scenario.parent)
    print(
        f"kvscope simulate: {sc.name}: {sc.cluster.num_engines} engines, {sc.duration_s:g} s …",
        file=sys.stderr,
    )
    result = Simulation(sc).run()
    payload = result.to_dict()
    if as_json:
        typer.echo(json.dumps(payload, indent=2))
    else:
        typer.echo(_summary_text(payload))


def _run_compare(
    raw: dict[str, Any], scenario: Path, compare_modes: str, sweep: str | None, as_json: bool
) -> None:
    """--compare (and --sweep): the modes side by side; the table (or the JSON) on stdout."""
    # start-up: the simulator (~100 ms) only when the command runs
    from planner.simulate.compare import compare, parse_modes, parse_sweep, render_table
    from planner.simulate.scenario import parse_scenario

    where = str(scenario)
    modes = parse_modes(compare_modes)
    sw = parse_sweep(sweep) if sweep else None
    parse_scenario(raw, where=where, base_dir=scenario.parent)  # fail fast on a bad file
    out = compare(raw, modes, sw, where=where, base_dir=scenario.parent)
    if as_json:
        typer.echo(json.dumps(out, indent=2))
    else:
        typer.echo(render_table(out), nl=False)
