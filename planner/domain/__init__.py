"""The domain model every other part of the planner stands on, with no state of its own.

``hardware`` (GPUs, models, storage tiers from data/hardware.yaml, each figure sourced; a
user YAML or a Hugging Face config.json adds entries), ``costmodel`` (KV bytes per token,
prefill and tier transfer seconds, HBM KV capacity), ``breakeven`` (B* and the break-even
context per tier), ``savings`` (what a shared prefix saves), ``payloads`` (the CLI's and the
API's compare-tiers and savings answers, with their input checks: ``InputError`` names the
input), ``citations`` (the ``[source: <id>]`` registry, data/sources.yaml), ``values``
(finite-or-None, JSON-ready numbers), ``slo`` (the latency target capacity is measured
against). Nothing here imports another planner sub-package.
"""

from planner.domain import breakeven, citations, costmodel, hardware, payloads, savings, values
from planner.domain.values import finite, json_ready

__all__ = ["breakeven", "citations", "costmodel", "finite", "hardware", "json_ready", "payloads",
           "savings", "values"]  # fmt: skip
