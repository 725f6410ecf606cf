"""The samples of a Prometheus text exposition by name, for tests that read one."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from core.kvscope_metrics import MetricDef

Series = dict[str, list[tuple[dict[str, str], float]]]


def parse(text: bytes | str) -> Series:
    """Every sample of an exposition by sample name: [(labels, value), …]."""
    out: Series = {}
    raw = text.decode() if isinstance(text, bytes) else text
    for family in text_string_to_metric_families(raw):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def value(series: Series, name: str, **labels: str) -> float:
    found = [
        v for lab, v in series.get(name, []) if all(lab.get(k) == w for k, w in labels.items())
    ]
    assert len(found) == 1, (name, labels, series.get(name))
    return found[0]


def labelsets(series: Series, metric: MetricDef, **labels: str) -> list[dict[str, str]]:
    return [
        lab
        for lab, _ in series.get(metric.name, [])
        if all(lab.get(k) == w for k, w in labels.items())
    ]
