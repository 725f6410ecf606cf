"""The store's inventory: clusters, scrape targets and their outcomes, engines, statistics.

A part of store.store.Store sharing its Database: every write is an upsert, so registering
the same target or engine on every collector start is harmless.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, delete, func, literal, select, union_all

from core.errors import ConfigError, StoreError
from core.records import ScrapeOutcome
from store import chunks, partitions
from store.db import Database
from store.tables import (
    OFFLOAD_MODES,
    TARGET_KINDS,
    Chunk5mRow,
    ChunkRow,
    ClusterRow,
    EngineChange,
    EngineChangeRow,
    EngineRecord,
    EngineRow,
    HeadRow,
    PlanRow,
    RollupStateRow,
    ScrapeOutcomeRow,
    SeriesRow,
    TargetRecord,
    TargetRow,
)

# What an engine runs: a change in any of these opens a new regime (engine_changes row).
REGIME_COLUMNS = ("offload", "model", "gpu", "tensor_parallel")
REGIME_FACTS = ("num_gpu_blocks", "block_size", "num_cpu_blocks")


def _jsonable(value: Any, where: str) -> Any:
    """Plain JSON types (mappings -> dict, sequences -> list) or a StoreError naming the key."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise StoreError(f"{where}: {value!r} cannot be stored as JSON")


def _regime(stored: Mapping[str, Any] | None) -> dict[str, Any]:
    """The regime part of a stored change's facts (what _record_change compares)."""
    facts = stored or {}
    return {k: facts.get(k) for k in (*REGIME_COLUMNS[1:], *REGIME_FACTS)}


class Inventory:
    """Clusters, targets, scrape outcomes and engines (Store's; outcomes written
    ``batch_size`` per transaction)."""

    def __init__(self, db: Database, batch_size: int) -> None:
        self.db = db
        self.batch_size = batch_size

    def write_outcomes(self, outcomes: Iterable[ScrapeOutcome]) -> int:
        """Record scrape outcomes; a retry of the same (target, started) updates in place."""
        self.db.require_schema()
        rows = [
            {
                "target": o.target,
                "started": o.started,
                "duration_s": o.duration_s,
                "up": o.up,
                "bytes": o.bytes,
                "series": o.series,
                "error_kind": o.error_kind,
                "error": o.error,
            }
            for o in outcomes
        ]
        if not rows:
            return 0
        stmt = self.db.insert(ScrapeOutcomeRow.__table__)
        stmt = stmt.on_conflict_do_update(
            index_elements=["target", "started"],
            set_={k: stmt.excluded[k] for k in rows[0] if k not in ("target", "started")},
        )
        for i in range(0, len(rows), self.batch_size):
            chunk = list(
                {(r["target"], r["started"]): r for r in rows[i : i + self.batch_size]}.values()
            )
            with self.db.tx("writing scrape outcomes", write=True) as conn:
                conn.execute(stmt, chunk)
        return len(rows)

    def outcomes(
        self,
        *,
        targets: Sequence[str] | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[ScrapeOutcome]:
        """Scrape outcomes with ``since <= started < until``, ordered by target, started."""
        self.db.require_schema()
        o = ScrapeOutcomeRow
        query = select(
            o.target, o.started, o.duration_s, o.up, o.bytes, o.series, o.error_kind, o.error
        )
        if targets is not None:
            query = query.where(o.target.in_(list(targets)))
        if since is not None:
            query = query.where(o.started >= since)
        if until is not None:
            query = query.where(o.started < until)
        with self.db.tx("reading scrape outcomes") as conn:
            rows = conn.execute(query.order_by(o.target, o.started)).all()
        return [ScrapeOutcome(*r) for r in rows]

    def cluster_id(self, conn: Connection, name: str) -> int:
        """The id of cluster ``name``, registered in ``conn``'s transaction if new."""
        if not name or len(name) > 200:
            raise ConfigError(f"cluster name must be 1-200 characters: {name!r}")
        stmt = self.db.insert(ClusterRow.__table__).values(name=name)
        conn.execute(stmt.on_conflict_do_nothing(index_elements=["name"]))
        return int(conn.execute(select(ClusterRow.id).where(ClusterRow.name == name)).scalar_one())

    def upsert_cluster(self, name: str) -> int:
        """Register a cluster (no-op when it exists); return its id."""
        self.db.require_schema()
        with self.db.tx(f"registering cluster {name}", write=True) as conn:
            return self.cluster_id(conn, name)

    def upsert_target(
        self, name: str, url: str, kind: str = "vllm", cluster: str = "default"
    ) -> TargetRecord:
        """Register or update a scrape target (kind: vllm, lmcache or prometheus)."""
        if kind not in TARGET_KINDS:
            raise ConfigError(f"target {name}: kind must be one of {TARGET_KINDS}, not {kind!r}")
        if not name:
            raise ConfigError(f"target name must not be empty (url {url})")
        self.db.require_schema()
        with self.db.tx(f"registering target {name}", write=True) as conn:
            values = {
                "name": name,
                "url": url,
                "kind": kind,
                "cluster_id": self.cluster_id(conn, cluster),
                "updated": time.time(),
            }
            stmt = self.db.insert(TargetRow.__table__).values(**values)
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["name"],
                    set_={k: stmt.excluded[k] for k in values if k != "name"},
                )
            )
        return TargetRecord(name=name, url=url, kind=kind, cluster=cluster)

    def delete_target(self, name: str) -> bool:
        """Forget a scrape target; False when there was none of that name.

        Its scrape outcomes, engine and windows stay: they are history, and a collector
        reading the targets table (``kvscope collect --targets-from-store``) stops scraping
        it at its next tick.
        """
        self.db.require_schema()
        with self.db.tx(f"deleting target {name}", write=True) as conn:
            result = conn.execute(delete(TargetRow).where(TargetRow.name == name))
        return bool(result.rowcount)

    def upsert_engine(  # noqa: PLR0913 - one parameter per engine fact stored
        self,
        cluster: str,
        source: str,
        *,
        model: str | None = None,
        gpu: str | None = None,
        hbm_gb: float | None = None,
        tensor_parallel: int | None = None,
        offload: str | None = None,
        facts: Mapping[str, Any] | None = None,
        observed_at: float | None = None,
    ) -> EngineRecord:
        """Register or update the engine scraped as ``source``; None keeps the stored value.

        ``offload`` is "none", "native" (vLLM's CPU offload) or "lmcache"; ``facts`` (e.g.
        block_size, num_gpu_blocks of the cache-config info family, catalog.FACTS) replaces
        the stored facts. ``observed_at``: the time these values were seen on the engine
        (a scrape or a Prometheus poll); when its regime (REGIME_COLUMNS, REGIME_FACTS)
        differs from the last recorded one, a change is recorded at that time, in the same
        transaction. Registration from configuration alone passes None: no change is
        recorded for what nobody observed.
        """
        if offload is not None and offload not in OFFLOAD_MODES:
            raise ConfigError(f"engine {source}: offload must be one of {OFFLOAD_MODES}")
        if hbm_gb is not None and not (math.isfinite(hbm_gb) and hbm_gb > 0):
            raise ConfigError(f"engine {source}: hbm_gb must be a positive number: {hbm_gb}")
        if tensor_parallel is not None and tensor_parallel < 1:
            raise ConfigError(f"engine {source}: tensor_parallel must be >= 1")
        if not source:
            raise ConfigError("engine source must not be empty")
        given = {
            "model": model,
            "gpu": gpu,
            "hbm_gb": hbm_gb,
            "tensor_parallel": tensor_parallel,
            "offload": offload,
            "facts": None if facts is None else _jsonable(facts, f"engine {source} facts"),
        }
        changes = {k: v for k, v in given.items() if v is not None}
        self.db.require_schema()
        with self.db.tx(f"registering engine {source}", write=True) as conn:
            values: dict[str, Any] = {
                "source": source,
                "cluster_id": self.cluster_id(conn, cluster),
                "updated": time.time(),
                "offload": "none",
                "facts": {},
                **changes,
            }
            stmt = self.db.insert(EngineRow.__table__).values(**values)
            update = ["cluster_id", "updated", *changes]
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["source"], set_={k: stmt.excluded[k] for k in update}
                )
            )
            if observed_at is not None:
                self._record_change(conn, source, observed_at)
        (engine,) = self.engines(source=source)
        return engine

    def _record_change(self, conn: Connection, source: str, at: float) -> None:
        """Append the engine's regime at ``at`` unless it equals the last one recorded."""
        if not math.isfinite(at):
            raise StoreError(f"engine {source}: observed_at must be finite, got {at!r}")
        e, ch = EngineRow, EngineChangeRow
        row = conn.execute(
            select(*(getattr(e, c) for c in REGIME_COLUMNS), e.facts).where(e.source == source)
        ).one()
        facts = row[-1] or {}
        regime = {c: row[i] for i, c in enumerate(REGIME_COLUMNS) if c != "offload"}
        regime |= {k: facts.get(k) for k in REGIME_FACTS}
        last = conn.execute(
            select(ch.offload, ch.facts).where(ch.source == source).order_by(ch.at.desc()).limit(1)
        ).first()
        if last is not None and last[0] == row[0] and _regime(last[1]) == regime:
            return
        stored = regime | {
            k: facts[k] for k in ("offload_basis", "provenance") if facts.get(k) is not None
        }
        stmt = self.db.insert(ch.__table__).values(
            source=source, at=at, offload=row[0], facts=_jsonable(stored, f"engine {source}")
        )
        conn.execute(stmt.on_conflict_do_nothing(index_elements=["source", "at"]))

    def engine_changes(self, sources: Sequence[str] | None = None) -> dict[str, list[EngineChange]]:
        """source -> its recorded regimes, oldest first (Store.upsert_engine's observed_at)."""
        self.db.require_schema()
        ch = EngineChangeRow
        query = select(ch.source, ch.at, ch.offload, ch.facts)
        if sources is not None:
            query = query.where(ch.source.in_(list(sources)))
        with self.db.tx("reading engine changes") as conn:
            rows = conn.execute(query.order_by(ch.source, ch.at)).all()
        out: dict[str, list[EngineChange]] = {}
        for source, at, offload, facts in rows:
            out.setdefault(source, []).append(EngineChange(at, offload, facts or {}))
        return out

    def engines(self, cluster: str | None = None, source: str | None = None) -> list[EngineRecord]:
        """Registered engines (optionally of one cluster or one source), by cluster, source."""
        self.db.require_schema()
        e, c = EngineRow, ClusterRow
        query = select(
            c.name, e.source, e.model, e.gpu, e.hbm_gb, e.tensor_parallel, e.offload, e.facts
        ).join(c, c.id == e.cluster_id)
        if cluster is not None:
            query = query.where(c.name == cluster)
        if source is not None:
            query = query.where(e.source == source)
        with self.db.tx("reading engines") as conn:
            rows = conn.execute(query.order_by(c.name, e.source)).all()
        changes = self.engine_changes([source] if source is not None else None)
        return [
            EngineRecord(
                cluster=r.name,
                source=r.source,
                model=r.model,
                gpu=r.gpu,
                hbm_gb=r.hbm_gb,
                tensor_parallel=r.tensor_parallel,
                offload=r.offload,
                facts=r.facts,
                changes=tuple(changes.get(r.source, ())),
            )
            for r in rows
        ]

    def targets(self, cluster: str | None = None) -> list[TargetRecord]:
        """Registered scrape targets (optionally of one cluster), by cluster, name."""
        self.db.require_schema()
        t, c = TargetRow, ClusterRow
        query = select(t.name, t.url, t.kind, c.name).join(c, c.id == t.cluster_id)
        if cluster is not None:
            query = query.where(c.name == cluster)
        with self.db.tx("reading targets") as conn:
            rows = conn.execute(query.order_by(c.name, t.name)).all()
        return [TargetRecord(*row) for row in rows]

    def stats(self) -> dict[str, Any]:
        """Row counts per table, the windows' count and time range, and window and series
        counts per signal; on PostgreSQL also the chunks' partitions (how many, the oldest
        and the newest)."""
        self.db.require_schema()
        tables = (
            ClusterRow, EngineRow, EngineChangeRow, TargetRow, ScrapeOutcomeRow, SeriesRow,
            HeadRow, ChunkRow, Chunk5mRow, PlanRow, RollupStateRow,
        )  # fmt: skip
        with self.db.tx("reading statistics") as conn:
            counts = {
                t.__tablename__: int(conn.execute(select(func.count()).select_from(t)).scalar_one())
                for t in tables
            }
            per_signal: dict[str, list[int]] = {}
            c, h, sr = ChunkRow, HeadRow, SeriesRow
            in_chunks = select(c.series_id, c.n.label("n"))
            in_tier = select(Chunk5mRow.series_id, Chunk5mRow.n.label("n"))
            in_head = select(h.series_id, literal(1).label("n"))
            held = union_all(in_chunks, in_tier, in_head).subquery()
            for signal, n, k in conn.execute(
                select(sr.signal, func.sum(held.c.n), func.count(func.distinct(sr.id)))
                .join(held, held.c.series_id == sr.id)
                .group_by(sr.signal)
            ):
                per_signal[str(signal)] = [int(n), int(k)]
            first, last = _time_range(conn)
            parts = partitions.partitions(conn) if self.db.dialect == "postgresql" else None
        out: dict[str, Any] = {
            "rows": counts,
            "windows": sum(n for n, _ in per_signal.values()),
            "windows_from": first,
            "windows_until": last,
            "signals": {s: {"windows": n, "series": k} for s, (n, k) in sorted(per_signal.items())},
        }
        if parts is not None:
            names = [p.name for p in parts]
            out["partitions"] = {"count": len(names), "oldest": names[0] if names else None,
                                 "newest": names[-1] if names else None}  # fmt: skip
        return out


def _time_range(conn: Connection) -> tuple[float | None, float | None]:
    """The first window's start and the last one's end, over the head and both tiers."""
    firsts: list[float] = []
    lasts: list[float] = []
    h = HeadRow
    lo, hi = conn.execute(select(func.min(h.start), func.max(h.start + h.length_s))).one()
    if lo is not None:
        firsts.append(float(lo))
        lasts.append(float(hi))
    for t, at in ((ChunkRow, ChunkRow.hour), (Chunk5mRow, Chunk5mRow.day)):
        for pick, into in ((func.min(at), firsts), (func.max(at), lasts)):
            when = conn.execute(select(pick)).scalar()
            if when is None:
                continue
            rows = [r for (data,) in conn.execute(select(t.data).where(at == when))
                    for r in chunks.decode(bytes(data))]  # fmt: skip
            if into is firsts:
                into.append(min(float(r[0]) for r in rows))
            else:
                into.append(max(float(r[0]) + float(r[1]) for r in rows))
    return (min(firsts) if firsts else None), (max(lasts) if lasts else None)
