"""The one duration grammar: ``500ms``, ``15s``, ``1m``, ``2h``, ``7d``, ``1w`` or a bare number
of seconds. The CLI parses its flags with :func:`parse_duration`; the API's query parameters
accept the subset :data:`API_PATTERN` (a whole number 1–9999 and a unit: bounded, so the
OpenAPI document states it) and are read by the same function. :func:`format_duration` writes
one for people ('3.2 d', '5.0 h')."""

from __future__ import annotations

import math
import re

from core.errors import ConfigError

UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
API_UNITS = ("s", "m", "h", "d", "w")
API_PATTERN = rf"^[1-9][0-9]{{0,3}}({'|'.join(API_UNITS)})$"


def parse_duration(text: str, what: str, *, allow_zero: bool = False) -> float:
    """Seconds of ``text`` (module docstring); ConfigError naming ``what`` when it is not a
    duration, or is 0 without ``allow_zero``."""
    m = _DURATION.match(text)
    if m is None:
        raise ConfigError(
            f"{what}: {text!r} is not a duration (use e.g. 500ms, 15s, 1m, 2h, 7d, 1w)"
        )
    seconds = float(m.group(1)) * UNITS[m.group(2) or "s"]
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ConfigError(f"{what}: must be greater than 0, got {text!r}")
    return seconds


def format_duration(seconds: float | None) -> str:
    """A duration for people: '3.2 d' / '5.0 h' / 'now'; 'n/a' when unknown or not finite."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    if seconds <= 0:
        return "now"
    return f"{seconds / 86400:.1f} d" if seconds >= 86400 else f"{seconds / 3600:.1f} h"
