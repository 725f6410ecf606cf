"""The one way the planner turns numbers into JSON: a finite float or None, and JSON-ready values.

JSON has no NaN or infinity: a figure the data cannot give (an unbounded interval end, a fit
that did not run) is written as null. Every JSON document kvscope prints (plan, advise,
forecast, fits) goes through :func:`json_ready`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any

__all__ = ["finite", "json_ready"]


def finite(x: object) -> float | None:
    """A finite real number (Python's or numpy's) as a float, else None (JSON null):
    NaN, ±inf, None, booleans and non-numbers all mean unknown."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return None
    v = float(x)
    return v if math.isfinite(v) else None


def json_ready(value: Any) -> Any:
    """Recursively: dataclass instances and mappings -> dicts (keys as str), tuples and lists
    -> lists, non-finite floats -> None; everything else as it is."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_ready(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return value
