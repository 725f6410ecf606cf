"""`kvscope costmodel …`: re-read vs re-prefill, break-even per tier, what a shared prefix
saves, the hardware catalogue."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from planner.domain.hardware import GPU, Catalog, Model, Tier

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
# reread
TierOpt = Annotated[str, typer.Option("--tier", help="storage tier")]
TokensOpt = Annotated[int, typer.Option("--tokens", help="prompt tokens")]
MfuLowOpt = Annotated[
    float, typer.Option("--mfu-low", help="prefill MFU at the slow end of the re-prefill range")
]
MfuHighOpt = Annotated[
    float, typer.Option("--mfu-high", help="prefill MFU at the fast end of the re-prefill range")
]
# breakeven
MfuOpt = Annotated[float, typer.Option("--mfu", help="prefill MFU (0, 1]")]
PromptTokensOpt = Annotated[int, typer.Option("--prompt-tokens", help="for B*")]
# compare-tiers
CompareTokensOpt = Annotated[
    int, typer.Option("--tokens", help="prompt tokens whose KV is re-read or re-prefilled")
]
CompareTiersOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--tier",
        help="storage tier to read the KV from; repeat it or give a comma list "
        "(default: every tier in the catalogue)",
    ),
]
CompareKvOpt = Annotated[
    str,
    typer.Option("--kv-dtype", help="KV cache dtype: auto (the model's), bf16, fp8, or both"),
]
# savings
PrefixTokensOpt = Annotated[
    int,
    typer.Option(
        "--prefix-tokens", help="tokens of the shared prefix (system prompt) of every query"
    ),
]
QueriesPerHourOpt = Annotated[
    float, typer.Option("--queries-per-hour", help="the tenant's queries per hour with it")
]
ReloadTierOpt = Annotated[str, typer.Option("--tier", help="tier the prefix's KV is reloaded from")]
GpuHourUsdOpt = Annotated[
    float | None,
    typer.Option(
        "--gpu-hour-usd",
        help="price of one GPU-hour in USD; there is no default price: without it "
        "only GPU-seconds are reported",
    ),
]
SavingsMfuOpt = Annotated[
    float,
    typer.Option(
        "--mfu",
        help="prefill MFU in (0, 1]; the default is the cost model's assumption "
        "(40–60 % is a simulator default, not a measurement)",
    ),
]
HitProbabilityOpt = Annotated[
    float,
    typer.Option(
        "--hit-probability",
        help="probability a later query finds the prefix still cached (the default "
        "is an assumption: no eviction within the cache lifetime)",
    ),
]
CacheLifetimeOpt = Annotated[
    float,
    typer.Option(
        "--cache-lifetime-s",
        help="seconds the prefix stays cached before it is computed again (the "
        "default is an assumption)",
    ),
]


@dataclass(frozen=True, slots=True)
class SavingsQuestion:
    """The flags of `kvscope costmodel savings` but --catalog and --json (checked by
    planner.domain.payloads.savings_payload)."""

    model: str
    gpu: str
    prefix_tokens: int
    queries_per_hour: float
    tp: int = 1
    tier: str = "cpu-dram-pcie"
    gpu_hour_usd: float | None = None
    mfu: float = 0.5
    hit_probability: float = 1.0
    cache_lifetime_s: float = 3600.0
    kv_dtype: str = "auto"


def _emit(payload: dict[str, Any], text: str, as_json: bool) -> None:
    typer.echo(json.dumps(payload, indent=2) if as_json else text)


def _option_name(field: str) -> str:
    """The command-line option of an input of planner.domain.payloads ("tiers" -> "--tier")."""
    return "--tier" if field == "tiers" else "--" + field.replace("_", "-")


def _setup(catalog: Path | None, model: str, gpu: str, kv_dtype: str) -> tuple[Catalog, Model, GPU]:
    # start-up: the cost model (planner.domain, ~40 ms) only when a command runs
    from planner.domain import hardware

    cat = hardware.load_catalog(catalog)
    return cat, hardware.with_kv_dtype(cat.model(model), kv_dtype), cat.gpu(gpu)


def reread_cmd(
    *,
    model: ModelOpt = "llama-3.1-70b-fp8",
    gpu: GpuOpt = "h100",
    tp: TpOpt = 4,
    tier: TierOpt = "ceph-hdd",
    tokens: TokensOpt = 4096,
    kv_dtype: KvOpt = "auto",
    compression: CompressionOpt = 1.0,
    mfu_low: MfuLowOpt = 0.2,
    mfu_high: MfuHighOpt = 0.6,
    catalog: CatalogOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-read a prompt's KV from a tier or re-prefill it?

    Example: kvscope costmodel reread --model llama-3.1-70b-fp8 --gpu h100 --tp 4
    --tier ceph-hdd --tokens 4096 --kv-dtype fp8 --json
    """
    # start-up: the cost model (planner.domain, ~40 ms) only when the command runs
    from planner.domain.breakeven import case_note, reread_vs_reprefill

    cat, m, g = _setup(catalog, model, gpu, kv_dtype)
    t = cat.tier(tier)
    c = reread_vs_reprefill(
        m, g, tp, t, tokens, mfu_range=(mfu_low, mfu_high), compression=compression
    )
    payload = c.to_dict()
    note = case_note(m, g, tp, t, tokens)
    if note is not None:
        payload["note"] = note
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


def breakeven_cmd(
    *,
    model: ModelOpt = "llama-3.1-8b",
    gpu: GpuOpt = "h100",
    tp: TpOpt = 1,
    mfu: MfuOpt = 0.5,
    prompt_tokens: PromptTokensOpt = 4096,
    kv_dtype: KvOpt = "auto",
    compression: CompressionOpt = 1.0,
    catalog: CatalogOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """B* (break-even bandwidth) and the break-even context length for every tier.

    Example: kvscope costmodel breakeven --model llama-3.1-8b --gpu h100 --tp 1 --json
    """
    # start-up: the cost model (planner.domain, ~40 ms) only when the command runs
    from planner.domain.breakeven import breakeven_bandwidth
    from planner.domain.costmodel import kv_bytes_per_token_engine, prefill_seconds

    cat, m, g = _setup(catalog, model, gpu, kv_dtype)
    b_star = breakeven_bandwidth(m, g, tp, mfu=mfu, prompt_tokens=prompt_tokens)
    rows = _breakeven_rows(cat, m, g, tp, mfu=mfu, compression=compression, b_star=b_star)
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
    head = (
        f"{m.name} on {tp}× {g.name}, MFU {mfu:.0%}: B* = {b_star / 1e9:.3g} GB/s "
        f"at {prompt_tokens} tokens"
    )
    _emit(payload, _breakeven_text(head, rows), as_json)


def _breakeven_rows(
    cat: Catalog, m: Model, g: GPU, tp: int, *, mfu: float, compression: float, b_star: float
) -> list[dict[str, Any]]:
    """One row per tier of the catalogue: its effective read bandwidth against B*, its
    break-even context."""
    # start-up: the cost model (planner.domain, ~40 ms) only when the command runs
    from planner.domain.breakeven import breakeven_context

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
    return rows


def _breakeven_text(head: str, rows: list[dict[str, Any]]) -> str:
    """``head``, then a table of the tiers' rows."""
    lines = [head, f"{'tier':<24} {'GB/s':>8} {'×B*':>7}  break-even context"]
    for r in rows:
        where = {"always": "always reads", "never": "never (re-prefill)"}.get(
            str(r["regime"]), f">= {r['breakeven_context_tokens']} tokens"
        )
        lines.append(
            f"{r['tier']:<24} {r['effective_read_Bps'] / 1e9:>8.3g} "
            f"{r['ratio_to_b_star']:>7.3g}  {where}"
        )
    return "\n".join(lines)


def catalog_cmd(catalog: CatalogOpt = None, as_json: JsonOpt = False) -> None:
    """List the known GPUs, models and tiers with their sources.

    Example: kvscope costmodel catalog --json
    """
    # start-up: the cost model (planner.domain, ~40 ms) only when the command runs
    from planner.domain.hardware import load_catalog

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


def compare_tiers_cmd(
    *,
    model: ModelOpt,
    tokens: CompareTokensOpt,
    tier: CompareTiersOpt = None,
    gpu: GpuOpt = "h100",
    tp: TpOpt = 1,
    kv_dtype: CompareKvOpt = "auto",
    catalog: CatalogOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-read a prompt's KV from each tier, or re-prefill it? One row per KV dtype × tier.

    Example: kvscope costmodel compare-tiers --model llama-3.1-70b-fp8 --gpu h100 --tp 4
    --tokens 4096 --tier ceph-hdd --kv-dtype both
    """
    # start-up: the cost model (planner.domain, ~40 ms) only when the command runs
    from planner.domain.hardware import load_catalog
    from planner.domain.payloads import compare_tiers_payload

    names = [n.strip() for item in tier or [] for n in item.split(",") if n.strip()]
    payload = compare_tiers_payload(
        model=model,
        gpu=gpu,
        tp=tp,
        tokens=tokens,
        tiers=None if tier is None else names,
        kv_dtype=kv_dtype,
        catalog=load_catalog(catalog),
        label=_option_name,
    )
    _emit(payload, _compare_tiers_text(payload, tokens, tp), as_json)


def _compare_tiers_text(payload: dict[str, Any], tokens: int, tp: int) -> str:
    """The comparisons of ``payload`` (compare_tiers_payload) as a table, then its notes."""
    # start-up: the cost model (planner.domain, ~40 ms) only when the command runs
    from planner.domain.costmodel import LMCACHE_CHUNK_TOKENS

    rows = payload["comparisons"]
    width = max(len("tier"), *(len(c["tier"]) for c in rows))
    lines = [
        f"{payload['model']}, {tokens} tokens, re-prefill on {tp}× {payload['gpu']}: "
        "re-read the KV from a tier or re-prefill it?",
        f"{'KV':<5} {'B/token':>9} {'KV GB':>7}  {'tier':<{width}}  "
        f"{'read s':<15} {'re-prefill s':<15} verdict",
    ]
    for c in rows:
        read, prefill = c["read_seconds"], c["prefill_seconds"]
        read_s = f"{read['low']:.3g}–{read['high']:.3g}"
        prefill_s = f"{prefill['low']:.3g}–{prefill['high']:.3g}"
        lines.append(
            f"{c['kv_dtype']:<5} {c['kv_bytes_per_token']:>9,.0f} {c['kv_bytes'] / 1e9:>7.3g}  "
            f"{c['tier']:<{width}}  {read_s:<15} {prefill_s:<15} {c['verdict']}"
        )
    mfu = payload["mfu_range"]
    lines.append(
        "read s: the tier's best…worst bandwidth and per-object latency (catalogue), one "
        f"object per {LMCACHE_CHUNK_TOKENS}-token chunk; re-prefill s: {mfu['high']:.0%}…"
        f"{mfu['low']:.0%} MFU (cost model); the sources and assumptions of every row: --json"
    )
    if payload["note"]:
        lines.append(f"note: {payload['note']}")
    return "\n".join(lines)


def savings_cmd(
    *,
    model: ModelOpt,
    gpu: GpuOpt,
    prefix_tokens: PrefixTokensOpt,
    queries_per_hour: QueriesPerHourOpt,
    tp: TpOpt = 1,
    tier: ReloadTierOpt = "cpu-dram-pcie",
    gpu_hour_usd: GpuHourUsdOpt = None,
    mfu: SavingsMfuOpt = 0.5,
    hit_probability: HitProbabilityOpt = 1.0,
    cache_lifetime_s: CacheLifetimeOpt = 3600.0,
    kv_dtype: KvOpt = "auto",
    catalog: CatalogOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """What caching a tenant's shared prefix saves: GPU-seconds (and USD) per hour.

    Example: kvscope costmodel savings --model llama-3.1-70b --gpu h100 --tp 4
    --prefix-tokens 6000 --queries-per-hour 200
    """
    # start-up: the cost model (planner.domain, ~40 ms) only when the command runs
    from planner.domain.hardware import load_catalog
    from planner.domain.payloads import savings_payload

    q = SavingsQuestion(
        model=model, gpu=gpu, prefix_tokens=prefix_tokens, queries_per_hour=queries_per_hour,
        tp=tp, tier=tier, gpu_hour_usd=gpu_hour_usd, mfu=mfu, hit_probability=hit_probability,
        cache_lifetime_s=cache_lifetime_s, kv_dtype=kv_dtype,
    )  # fmt: skip
    cat = load_catalog(catalog)
    payload = savings_payload(
        model=q.model,
        gpu=q.gpu,
        tp=q.tp,
        tier=q.tier,
        kv_dtype=q.kv_dtype,
        prefix_tokens=q.prefix_tokens,
        queries_per_hour=q.queries_per_hour,
        gpu_hour_usd=q.gpu_hour_usd,
        mfu=q.mfu,
        hit_probability=q.hit_probability,
        cache_lifetime_s=q.cache_lifetime_s,
        catalog=cat,
        label=_option_name,
    )
    t = cat.tier(payload["tier"])  # its bandwidth and latency, for the text
    _emit(payload, savings_text(q, payload, t), as_json)


def savings_text(q: SavingsQuestion, payload: dict[str, Any], t: Tier) -> str:
    """The answer (savings_payload) to ``q`` in words, each figure with its formula; ``t``:
    the tier the KV is reloaded from."""
    # start-up: the cost model (planner.domain, ~40 ms) only when the command runs
    from planner.domain.costmodel import LMCACHE_CHUNK_TOKENS

    tp, mfu, prefix_tokens = q.tp, q.mfu, q.prefix_tokens
    kv_pt = payload["kv_bytes_per_token"]
    prefill, reload = payload["prefill_seconds"], payload["reload_seconds"]
    reuses, saved = payload["reuses_per_hour"], payload["saved_gpu_seconds_per_hour"]
    per_lifetime = q.queries_per_hour * q.cache_lifetime_s / 3600
    bandwidth = t.read_Bps * (tp if t.per_gpu else 1)
    per_gpu = f" ({tp} × {t.read_Bps / 1e9:.3g} GB/s, one link per GPU)" if t.per_gpu else ""
    usd = (
        "not priced (pass --gpu-hour-usd: kvscope has no default GPU price)"
        if payload["saved_usd_per_hour"] is None
        else f"{payload['saved_usd_per_hour']:.4g} USD/h = {saved:.4g} / "
        f"3600 × {q.gpu_hour_usd:g} USD per GPU-hour (--gpu-hour-usd)"
    )
    sources = payload["sources"]
    lines = [
        f"a {prefix_tokens}-token prefix shared by {q.queries_per_hour:g} queries/h of "
        f"{payload['model']} on {tp}× {payload['gpu']}, KV reloaded from {t.name}:",
        f"  re-prefill of the prefix   {prefill:.4g} s per query (cost model: "
        f"2·N·S + attention FLOPs at {mfu:.0%} MFU, engine otherwise idle)",
        f"  reload of its KV           {reload:.4g} s per query "
        f"({kv_pt * prefix_tokens / 1e9:.3g} GB = {prefix_tokens} × {kv_pt:,.0f} B/token "
        f"at {bandwidth / 1e9:.3g} GB/s{per_gpu} + {t.latency_s * 1e3:.3g} ms per "
        f"{LMCACHE_CHUNK_TOKENS}-token chunk: the tier's nominal figures)",
        f"  reuses per hour            {reuses:.4g} = ({per_lifetime:.4g} queries "
        f"per {q.cache_lifetime_s:g} s cache lifetime − the 1 that computes the prefix) × hit "
        f"probability {q.hit_probability:g} × {3600 / q.cache_lifetime_s:.4g} lifetimes/h",
        f"  saved GPU-seconds per hour {saved:.4g} = "
        f"{reuses:.4g} × ({prefill:.4g} − {reload:.4g}) s "
        f"× {tp} GPU(s) ({prefill - reload:.4g} s saved per reuse)",
        f"  saved USD per hour         {usd}",
        f"verdict: {payload['verdict']}",
        "sources:",
        f"  model {payload['model']}: {sources['model']}",
        f"  GPU {payload['gpu']}: {sources['gpu']}",
        f"  tier {t.name}: {sources['tier']}",
        "assumptions:",
        *(f"  - {a}" for a in payload["assumptions"]),
    ]
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    sub = typer.Typer(
        help="Analytic cost model: KV bytes, prefill time, tier transfer time, what a "
        "shared prefix saves."
    )
    app.add_typer(sub, name="costmodel")
    sub.command("reread")(reread_cmd)
    sub.command("breakeven")(breakeven_cmd)
    sub.command("catalog")(catalog_cmd)
    sub.command("compare-tiers")(compare_tiers_cmd)
    sub.command("savings")(savings_cmd)
