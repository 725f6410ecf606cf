"""PromQL over the catalogue: rates, guarded ratios and quantiles of canonical signals.

Vendor names come from :func:`core.catalog.promql_expr`; on top, written once: counters only
through ``rate()``/``increase()``, divisions as ``a / (b > 0)`` (no traffic, no point), and
quantiles as ``histogram_quantile`` over summed bucket rates. A :class:`Scope` says where an
expression runs (the rules' fixed window or a dashboard's ``$__rate_interval``).

Conventions: dashboards/DESIGN.md#promql
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from core import catalog
from core.errors import ConfigError
from dashboards.config import MixinConfig

SpellingMatchers = Callable[[catalog.Spelling], str]

__all__ = [
    "Scope",
    "by",
    "divide",
    "gauge",
    "histogram_mean",
    "over_time",
    "quantile",
    "rate",
    "rule_scope",
    "sum_by",
]


def _join(*matchers: str) -> str:
    return ",".join(m.strip().strip("{}").strip(",") for m in matchers if m.strip())


@dataclass(frozen=True, slots=True)
class Scope:
    """Where an expression runs: its range window and the matchers of each kind of series."""

    window: str
    vllm: str = ""
    lmcache: str = ""
    kvscope: str = ""

    def matchers(self, signal: str) -> str:
        """Matchers for every spelling of ``signal`` (LMCache's: see ``spelling``)."""
        return "" if catalog.SIGNALS[signal].source == "lmcache" else self.vllm

    def spelling(self, signal: str) -> SpellingMatchers | None:
        """LMCache signals: the LMCache-server matchers for the MP server's own names, the
        vLLM ones for in-process (legacy) names, which vLLM's /metrics serves."""
        if catalog.SIGNALS[signal].source != "lmcache":
            return None
        return lambda sp: self.lmcache if catalog.is_lmcache_server(sp) else self.vllm


def rule_scope(cfg: MixinConfig) -> Scope:
    """The scope of the recording and alerting rules: the config's window and selectors."""
    return Scope(cfg.rate_window, cfg.vllm_selector, cfg.lmcache_selector, cfg.collector_selector)


def by(labels: tuple[str, ...]) -> str:
    return ", ".join(labels)


def gauge(signal: str, scope: Scope, extra: str = "") -> str:
    """A gauge signal in canonical labels, every spelling."""
    return catalog.promql_expr(
        signal, _join(scope.matchers(signal), extra), spelling_matchers=scope.spelling(signal)
    )


def rate(signal: str, scope: Scope, extra: str = "", part: catalog.Part = "bucket") -> str:
    """``rate()`` of a counter (or a histogram's ``part``) over the scope's window."""
    sig = catalog.SIGNALS[signal]
    if sig.kind == "gauge":
        raise ConfigError(f"rate() of gauge {signal}: read it with gauge()")
    return catalog.promql_expr(
        signal, _join(scope.matchers(signal), extra), part, range_fn="rate", window=scope.window,
        spelling_matchers=scope.spelling(signal),
    )  # fmt: skip


def over_time(fn: str, signal: str, scope: Scope, extra: str = "") -> str:
    """``<fn>_over_time()`` of a gauge signal over the scope's window."""
    return catalog.promql_expr(
        signal, _join(scope.matchers(signal), extra), range_fn=f"{fn}_over_time",
        window=scope.window, spelling_matchers=scope.spelling(signal),
    )  # fmt: skip


def sum_by(labels: tuple[str, ...], expr: str, op: str = "sum") -> str:
    return f"{op} by ({by(labels)}) ({expr})"


def divide(numerator: str, denominator: str) -> str:
    """``numerator / (denominator > 0)``: no point where the denominator is 0 (no traffic)."""
    return f"({numerator}) / (({denominator}) > 0)"


def histogram_mean(signal: str, scope: Scope, labels: tuple[str, ...] | None) -> str:
    """Mean observation over the window: rate(_sum) / rate(_count), summed over ``labels``
    (None: per series)."""
    num, den = rate(signal, scope, part="sum"), rate(signal, scope, part="count")
    if labels is not None:
        num, den = sum_by(labels, num), sum_by(labels, den)
    return divide(num, den)


def quantile(q: float, signal: str, scope: Scope, labels: tuple[str, ...]) -> str:
    """The q-quantile of a histogram signal per ``labels`` (``le`` added to the sum)."""
    if catalog.SIGNALS[signal].kind != "histogram":
        raise ConfigError(f"histogram_quantile of {signal}, which is not a histogram")
    return f"histogram_quantile({q}, {sum_by(('le', *labels), rate(signal, scope))})"
