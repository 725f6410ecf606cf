"""Roll-up hand-off through the store: a target moving to another collector loses nothing.

At a clean stop each collector leaves every target's roll-up state in ``rollup_states``; a
collector that starts scraping a target takes the row (read and delete in one transaction)
and resumes from the newer of it and its own checkpoint. Re-sharding loses nothing when the
new collectors start within the stale horizon (5 windows) after the old ones stop.

Design: store/DESIGN.md#handoff
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence

from sqlalchemy import delete

from core.records import Saved
from store.db import Database
from store.tables import RollupStateRow

log = logging.getLogger(__name__)
_CHUNK = 500  # names per IN (...) list: well under SQLite's 32,766 bound parameters


class HandoffStore:
    """Roll-up states left for the next collector of a target (Store's)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def leave_rollup_states(self, states: Iterable[Saved]) -> int:
        """Store each target's state, replacing an older one of it; return how many."""
        rows = [
            {
                "target": s.name,
                "url": s.url,
                "written": s.written,
                "state": json.dumps(s.state, separators=(",", ":")),
            }
            for s in states
        ]
        if not rows:
            return 0
        self.db.require_schema()
        what = f"leaving the roll-up state of {len(rows)} target(s)"
        with self.db.tx(what, write=True) as conn:
            for i in range(0, len(rows), _CHUNK):
                stmt = self.db.insert(RollupStateRow).values(rows[i : i + _CHUNK])
                conn.execute(
                    stmt.on_conflict_do_update(
                        index_elements=["target"],
                        set_={c: stmt.excluded[c] for c in ("url", "written", "state")},
                    )
                )
        return len(rows)

    def take_rollup_states(self, targets: Sequence[str]) -> dict[str, Saved]:
        """The states left for ``targets``, deleted from the store as they are read."""
        if not targets:
            return {}
        self.db.require_schema()
        out: dict[str, Saved] = {}
        what = f"taking the roll-up state of {len(targets)} target(s)"
        with self.db.tx(what, write=True) as conn:
            for i in range(0, len(targets), _CHUNK):
                names = list(targets[i : i + _CHUNK])
                # one DELETE … RETURNING: of two collectors taking the same rows at once,
                # the second waits on the first's row locks and then finds them gone
                # (PostgreSQL; a SELECT then DELETE let both read them under READ COMMITTED)
                found = conn.execute(
                    delete(RollupStateRow)
                    .where(RollupStateRow.target.in_(names))
                    .returning(RollupStateRow.target, RollupStateRow.url,
                               RollupStateRow.written, RollupStateRow.state)
                ).all()  # fmt: skip
                for r in found:
                    try:
                        state = json.loads(r.state)
                    except ValueError as exc:  # written by this module: a damaged row
                        log.error("target %s: its stored roll-up state is unusable: %s",
                                  r.target, exc)  # fmt: skip
                        continue
                    out[r.target] = Saved(r.target, r.url, float(r.written), state)
        return out
