"""Validated reading of scenario mappings: typed getters that name the dotted key on error.

Every value read is recorded with where it came from ("scenario" or the documented default
and its source) so a simulation result can list the parameters it used.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter a simulation used: dotted key, value and where it came from."""

    key: str
    value: Any
    source: str


class Section:
    """A mapping being read; `finish()` rejects the keys nobody asked for."""

    def __init__(self, data: object, path: str, where: str, params: list[Param]) -> None:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"{where}: {path or 'top level'} must be a mapping, got {type(data).__name__}"
            )
        self.data: Mapping[str, Any] = data
        self.path = path
        self.where = where
        self.params = params
        self._seen: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def fail(self, name: str, message: str) -> ConfigError:
        return ConfigError(f"{self.where}: {self.key(name)}: {message}")

    def has(self, name: str) -> bool:
        return name in self.data and self.data[name] is not None

    def raw(self, name: str) -> Any:
        self._seen.add(name)
        return self.data.get(name)

    def _record(self, name: str, value: Any, default_source: str | None) -> None:
        given = name in self.data and self.data[name] is not None
        source = "scenario" if given else (default_source or "default")
        self.params.append(Param(self.key(name), value, source))

    def number(
        self,
        name: str,
        default: float | None = None,
        *,
        source: str | None = None,
        low: float | None = None,
        high: float | None = None,
        low_open: bool = False,
        required: bool = False,
        record: bool = True,
    ) -> float:
        self._seen.add(name)
        value = self.data.get(name)
        if value is None:
            if required or default is None:
                raise self.fail(name, "is required")
            value = default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(name, f"must be a number, got {value!r}")
        out = float(value)
        if not math.isfinite(out):
            raise self.fail(name, f"must be finite, got {value!r}")
        if low is not None and (out < low or (low_open and out == low)):
            raise self.fail(name, f"must be {'>' if low_open else '>='} {low:g}, got {value!r}")
        if high is not None and out > high:
            raise self.fail(name, f"must be <= {high:g}, got {value!r}")
        if record:
            self._record(name, out, source)
        return out

    def integer(
        self,
        name: str,
        default: int | None = None,
        *,
        source: str | None = None,
        low: int | None = None,
        high: int | None = None,
        required: bool = False,
        record: bool = True,
    ) -> int:
        self._seen.add(name)
        value = self.data.get(name)
        if value is None:
            if required or default is None:
                raise self.fail(name, "is required")
            value = default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(name, f"must be an integer, got {value!r}")
        if low is not None and value < low:
            raise self.fail(name, f"must be >= {low}, got {value!r}")
        if high is not None and value > high:
            raise self.fail(name, f"must be <= {high}, got {value!r}")
        if record:
            self._record(name, value, source)
        return value

    def optional_integer(self, name: str, *, low: int = 1, source: str | None = None) -> int | None:
        if not self.has(name):
            self._seen.add(name)
            self.params.append(Param(self.key(name), None, source or "default"))
            return None
        return self.integer(name, low=low)

    def choice(
        self, name: str, default: str, choices: tuple[str, ...], *, source: str | None = None
    ) -> str:
        self._seen.add(name)
        value = self.data.get(name, default)
        if value is None:
            value = default
        if not isinstance(value, str) or value.strip().lower() not in choices:
            raise self.fail(name, f"must be one of {', '.join(choices)}, got {value!r}")
        out = value.strip().lower()
        self._record(name, out, source)
        return out

    def string(self, name: str, default: str, *, source: str | None = None) -> str:
        self._seen.add(name)
        value = self.data.get(name, default)
        if value is None:
            value = default
        if not isinstance(value, str) or not value.strip():
            raise self.fail(name, f"must be a non-empty string, got {value!r}")
        self._record(name, value.strip(), source)
        return value.strip()

    def boolean(self, name: str, default: bool, *, source: str | None = None) -> bool:
        self._seen.add(name)
        value = self.data.get(name, default)
        if value is None:
            value = default
        if not isinstance(value, bool):
            raise self.fail(name, f"must be true or false, got {value!r}")
        self._record(name, value, source)
        return value

    def section(self, name: str) -> Section:
        self._seen.add(name)
        return Section(self.data.get(name), self.key(name), self.where, self.params)

    def finish(self) -> None:
        unknown = sorted(str(k) for k in self.data if k not in self._seen)
        if unknown:
            allowed = ", ".join(sorted(self._seen))
            raise ConfigError(
                f"{self.where}: {self.key(unknown[0])}: unknown key (allowed here: {allowed})"
            )
