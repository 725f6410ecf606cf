"""`kvscope plan`: from the store's windows to a decision, a forecast, sizing and configs.

``build_plan(store, …)`` reads the windows and engine metadata of a cluster, builds the
analysis frame (planner/frames.py), states what is happening (planner/plan_observe.py),
runs every fit the data supports (planner/plan_fits.py: preemption knee, offload gain per
mode, prefill MFU, LMCache hit-rate curve), forecasts KV demand against HBM KV capacity
and the request rate (planner/plan_forecast.py), fills an Evidence record, decides
(planner/decide.py) and sizes (planner/sizing.py). A fit or forecast the data cannot
support is a ``can_tell: false`` entry with the reason, never an exception.

Evidence fields this module cannot fill from metrics stay None (EVIDENCE_GAPS says why);
the decider names them as unknown and lowers its confidence.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from collector.errors import ConfigError, KvscopeError
from planner.decide import Decision, decide
from planner.evidence import Evidence
from planner.plan_fits import FitRun, Hardware, gain_evidence, hit_curve, mfu_evidence, run_fits
from planner.plan_forecast import ForecastRun, kv_capacity, run_forecasts
from planner.plan_observe import NEEDED_SIGNALS, modes_by_source, most_common, observe
from planner.plan_table import PLAN_COLUMNS, WindowTable, names
from planner.sizing import Sizing, size

if TYPE_CHECKING:
    import pandas as pd

    from collector.store import Store

HOURS_PER_MONTH = 730.0  # 365 × 24 / 12
EVIDENCE_GAPS: Mapping[str, str] = {
    "vllm_version": "vLLM exposes no version metric; the configs assume the latest supported",
    "engines_per_node": "the store holds no node topology (sizing assumes 1 engine per node)",
    "nodes": "the store holds no node topology",
    "cross_engine_reuse": "needs per-request prefix hashes (a trace): metrics count hits, not "
    "which engine holds the prefix",
    "cross_node_reuse": "needs per-request prefix hashes and node placement (a trace)",
    "distinct_prefix_tokens": "needs per-request prefix hashes (a trace)",
    "overhead_zero_hit": "needs offload engines measured at a 0 % hit rate; not separated from "
    "the gain fit",
    "l2_tier": "the L2 tier is not visible in the metrics",
    "cpu_dram_per_node_gib": "host DRAM is not visible in the metrics",
}


class NoData(KvscopeError):
    """The store holds no windows for the cluster and period asked about."""


@dataclass(frozen=True, slots=True, eq=False)
class PlanDetails:
    """What the plots need beyond the JSON: the frame, the fit objects, the forecasts; and
    the seconds each stage took (read, frame, observe, fits, forecasts, decide)."""

    frame: pd.DataFrame
    fits: Mapping[str, FitRun]
    forecasts: ForecastRun
    seconds: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, eq=False)
class Plan:
    """The answer of `kvscope plan`; ``to_dict()`` is its JSON (module docstring)."""

    cluster: str | None
    window: Mapping[str, Any]
    happening: Mapping[str, Any]
    evidence: Evidence
    decision: Decision
    fits: Mapping[str, Mapping[str, Any]]
    forecast: Mapping[str, Any]
    sizing: Sizing | None
    sizing_error: str | None
    cost: Mapping[str, Any] | None
    basis: tuple[str, ...]
    details: PlanDetails

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (non-finite numbers become null)."""
        sizing = self.sizing.to_dict() if self.sizing else {"error": self.sizing_error}
        out: dict[str, Any] = json_safe(
            {
                "cluster": self.cluster,
                "window": dict(self.window),
                "happening": dict(self.happening),
                "decision": self.decision.to_dict(),
                "fits": {k: dict(v) for k, v in self.fits.items()},
                "forecast": dict(self.forecast),
                "sizing": sizing,
                "configs": dict(self.sizing.configs) if self.sizing else {},
                "cost": dict(self.cost) if self.cost else None,
                "evidence": asdict(self.evidence),
                "basis": list(self.basis),
            }
        )
        return out


def json_safe(obj: Any) -> Any:
    """Floats that are not finite become None; tuples become lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def _no_data(store: Store, cluster: str | None, since: float | None) -> NoData:
    stats = store.stats()
    if not stats["rows"].get("windows"):
        return NoData(f"the store {store.url} holds no windows yet: run `kvscope collect` first")
    where = f" of cluster {cluster!r}" if cluster else ""
    when = f" since {_iso(since)}" if since is not None else ""
    return NoData(
        f"no windows{where}{when} in {store.url} (it holds windows from "
        f"{_iso(stats['windows_from'])} to {_iso(stats['windows_until'])}): widen --since "
        "or check --cluster"
    )


def _iso(t: float | None) -> str:
    if t is None:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t))


def _hardware(engines: list[Any], basis: list[str]) -> tuple[dict[str, Any], Hardware | None]:
    """Model/GPU/TP of the engines (the most common when they differ)."""
    from planner.hardware import get_gpu, get_model

    out: dict[str, Any] = {}
    for key, attr in (("model", "model"), ("gpu", "gpu"), ("tp", "tensor_parallel")):
        value, distinct = most_common(getattr(e, attr) for e in engines)
        out[key] = value
        if distinct > 1:
            basis.append(
                f"engines differ in {key} ({distinct} values): fits pool them, the "
                f"priors use the most common ({value})"
            )
    if not all(out.values()):
        missing = [k for k, v in out.items() if not v]
        basis.append(
            f"engine metadata lacks {', '.join(missing)}: cost-model priors and the "
            "MFU fit are unavailable (register engines with model, gpu, tp)"
        )
        return out, None
    try:
        return out, Hardware(get_model(str(out["model"])), get_gpu(str(out["gpu"])), int(out["tp"]))
    except ConfigError as exc:
        basis.append(f"hardware catalogue: {exc}")
        return out, None


def lmcache_up_fraction(
    store: Store, cluster: str | None, since: float | None, until: float | None
) -> float | None:
    """Share of the cluster's LMCache targets whose last scrape in the period was up."""
    names = [t.name for t in store.targets(cluster) if t.kind == "lmcache"]
    if not names:
        return None
    last: dict[str, tuple[float, bool]] = {}
    for o in store.outcomes(targets=names, since=since, until=until):
        if o.target not in last or o.started >= last[o.target][0]:
            last[o.target] = (o.started, o.up)
    if not last:
        return None
    return sum(up for _, up in last.values()) / len(last)


def build_plan(
    store: Store,
    *,
    cluster: str | None = None,
    since: float | None = None,
    until: float | None = None,
    horizon_s: float = 7 * 86400,
    gpu_price_per_hour: float | None = None,
    seed: int = 0,
    forecast_seconds: float = 8.0,
    columnar: bool = True,
) -> Plan:
    """Read, fit, forecast, decide and size (module docstring). Raises NoData when the store
    has no windows for the cluster and period, ConfigError on a bad argument.

    The windows are read as one columnar frame (Store.read_frame); ``columnar=False`` reads
    Window records (read_windows) instead and converts them: the same plan, much slower for
    millions of windows, kept as the reference the columnar path is tested against.
    """
    from collector.store_frame import windows_frame
    from planner.frames import engine_frame

    if not (math.isfinite(horizon_s) and horizon_s > 0):
        raise ConfigError(f"horizon must be a positive duration, got {horizon_s!r} s")
    if not (math.isfinite(forecast_seconds) and forecast_seconds > 0):
        raise ConfigError(f"forecast time budget must be > 0 s, got {forecast_seconds!r}")
    if gpu_price_per_hour is not None and not (
        math.isfinite(gpu_price_per_hour) and gpu_price_per_hour >= 0
    ):
        raise ConfigError(f"gpu price must be a number >= 0, got {gpu_price_per_hour!r}")
    took: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        took[stage] = now - clock
        clock = now

    signals = sorted(NEEDED_SIGNALS)
    if columnar:
        table = store.read_frame(
            signals=signals, cluster=cluster, since=since, until=until, columns=PLAN_COLUMNS
        )
    else:
        rows = store.read_windows(signals=signals, cluster=cluster, since=since, until=until)
        table = windows_frame(rows, PLAN_COLUMNS)
    if not len(table):
        raise _no_data(store, cluster, since)
    windows = WindowTable(table)
    lap("read")
    engines = store.engines(cluster)
    meta = {e.source: e for e in engines}
    frame = engine_frame(table, meta)
    lap("frame")
    present = names(frame["source"])
    in_window = [e for e in engines if e.source in present]
    basis: list[str] = [
        f"{len(windows)} windows of {len(present)} source(s) from {store.url}"
        + (f", cluster {cluster!r}" if cluster else ""),
        "decision: rules R1–R9 of planner/DECIDER.md; each reason names its source "
        "(measured, the cost model, or a published figure from numbers.md)",
    ]
    unregistered = sorted(present - set(meta))
    if unregistered:
        basis.append(
            f"{len(unregistered)} source(s) without engine metadata (offload mode "
            f"unknown): {', '.join(unregistered[:5])}"
        )
    hw_names, hw = _hardware(in_window, basis)
    modes = {s: m for s, m in modes_by_source(in_window).items() if s in present}
    happening, ev_obs = observe(frame, windows, modes)
    lap("observe")
    fits = run_fits(frame, hw, seed=seed)
    lap("fits")
    cap = kv_capacity(windows, {e.source: e.facts for e in in_window}, hw)
    fc = run_forecasts(windows, cap, horizon_s=horizon_s, seed=seed, max_seconds=forecast_seconds)
    lap("forecasts")
    u_now = ev_obs.get("kv_util_p50")
    native, native_at = gain_evidence(fits["gain_native"], u_now)
    lmcache, lmcache_at = gain_evidence(fits["gain_lmcache"], u_now)
    for name, at in (("gain_native", native_at), ("gain_lmcache", lmcache_at)):
        fits[name].entry["at_current_util"] = at
    fc_ev = {k: v for k, v in fc.evidence.items() if not k.startswith("_")}
    evidence = Evidence(
        model=hw_names["model"],
        gpu=hw_names["gpu"],
        tp=hw_names["tp"],
        native_gain=native,
        lmcache_gain=lmcache,
        effective_mfu=mfu_evidence(fits["prefill_mfu"]),
        l1_hit_curve=hit_curve(fits["lmcache_hitrate"]),
        lmcache_up_fraction=lmcache_up_fraction(store, cluster, since, until),
        **ev_obs,
        **fc_ev,
    )
    decision = decide(evidence)
    sizing, sizing_error = None, None
    try:
        sizing = size(evidence, decision)
    except ConfigError as exc:
        sizing_error = str(exc)
    basis += _basis(evidence, fits, fc)
    first = float(table["start"].min())
    last = float((table["start"] + table["length_s"]).max())
    window = {
        "since": since,
        "until": until,
        "first": first,
        "last": last,
        "first_utc": _iso(first),
        "last_utc": _iso(last),
        "windows": len(windows),
        "engines": evidence.engines or 0,
        "sources": len(present),
    }
    lap("decide")
    return Plan(
        cluster,
        window,
        happening,
        evidence,
        decision,
        {k: r.entry for k, r in fits.items()},
        fc.section,
        sizing,
        sizing_error,
        _cost(evidence, sizing, gpu_price_per_hour),
        tuple(basis),
        PlanDetails(frame, fits, fc, took),
    )


def _basis(ev: Evidence, fits: Mapping[str, FitRun], fc: ForecastRun) -> list[str]:
    out: list[str] = []
    if ev.effective_mfu is None:
        why = fits["prefill_mfu"].entry.get("why") or "no fit"
        out.append(
            f"prefill MFU: prior 50 % from numbers.md (40–60 % simulator default); the "
            f"fit could not tell: {why}"
        )
    else:
        m = ev.effective_mfu
        out.append(
            f"prefill MFU: fitted {m.estimate:.1%} [{m.lo:.1%}, {m.hi:.1%}] "
            f"({fits['prefill_mfu'].entry['n']} low-load windows)"
        )
    for name, entry in fits.items():
        if not entry.entry.get("can_tell"):
            out.append(f"fit {name}: cannot tell: {entry.entry.get('why')}")
    if fc.capacity is not None:
        out.append(f"HBM KV capacity: {fc.capacity.basis}")
    if fc.evidence.get("_saturation_censored"):
        out.append(
            "time to saturation: an end lies beyond the forecast horizon; it is "
            "reported at the horizon (censored)"
        )
    for name, why in EVIDENCE_GAPS.items():
        if getattr(ev, name) is None:
            out.append(f"left unknown: {name}: {why}")
    return out


def _cost(ev: Evidence, sizing: Sizing | None, price: float | None) -> dict[str, Any] | None:
    """GPU cost per month of the engines now and of the sized fleet (price × GPUs × 730 h)."""
    if price is None:
        return None
    gpus = ev.tp or 1
    per_engine = price * gpus * HOURS_PER_MONTH
    out: dict[str, Any] = {
        "gpu_price_per_hour": price,
        "gpus_per_engine": gpus,
        "per_engine_per_month": per_engine,
        "current_per_month": per_engine * ev.engines if ev.engines else None,
        "basis": f"price × {gpus} GPU(s) per engine × {HOURS_PER_MONTH:g} h per month"
        + ("" if ev.tp else " (tp unknown: 1 assumed)"),
    }
    eng = sizing.engines if sizing else None
    if eng is not None:
        out |= {
            "needed_per_month": per_engine * eng.needed,
            "needed_interval_per_month": [per_engine * eng.lo, per_engine * eng.hi],
        }
        if eng.needed_with_offload is not None:
            out["needed_with_offload_per_month"] = per_engine * eng.needed_with_offload
    return out
