"""`kvscope advise`: what-if advice without history (cost model + a short simulation)."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from core.errors import ConfigError


def advise_cmd(  # noqa: PLR0917 - one parameter per CLI flag
    model: Annotated[str | None, typer.Option("--model", help="e.g. llama-3.1-8b")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="e.g. h100")] = None,
    tp: Annotated[int | None, typer.Option("--tp", help="tensor-parallel GPUs/engine")] = None,
    prompt_tokens: Annotated[
        int | None, typer.Option("--prompt-tokens", help="prompt length, tokens")
    ] = None,
    output_tokens: Annotated[
        int | None, typer.Option("--output-tokens", help="output length, tokens")
    ] = None,
    qps: Annotated[float | None, typer.Option("--qps", help="requests/s, cluster")] = None,
    prefix_share: Annotated[
        float | None,
        typer.Option("--prefix-share", help="share of each prompt that is a shared prefix"),
    ] = None,
    engines: Annotated[int, typer.Option("--engines", help="vLLM engines")] = 1,
    prefix_tokens: Annotated[
        int | None,
        typer.Option("--prefix-tokens", help="distinct shared-prefix tokens (working set)"),
    ] = None,
    cpu_gb: Annotated[
        float | None, typer.Option("--cpu-gb", help="host DRAM per node for KV, GiB")
    ] = None,
    vllm_version: Annotated[
        str, typer.Option("--vllm-version", help="vLLM release the configs are for")
    ] = "0.33.0",
    duration: Annotated[
        float, typer.Option("--duration", help="simulated seconds per mode")
    ] = 300.0,
    seed: Annotated[int, typer.Option("--seed", help="simulation seed")] = 0,
    router: Annotated[
        str | None,
        typer.Option(
            "--router",
            help="round_robin (default), least_loaded, prefix_affinity or scorer (llm-d)",
        ),
    ] = None,
    scorer_weights: Annotated[
        str | None,
        typer.Option(
            "--scorer-weights",
            help="scorer router weights, e.g. prefix=3,kv=2,queue=2 (llm-d's defaults)",
        ),
    ] = None,
    compare_routers: Annotated[
        bool,
        typer.Option(
            "--compare-routers/--no-compare-routers",
            help="also answer under the other routers (shorter runs)",
        ),
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object on stdout")] = False,
    explain: Annotated[
        bool, typer.Option("--explain", help="print how the decider decides (DECIDER.md)")
    ] = False,
) -> None:
    """What-if: none / native / lmcache for a workload, without history.

    Example: kvscope advise --model llama-3.1-8b --gpu h100 --tp 1 --prompt-tokens 8000
    --output-tokens 256 --qps 8 --prefix-share 0.75 --engines 4 --prefix-tokens 120000 --json

    Example: kvscope advise --explain
    """
    if explain:
        # start-up: the planner (~50 ms) only when the command runs
        from planner.decide.decision import decider_doc

        typer.echo(decider_doc(), nl=False)
        return
    required = {
        "--model": model,
        "--gpu": gpu,
        "--tp": tp,
        "--prompt-tokens": prompt_tokens,
        "--output-tokens": output_tokens,
        "--qps": qps,
        "--prefix-share": prefix_share,
    }
    missing = [flag for flag, value in required.items() if value is None]
    if missing:
        raise ConfigError(f"missing {', '.join(missing)} (or use --explain)")
    assert model and gpu and tp is not None and prompt_tokens is not None
    assert output_tokens is not None and qps is not None and prefix_share is not None
    # start-up: the planner (numpy, pandas; ~0.8 s) only when the command runs
    from planner.advise.question import parse_scorer_weights
    from planner.advise.whatif import WhatIf, advise
    from planner.report.advise_text import advice_text

    whatif = WhatIf(
        model,
        gpu,
        tp,
        prompt_tokens,
        output_tokens,
        qps,
        prefix_share,
        engines,
        prefix_tokens,
        cpu_gb,
        vllm_version,
        duration,
        seed,
        router.strip().lower() if router is not None else None,
        parse_scorer_weights(scorer_weights) if scorer_weights is not None else None,
        compare_routers,
    )
    result = advise(whatif, progress=lambda msg: print(msg, file=sys.stderr))
    payload = result.to_dict()
    if as_json:
        typer.echo(json.dumps(payload, indent=2))
    else:
        typer.echo(advice_text(payload), nl=False)


def register(app: typer.Typer) -> None:
    app.command("advise")(advise_cmd)
