"""What to deploy for a decision: engine counts, CPU-tier and L1/L2 sizes, and the configs.

- ``sizing``: :func:`size`, engines and offload buffers from the forecast and the fits;
- ``configs``: version-aware vLLM flags and LMCache configuration for the chosen mode.
"""

from planner.deploy import configs
from planner.deploy.sizing import Sizing, size

__all__ = ["Sizing", "configs", "size"]
