"""`kvscope advise`: the decision without history, from the cost model and short simulations.

- ``question``: the WhatIf (workload + deployment) and its checks;
- ``sim``: the scenario a what-if becomes and one seeded simulation per mode;
- ``whatif``: :func:`advise`, cost model + simulations -> Evidence -> decision -> sizing;
- ``SCORER_DEFAULTS``: the scorer router's default weights (llm-d), for the API's schema.
"""

from planner.advise.question import WhatIf
from planner.advise.whatif import Advice, advise
from planner.simulate.router_spec import SCORER_DEFAULTS

__all__ = ["SCORER_DEFAULTS", "Advice", "WhatIf", "advise"]
