"""`kvscope costmodel …`: re-read vs re-prefill, break-even per tier, the hardware catalogue."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

CatalogOpt = Annotated[
    Path | None,
    typer.Option("--catalog", help="YAML file adding or overriding GPUs / models / tiers"),
]
ModelOpt = Annotated[str, typer.Option("--model", help="model name, e.g. llama-3.1-70b-fp8")]
GpuOpt = Annotated[str, typer.Option("--gpu", help="GPU name, e.g. h100")]
TpOpt = Annotated[int, typer.Option("--tp", help="tensor-parallel GPUs per engine")]
KvOpt = Annotated[
    str, typer.Option("--kv-dtype", help="KV cache dtype: auto (the model's), bf16 or fp8")
]
CompressionOpt = Annotated[
    float, typer.Option("--compression", help="KV compression ratio (CacheGen: 3.5–4.3)")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable JSON on stdout")]


def _emit(payload: dict[str, Any], text: str, as_json: bool) -> None:
    typer.echo(json.dumps(payload, indent=2) if as_json else text)


def _setup(catalog: Path | None, model: str, gpu: str, kv_dtype: str) -> tuple[Any, Any, Any]:
    from planner.model import hardware

    cat = hardware.load_catalog(catalog)
    return cat, hardware.with_kv_dtype(cat.model(model), kv_dtype), cat.gpu(gpu)


def register(app: typer.Typer) -> None:
    sub = typer.Typer(help="Analytic cost model: KV bytes, prefill time, tier transfer time.")
    app.add_typer(sub, name="costmodel")

    @sub.command("reread")
    def reread_cmd(
        *,
        model: ModelOpt = "llama-3.1-70b-fp8",
        gpu: GpuOpt = "h100",
        tp: TpOpt = 4,
        tier: Annotated[str, typer.Option("--tier", help="storage tier")] = "ceph-hdd",
        tokens: Annotated[int, typer.Option("--tokens", help="prompt tokens")] = 4096,
        kv_dtype: KvOpt = "auto",
        compression: CompressionOpt = 1.0,
        mfu_low: Annotated[float, typer.Option("--mfu-low")] = 0.2,
        mfu_high: Annotated[float, typer.Option("--mfu-high")] = 0.6,
        catalog: CatalogOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Re-read a prompt's KV from a tier or re-prefill it?

        Example: kvscope costmodel reread --model llama-3.1-70b-fp8 --gpu h100 --tp 4
        --tier ceph-hdd --tokens 4096 --kv-dtype fp8 --json
        """
        from planner.model.breakeven import SEED_EXERCISE_NOTE, reread_vs_reprefill

        cat, m, g = _setup(catalog, model, gpu, kv_dtype)
        c = reread_vs_reprefill(
            m, g, tp, cat.tier(tier), tokens, mfu_range=(mfu_low, mfu_high), compression=compression
        )
        payload = c.to_dict()
        if m.name.startswith("llama-3.1-70b") and tokens == 4096 and "ceph-hdd" in tier.lower():
            payload["seed_exercise_note"] = SEED_EXERCISE_NOTE
        text = (
            f"{c.tokens} tokens of {c.model} KV = {c.kv_bytes / 1e9:.3g} GB "
            f"({c.kv_bytes_per_token:,.0f} B/token, compression {c.compression:g}×)\n"
            f"read from {c.tier}: {c.read_seconds_low:.3g}–{c.read_seconds_high:.3g} s\n"
            f"re-prefill on {c.tp}× {c.gpu}: "
            f"{c.prefill_seconds_low:.3g}–{c.prefill_seconds_high:.3g} s\n"
            f"verdict: {c.verdict} — {c.explanation}\nassumptions:\n"
            + "\n".join(f"  - {a}" for a in c.assumptions)
        )
        _emit(payload, text, as_json)

    @sub.command("breakeven")
    def breakeven_cmd(
        *,
        model: ModelOpt = "llama-3.1-8b",
        gpu: GpuOpt = "h100",
        tp: TpOpt = 1,
        mfu: Annotated[float, typer.Option("--mfu", help="prefill MFU (0, 1]")] = 0.5,
        prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", help="for B*")] = 4096,
        kv_dtype: KvOpt = "auto",
        compression: CompressionOpt = 1.0,
        catalog: CatalogOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """B* (break-even bandwidth) and the break-even context length for every tier.

        Example: kvscope costmodel breakeven --model llama-3.1-8b --gpu h100 --tp 1 --json
        """
        from planner.model.breakeven import breakeven_bandwidth, breakeven_context
        from planner.model.costmodel import kv_bytes_per_token_engine, prefill_seconds

        cat, m, g = _setup(catalog, model, gpu, kv_dtype)
        b_star = breakeven_bandwidth(m, g, tp, mfu=mfu, prompt_tokens=prompt_tokens)
        rows = []
        for t in cat.tiers.values():
            ctx = breakeven_context(m, g, tp, t, mfu=mfu, compression=compression)
            effective = t.read_Bps * compression * (tp if t.per_gpu else 1)
            rows.append(
                {
                    "tier": t.name,
                    "effective_read_Bps": effective,
                    "ratio_to_b_star": effective / b_star,
                    "breakeven_context_tokens": ctx.tokens,
                    "regime": ctx.regime,
                    "explanation": ctx.explanation,
                    "source": t.source,
                }
            )
        payload = {
            "model": m.name,
            "gpu": g.name,
            "tp": tp,
            "mfu": mfu,
            "compression_ratio": compression,
            "kv_bytes_per_token": kv_bytes_per_token_engine(m),
            "prompt_tokens": prompt_tokens,
            "prefill_seconds": prefill_seconds(m, g, tp, prompt_tokens, mfu=mfu),
            "b_star_Bps": b_star,
            "tiers": rows,
            "assumptions": [
                "B* = KV bytes of the prompt / its prefill seconds on an idle engine",
                "break-even context uses each tier's nominal bandwidth and per-object latency, "
                "one object per 256-token LMCache chunk, no load/compute overlap",
                f"model: {m.source}",
                f"GPU: {g.source}",
            ],
        }
        lines = [
            f"{m.name} on {tp}× {g.name}, MFU {mfu:.0%}: B* = {b_star / 1e9:.3g} GB/s "
            f"at {prompt_tokens} tokens",
            f"{'tier':<24} {'GB/s':>8} {'×B*':>7}  break-even context",
        ]
        for r in rows:
            where = {"always": "always reads", "never": "never (re-prefill)"}.get(
                str(r["regime"]), f">= {r['breakeven_context_tokens']} tokens"
            )
            lines.append(
                f"{r['tier']:<24} {r['effective_read_Bps'] / 1e9:>8.3g} "
                f"{r['ratio_to_b_star']:>7.3g}  {where}"
            )
        _emit(payload, "\n".join(lines), as_json)

    @sub.command("catalog")
    def catalog_cmd(catalog: CatalogOpt = None, as_json: JsonOpt = False) -> None:
        """List the known GPUs, models and tiers with their sources.

        Example: kvscope costmodel catalog --json
        """
        from dataclasses import asdict

        from planner.model.hardware import load_catalog

        cat = load_catalog(catalog)
        payload = {
            "units": {
                "hbm_bytes": "B",
                "*_Bps": "bytes/s",
                "*_flops": "FLOP/s (dense)",
                "latency_s": "s per object",
            },
            "gpus": [asdict(g) for g in cat.gpus.values()],
            "models": [asdict(m) for m in cat.models.values()],
            "tiers": [asdict(t) for t in cat.tiers.values()],
            "aliases": dict(sorted(cat.aliases.items())),
        }
        lines = ["GPUs:"]
        lines += [f"  {g.name}: {g.source}" for g in cat.gpus.values()]
        lines += ["models:"] + [f"  {m.name}: {m.source}" for m in cat.models.values()]
        lines += ["tiers:"] + [f"  {t.name}: {t.source}" for t in cat.tiers.values()]
        _emit(payload, "\n".join(lines), as_json)

    @sub.command("seed-exercise")
    def seed_cmd(catalog: CatalogOpt = None, as_json: JsonOpt = False) -> None:
        """The seed's 'LMCache on HDD Ceph, 70B FP8, 4 K tokens' exercise, both KV dtypes.

        Example: kvscope costmodel seed-exercise --json
        """
        from planner.model.breakeven import SEED_EXERCISE_NOTE, seed_exercise
        from planner.model.hardware import load_catalog

        result = seed_exercise(load_catalog(catalog))
        payload = {
            "note": SEED_EXERCISE_NOTE,
            "kv_dtype": {k: c.to_dict() for k, c in result.items()},
        }
        text = (
            SEED_EXERCISE_NOTE
            + "\n"
            + "\n".join(
                f"{k} KV: {c.kv_bytes / 1e9:.3g} GB, read {c.read_seconds_low:.3g}–"
                f"{c.read_seconds_high:.3g} s vs re-prefill {c.prefill_seconds_low:.3g}–"
                f"{c.prefill_seconds_high:.3g} s → {c.verdict}"
                for k, c in result.items()
            )
        )
        _emit(payload, text, as_json)
