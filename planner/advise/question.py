"""The question `kvscope advise` answers: a workload and a deployment, checked flag by flag."""

from __future__ import annotations

import math
from dataclasses import dataclass

from collector.errors import ConfigError
from planner.deploy import configs
from planner.model import costmodel
from planner.model.hardware import get_gpu, get_model

__all__ = ["WhatIf"]


@dataclass(frozen=True, slots=True)
class WhatIf:
    """The workload and cluster of a what-if question (`kvscope advise` flags)."""

    model: str
    gpu: str
    tp: int
    prompt_tokens: int
    output_tokens: int
    qps: float
    prefix_share: float  # share of each prompt that is a shared prefix (0-1)
    engines: int = 1
    prefix_tokens: int | None = None  # distinct shared-prefix tokens (the working set)
    cpu_gb: float | None = None  # host DRAM per node for KV offload, GiB
    vllm_version: str = "0.33.0"
    duration_s: float = 300.0
    seed: int = 0

    def check(self) -> None:
        """ConfigError naming the flag of the first bad value."""
        ints = (
            ("--tp", self.tp),
            ("--prompt-tokens", self.prompt_tokens),
            ("--output-tokens", self.output_tokens),
            ("--engines", self.engines),
        )
        for flag, value in ints:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{flag} must be an integer >= 1, got {value!r}")
        for flag, num in (("--qps", self.qps), ("--duration", self.duration_s)):
            if not (math.isfinite(num) and num > 0):
                raise ConfigError(f"{flag} must be a number > 0, got {num!r}")
        if not (math.isfinite(self.prefix_share) and 0 <= self.prefix_share <= 1):
            raise ConfigError(f"--prefix-share must be in [0, 1], got {self.prefix_share!r}")
        if self.prefix_tokens is not None and self.prefix_tokens < 1:
            raise ConfigError(f"--prefix-tokens must be >= 1, got {self.prefix_tokens!r}")
        if self.cpu_gb is not None and not (math.isfinite(self.cpu_gb) and self.cpu_gb > 0):
            raise ConfigError(f"--cpu-gb must be a number > 0, got {self.cpu_gb!r}")
        try:
            configs.parse_vllm_version(self.vllm_version)
            model, gpu = get_model(self.model), get_gpu(self.gpu)
            costmodel.hbm_kv_capacity_tokens(model, gpu, self.tp)
        except ConfigError as exc:
            raise ConfigError(f"--model/--gpu/--tp/--vllm-version: {exc}") from exc
