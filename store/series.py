"""Series ids: each (source, signal, labels) named once in ``series`` by a small integer.

:class:`SeriesIds` resolves the series of a batch of windows to their ids, inserting the new
ones (``INSERT … ON CONFLICT DO NOTHING``, then a look-up: concurrent writers of the same
series both get the one id) and caching the answers; ids never change, so the cache needs
no invalidation (a series is never deleted while a Store runs: retention keeps them).
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite

from core.records import Labels
from store.tables import SeriesRow, labels_json, series_key

# one series as a writer names it: source, signal, labels, kind
Named = tuple[str, str, Labels, str]
_LOOKUP = 500  # (source, key) pairs per look-up statement
_CACHE_MAX = 1_000_000


class SeriesIds:
    """The id of every series a Store has written or read (module docstring)."""

    def __init__(self) -> None:
        self.ids: dict[tuple[str, str, Labels], int] = {}
        self.by_source: dict[str, set[int]] = {}

    def get(self, source: str, signal: str, labels: Labels) -> int | None:
        return self.ids.get((source, signal, labels))

    def resolve(self, conn: Connection, names: Iterable[Named]) -> None:
        """Make sure every named series has a row and its id is cached."""
        missing: dict[tuple[str, str], Named] = {}
        for source, signal, labels, kind in names:
            if (source, signal, labels) not in self.ids:
                missing[(source, series_key(signal, labels))] = (source, signal, labels, kind)
        if not missing:
            return
        if len(self.ids) > _CACHE_MAX:
            self.ids.clear()
            self.by_source.clear()
        insert = sqlite.insert if conn.dialect.name == "sqlite" else postgresql.insert
        rows = [
            {"source": s, "key": k, "signal": sig, "labels": labels_json(lab), "kind": kind}
            for (s, k), (_, sig, lab, kind) in sorted(missing.items())
        ]
        conn.execute(insert(SeriesRow).on_conflict_do_nothing(), rows)
        keys = sorted(missing)
        for i in range(0, len(keys), _LOOKUP):
            part = keys[i : i + _LOOKUP]
            found = conn.execute(
                select(SeriesRow.source, SeriesRow.key, SeriesRow.id).where(
                    tuple_(SeriesRow.source, SeriesRow.key).in_(part)
                )
            )
            for source, key, sid in found:
                _, signal, labels, _kind = missing[(source, key)]
                self.ids[(source, signal, labels)] = int(sid)
                self.by_source.setdefault(source, set()).add(int(sid))

    def of_source(self, conn: Connection, source: str) -> list[int]:
        """Every series id of ``source`` in the store (read each time: another writer may
        have added one)."""
        found = conn.execute(select(SeriesRow.id).where(SeriesRow.source == source)).scalars()
        return sorted(int(i) for i in found)
