"""Every vendor metric name (vllm:…, lmcache:…, lmcache_mp_…) is spelled only in
core/catalog.py; everyone else takes it from the catalogue (docs/architecture.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "collector", "planner", "dashboards", "api", "kvscope", "benchmarks")
# A full family name: a prefix alone (``vllm:``), a glob (``vllm:kv_offload_*``), a one-letter
# example (``vllm:x``) or an identifier that merely contains the prefix
# (vllm_lmcache_mp_args, lmcache.integration.vllm.lmcache_mp_connector) is not one.
VENDOR_NAME = re.compile(r"\b(?:vllm:|lmcache:|lmcache_mp_)[a-z0-9_]{3,}(?![\w*])")
MODULE_PATHS = ("lmcache_mp_connector",)


def _offenders(text: str) -> list[str]:
    return [m for m in VENDOR_NAME.findall(text) if m not in MODULE_PATHS]


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ('msg = "needs vllm:prompt_tokens_recomputed"', ["vllm:prompt_tokens_recomputed"]),
        ("lmcache:num_hit_tokens and lmcache_mp_l1_usage_ratio", ["lmcache:num_hit_tokens",
                                                                  "lmcache_mp_l1_usage_ratio"]),
        ("keeps the ``vllm:`` colons; vllm:kv_offload_* families; vllm:x", []),
        ("def vllm_lmcache_mp_args(); lmcache.integration.vllm.lmcache_mp_connector", []),
    ],
)  # fmt: skip
def test_vendor_name_pattern_finds_names_not_prefixes(text: str, found: list[str]) -> None:
    assert _offenders(text) == found


def test_vendor_metric_names_are_spelled_only_in_the_catalogue() -> None:
    offenders = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "core" / "catalog.py":
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                offenders += [f"{path.relative_to(ROOT)}:{n}: {m}" for m in _offenders(line)]
    assert not offenders, "vendor metric names outside core/catalog.py:\n" + "\n".join(offenders)
