"""What is happening in a cluster: the plain statistics of `kvscope plan` (no model, no fit).

Every figure comes with what it rests on (``basis``) and how many windows or events it
counts, so a reader can tell a measurement over a day of 40 engines from one over ten
minutes of one. Quantiles are over *windows* (one per engine and rollup window); ratios are
pooled over the whole period (Σ numerator / Σ denominator), never averages of ratios.

:func:`observe` returns the ``happening`` section of the plan and the Evidence fields that
follow from it (planner/decide/evidence.py says where each field comes from).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from core import catalog
from core.catalog import DERIVED_RATIOS
from core.records import Window
from planner.decide.evidence import Evidence
from planner.domain.values import finite
from planner.frames.groups import text_values
from planner.frames.table import WindowTable, names, seq_sum, weighted_median_array
from planner.plan.needed import (
    LMCACHE_HEALTHY,
    PROMPT_HIST,
    PROMPT_TOKENS,
    RECOMPUTED,
)

if TYPE_CHECKING:
    import numpy.typing as npt
    import pandas as pd

    FloatArray = npt.NDArray[np.float64]
    Windows = Sequence[Window] | pd.DataFrame | WindowTable

_RATIO_OF = {ratio: (num, den) for ratio, num, den in DERIVED_RATIOS}
OFFLOAD_MODES = ("none", "native", "lmcache")


@dataclass(frozen=True, slots=True)
class Observed:
    """The Evidence fields that what is happening fills (planner/decide/evidence.py says
    what each means); None = the windows could not tell."""

    kv_util_p50: float | None
    kv_util_p95: float | None
    preemptions_per_1k: float | None
    reprefill_share: float | None
    prefix_hit_ratio: float | None
    external_hit_ratio: float | None
    current_mode: str | None
    prompt_tokens_mean: float | None
    prompt_tokens_p90: float | None
    prompt_tokens_p90_censored: bool
    lmcache_healthy: bool | None
    engines: int | None

    def apply(self, ev: Evidence) -> Evidence:
        """``ev`` with the fields what is happening fills."""
        return replace(
            ev,
            kv_util_p50=self.kv_util_p50,
            kv_util_p95=self.kv_util_p95,
            preemptions_per_1k=self.preemptions_per_1k,
            reprefill_share=self.reprefill_share,
            prefix_hit_ratio=self.prefix_hit_ratio,
            external_hit_ratio=self.external_hit_ratio,
            current_mode=self.current_mode,
            prompt_tokens_mean=self.prompt_tokens_mean,
            prompt_tokens_p90=self.prompt_tokens_p90,
            prompt_tokens_p90_censored=self.prompt_tokens_p90_censored,
            lmcache_healthy=self.lmcache_healthy,
            engines=self.engines,
        )


def _share(x: float | None) -> float | None:
    """A share clamped to [0, 1]: a counter glitch must not push it past 1."""
    return None if x is None else min(max(float(x), 0.0), 1.0)


def quantiles(values: Iterable[float], qs: Sequence[float]) -> list[float | None]:
    """Quantiles of the finite values (None each when there is none)."""
    if isinstance(values, np.ndarray) and values.dtype == np.float64:
        arr = values[np.isfinite(values)]  # the same values, without a Python loop
    else:
        arr = np.asarray([v for v in values if finite(v) is not None], dtype=float)
    if arr.size == 0:
        return [None] * len(qs)
    return [float(v) for v in np.quantile(arr, qs)]


def weighted_median(
    values: Sequence[float] | FloatArray, weights: Sequence[float] | FloatArray
) -> float | None:
    """The value at half the total weight (finite values with weight > 0 only)."""
    if isinstance(values, np.ndarray) and isinstance(weights, np.ndarray):
        return weighted_median_array(values.astype(float), weights.astype(float))
    pairs = sorted(
        (v, w)
        for v, w in zip(values, weights, strict=True)
        if finite(v) is not None and (w or 0) > 0
    )
    total = sum(w for _, w in pairs)
    if not pairs or total <= 0:
        return None
    run = 0.0
    for v, w in pairs:
        run += w
        if run >= total / 2:
            return float(v)
    return float(pairs[-1][0])


def pooled_ratio(
    windows: Windows, ratio: str, sources: Iterable[str] | None = None
) -> tuple[float | None, float]:
    """(Σ Δnumerator / Σ Δdenominator, Σ Δdenominator) over the windows of ``sources``.

    The counters are used when present (exact); else the derived ratio windows, weighted by
    their denominator delta. (None, 0) when nothing was queried.
    """
    t = WindowTable.of(windows)
    num_sig, den_sig = _RATIO_OF[ratio]
    sums = []
    for signal in (num_sig, den_sig):
        delta = t.values(signal, "delta", t.rows(signal, sources))
        sums.append(seq_sum(delta[np.isfinite(delta)]))
    if sums[1] > 0:
        return sums[0] / sums[1], sums[1]
    rows = t.rows(ratio, sources)
    mean, delta = t.values(ratio, "mean", rows), t.values(ratio, "delta", rows)
    keep = np.isfinite(mean) & (delta > 0)
    den = seq_sum(delta[keep])
    if den > 0:
        return seq_sum(mean[keep] * delta[keep]) / den, den
    return None, 0.0


def reprefill_share(windows: Windows) -> tuple[float | None, str]:
    """Recomputed prompt tokens / prompt tokens on the sources that report recomputation."""
    t = WindowTable.of(windows)

    def counted(signal: str) -> tuple[FloatArray, npt.NDArray[np.object_]]:
        """Per window the counter's increase (a counter without delta: rate × length) and
        its source, windows without either left out."""
        delta, rate = t.values(signal, "delta"), t.values(signal, "rate")
        with np.errstate(invalid="ignore", over="ignore"):
            from_rate = np.where(np.isnan(rate), 0.0, rate) * t.values(signal, "length_s")
        d = np.where(np.isnan(delta), from_rate, delta)
        keep = np.isfinite(d)
        names = np.asarray([*t.names(signal), ""], dtype=object)
        return d[keep], names[t.codes(signal, "source")[keep]]

    recomputed: list[float] = []
    den = 0.0
    if t.part(RECOMPUTED) is not None:
        d_rec, src_rec = counted(RECOMPUTED)
        d_all, src_all = counted(PROMPT_TOKENS)
        _, first = np.unique(src_rec, return_index=True)
        for source in src_rec[np.sort(first)].tolist():  # in order of first appearance
            recomputed.append(seq_sum(d_rec[src_rec == source]))
            den += seq_sum(d_all[src_all == source])
    family = catalog.SIGNALS[RECOMPUTED].exported  # the vendor name lives in the catalogue
    if not recomputed or den <= 0:
        return None, (
            f"not derivable: needs {family} (exposed by vLLM 0.16–0.19 only) beside the "
            "prompt-token counter"
        )
    share = min(max(sum(recomputed) / den, 0.0), 1.0)
    return share, (
        f"Σ recomputed / Σ prompt tokens over {len(recomputed)} source(s) reporting {family}"
    )


def lmcache_health(windows: Windows) -> bool | None:
    """False when any LMCache healthy gauge ended below 0.5; None when none is exposed."""
    t = WindowTable.of(windows)
    last, mean = t.values(LMCACHE_HEALTHY, "last"), t.values(LMCACHE_HEALTHY, "mean")
    value = np.where(np.isnan(last), mean, last)
    rows = np.flatnonzero(np.isfinite(value))
    value = value[rows]
    if rows.size == 0:
        return None
    labels = t.codes(LMCACHE_HEALTHY, "labels")
    series = t.codes(LMCACHE_HEALTHY, "source", rows) * (int(labels.max()) + 2) + labels[rows]
    # Per series its latest window; of equal starts the later row (a loop keeping >=).
    start = t.values(LMCACHE_HEALTHY, "start", rows)
    order = np.lexsort((np.arange(rows.size), start, series))
    ends = np.flatnonzero(np.diff(series[order], append=-1) != 0)
    return bool((value[order][ends] >= 0.5).all())


def _engine_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of vLLM engines (a KV-utilization or token figure), not LMCache-only sources."""
    has = frame["kv_util"].notna() | frame["tokens_per_s"].notna()
    return frame[has]


def current_mode(modes: Mapping[str, str]) -> tuple[str | None, str]:
    """The deployed offload mode from the engines' modes, and how it was read."""
    seen = {m for m in modes.values() if m in OFFLOAD_MODES}
    if not seen:
        return None, "no engine has a known offload mode (register engines with their offload)"
    offload = seen - {"none"}
    if len(offload) > 1:
        return None, (
            f"engines run {', '.join(sorted(seen))}: a mixed deployment, not 'both' on one "
            "engine; the deployed-connector rule (R6) is not applied"
        )
    mode = offload.pop() if offload else "none"
    note = "every engine" if len(seen) == 1 else f"the {mode} engines (others run none)"
    return mode, f"{mode}: from engine metadata of {note}"


_SUMMARY_COLUMNS = ("source", "engine", "kv_util", "preemptions", "requests", "tokens_per_s")


def _mode_summary(rows: pd.DataFrame, windows: WindowTable, sources: set[str]) -> dict[str, Any]:
    """One mode's KV use, preemptions, throughput and hit ratios (``rows``: its windows,
    the _SUMMARY_COLUMNS at least)."""
    p50, p95 = quantiles(rows["kv_util"].to_numpy(dtype=float), [0.5, 0.95])
    pre = float(np.nansum(rows["preemptions"].to_numpy(dtype=float)))
    req = float(np.nansum(rows["requests"].to_numpy(dtype=float)))
    per_engine = rows.groupby(["source", "engine"])["tokens_per_s"].mean()
    return {
        "engines": len(per_engine),
        "windows": len(rows),
        "kv_util_p50": p50,
        "kv_util_p95": p95,
        "tokens_per_s_per_engine": finite(per_engine.mean()) if len(per_engine) else None,
        "preemptions_per_1k_requests": 1000 * pre / req if req > 0 else None,
        "prefix_hit_ratio": pooled_ratio(windows, "prefix_cache_hit_ratio", sources)[0],
        "external_hit_ratio": pooled_ratio(windows, "external_prefix_cache_hit_ratio", sources)[0],
        "lmcache_hit_ratio": pooled_ratio(windows, "lmcache_hit_ratio", sources)[0],
    }


def observe(
    frame: pd.DataFrame, windows: Windows, modes: Mapping[str, str]
) -> tuple[dict[str, Any], Observed]:
    """(``happening`` section, the Evidence fields it fills) from the frame and the raw windows.

    ``windows``: Window records or their table (planner/frames/table.py); ``modes`` maps a
    source to its offload mode (engine metadata).
    """
    windows = WindowTable.of(windows)
    rows = _engine_rows(frame)
    out: dict[str, Any] = {}
    out["kv_util"] = _kv_util(rows)
    p50, p95 = out["kv_util"]["p50"], out["kv_util"]["p95"]
    out["preemptions"] = _preemptions(rows)
    per_1k = out["preemptions"]["per_1k_requests"]
    share, why = reprefill_share(windows)
    out["reprefill_share"] = {"value": share, "basis": why}
    mode, mode_basis = current_mode(modes)
    out["hit_ratios"], ext = _hit_ratios(windows, modes, mode)
    hits = out["hit_ratios"]
    out["current_mode"] = {"mode": mode, "basis": mode_basis}
    out["ttft"] = _ttft(rows)
    out["tokens_per_s"] = _tokens_per_s(rows)
    out["prompt_tokens"] = _prompt_tokens(windows)
    prompt_mean, prompt_p90 = out["prompt_tokens"]["mean"], out["prompt_tokens"]["p90"]
    censored = out["prompt_tokens"]["p90_censored"]
    out["by_mode"] = _by_mode(rows, windows, modes)
    healthy = lmcache_health(windows)
    out["lmcache_healthy"] = healthy
    evidence = Observed(
        kv_util_p50=_share(p50),
        kv_util_p95=_share(p95),
        preemptions_per_1k=per_1k,
        reprefill_share=_share(share),
        prefix_hit_ratio=_share(hits["prefix"]["ratio"]),
        external_hit_ratio=_share(ext),
        current_mode=mode,
        prompt_tokens_mean=prompt_mean,
        prompt_tokens_p90=prompt_p90,
        prompt_tokens_p90_censored=censored,
        lmcache_healthy=healthy,
        engines=len(rows.groupby(["source", "engine"])) or None,
    )
    return out, evidence


def _kv_util(rows: pd.DataFrame) -> dict[str, Any]:
    """Quantiles of the engines' window-mean KV use, and the largest in-window maximum."""
    p50, p95 = quantiles(rows["kv_util"].to_numpy(dtype=float), [0.5, 0.95])
    kv_max = finite(np.nanmax(rows["kv_util_max"].to_numpy(dtype=float))) if len(rows) else None
    n_kv = int(rows["kv_util"].notna().sum())
    return {
        "p50": p50,
        "p95": p95,
        "max": kv_max,
        "windows": n_kv,
        "basis": "quantiles of per-engine window means of kv_cache_usage_ratio; max = the "
        "largest in-window maximum",
    }


def _preemptions(rows: pd.DataFrame) -> dict[str, Any]:
    """Preemptions per 1000 finished requests (TTFT observations when none are counted)."""
    pre = float(np.nansum(rows["preemptions"].to_numpy(dtype=float)))
    req = float(np.nansum(rows["requests"].to_numpy(dtype=float)))
    counted = "finished requests (request_success_total)"
    if req <= 0:
        req = float(np.nansum(rows["ttft_count"].to_numpy(dtype=float)))
        counted = "TTFT observations (no request_success_total): requests that got a token"
    per_1k = 1000.0 * pre / req if req > 0 and rows["preemptions"].notna().any() else None
    return {
        "per_1k_requests": per_1k,
        "preemptions": pre,
        "requests": req,
        "basis": f"Σ preemptions / Σ {counted} × 1000",
    }


def _hit_ratios(
    windows: WindowTable, modes: Mapping[str, str], mode: str | None
) -> tuple[dict[str, Any], float | None]:
    """(pooled hit ratios, the external one on the engines of the deployed ``mode`` if any,
    else over all)."""
    deployed = {s for s, m in modes.items() if m == mode} if mode not in (None, "none") else None
    hits: dict[str, Any] = {}
    for key, ratio in (
        ("prefix", "prefix_cache_hit_ratio"),
        ("external", "external_prefix_cache_hit_ratio"),
        ("lmcache", "lmcache_hit_ratio"),
    ):
        value, weight = pooled_ratio(windows, ratio)
        hits[key] = {"ratio": value, "queried_tokens": weight}
    hits["basis"] = "pooled over the period: Σ hit tokens / Σ queried tokens"
    ext = hits["external"]["ratio"]
    if deployed is not None:
        ext = pooled_ratio(windows, "external_prefix_cache_hit_ratio", deployed)[0]
        hits["external_deployed"] = {"ratio": ext, "engines_mode": mode}
    return hits, ext


def _ttft(rows: pd.DataFrame) -> dict[str, Any]:
    """Request-weighted median of the windows' TTFT p90s, the worst one, and the mean."""
    counts = rows["ttft_count"].to_numpy(dtype=float)
    tsum = float(np.nansum(rows["ttft_mean_s"].to_numpy(dtype=float) * counts))
    return {
        "p90_s": weighted_median(rows["ttft_p90_s"].to_numpy(dtype=float), np.nan_to_num(counts)),
        "worst_window_p90_s": quantiles(rows["ttft_p90_s"].to_numpy(dtype=float), [1.0])[0],
        "mean_s": tsum / float(np.nansum(counts)) if np.nansum(counts) > 0 else None,
        "requests": float(np.nansum(counts)),
        "basis": "p90: request-weighted median of the windows' histogram p90s (approximation); "
        "mean: Σ TTFT sum / Σ count",
    }


def _tokens_per_s(rows: pd.DataFrame) -> dict[str, Any]:
    """The cluster's token rate (summed over engines per window start): mean, p50, p95."""
    cluster_tps = rows.groupby("start")["tokens_per_s"].sum(min_count=1).dropna()
    mean_tps, p95_tps = quantiles(cluster_tps.to_numpy(dtype=float), [0.5, 0.95])
    return {
        "cluster_mean": finite(cluster_tps.mean()) if len(cluster_tps) else None,
        "cluster_p50": mean_tps,
        "cluster_p95": p95_tps,
        "basis": "prompt + generation token rates summed over engines per window start",
    }


def _prompt_tokens(windows: WindowTable) -> dict[str, Any]:
    """Mean and p90 prompt length from the request_prompt_tokens histogram."""
    prompt_mean, prompt_p90, censored = prompt_lengths(windows)
    return {
        "mean": prompt_mean,
        "p90": prompt_p90,
        "p90_censored": censored,
        "basis": "request_prompt_tokens histogram: mean = Σ sum / Σ count (exact); p90 = "
        "request-weighted median of the windows' p90s (approximation)"
        + (
            "; censored: the p90 lies in the +Inf bucket of the median windows, so it is only "
            "known as >= the top finite bucket bound (vLLM's buckets end below max_model_len)"
            if censored
            else ""
        ),
    }


def _by_mode(rows: pd.DataFrame, windows: WindowTable, modes: Mapping[str, str]) -> dict[str, Any]:
    """The summary per offload mode (:func:`_mode_summary`)."""
    by_mode: dict[str, Any] = {}
    # LMCache servers scraped as their own targets have no engine rows: their hit counters
    # belong to the lmcache mode.
    signals = set(windows.summary["signal"])
    servers = windows.sources_of(s for s in signals if str(s).startswith("lmcache_"))
    servers -= names(rows["source"])
    mode_of = text_values(rows["offload_mode"])
    for m in sorted(names(rows["offload_mode"])):
        sub = rows.loc[mode_of == m, list(_SUMMARY_COLUMNS)]  # what _mode_summary reads
        sources = names(sub["source"]) | {s for s, mm in modes.items() if mm == m}
        if m == "lmcache":
            sources |= servers
        by_mode[m] = _mode_summary(sub, windows, sources)
    return by_mode


def p90_censored(w: Window) -> bool:
    """True when the window's p90 lies in the +Inf bucket: PromQL's histogram_quantile then
    returns the highest finite bound, a lower bound of the real p90 (collector/rollup.py).

    The window keeps no bucket bounds, but the quantiles tell: two quantiles whose ranks fall
    in the same finite bucket are interpolated to different values, so p99 == p90 > 0 means
    both ranks are in the +Inf bucket (or p90's rank ends exactly at the top bound's count,
    where "≥ the bound" is as true).
    """
    return w.p90 is not None and w.p99 is not None and w.p90 > 0 and w.p99 == w.p90


def prompt_lengths(windows: Windows) -> tuple[float | None, float | None, bool]:
    """(exact mean, p90, p90 censored) of request_prompt_tokens over the windows.

    The p90 is the request-weighted median of the windows' p90s; it is censored (a lower
    bound) when a censored window's p90 is at or below that median, since its real value
    may move the median up (censored values above the median cannot).
    """
    t = WindowTable.of(windows)
    delta = t.values(PROMPT_HIST, "delta")
    rows = np.flatnonzero(delta > 0)  # NaN (unknown) is not
    delta = delta[rows]
    count = seq_sum(delta)
    sums = t.values(PROMPT_HIST, "sum_delta", rows)
    total = seq_sum(np.where(np.isnan(sums), 0.0, sums))
    p90, p99 = t.values(PROMPT_HIST, "p90", rows), t.values(PROMPT_HIST, "p99", rows)
    known = np.isfinite(p90)
    censored = p90[known & (p90 > 0) & (p99 == p90)]  # as p90_censored, per window
    mean = total / count if count > 0 and total > 0 else None
    median = weighted_median(p90[known], delta[known])
    return mean, median, median is not None and bool((censored <= median).any())


def modes_by_source(engines: Iterable[object]) -> dict[str, str]:
    """source -> offload mode of the store's engine records."""
    out: dict[str, str] = {}
    for e in engines:
        out[str(getattr(e, "source", ""))] = str(getattr(e, "offload", "unknown") or "unknown")
    return out


def most_common(values: Iterable[object]) -> tuple[object | None, int]:
    """The most common non-empty value and how many distinct values there were."""
    counts = Counter(v for v in values if v not in (None, ""))
    if not counts:
        return None, 0
    return counts.most_common(1)[0][0], len(counts)
