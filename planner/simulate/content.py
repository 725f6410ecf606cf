"""Content identity: a prefix tree of token segments shared by every cache of a simulation.

A request's prompt is a path of segments; two requests share KV exactly as far as their
paths share nodes (as vLLM's and LMCache's chained block hashes do). A batch run keeps nodes
in lists; a served or looping run builds the tree ``sparse`` and ``prune(live)`` drops what
nothing can reach, so memory stays bounded.

Design: planner/simulate/METHODS.md#content
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from typing import TypeAlias

# node -> value; a list in a batch run, a dict in a sparse (prunable) tree
NodeTable: TypeAlias = list[int] | dict[int, int]
_Lists: TypeAlias = tuple[list[int], list[int], list[int], list[int]]
_Dicts: TypeAlias = tuple[dict[int, int], dict[int, int], dict[int, int], dict[int, int]]


class ContentTree:
    """Segments of token content: node -> (parent, start token, end token)."""

    __slots__ = ("_dicts", "_interned", "_lists", "created", "end", "hw", "parent", "start")

    def __init__(self, *, sparse: bool = False) -> None:
        self._lists: _Lists | None = None
        self._dicts: _Dicts | None = None
        tables: tuple[NodeTable, NodeTable, NodeTable, NodeTable]
        if sparse:
            self._dicts = tables = ({}, {}, {}, {})
        else:
            self._lists = tables = ([], [], [], [])
        self.parent: NodeTable = tables[0]
        self.start: NodeTable = tables[1]
        self.end: NodeTable = tables[2]
        self.hw: NodeTable = tables[3]  # tokens of the node ever computed anywhere (re-prefill)
        self._interned: dict[tuple[int, object], int] = {}
        self.created = 0  # node ids issued so far (the next node's id)

    @property
    def sparse(self) -> bool:
        return self._dicts is not None

    def new(self, parent: int, length: int) -> int:
        """A fresh node (content nobody else has) of `length` tokens after `parent` (-1 = root)."""
        start = self.end[parent] if parent >= 0 else 0
        n = self.created
        self.created = n + 1
        if self._lists is not None:
            p, s, e, h = self._lists
            p.append(parent)
            s.append(start)
            e.append(start + length)
            h.append(0)
        else:
            assert self._dicts is not None
            p_, s_, e_, h_ = self._dicts
            p_[n] = parent
            s_[n] = start
            e_[n] = start + length
            h_[n] = 0
        return n

    def shared(self, parent: int, key: object, length: int) -> int:
        """The node for content `key` after `parent`, created once (same key = same tokens)."""
        node = self._interned.get((parent, key))
        if node is None:
            node = self.new(parent, length)
            self._interned[(parent, key)] = node
        return node

    def __len__(self) -> int:
        """Nodes held (= created, unless pruned)."""
        return len(self.parent)

    @property
    def interned(self) -> int:
        """Shared (keyed) nodes held."""
        return len(self._interned)

    def interned_after(self, parents: Container[int]) -> list[int]:
        """The shared nodes whose parent is one of `parents`."""
        return [n for (p, _), n in self._interned.items() if p in parents]

    def prune(self, roots: Iterable[int]) -> int:
        """Keep `roots` and their ancestors, drop every other node (and its interned key);
        returns the nodes dropped. Sparse trees only."""
        if self._dicts is None:
            raise TypeError("prune() needs a sparse ContentTree")
        parent = self._dicts[0]
        live: set[int] = set()
        for root in roots:
            n = root
            while n >= 0 and n not in live:
                live.add(n)
                n = parent[n]
        dead = [n for n in parent if n not in live]
        for table in self._dicts:  # in place: the caches hold references to these tables
            for n in dead:
                del table[n]
        if dead:
            self._interned = {k: n for k, n in self._interned.items() if n in live}
        return len(dead)
