"""The samples of a Prometheus text exposition by name, and promtool's lint of one, for tests
that read or check an exposition."""

from __future__ import annotations

import subprocess
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from core.kvscope_metrics import MetricDef

Series = dict[str, list[tuple[dict[str, str], float]]]
PROMTOOL = Path("/usr/bin/promtool")  # Debian's prometheus package


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


def assert_promtool_clean(text: bytes) -> None:
    """promtool ``check metrics`` passes ``text`` with no finding at all."""
    proc = subprocess.run(
        [str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, timeout=30,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == proc.stderr == b"", (proc, text.decode())
