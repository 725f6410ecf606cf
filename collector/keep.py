"""Which windows the collector writes: ``--keep used`` (the default) or ``--keep all``.

``used`` keeps the signals kvscope reads back from the store (core.catalog STORED_SIGNALS:
the catalogue's ``stored`` flag and the derived ratios of stored counters); ``all`` keeps
every canonical signal. The windows are filtered before the spool and the store, so a
spooled segment holds only kept windows. Prometheus mode also queries only what it keeps,
plus the signals engine facts look at (collector.engine_facts PRESENCE_SIGNALS).
"""

from __future__ import annotations

from collections.abc import Sequence

from collector.engine_facts import PRESENCE_SIGNALS
from core.catalog import DERIVED_RATIOS, SIGNALS, STORED_SIGNALS
from core.errors import ConfigError
from core.records import Window

# None: keep every window; else the signal names kept.
Keep = frozenset[str] | None
KEEP_CHOICES: dict[str, Keep] = {"used": STORED_SIGNALS, "all": None}


def parse_keep(choice: str, what: str = "--keep") -> Keep:
    """The keep set named by ``choice`` (used or all); ConfigError otherwise."""
    try:
        return KEEP_CHOICES[choice]
    except KeyError:
        raise ConfigError(
            f"{what} must be one of {', '.join(KEEP_CHOICES)} (used: only the signals kvscope "
            f"reads back; all: every signal of the catalogue), got {choice!r}"
        ) from None


def kept_windows(windows: Sequence[Window], keep: Keep) -> Sequence[Window]:
    """The windows of kept signals, in their order (all of them when ``keep`` is None)."""
    if keep is None:
        return windows
    return [w for w in windows if w.signal in keep]


def query_signals(keep: Keep) -> list[str] | None:
    """The catalogue signals Prometheus mode queries for ``keep`` (None: all of them): the
    kept ones, the counters of kept derived ratios and PRESENCE_SIGNALS, in catalogue order."""
    if keep is None:
        return None
    wanted: set[str] = set(keep) | set(PRESENCE_SIGNALS)
    wanted.update(x for ratio, num, den in DERIVED_RATIOS if ratio in keep for x in (num, den))
    return [name for name in SIGNALS if name in wanted]
