"""The domain model every other part of the planner stands on, with no state of its own.

- ``hardware``: the catalogue of GPUs, models and storage tiers (data/hardware.yaml, each
  figure with its source; a user YAML or a Hugging Face config.json adds entries);
- ``costmodel``: KV bytes per token, prefill seconds, tier transfer seconds, HBM KV capacity;
- ``breakeven``: the break-even bandwidth B* and context length per tier (re-read vs re-prefill);
- ``savings``: what a shared prefix saves each tenant;
- ``answers``: the JSON answers of compare-tiers and savings from their inputs (the CLI's and
  the API's), with the domain checks of those inputs (``InputError`` names the input);
- ``sources``: the registry of published sources cited as ``[source: <id>]``
  (data/sources.yaml: title, owner, date, URL, figures and their hardware);
- ``values``: finite-or-None and JSON-ready values, the one way numbers become JSON.

Nothing here imports another planner sub-package.
"""

from planner.model import answers, breakeven, costmodel, hardware, savings, sources, values
from planner.model.values import finite, json_ready

__all__ = ["answers", "breakeven", "costmodel", "finite", "hardware", "json_ready", "savings",
           "sources", "values"]  # fmt: skip
