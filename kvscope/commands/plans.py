"""`kvscope plans list|accuracy`: the stored plans, and how they fared against what happened."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from core.durations import format_duration, parse_duration
from core.errors import ConfigError
from kvscope.commands.options import DbOpt, JsonOpt
from kvscope.commands.plan import check_sqlite_exists

if TYPE_CHECKING:
    from planner.plan import PlanOutcome
    from store.store import Store
    from store.tables import PlanRecord

ClusterOpt = Annotated[str | None, typer.Option("--cluster", help="only this cluster")]
NO_PLANS = "no stored plans: `kvscope plan --save` (or --every 15m) keeps them"


def _store(db: str | None) -> Store:
    # start-up: the settings (pydantic) and the store (sqlalchemy) only when a command runs
    from pydantic import ValidationError

    from kvscope.cli_settings import get_settings
    from store.store import Store

    try:
        url = get_settings(db=db).db
    except ValidationError as exc:
        raise ConfigError(f"--db (or KVSCOPE_DB): {exc.errors()[0]['msg']}") from exc
    check_sqlite_exists(url)
    return Store(url)


def _utc(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(t))


def _num(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _ci(h: Mapping[str, float | None], name: str, fmt: str = "{:.2f}") -> str:
    """``name``'s estimate [``name_lo``, ``name_hi``], or - when unknown."""
    est = h.get(name)
    if est is None:
        return "-"
    return f"{fmt.format(est)} [{_num(h.get(name + '_lo'), fmt)}, {_num(h.get(name + '_hi'), fmt)}]"


def _peak(h: Mapping[str, float | None]) -> str:
    cap = h.get("kv_capacity")
    if h.get("forecast_peak") is None:
        return "-"
    if not cap:
        return _ci(h, "forecast_peak", "{:.4g}")
    keys = ("forecast_peak", "forecast_peak_lo", "forecast_peak_hi")
    share = {k: None if (v := h.get(k)) is None else v / cap for k in keys}
    return _ci(share, "forecast_peak", "{:.0%}") + " of HBM"


def _saturation(h: Mapping[str, float | None]) -> str:
    lo, hi = h.get("saturation_lo_s"), h.get("saturation_hi_s")
    if h.get("saturation_s") is None and lo is None:
        return "not within the horizon"
    p = h.get("p_saturation")
    text = (
        f"{format_duration(h.get('saturation_s'))} [{format_duration(lo)}, {format_duration(hi)}]"
    )
    return text + ("" if p is None else f", P {p:.0%}")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in [header, *rows]]  # fmt: skip
    return "\n".join(lines) + "\n"


def _record_dict(rec: PlanRecord) -> dict[str, Any]:
    # start-up: the planner's domain (its catalogues' YAML) only when a command runs
    from planner.domain.values import json_ready

    out: dict[str, Any] = json_ready(
        {
            "id": rec.id,
            "cluster": rec.cluster,
            "group": rec.group,
            "created_at": rec.created_at,
            "window_from": rec.window_from,
            "window_until": rec.window_until,
            "horizon_s": rec.horizon_s,
            "version": rec.version,
            "mode": rec.mode,
            "headline": dict(rec.headline),
        }
    )
    return out


def list_text(records: Sequence[PlanRecord]) -> str:
    """The history as a table, newest first."""
    if not records:
        return NO_PLANS + "\n"
    rows = [
        [
            _utc(r.created_at),
            r.cluster,
            r.group or "-",
            f"{_utc(r.window_from)} → {_utc(r.window_until)}",
            r.mode or "(per group)",
            _num(r.headline.get("score")),
            _ratio(r.headline, "capacity_native"),
            _ratio(r.headline, "capacity_lmcache"),
            _peak(r.headline),
            _saturation(r.headline),
        ]
        for r in records
    ]
    header = ["created (UTC)", "cluster", "group", "window (UTC)", "mode", "score",
              "capacity native / none", "capacity lmcache / none", "forecast peak",
              "time to saturation"]  # fmt: skip
    return _table(header, rows)


def _ratio(headline: Mapping[str, Any], key: str) -> str:
    """ "1.25 [1.10, 1.42]", "≥ 1.17" for a lower bound, "-" when unknown."""
    est, lo, hi = (headline.get(key + k) for k in ("", "_lo", "_hi"))
    if est is None or lo is None:
        return "-"
    return f"≥ {lo:.2f}" if hi is None else f"{est:.2f} [{lo:.2f}, {hi:.2f}]"


def _capacity(o: PlanOutcome) -> str:
    parts = []
    for g in o.capacity:
        got = "cannot tell" if g.measured is None else f"{g.measured:.2f}"
        mark = {None: "", True: " inside", False: " OUTSIDE"}[g.inside]
        span = f"≥ {g.lo:.2f}" if g.hi is None else f"{g.predicted:.2f} [{g.lo:.2f}, {g.hi:.2f}]"
        parts.append(f"{g.mode} {span} → {got}{mark}")
    return "; ".join(parts) or "-"


def accuracy_text(outcomes: Sequence[PlanOutcome], summary: Mapping[str, Any]) -> str:
    """The closed-loop table and its summary."""
    if not outcomes:
        return NO_PLANS + "\n"
    rows = []
    for o in outcomes:
        if o.pending:
            cov, sat = "pending", ""
        else:
            cov = "-" if o.coverage is None else f"{o.kv_covered}/{o.kv_points} = {o.coverage:.0%}"
            sat = o.saturation.replace("_", " ")
            if o.saturated_at is not None:
                sat += f" (at {_utc(o.saturated_at)})"
        rows.append([str(o.plan_id), _utc(o.created_at), o.cluster, o.group or "-",
                     _utc(o.horizon_end), f"{o.level:.0%}", cov, sat or "-",
                     "-" if o.pending else _capacity(o)])  # fmt: skip
    header = ["plan", "created (UTC)", "cluster", "group", "horizon end", "level",
              "KV in interval", "saturation", "capacity ratio at the SLO"]  # fmt: skip
    kv, caps = summary["kv_demand"], summary["capacity"]
    lines = [f"plans: {summary['scored']} scored, {summary['pending']} pending"]
    if kv["coverage"] is None:
        lines.append("KV-demand coverage: nothing to compare yet")
    else:
        iv = kv["interval"]
        lines.append(
            f"KV-demand coverage: {kv['covered']}/{kv['points']} = {kv['coverage']:.1%} "
            f"[{iv['lo']:.1%}, {iv['hi']:.1%}] ({iv['level']:.0%} Wilson) against nominal "
            f"{kv['nominal']:.1%}, over {kv['plans']} plan(s); {kv['note']}"
        )
    verdicts = ", ".join(
        f"{k.replace('_', ' ')} {n}" for k, n in summary["saturation"].items() if n
    )
    lines.append(f"saturation: {verdicts or '-'}")
    if caps["checks"]:
        lines.append(
            f"capacity ratio: {caps['inside']} inside, {caps['outside']} outside, "
            f"{caps['cannot_tell']} cannot tell ({caps['note']})"
        )
    else:
        lines.append("capacity ratio: no stored plan gave an interval to check")
    return _table(header, rows) + "\n" + "\n".join(lines) + "\n"


def list_cmd(
    db: DbOpt = None,
    cluster: ClusterOpt = None,
    since: Annotated[
        str, typer.Option("--since", help="plans made this far back, e.g. 7d, or 'all'")
    ] = "all",
    as_json: JsonOpt = False,
) -> None:
    """The stored plans, newest first (the history).

    Per plan: when it was made, cluster and model group, the history it used, the mode,
    decision score, break-evens, forecast peak and time to saturation.

    Example: kvscope plans list --db sqlite:///kvscope.db --cluster prod --since 7d

    Example: kvscope plans list --db sqlite:///kvscope.db --json
    """
    since_s = None if since.strip() == "all" else time.time() - parse_duration(since, "--since")
    with _store(db) as store:
        records = store.plans(cluster, since=since_s)
    if as_json:
        typer.echo(json.dumps({"plans": [_record_dict(r) for r in records]}, indent=2))
    else:
        typer.echo(list_text(records), nl=False)


def accuracy_cmd(db: DbOpt = None, cluster: ClusterOpt = None, as_json: JsonOpt = False) -> None:
    """How each stored plan fared against what happened (the closed loop).

    Every plan whose horizon has passed is compared with the windows that came later: KV demand
    inside the forecast interval (realised vs nominal coverage), saturation before / after the
    predicted bounds, the capacity ratio inside its interval; the others are pending. The
    statistics: planner/plan/METHODS.md#outcome.

    Example: kvscope plans accuracy --db sqlite:///kvscope.db --cluster prod
    Example: kvscope plans accuracy --db sqlite:///kvscope.db --json
    """
    # start-up: the planner (numpy, pandas; ~0.5 s) only when the command runs
    from planner.plan import accuracy_summary, score_plans

    with _store(db) as store:
        outcomes = score_plans(store, cluster)
    summary = accuracy_summary(outcomes)
    if as_json:
        payload = {"outcomes": [o.to_dict() for o in outcomes], "summary": summary}
        typer.echo(json.dumps(payload, indent=2))
    else:
        typer.echo(accuracy_text(outcomes, summary), nl=False)


def register(app: typer.Typer) -> None:
    sub = typer.Typer(
        help="Stored plans (`kvscope plan --save`): the history, and the closed loop that "
        "scores each plan against what happened.",
        no_args_is_help=True,
    )
    app.add_typer(sub, name="plans")
    sub.command("list")(list_cmd)
    sub.command("accuracy")(accuracy_cmd)
