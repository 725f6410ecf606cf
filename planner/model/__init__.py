"""The domain model every other part of the planner stands on, with no state of its own.

- ``hardware``: the catalogue of GPUs, models and storage tiers (data/hardware.yaml, each
  figure with its source; a user YAML or a Hugging Face config.json adds entries);
- ``costmodel``: KV bytes per token, prefill seconds, tier transfer seconds, HBM KV capacity;
- ``breakeven``: the break-even bandwidth B* and context length per tier (re-read vs re-prefill);
- ``savings``: what a shared prefix saves each tenant;
- ``sources``: the registry of published sources cited as ``[source: <id>]``
  (data/sources.yaml: title, owner, date, URL, figures and their hardware);
- ``values``: finite-or-None and JSON-ready values, the one way numbers become JSON.

Nothing here imports another planner sub-package.
"""

from planner.model import breakeven, costmodel, hardware, savings, sources, values

__all__ = ["breakeven", "costmodel", "hardware", "savings", "sources", "values"]
