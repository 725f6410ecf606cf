"""The readable answer of `kvscope advise` (without --json), from ``Advice.to_dict()``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planner.report.plan_text import decision_lines

ROWS = (
    ("total_tokens_per_s", "throughput tok/s", "{:,.0f}"),
    ("throughput_gain", "gain vs none", "{:+.1%}"),
    ("ttft_mean_s", "TTFT mean s", "{:.3f}"),
    ("ttft_change", "TTFT change", "{:+.1%}"),
    ("prefill_compute_saved", "prefill compute saved", "{:.1%}"),
    ("preemptions", "preemptions", "{:,.0f}"),
    ("external_hit_rate", "external hit rate", "{:.1%}"),
    ("prefix_hit_rate", "GPU prefix hit rate", "{:.1%}"),
    ("kv_util_p95", "KV use p95", "{:.1%}"),
    ("completed_requests", "completed requests", "{:,.0f}"),
)


def _cell(value: object, fmt: str) -> str:
    return "-" if not isinstance(value, int | float) else fmt.format(value)


def _pct(value: object, fmt: str = "{:+.1%}") -> str:
    return _cell(value, fmt)


def band_lines(band: Mapping[str, Any]) -> list[str]:
    """What the simulated gains' band is: the simulator's largest in-sample miss on published
    rows (no coverage level), and how it fared with each publication held out."""
    lines = [
        f"  gain band: ±({band['absolute'] * 100:.1f} pp + {band['relative']:.0%} of |gain|), "
        f"the simulator's largest in-sample miss over {band['rows']} published throughput "
        f"changes ({band['row_set']}; {band['source']}); no coverage level: it covers those "
        "rows by construction",
    ]
    if band.get("loso_excess_pp") is None:
        held = (
            f"out-of-source: not checked, its {band['rows']} rows come from "
            f"{band['publications']} publication"
        )
    else:
        held = (
            "out-of-source: rebuilt without each publication's rows it left "
            f"{band['loso_rows_outside']} of {band['loso_rows']} held-out rows outside, by up to "
            f"{band['loso_excess_pp']:.1f} pp"
        )
    lines.append(f"  {held}; regime: {band.get('basis', band['regime'])}")
    return lines


def _band_cell(band: object) -> str:
    if not isinstance(band, Mapping):
        return "-"
    return f"{band['lo']:+.0%}..{band['hi']:+.0%}"


def router_lines(d: Mapping[str, Any]) -> list[str]:
    """Which router the answer assumed, and the headline under each router simulated."""
    r = d.get("router") or {}
    if not r:
        return []
    assumed = r["assumed"]
    how = "the default: --router not given" if r["default"] else "--router"
    if assumed == "scorer":
        w = r["scorer_weights"]
        how += "; weights " + ", ".join(f"{k}={v:g}" for k, v in w.items())
    lines = [f"Router assumed: {assumed} ({how})"]
    rows = r["rows"]
    if len(rows) > 1:
        lines.append(
            "  routing decides whether a prefix recurs on the engine holding it; the answer "
            f"under each router (others: <= {r['alternatives_max_requests']:,} requests per mode)"
        )
    lines.append(
        f"  {'router':17}{'recommended':>12}{'gain':>9}{'prefill saved':>15}"
        f"{'LMCache saved':>15}{'native saved':>14}{'GPU hit':>9}"
    )
    for row in rows:
        mark = " *" if row["router"] == assumed else ""
        lines.append(
            f"  {row['router'] + mark:17}{row['recommended']:>12}"
            f"{_pct(row['throughput_gain']):>9}"
            f"{_pct(row['prefill_compute_saved'], '{:.1%}'):>15}"
            f"{_pct(row['lmcache_prefill_compute_saved'], '{:.1%}'):>15}"
            f"{_pct(row['native_prefill_compute_saved'], '{:.1%}'):>14}"
            f"{_pct(row['gpu_prefix_hit_rate'], '{:.1%}'):>9}"
        )
    lines.append(
        "  * assumed; gain = simulated throughput gain of the recommended mode vs none "
        '("both" reads LMCache\'s run); saved = prefill compute saved'
    )
    return lines


def advice_text(d: Mapping[str, Any]) -> str:
    """Decision, simulated figures per mode, cost model, sizing, configs and notes."""
    i, c, sim = d["inputs"], d["cost_model"], d["simulated"]
    head = (
        f"kvscope advise: {c['model']} on {i['engines']} engine(s) of {i['tp']}× {c['gpu']}, "
        f"{i['prompt_tokens']}-token prompts ({i['prefix_share']:.0%} shared prefix), "
        f"{i['output_tokens']} output tokens, {i['qps']:g} req/s"
    )
    modes = list(sim["modes"])
    table = [
        f"Simulated (seed {i['seed']}, {d['scenario']['duration_s']:.0f} s, first "
        f"{d['scenario']['warmup_s']:.0f} s not measured)",
        *band_lines(sim["gain_band"]),
        f"  {'':24}" + "".join(f"{m:>14}" for m in modes),
    ]
    for key, label, fmt in ROWS:
        table.append(
            f"  {label:24}" + "".join(f"{_cell(sim['modes'][m].get(key), fmt):>14}" for m in modes)
        )
        if key == "throughput_gain":
            bands = [_band_cell(sim["modes"][m].get("throughput_gain_band")) for m in modes]
            table.append(f"  {'gain band':24}" + "".join(f"{b:>14}" for b in bands))
    table.append(f"  note: {sim['note']}")
    tiers = ", ".join(
        f"{t['tier']} " + (f"from {t['tokens']} tokens" if t["regime"] == "above" else t["regime"])
        for t in c["breakeven_context_by_tier"]
    )
    busy = c["prefill_busy_engines"]
    cost = [
        f"Cost model (MFU {c['mfu']:.0%}: {c['mfu_basis']})",
        f"  KV {c['kv_bytes_per_token']:,.0f} B/token; HBM KV {c['hbm_kv_tokens_per_engine']:,} "
        f"tokens ({c['hbm_kv_gib_per_engine']:.1f} GiB) per engine",
        f"  prefill: {c['prefill_seconds_prompt']:.3g} s per prompt, "
        f"{c['prefill_seconds_prefix']:.3g} s for the shared prefix; "
        f"B* {c['breakeven_bandwidth_Bps'] / 1e9:.3g} GB/s",
        f"  prefill keeps {busy['all_computed']:.2f} engines busy "
        f"({busy['prefix_cached']:.2f} with the prefix cached); decode not included",
        f"  reading beats re-prefill: {tiers}",
    ]
    sizing = d["sizing"]
    size_lines = ["Sizing"]
    if "error" in sizing:
        size_lines.append(f"  cannot size: {sizing['error']}")
    else:
        e = sizing.get("engines")
        if e:
            size_lines.append(
                f"  engines for HBM KV: {e['needed']} [{e['lo']}, {e['hi']}] "
                f"(peak {e['peak']:,.0f} {e['unit']} + {e['headroom']:.0%} headroom; compute "
                "not sized: see the prefill line above)"
            )
        if sizing.get("native_cpu_gib"):
            size_lines.append(f"  native CPU buffer: {sizing['native_cpu_gib']:.0f} GiB per engine")
        if sizing.get("l1_size_gib"):
            size_lines.append(
                f"  LMCache L1: {sizing['l1_size_gib']:.0f} GiB per node ({sizing['l1_basis']})"
            )
    size_lines.append("Configs" if d["configs"] else "Configs: none needed for this mode")
    size_lines += [f"  {name}: {cmd}" for name, cmd in d["configs"].items()]
    notes = ["Notes"] + [f"  - {n}" for n in d["notes"]]
    blocks = [[head], decision_lines(d), router_lines(d), table, cost, size_lines, notes]
    blocks = [b for b in blocks if b]
    return "\n\n".join("\n".join(b) for b in blocks) + "\n"
