"""Stored plans (the ``plans`` table): save one, read the latest, read the history.

The planner makes plans; the store keeps them opaque (the JSON document) beside the headline
figures as columns (store.tables.PLAN_HEADLINE), so the history, the closed loop and
kvscope's own /metrics read numbers without parsing documents. A plan is unique on (cluster,
group, window range): saving a plan of the same history again replaces it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sqlalchemy import func, select

from core.errors import ConfigError
from store.db import Database
from store.inventory import Inventory
from store.tables import PLAN_HEADLINE, ClusterRow, PlanRecord, PlanRow

_PLAN_COLUMNS = ("created_at", "horizon_s", "version", "mode", "document", *PLAN_HEADLINE)
_READ_COLUMNS = ("id", "group_name", "window_from", "window_until", *_PLAN_COLUMNS)
_SUMMARY_COLUMNS = tuple(c for c in _READ_COLUMNS if c != "document")


def _number(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"plan headline {name!r} must be a number or None, got {value!r}")
    return float(value) if math.isfinite(value) else None


class PlanStore:
    """Plans (Store's); ``inventory`` registers a plan's cluster."""

    def __init__(self, db: Database, inventory: Inventory) -> None:
        self.db = db
        self.inventory = inventory

    def save_plan(self, plan: PlanRecord) -> int:
        """Insert or replace the plan of (cluster, group, window range); return its id."""
        unknown = sorted(set(plan.headline) - set(PLAN_HEADLINE))
        if unknown:
            raise ConfigError(f"plan headline: unknown field(s) {', '.join(unknown)}")
        if not (plan.window_from <= plan.window_until):
            raise ConfigError(
                f"plan window: from {plan.window_from} is after until {plan.window_until}"
            )
        headline = {k: _number(plan.headline.get(k), k) for k in PLAN_HEADLINE}
        self.db.require_schema()
        with self.db.tx(f"saving a plan of cluster {plan.cluster}", write=True) as conn:
            values: dict[str, Any] = {
                "cluster_id": self.inventory.cluster_id(conn, plan.cluster),
                "group_name": plan.group,
                "window_from": plan.window_from,
                "window_until": plan.window_until,
                "created_at": plan.created_at,
                "horizon_s": plan.horizon_s,
                "version": plan.version,
                "mode": plan.mode,
                "document": dict(plan.document),
                **headline,
            }
            stmt = self.db.insert(PlanRow.__table__).values(**values)
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["cluster_id", "group_name", "window_from", "window_until"],
                    set_={k: stmt.excluded[k] for k in _PLAN_COLUMNS},
                )
            )
            key = (
                PlanRow.group_name == plan.group,
                PlanRow.window_from == plan.window_from,
                PlanRow.window_until == plan.window_until,
                PlanRow.cluster_id == values["cluster_id"],
            )
            return int(conn.execute(select(PlanRow.id).where(*key)).scalar_one())

    def plans(
        self,
        cluster: str | None = None,
        group: str | None = None,
        *,
        since: float | None = None,
        limit: int = 1000,
        documents: bool = True,
    ) -> list[PlanRecord]:
        """Stored plans, newest first (by created_at, then id); ``since``: created at or
        after (epoch s); ``group`` "" is the whole-cluster plan, None any group;
        ``documents=False`` leaves each record's document empty (not read: headline only)."""
        if limit < 1:
            raise ConfigError(f"limit must be >= 1, got {limit}")
        self.db.require_schema()
        p, c = PlanRow, ClusterRow
        columns = _READ_COLUMNS if documents else _SUMMARY_COLUMNS
        query = select(*(p.__table__.c[k] for k in columns), c.name).join(c, c.id == p.cluster_id)
        if cluster is not None:
            query = query.where(c.name == cluster)
        if group is not None:
            query = query.where(p.group_name == group)
        if since is not None:
            query = query.where(p.created_at >= since)
        query = query.order_by(p.created_at.desc(), p.id.desc()).limit(limit)
        with self.db.tx("reading plans") as conn:
            rows = conn.execute(query).all()
        return [_record(dict(zip(columns, row[:-1], strict=True)), row[-1]) for row in rows]

    def latest_plan(
        self, cluster: str, group: str = "", *, document: bool = True
    ) -> PlanRecord | None:
        """The newest stored plan of the cluster (and group), or None (``document=False``:
        without its document, as :meth:`plans`)."""
        found = self.plans(cluster, group, limit=1, documents=document)
        return found[0] if found else None

    def plan_document(self, plan_id: int) -> dict[str, Any] | None:
        """The JSON document of the stored plan ``plan_id`` (None: no such plan)."""
        self.db.require_schema()
        with self.db.tx("reading a plan document") as conn:
            doc = conn.execute(select(PlanRow.document).where(PlanRow.id == plan_id)).scalar()
        return None if doc is None else dict(doc)

    def latest_plans(self, cluster: str | None = None) -> list[PlanRecord]:
        """The newest stored plan of every (cluster, group), by cluster then group (one query,
        whatever the history's length); ``cluster`` None: every cluster."""
        self.db.require_schema()
        p, c = PlanRow, ClusterRow
        rank = (
            func.row_number()
            .over(
                partition_by=(p.cluster_id, p.group_name),
                order_by=(p.created_at.desc(), p.id.desc()),
            )
            .label("rank")
        )
        newest = select(p.id, rank).subquery()
        query = (
            select(*(p.__table__.c[k] for k in _READ_COLUMNS), c.name)
            .join(c, c.id == p.cluster_id)
            .join(newest, newest.c.id == p.id)
            .where(newest.c.rank == 1)
        )
        if cluster is not None:
            query = query.where(c.name == cluster)
        query = query.order_by(c.name, p.group_name)
        with self.db.tx("reading the latest plans") as conn:
            rows = conn.execute(query).all()
        return [_record(dict(zip(_READ_COLUMNS, row[:-1], strict=True)), row[-1]) for row in rows]

    def clusters(self) -> list[str]:
        """Every registered cluster, by name."""
        self.db.require_schema()
        with self.db.tx("reading clusters") as conn:
            names = conn.execute(select(ClusterRow.name).order_by(ClusterRow.name)).scalars()
            return [str(n) for n in names]


def _record(row: Mapping[str, Any], cluster: str) -> PlanRecord:
    headline: Mapping[str, float | None] = {k: row[k] for k in PLAN_HEADLINE}
    return PlanRecord(
        cluster=cluster,
        group=row["group_name"],
        created_at=row["created_at"],
        window_from=row["window_from"],
        window_until=row["window_until"],
        horizon_s=row["horizon_s"],
        version=row["version"],
        mode=row["mode"],
        document=row.get("document") or {},
        headline=headline,
        id=row["id"],
    )
