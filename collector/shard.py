"""Sharded collection: ``kvscope collect --shard I/N`` scrapes the targets whose name hashes to I.

The hash is Prometheus' ``hashmod`` relabel action (prometheus/model/relabel: the MD5 of the
value, its last 8 bytes as a big-endian unsigned 64-bit integer, modulo N), applied to the
target's name — the ``instance`` label for file_sd targets, the name in a targets file or the
store's targets table. A collector fleet sharded this way splits the targets exactly as
Prometheus servers sharded with ``hashmod`` on the same label would, and a target's shard
depends on its name alone: no coordination, and every target on exactly one shard of N.
Changing N moves about (N' - 1)/N' of the targets; store.handoff carries their roll-ups
over when the old collectors stop before the new ones start.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from core.errors import ConfigError

MAX_SHARDS = 10_000
_SPEC = re.compile(r"(\d+)/(\d+)")


class _Named(Protocol):
    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=_Named)


def hashmod(value: str, modulus: int) -> int:
    """Prometheus' hashmod of ``value`` (UTF-8) modulo ``modulus``."""
    digest = hashlib.md5(value.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[8:], "big") % modulus


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard ``index`` of ``count`` (0 <= index < count)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SHARDS:
            raise ConfigError(f"shard count must be 1..{MAX_SHARDS}, got {self.count}")
        if not 0 <= self.index < self.count:
            raise ConfigError(
                f"shard index must be 0..{self.count - 1} for {self.count} shard(s), "
                f"got {self.index}"
            )

    @classmethod
    def parse(cls, spec: str, what: str = "--shard") -> Shard:
        """``"I/N"``: shard I (from 0) of N."""
        m = _SPEC.fullmatch(spec.strip())
        if m is None:
            raise ConfigError(f"{what} must be I/N (shard I of N, I from 0), got {spec!r}")
        try:
            return cls(int(m[1]), int(m[2]))
        except ConfigError as exc:
            raise ConfigError(f"{what} {spec}: {exc}") from exc

    def owns(self, name: str) -> bool:
        return hashmod(name, self.count) == self.index

    def select(self, items: Iterable[N]) -> list[N]:
        """The items (targets) whose name is this shard's, in their order."""
        return [i for i in items if self.owns(i.name)]

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"
