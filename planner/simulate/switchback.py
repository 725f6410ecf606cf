"""`cluster.switchback`: canary engines whose offload is switched on and off in periods of time,
as an operator evaluates offload on one engine (a switchback experiment).

Periods of `block_s` from t = 0, on or off by an explicit cycled `schedule` or by randomized
(on, off)/(off, on) pairs from ``random.Random(seed)``. A period whose state differs from the
previous one's restarts the listed engines with the new configuration (Engine.restart).

Design: planner/simulate/METHODS.md#switchback; PARAMETERS.md, "Switchback"
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from planner.simulate.spec import Param, Section

SWITCH_MODES = ("native", "lmcache")
SRC_PERIOD = "default: assumption (30-minute blocks)"
SRC_MODE = "default: native (vLLM's CPU offload; lmcache needs the scenario's LMCache pool)"


@dataclass(frozen=True, slots=True)
class SwitchbackSpec:
    """The canary engines, their offload when on, the periods and how their order is chosen."""

    engines: tuple[int, ...]
    mode: str  # native | lmcache, during "on" periods ("off" periods: none)
    period_s: float
    start: str | None = None  # "on" | "off": pair 0 starts so; None: drawn like the others
    schedule: tuple[bool, ...] | None = None  # explicit on (True) / off per period, cycled
    seed: int | None = None  # None until parse_scenario fills in the scenario's seed


@dataclass(frozen=True, slots=True)
class Switch:
    """A regime of one engine: from simulated time `t` it runs `offload`; `aborted` requests
    were in flight at the restart and sent again (0 for the regime the run starts with)."""

    t: float
    engine: int
    offload: str
    aborted: int = 0


class Schedule:
    """Whether each period is on (lazily drawn, so a looping server never runs out)."""

    def __init__(self, spec: SwitchbackSpec) -> None:
        self.spec = spec
        self._rng = random.Random(spec.seed if spec.seed is not None else 0)
        self._pairs: list[bool] = []  # pair p: True = (on, off), False = (off, on)

    def on(self, period: int) -> bool:
        """True when period `period` (0, 1, ...) runs the offload."""
        spec = self.spec
        if spec.schedule is not None:
            return spec.schedule[period % len(spec.schedule)]
        pair = period // 2
        while len(self._pairs) <= pair:
            self._pairs.append(self._rng.random() < 0.5)
        first_on = self._pairs[pair]
        if pair == 0 and spec.start is not None:
            first_on = spec.start == "on"
        return first_on if period % 2 == 0 else not first_on

    def mode(self, period: int) -> str:
        """The listed engines' offload mode during `period`."""
        return self.spec.mode if self.on(period) else "none"

    def next_switch(self, period: int) -> int | None:
        """The first period after `period` whose state differs from its predecessor's (None: an
        explicit schedule of one state never switches)."""
        now = self.on(period)
        # random pairs switch within 2 periods; a cycled schedule repeats within its length
        horizon = len(self.spec.schedule) if self.spec.schedule is not None else 3
        for b in range(period + 1, period + horizon + 1):
            if self.on(b) != now:
                return b
        return None

    def regimes(self, until: float) -> list[tuple[float, str]]:
        """(start time, mode) of every regime that starts before `until`, the first at 0."""
        out = [(0.0, self.mode(0))]
        period = 0
        while True:
            nxt = self.next_switch(period)
            if nxt is None or nxt * self.spec.period_s >= until:
                return out
            out.append((nxt * self.spec.period_s, self.mode(nxt)))
            period = nxt


def parse_switchback(
    sec: Section, engines_offload: tuple[str, ...], *, lmcache_scope_given: bool
) -> SwitchbackSpec | None:
    """`cluster.switchback` (None when absent; its keys are recorded only when present, so
    other scenarios' parameter lists are unchanged). The listed engines' own offload (the
    cluster's `offload` / `engines_offload`) must be none: that is their "off" state."""
    if not sec.has("switchback"):
        sec.raw("switchback")
        return None
    s = sec.section("switchback")
    engines = _engines(s, len(engines_offload))
    for i in engines:
        if engines_offload[i] != "none":
            raise s.fail(
                "engines",
                f"engine {i} runs {engines_offload[i]} offload in cluster.engines_offload; a "
                "switchback engine's own offload must be none (its off state)",
            )
    mode = s.choice("mode", "native", SWITCH_MODES, source=SRC_MODE)
    if mode == "lmcache" and not lmcache_scope_given:
        raise s.fail(
            "mode",
            "lmcache needs the LMCache server the canary connects to: set cluster.lmcache_scope "
            "(engine, node or cluster)",
        )
    period = s.number("block_s", 1800.0, low=0.0, low_open=True, source=SRC_PERIOD)
    start = _on_off(s, "start", s.raw("start")) if s.has("start") else None
    schedule = _schedule(s)
    if schedule is not None and start is not None:
        raise s.fail("start", "applies only without an explicit schedule (its first entry)")
    seed = s.integer("seed", low=0) if s.has("seed") else None
    s.raw("seed")
    s.finish()
    s.params.append(Param(s.key("engines"), list(engines), "scenario"))
    if start is not None:
        s.params.append(Param(s.key("start"), start, "scenario"))
    if schedule is not None:
        s.params.append(
            Param(s.key("schedule"), ["on" if b else "off" for b in schedule], "scenario")
        )
    return SwitchbackSpec(engines, mode, period, start, schedule, seed)


def _engines(s: Section, n_engines: int) -> tuple[int, ...]:
    value = s.raw("engines")
    if not isinstance(value, list) or not value:
        raise s.fail("engines", f"must be a non-empty list of engine indices, got {value!r}")
    out: list[int] = []
    for i, e in enumerate(value):
        if isinstance(e, bool) or not isinstance(e, int) or not 0 <= e < n_engines:
            raise s.fail(f"engines[{i}]", f"must be an engine index 0..{n_engines - 1}, got {e!r}")
        if e in out:
            raise s.fail(f"engines[{i}]", f"engine {e} is listed twice")
        out.append(e)
    return tuple(sorted(out))


def _on_off(s: Section, key: str, value: object) -> str:
    """ "on" / "off" (YAML 1.1 reads a bare on / off as true / false: both are accepted)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str) and value.strip().lower() in ("on", "off"):
        return value.strip().lower()
    raise s.fail(key, f"must be on or off, got {value!r}")


def _schedule(s: Section) -> tuple[bool, ...] | None:
    value = s.raw("schedule")
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise s.fail("schedule", f"must be a non-empty list of on / off, got {value!r}")
    return tuple(_on_off(s, f"schedule[{i}]", v) == "on" for i, v in enumerate(value))
