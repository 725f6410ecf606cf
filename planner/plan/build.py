"""`kvscope plan`: from the store's windows to a decision, a forecast, sizing and configs.

``build_plan(store, …)`` reads a cluster's windows and engine metadata, builds the analysis
frame, observes, fits, forecasts, fills an Evidence record, decides and sizes. What the data
cannot support is a ``can_tell: false`` entry with the reason, never an exception; Evidence
fields no metric fills stay None (EVIDENCE_GAPS says why).

Method: planner/plan/METHODS.md#build
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from core.errors import ConfigError
from planner.decide.decision import decide
from planner.decide.evidence import Evidence
from planner.deploy.sizing import size
from planner.domain.slo import Slo
from planner.fit.orchestrate import fit_all, not_fitted
from planner.fit.registry import EQUAL_KV
from planner.frames.frames import engine_frame
from planner.frames.residency import residency_histograms
from planner.frames.table import PLAN_COLUMNS, WindowTable, names
from planner.plan.basis import (
    EVIDENCE_GAPS,
    HOURS_PER_MONTH,
    dram_of,
    facts_basis,
    hardware_of,
    plan_basis,
    plan_cost,
)
from planner.plan.fits import (
    LEVEL,
    NO_HW,
    FitRun,
    Hardware,
    cost_model,
    equal_kv_at,
    fit_runs,
    hit_curve,
    mfu_evidence,
)
from planner.plan.forecast import ForecastRun, kv_capacity, run_forecasts
from planner.plan.fork import Forked
from planner.plan.group_plans import (
    GroupSlice,
    groups_basis,
    pick_group,
    split_groups,
)
from planner.plan.needed import NEEDED_SIGNALS
from planner.plan.observe import Observed, modes_by_source, observe
from planner.plan.record import GroupPlan, NoData, Plan, PlanDetails
from planner.plan.tier import recommended_gib, tier_section
from planner.plan.verdict import ModeVerdict, run_verdicts, verdict_section
from planner.plan.windows import finish_frame, fold, read_windows
from store.frame import windows_frame

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    import pandas as pd

    from planner.decide.decision import Decision
    from planner.deploy.sizing import Sizing
    from planner.fit.orchestrate import FitReport
    from planner.plan.windows import SignalPart
    from store.store import Store
    from store.tables import EngineRecord

__all__ = ["EVIDENCE_GAPS", "HOURS_PER_MONTH", "build_plan", "lmcache_up_fraction"]


def _no_data(store: Store, cluster: str | None, since: float | None) -> NoData:
    stats = store.stats()
    if not stats["windows"]:
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


@dataclass(slots=True)
class _Run:
    """What every part of one `kvscope plan` shares: the store, the arguments, the clock."""

    store: Store
    cluster: str | None
    since: float | None
    until: float | None
    horizon_s: float
    price: float | None
    seed: int
    forecast_seconds: float
    slo: Slo = field(default_factory=Slo)
    lmcache_up: float | None = None
    took: dict[str, float] = field(default_factory=dict)
    clock: float = field(default_factory=time.perf_counter)

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.took[stage] = now - self.clock
        self.clock = now

    def fresh(self) -> _Run:
        """The same run with its own stage timings (a group's plan)."""
        return _Run(self.store, self.cluster, self.since, self.until, self.horizon_s,
                    self.price, self.seed, self.forecast_seconds, self.slo,
                    self.lmcache_up)  # fmt: skip


def build_plan(  # noqa: PLR0913 - keyword-only plan options (kvscope plan's flags)
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
    group: str | None = None,
    slo: Slo | None = None,
    parts: Iterable[SignalPart] | None = None,
) -> Plan:
    """Read, fit, forecast, decide and size (METHODS.md#build). Raises NoData when the store
    has no windows for the cluster and period, ConfigError on a bad argument (an unknown
    ``group`` among them, naming the known ones).

    Several model groups are planned per group (``groups``; ``group`` plans one alone).
    Windows are read a signal at a time as columnar frames, or taken from ``parts`` (the
    same signals of the same store, read by planner/plan/readahead.py's child);
    ``columnar=False`` reads Window records instead (the slower reference the columnar path
    is tested against).
    """
    if not (math.isfinite(horizon_s) and horizon_s > 0):
        raise ConfigError(f"horizon must be a positive duration, got {horizon_s!r} s")
    if not (math.isfinite(forecast_seconds) and forecast_seconds > 0):
        raise ConfigError(f"forecast time budget must be > 0 s, got {forecast_seconds!r}")
    if gpu_price_per_hour is not None and not (
        math.isfinite(gpu_price_per_hour) and gpu_price_per_hour >= 0
    ):
        raise ConfigError(f"gpu price must be a number >= 0, got {gpu_price_per_hour!r}")
    run = _Run(store, cluster, since, until, horizon_s, gpu_price_per_hour, seed,
               forecast_seconds, slo or Slo())  # fmt: skip
    engines = store.engines(cluster)
    meta = {e.source: e for e in engines}
    if columnar:  # one signal at a time, folded into the frame as it is read
        if parts is None:
            windows, builder = read_windows(store, cluster=cluster, since=since, until=until)
        else:
            windows, builder = fold(parts)
        if not len(windows):
            raise _no_data(store, cluster, since)
        run.lap("read")
        frame = finish_frame(builder, meta, store, cluster=cluster, since=since, until=until)
        del builder
    else:
        rows = store.read_windows(
            signals=sorted(NEEDED_SIGNALS), cluster=cluster, since=since, until=until
        )
        table = windows_frame(rows, PLAN_COLUMNS)
        del rows
        windows = WindowTable(table)
        if not len(windows):
            raise _no_data(store, cluster, since)
        run.lap("read")
        frame = engine_frame(table, meta)
        del table
    run.lap("frame")
    run.lmcache_up = lmcache_up_fraction(store, cluster, since, until)
    groups = split_groups(frame, windows.sources)
    if group is not None:
        return _group_plan(run, windows, frame, engines, pick_group(groups, group), len(groups))
    if len(groups) <= 1:
        return _plan(run, windows, frame, engines, [])
    planned = []
    for g in groups:
        p = _group_plan(run.fresh(), windows, frame, engines, g, len(groups))
        planned.append(GroupPlan(g.name, g.engines, tuple(sorted(g.sources)), p))
    run.clock = time.perf_counter()  # the pooled stages' own times
    return _plan(run, windows, frame, engines, [groups_basis(groups)], groups=tuple(planned))


def _group_plan(  # noqa: PLR0917 - the parts of one plan
    run: _Run,
    windows: WindowTable,
    frame: pd.DataFrame,
    engines: list[EngineRecord],
    g: GroupSlice,
    of: int,
) -> Plan:
    """The plan of one model group: its frame rows and its sources' windows."""
    note = f"model group {g.name!r}: {len(g.engines)} engine(s), 1 of {of} group(s)"
    if g.shared:
        note += f"; sources shared with every group: {', '.join(g.shared[:5])}"
    sub = frame[g.rows].reset_index(drop=True)
    return _plan(run, windows.restrict(g.sources), sub, engines, [note], group=g.name)


def _cpu_tier(  # noqa: PLR0917 - the parts of one plan the section reads
    run: _Run,
    frame: pd.DataFrame,
    engines: list[EngineRecord],
    hw: Hardware | None,
    evidence: Evidence,
    sources: set[str],
) -> dict[str, Any]:
    """The plan's "What a CPU tier would buy" (planner/plan/tier.py) from the engines' KV
    residency histograms over the plan's period."""
    hists = residency_histograms(
        run.store, cluster=run.cluster, sources=sorted(sources), since=run.since, until=run.until
    )
    mfu = evidence.effective_mfu  # the prefill MFU fit's, when it can tell
    return tier_section(
        frame,
        engines,
        hists,
        hw,
        slo=run.slo,
        mfu=mfu.estimate if mfu else None,
        engines_per_node=evidence.engines_per_node,
        seed=run.seed,
    )


def _plan(
    run: _Run,
    windows: WindowTable,
    frame: pd.DataFrame,
    engines: list[EngineRecord],
    notes: list[str],
    *,
    group: str | None = None,
    groups: tuple[GroupPlan, ...] = (),
) -> Plan:
    """The plan of these windows and frame rows (a whole cluster or one model group).

    With ``groups`` (several model groups) nothing is fitted, decided or sized: fits across
    models mix what cannot be pooled; each group's plan holds its own fits, decision, sizing.
    The rows of ``windows`` are dropped once the stages that read them have run.
    """
    meta = {e.source: e for e in engines}
    present = names(frame["source"])
    in_window = [e for e in engines if e.source in present]
    basis = _opening_basis(run, windows, present, meta, notes, grouped=bool(groups))
    basis += facts_basis(in_window)
    hw_names, hw = hardware_of(in_window, basis)
    modes = {s: m for s, m in modes_by_source(in_window).items() if s in present}
    cap = kv_capacity(windows, {e.source: e.facts for e in in_window}, hw)

    def beside_the_fits() -> tuple[
        tuple[dict[str, Any], Observed], dict[str, ModeVerdict], ForecastRun
    ]:
        seen = observe(frame, windows, modes)
        verdicts = {} if groups else run_verdicts(frame, in_window, slo=run.slo, seed=run.seed)
        fc = run_forecasts(windows, cap, horizon_s=run.horizon_s, seed=run.seed,
                           max_seconds=run.forecast_seconds)  # fmt: skip
        return seen, verdicts, fc

    side = Forked(beside_the_fits)  # neither reads what the other makes
    if not side.forked:  # a killed child's stage runs again here, on the rows
        windows.drop_rows()  # nothing below reads them (~1.3 GB at 1,000 engines × 7 days)
    fits = fit_runs(_fit_report(run, frame, hw, len(groups)))
    run.lap("fits")
    (happening, seen), verdicts, fc = side.result()
    run.lap("observe_verdicts_forecasts")
    u_now = seen.kv_util_p50
    for mode in ("native", "lmcache"):
        fits[EQUAL_KV + mode].entry["at_current_util"] = equal_kv_at(fits[EQUAL_KV + mode], u_now)
    measured = _measured(run, hw_names, verdicts, fits, in_window)
    evidence = fc.evidence.apply(seen.apply(measured))
    cpu_tier = None if groups else _cpu_tier(run, frame, in_window, hw, evidence, present)
    if cpu_tier is not None:
        evidence = replace(
            evidence,
            cpu_tier_native_gib=recommended_gib(cpu_tier, "native"),
            cpu_tier_pool_gib=recommended_gib(cpu_tier, "lmcache"),
        )
    run.lap("cpu_tier")
    decision = None if groups else decide(evidence)
    sizing, sizing_error = _sizing(evidence, decision)
    basis += plan_basis(evidence, fits, fc)
    window = _window_section(run, windows, evidence.engines, len(present))
    run.lap("decide")
    offload = verdict_section(verdicts, evidence, run.slo) if verdicts else None
    return Plan(
        run.cluster,
        window,
        happening,
        evidence,
        decision,
        offload,
        cpu_tier,
        {k: r.entry for k, r in fits.items()},
        fc.section,
        sizing,
        sizing_error,
        plan_cost(evidence, sizing, run.price),
        tuple(basis),
        PlanDetails(frame, fits, fc, run.took, verdicts),
        group,
        groups,
    )


def _opening_basis(
    run: _Run,
    windows: WindowTable,
    present: set[str],
    meta: Mapping[str, EngineRecord],
    notes: list[str],
    *,
    grouped: bool,
) -> list[str]:
    """The plan's first basis lines: what was read, the notes, the decision rules (unless
    ``grouped``) and the sources without engine metadata."""
    basis: list[str] = [
        f"{len(windows)} windows of {len(present)} source(s) from {run.store.url}"
        + (f", cluster {run.cluster!r}" if run.cluster else ""),
        *notes,
    ]
    if not grouped:
        basis.append(
            "decision: rules R1–R9 of planner/decide/DECIDER.md; each reason names its source "
            "(measured, the cost model, or a published figure cited as [source: <id>], with its "
            "source_id and source_url; `kvscope sources <id>` prints it)"
        )
    servers = {t.name for t in run.store.targets(run.cluster) if t.kind == "lmcache"}
    unregistered = sorted(present - set(meta) - servers)  # an LMCache server is no engine
    if unregistered:
        basis.append(
            f"{len(unregistered)} source(s) without engine metadata (offload mode "
            f"unknown): {', '.join(unregistered[:5])}"
        )
    return basis


def _fit_report(run: _Run, frame: pd.DataFrame, hw: Hardware | None, n_groups: int) -> FitReport:
    """Every fit of the frame, or (several model groups: ``n_groups`` > 0) none."""
    if n_groups:
        return not_fitted(f"fitted per model group ({n_groups} groups): see groups")
    flops, peak = cost_model(hw)
    return fit_all(frame, prefill_flops=flops, peak_flops=peak, no_cost=NO_HW,
                   level=LEVEL, seed=run.seed)  # fmt: skip


def _measured(
    run: _Run,
    hw_names: dict[str, Any],
    verdicts: dict[str, ModeVerdict],
    fits: dict[str, FitRun],
    in_window: list[EngineRecord],
) -> Evidence:
    """The Evidence of the hardware, the capacity verdicts and the fits (before the
    observations and forecasts apply theirs)."""
    return Evidence(
        model=hw_names["model"],
        gpu=hw_names["gpu"],
        tp=hw_names["tp"],
        native_capacity=verdicts["native"].evidence if verdicts else None,
        lmcache_capacity=verdicts["lmcache"].evidence if verdicts else None,
        effective_mfu=mfu_evidence(fits["prefill_mfu"]),
        l1_hit_curve=hit_curve(fits["lmcache_hitrate"]),
        lmcache_up_fraction=run.lmcache_up,
        cpu_dram_per_node_gib=dram_of(in_window),
    )


def _sizing(evidence: Evidence, decision: Decision | None) -> tuple[Sizing | None, str | None]:
    """(sizing, why it could not be made) of the decision; (None, None) without one."""
    sizing, sizing_error = None, None
    if decision is not None:
        try:
            sizing = size(evidence, decision)
        except ConfigError as exc:
            sizing_error = str(exc)
    return sizing, sizing_error


def _window_section(
    run: _Run, windows: WindowTable, engines: int | None, sources: int
) -> dict[str, Any]:
    """The plan's ``window`` section: the period asked for and the one the windows span."""
    first, last = windows.span()
    return {
        "since": run.since,
        "until": run.until,
        "first": first,
        "last": last,
        "first_utc": _iso(first),
        "last_utc": _iso(last),
        "windows": len(windows),
        "engines": engines or 0,
        "sources": sources,
    }
