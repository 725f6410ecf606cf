"""engines.yaml: the facts an engine's metrics cannot say, set by label matchers.

``rules: [{match: {label: regex, …}, set: {fact: value, …}}, …]``: matchers are regexes
anchored at both ends (PromQL's ``=~``), all of a rule's must match, a missing label is "".
Each fact comes from the first matching rule that sets it (``gpu``, ``hbm_gb``,
``tensor_parallel``, ``dram_gib``, ``model``, ``offload``). Example: examples/engines.yaml.

Rules: collector/DESIGN.md#engine_rules
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collector.scrape import read_yaml
from core.errors import ConfigError
from core.records import OFFLOAD_MODES

__all__ = ["RULE_KEYS", "EngineRule", "EngineRules", "load_engine_rules", "parse_engine_rules"]

RULE_KEYS = ("gpu", "hbm_gb", "tensor_parallel", "dram_gib", "model", "offload")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")  # a Prometheus label name


@dataclass(frozen=True, slots=True)
class EngineRule:
    """One rule: every matcher must match; then it sets ``sets``."""

    index: int
    matchers: tuple[tuple[str, re.Pattern[str]], ...]
    sets: Mapping[str, Any]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(p.fullmatch(labels.get(k, "")) is not None for k, p in self.matchers)


@dataclass(frozen=True, slots=True)
class EngineRules:
    """The rules of one engines.yaml, in file order."""

    source: str
    rules: tuple[EngineRule, ...] = ()

    def facts_for(self, labels: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
        """fact -> (value, which rule set it): the first matching rule that sets each fact."""
        out: dict[str, tuple[Any, str]] = {}
        for rule in self.rules:
            if rule.matches(labels):
                for key, value in rule.sets.items():
                    out.setdefault(key, (value, f"{self.source} rule {rule.index + 1}"))
        return out


def load_engine_rules(path: str | Path) -> EngineRules:
    """Read and validate an engines.yaml (DESIGN.md#engine_rules); ConfigError names what is
    wrong."""
    p = Path(path)
    return parse_engine_rules(read_yaml(p, "engine rules file"), source=p.name)


def parse_engine_rules(doc: object, *, source: str = "engines.yaml") -> EngineRules:
    """Validate an already-loaded engines.yaml document."""
    if not isinstance(doc, Mapping) or set(doc) != {"rules"}:
        raise ConfigError(f"{source}: expected a mapping with the one key 'rules'")
    entries = doc["rules"]
    if not isinstance(entries, list):
        raise ConfigError(f"{source}: 'rules' must be a list")
    return EngineRules(source, tuple(_rule(e, i, f"{source}: rules[{i}]") for i, e in
                                     enumerate(entries)))  # fmt: skip


def _rule(entry: object, index: int, where: str) -> EngineRule:
    if not isinstance(entry, Mapping) or set(entry) - {"match", "set"} or "set" not in entry:
        raise ConfigError(f"{where}: expected a mapping with keys 'match' and 'set'")
    match = entry.get("match") or {}
    if not isinstance(match, Mapping):
        raise ConfigError(f"{where}.match: expected a mapping of label name to regex")
    matchers = []
    for label, pattern in match.items():
        if not isinstance(label, str) or not _LABEL.match(label):
            raise ConfigError(f"{where}.match: {label!r} is not a label name")
        if not isinstance(pattern, str):
            raise ConfigError(f"{where}.match.{label}: the pattern must be a string")
        try:
            matchers.append((label, re.compile(pattern)))
        except re.error as exc:
            raise ConfigError(f"{where}.match.{label}: bad regex {pattern!r}: {exc}") from exc
    sets = entry["set"]
    if not isinstance(sets, Mapping) or not sets:
        raise ConfigError(f"{where}.set: expected a non-empty mapping of facts")
    unknown = sorted(str(k) for k in sets if k not in RULE_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}.set: unknown fact(s) {', '.join(unknown)}; allowed: {', '.join(RULE_KEYS)}"
        )
    return EngineRule(index, tuple(matchers), {k: _value(k, v, f"{where}.set.{k}")
                                                for k, v in sets.items()})  # fmt: skip


def _value(key: str, value: object, where: str) -> Any:
    if key in ("gpu", "model"):
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
        return value.strip()
    if key == "offload":
        if value not in OFFLOAD_MODES:
            raise ConfigError(f"{where}: expected one of {', '.join(OFFLOAD_MODES)}, got {value!r}")
        return value
    if key == "tensor_parallel":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where}: expected an integer >= 1, got {value!r}")
        return value
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(float(value)) or float(value) <= 0:  # type: ignore[arg-type]
        raise ConfigError(f"{where}: expected a positive number, got {value!r}")
    return float(value)  # type: ignore[arg-type]
