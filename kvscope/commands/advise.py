"""`kvscope advise`: what-if advice without history (cost model + a short simulation)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from core.errors import ConfigError

if TYPE_CHECKING:
    from planner.advise.question import WhatIf

ModelOpt = Annotated[str | None, typer.Option("--model", help="e.g. llama-3.1-8b")]
GpuOpt = Annotated[str | None, typer.Option("--gpu", help="e.g. h100")]
TpOpt = Annotated[int | None, typer.Option("--tp", help="tensor-parallel GPUs/engine")]
PromptTokensOpt = Annotated[
    int | None, typer.Option("--prompt-tokens", help="prompt length, tokens")
]
OutputTokensOpt = Annotated[
    int | None, typer.Option("--output-tokens", help="output length, tokens")
]
QpsOpt = Annotated[float | None, typer.Option("--qps", help="requests/s, cluster")]
PrefixShareOpt = Annotated[
    float | None,
    typer.Option("--prefix-share", help="share of each prompt that is a shared prefix"),
]
EnginesOpt = Annotated[int, typer.Option("--engines", help="vLLM engines")]
PrefixTokensOpt = Annotated[
    int | None,
    typer.Option("--prefix-tokens", help="distinct shared-prefix tokens (working set)"),
]
CpuGbOpt = Annotated[float | None, typer.Option("--cpu-gb", help="host DRAM per node for KV, GiB")]
VllmVersionOpt = Annotated[
    str, typer.Option("--vllm-version", help="vLLM release the configs are for")
]
DurationOpt = Annotated[float, typer.Option("--duration", help="simulated seconds per mode")]
SeedOpt = Annotated[int, typer.Option("--seed", help="simulation seed")]
RouterOpt = Annotated[
    str | None,
    typer.Option(
        "--router",
        help="round_robin (default), least_loaded, prefix_affinity or scorer (llm-d)",
    ),
]
ScorerWeightsOpt = Annotated[
    str | None,
    typer.Option(
        "--scorer-weights",
        help="scorer router weights, e.g. prefix=3,kv=2,queue=2 (llm-d's defaults)",
    ),
]
CompareRoutersOpt = Annotated[
    bool,
    typer.Option(
        "--compare-routers/--no-compare-routers",
        help="also answer under the other routers (shorter runs)",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="one JSON object on stdout")]
ExplainOpt = Annotated[
    bool, typer.Option("--explain", help="print how the decider decides (DECIDER.md)")
]


def advise_cmd(  # noqa: PLR0917 - one parameter per CLI flag
    model: ModelOpt = None,
    gpu: GpuOpt = None,
    tp: TpOpt = None,
    prompt_tokens: PromptTokensOpt = None,
    output_tokens: OutputTokensOpt = None,
    qps: QpsOpt = None,
    prefix_share: PrefixShareOpt = None,
    engines: EnginesOpt = 1,
    prefix_tokens: PrefixTokensOpt = None,
    cpu_gb: CpuGbOpt = None,
    vllm_version: VllmVersionOpt = "0.33.0",
    duration: DurationOpt = 300.0,
    seed: SeedOpt = 0,
    router: RouterOpt = None,
    scorer_weights: ScorerWeightsOpt = None,
    compare_routers: CompareRoutersOpt = True,
    as_json: JsonOpt = False,
    explain: ExplainOpt = False,
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
    from planner.advise.whatif import WhatIf

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
    run_advise(whatif, as_json)


def register(app: typer.Typer) -> None:
    app.command("advise")(advise_cmd)


def run_advise(whatif: WhatIf, as_json: bool) -> None:
    """Answer ``whatif`` (progress on stderr); the advice (or its JSON) on stdout."""
    # start-up: the planner (numpy, pandas; ~0.8 s) only when the command runs
    from planner.advise.whatif import advise
    from planner.report.advise_text import advice_text

    result = advise(whatif, progress=lambda msg: print(msg, file=sys.stderr))
    payload = result.to_dict()
    if as_json:
        typer.echo(json.dumps(payload, indent=2))
    else:
        typer.echo(advice_text(payload), nl=False)
