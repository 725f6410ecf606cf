"""Simulator telemetry -> Prometheus text format 0.0.4, as vLLM 0.33 and LMCache 0.5.6 expose it.

Rendered by prometheus_client's own ``generate_latest`` from a custom collector; every family
name comes from core.catalog (``export_spelling``). vLLM endpoints render like vLLM under
``PROMETHEUS_MULTIPROC_DIR`` (no ``_created``), LMCache ones like ``lmcache server``;
``python_*``/``process_*`` families are left out.

Design: planner/simulate/METHODS.md#exposition
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from core import catalog
from core.catalog import Labels
from core.errors import ConfigError
from planner.simulate.scenario import Scenario
from planner.simulate.telemetry import EngineSnapshot, HistogramSnapshot, LMCacheSnapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM 0.33 CacheConfig fields shown in cache_config_info (the fixture holds ~40; these are
# the ones a planner reads plus the offload switches).
ENGINE_INDEX = "0"
L1_LABELS: Labels = (("backend", "dram"), ("l1_tag", "_default"))  # LMCache 0.5.6 defaults
# OTel resource of `lmcache server` (exporter 0.61b0; tests/fixtures/metrics, MP idle fixture)
OTEL_RESOURCE: Labels = (
    ("service_name", "unknown_service"),
    ("telemetry_sdk_language", "python"),
    ("telemetry_sdk_name", "opentelemetry"),
    ("telemetry_sdk_version", "1.40.0"),
)
_FACT_HELP = {
    "cache_config": "Information of the LLMEngine CacheConfig",
    "kv_offload_config": "Static configuration of the KV offload managers of this engine.",
    "lmcache_target": "Target metadata",
}


@dataclass(frozen=True, slots=True)
class Series:
    """One series of a canonical signal; ``labels`` are the canonical ones beyond the
    endpoint's common labels (``direction``, ``finished_reason``, ``l1_tag`` …)."""

    signal: str
    labels: Labels
    value: float | HistogramSnapshot


@dataclass(frozen=True, slots=True)
class EndpointView:
    """Everything one ``/metrics`` endpoint shows at one instant.

    ``common`` labels (``engine``, ``model_name``) are added to each series whose exported
    family has that label; ``facts`` are (catalog.FACTS key, labels) rendered with value 1.
    ``omit_zero`` drops counters at 0 and empty histograms (OpenTelemetry instruments
    appear on their first measurement); gauges always show.
    """

    series: tuple[Series, ...]
    common: Labels = ()
    facts: tuple[tuple[str, Labels], ...] = ()
    omit_zero: bool = False


def _bucket_pairs(h: HistogramSnapshot) -> list[tuple[str, float]]:
    if len(h.cumulative) != len(h.bounds) + 1:
        raise ConfigError(
            f"histogram with {len(h.bounds)} bounds has {len(h.cumulative)} cumulative counts "
            "(want one per bound plus +Inf)"
        )
    # prometheus_client's own `le` spelling (1e+06, 0.005, 2560.0)
    les = [str(floatToGoString(b)) for b in h.bounds]  # type: ignore[no-untyped-call]
    pairs = [(le, float(c)) for le, c in zip(les, h.cumulative, strict=False)]
    pairs.append(("+Inf", float(h.cumulative[-1])))
    return pairs


def _family(sig: catalog.SignalDef, family: str) -> Metric:
    help_ = sig.help
    if sig.kind == "counter":
        return CounterMetricFamily(family, help_)
    if sig.kind == "gauge":
        return GaugeMetricFamily(family, help_)
    return HistogramMetricFamily(family, help_)


def _labels_for(
    sig: catalog.SignalDef, spelling: catalog.Spelling, common: Labels, own: Labels
) -> dict[str, str]:
    """The exported label set: common labels the family has, plus the series' own labels
    minus the ones the family implies (``direction`` of ``kv_offload_load_bytes``)."""
    allowed = set(spelling.labels)
    implied = dict(spelling.const_labels)
    out = {k: v for k, v in common if k in allowed}
    for key, value in own:
        if key in implied:
            if implied[key] != value:
                raise ConfigError(f"{sig.name}: {key}={value!r} does not fit {spelling.family}")
            continue
        if key not in allowed:
            raise ConfigError(
                f"{sig.name}: label {key!r} is not a label of {spelling.family} "
                f"(labels: {', '.join(spelling.labels) or 'none'})"
            )
        out[key] = value
    return out


def _unmeasured(sig: catalog.SignalDef, value: float | HistogramSnapshot) -> bool:
    """An OpenTelemetry counter/histogram nobody has recorded into yet (gauges always show)."""
    if isinstance(value, HistogramSnapshot):
        return value.count == 0
    return sig.kind == "counter" and value == 0.0


def families(view: EndpointView) -> list[Metric]:
    """prometheus_client metric families for ``view``, in catalogue order, facts last."""
    by_family: dict[str, Metric] = {}
    order = {name: i for i, name in enumerate(catalog.SIGNALS)}
    for s in sorted(view.series, key=lambda s: order.get(s.signal, -1)):
        sig = catalog.SIGNALS.get(s.signal)
        if sig is None:
            raise ConfigError(f"unknown signal {s.signal!r} (see core.catalog.SIGNALS)")
        hist = s.value if isinstance(s.value, HistogramSnapshot) else None
        if (hist is None) != (sig.kind != "histogram"):
            raise ConfigError(f"{s.signal} is a {sig.kind}; got {type(s.value).__name__}")
        if view.omit_zero and _unmeasured(sig, s.value):
            continue
        spelling = catalog.export_spelling(s.signal, dict(s.labels))
        labels = _labels_for(sig, spelling, view.common, s.labels)
        fam = by_family.get(spelling.family)
        if fam is None:
            fam = by_family[spelling.family] = _family(sig, spelling.family)
        if hist is not None:
            for le, count in _bucket_pairs(hist):
                fam.add_sample(fam.name + "_bucket", {**labels, "le": le}, count)
            fam.add_sample(fam.name + "_count", labels, float(hist.count))
            fam.add_sample(fam.name + "_sum", labels, float(hist.sum))
        else:
            assert not isinstance(s.value, HistogramSnapshot)
            suffix = "_total" if sig.kind == "counter" else ""
            fam.add_sample(fam.name + suffix, labels, float(s.value))
    out = list(by_family.values())
    facts: dict[str, Metric] = {}
    for key, fact_labels in view.facts:
        name = catalog.FACTS[key]
        fam = facts.get(name)
        if fam is None:
            fam = facts[name] = GaugeMetricFamily(name, _FACT_HELP.get(key, key))
        fam.add_sample(name, dict(fact_labels), 1.0)
    return out + list(facts.values())


class _Collector:
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self._metrics)


def render(view: EndpointView) -> bytes:
    """The exposition body (UTF-8 text format 0.0.4) of one endpoint."""
    return generate_latest(_Collector(families(view)))


# --------------------------------------------------------------------------- telemetry -> views


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What an engine's vLLM command line would say (cache_config_info / kv_offload labels)."""

    model_name: str
    block_size: int
    num_gpu_blocks: int
    gpu_memory_utilization: float
    enable_prefix_caching: bool = True
    cache_dtype: str = "auto"
    cpu_cache_bytes: float = 0.0  # native offload: this engine's CPU KV pool
    kv_bytes_per_token: float = 0.0  # unique KV bytes per token of the engine (all TP ranks)


def engine_config(scenario: Scenario) -> EngineConfig:
    """The EngineConfig every engine of ``scenario`` shares."""
    spec = scenario.cluster
    raw = scenario.raw.get("cluster")
    dtype = raw.get("kv_cache_dtype", "auto") if isinstance(raw, dict) else "auto"
    return EngineConfig(
        model_name=spec.model.name,
        block_size=spec.block_size,
        num_gpu_blocks=spec.num_gpu_blocks,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        enable_prefix_caching=spec.enable_prefix_caching,
        cache_dtype=str(dtype),
        cpu_cache_bytes=spec.cpu_cache_bytes,
        kv_bytes_per_token=spec.kv_bytes_per_token_engine,
    )


def engine_facts(snap: EngineSnapshot, cfg: EngineConfig) -> tuple[tuple[str, Labels], ...]:
    """cache_config_info (and kv_offload_config_info for native offload) of one engine."""
    native = snap.offload == "native"
    cpu_blocks = 0
    per_block = cfg.block_size * cfg.kv_bytes_per_token
    if native and per_block > 0:
        cpu_blocks = int(cfg.cpu_cache_bytes // per_block)
    cache = {
        "block_size": str(cfg.block_size),
        "cache_dtype": cfg.cache_dtype,
        "enable_prefix_caching": str(cfg.enable_prefix_caching),
        "engine": ENGINE_INDEX,
        "gpu_memory_utilization": str(float(cfg.gpu_memory_utilization)),
        "kv_offloading_backend": snap.offload if snap.offload != "none" else "native",
        "kv_offloading_size": str(cfg.cpu_cache_bytes / 2**30) if native else "None",
        "num_cpu_blocks": str(cpu_blocks),
        "num_gpu_blocks": str(cfg.num_gpu_blocks),
    }
    cache.update({k: str(v) for k, v in snap.facts.items()})
    out: list[tuple[str, Labels]] = [("cache_config", tuple(sorted(cache.items())))]
    if native:
        chunk = cfg.block_size  # CPU spec default: one GPU block per CPU chunk
        offload = {
            "cpu_blocks_per_chunk": "1",
            "cpu_kv_cache_size_bytes": str(int(cfg.cpu_cache_bytes)),
            "cpu_kv_cache_size_tokens": str(cpu_blocks * chunk),
            "cpu_num_chunks": str(cpu_blocks),
            "engine": ENGINE_INDEX,
            "model_name": cfg.model_name,
        }
        out.append(("kv_offload_config", tuple(sorted(offload.items()))))
    return tuple(out)


def _known(names: Iterable[tuple[str, float]]) -> list[Series]:
    return [Series(k, (), v) for k, v in names if k in catalog.SIGNALS]


def engine_view(snap: EngineSnapshot, cfg: EngineConfig) -> EndpointView:
    """The ``/metrics`` of one simulated vLLM 0.33 server.

    Signals the snapshot holds that the catalogue does not know are not rendered; offload
    families only for native offload (METHODS.md#exposition).
    """
    native = snap.offload == "native"
    series = _known(snap.counters.items())
    gauges = [(k, v) for k, v in snap.gauges.items() if native or not k.startswith("offload_")]
    series += _known(gauges)
    series += [
        Series("request_success_total", (("finished_reason", r),), float(n))
        for r, n in snap.finished.items()
    ]
    if native:
        for direction, value in snap.offload_bytes.items():
            series.append(Series("offload_bytes_total", (("direction", direction),), value))
        for direction, value in snap.offload_seconds.items():
            series.append(Series("offload_seconds_total", (("direction", direction),), value))
    series += [Series(k, (), h) for k, h in snap.histograms.items() if k in catalog.SIGNALS]
    common: Labels = (("engine", ENGINE_INDEX), ("model_name", cfg.model_name))
    return EndpointView(tuple(series), common, engine_facts(snap, cfg))


_L1_SIGNALS = frozenset({
    "lmcache_l1_usage_bytes", "lmcache_l1_usage_ratio", "lmcache_l1_read_chunks_total",
    "lmcache_l1_write_chunks_total", "lmcache_l1_evicted_chunks_total",
    "lmcache_l1_chunk_reuse_gap_seconds",
})  # fmt: skip
_L2_NAMED = frozenset({
    "lmcache_l2_usage_bytes", "lmcache_l2_store_throughput_gbps", "lmcache_l2_load_throughput_gbps",
})  # fmt: skip


def pool_view(snap: LMCacheSnapshot, model_name: str, l2_name: str = "") -> EndpointView:
    """The ``/metrics`` of one simulated ``lmcache server`` (MP mode) holding ``snap``."""
    series: list[Series] = []
    for name, value in [*snap.counters.items(), *snap.gauges.items()]:
        sig = catalog.SIGNALS.get(name)
        if sig is None:
            continue
        labels = catalog.export_spelling(name).labels
        own: list[tuple[str, str]] = []
        if name in _L1_SIGNALS:
            own = [(k, v) for k, v in L1_LABELS if k in labels]
        elif name in _L2_NAMED:
            own = [("l2_name", l2_name or "l2")]
        series.append(Series(name, tuple(own), value))
    for name, h in snap.histograms.items():
        if name not in catalog.SIGNALS:
            continue
        if name in _L1_SIGNALS:  # the L1 chunk reuse gap: l1_tag, as the MP server labels it
            labels = catalog.export_spelling(name).labels
            series.append(Series(name, tuple((k, v) for k, v in L1_LABELS if k in labels), h))
        else:
            series.append(Series(name, (("l2_name", l2_name or "l2"),), h))
    resource = (("service_instance_id", f"kvscope-sim-lmcache-{snap.pool}"), *OTEL_RESOURCE)
    return EndpointView(
        tuple(series),
        common=(("model_name", model_name),),
        facts=(("lmcache_target", tuple(sorted(resource))),),
        omit_zero=True,
    )


def expected_values(view: EndpointView) -> Mapping[tuple[str, Labels], float | HistogramSnapshot]:
    """(signal, canonical labels) -> value as a collector reading ``render(view)`` must see it.

    Canonical labels: the exported labels with the family's implied ones added back.
    """
    out: dict[tuple[str, Labels], float | HistogramSnapshot] = {}
    for s in view.series:
        sig = catalog.SIGNALS[s.signal]
        if view.omit_zero and _unmeasured(sig, s.value):
            continue
        spelling = catalog.export_spelling(s.signal, dict(s.labels))
        labels = _labels_for(sig, spelling, view.common, s.labels)
        labels.update(spelling.const_labels)
        out[(s.signal, tuple(sorted(labels.items())))] = s.value
    return out
