"""The question `kvscope advise` answers: a workload and a deployment, checked flag by flag."""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.errors import ConfigError, InputError
from planner.deploy import configs
from planner.domain import costmodel
from planner.domain.hardware import get_gpu, get_model
from planner.simulate.router_spec import SCORER_DEFAULTS, SCORER_KEYS
from planner.simulate.scenario import ROUTERS

__all__ = ["DEFAULT_ROUTER", "WhatIf", "parse_scorer_weights"]

DEFAULT_ROUTER = "round_robin"  # the simulator's default (a Kubernetes Service spreads so)


def parse_scorer_weights(text: str) -> dict[str, float]:
    """``prefix=2,kv=1,queue=1`` (any subset) -> weights; ConfigError naming the bad part."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--scorer-weights: {part!r} is not KEY=NUMBER (e.g. prefix=3,kv=2)")
        try:
            out[key] = float(value)
        except ValueError:
            raise ConfigError(
                f"--scorer-weights: {key}: {value.strip()!r} is not a number"
            ) from None
    return out


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
    router: str | None = None  # None: DEFAULT_ROUTER, said so in the answer
    scorer_weights: dict[str, float] | None = None  # the scorer router's; None: llm-d's
    compare_routers: bool = True  # also answer under every other router (shorter runs)

    @property
    def assumed_router(self) -> str:
        return self.router or DEFAULT_ROUTER

    def scorer_config(self) -> dict[str, float]:
        """The scorer's weights, the unnamed ones at llm-d's defaults."""
        return {**SCORER_DEFAULTS, **(self.scorer_weights or {})}

    def check(self) -> None:  # noqa: PLR0912 - one check per field of the question, each naming it
        """InputError of the first bad value: its message names the CLI flag, its ``field``
        the attribute (the API body's field)."""
        ints = (
            ("--tp", "tp", self.tp),
            ("--prompt-tokens", "prompt_tokens", self.prompt_tokens),
            ("--output-tokens", "output_tokens", self.output_tokens),
            ("--engines", "engines", self.engines),
        )
        for flag, name, value in ints:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(name, f"{flag} must be an integer >= 1, got {value!r}")
        for flag, name, num in (
            ("--qps", "qps", self.qps),
            ("--duration", "duration_s", self.duration_s),
        ):
            if not (math.isfinite(num) and num > 0):
                raise InputError(name, f"{flag} must be a number > 0, got {num!r}")
        if not (math.isfinite(self.prefix_share) and 0 <= self.prefix_share <= 1):
            raise InputError(
                "prefix_share", f"--prefix-share must be in [0, 1], got {self.prefix_share!r}"
            )
        if self.prefix_tokens is not None and self.prefix_tokens < 1:
            raise InputError(
                "prefix_tokens", f"--prefix-tokens must be >= 1, got {self.prefix_tokens!r}"
            )
        if self.cpu_gb is not None and not (math.isfinite(self.cpu_gb) and self.cpu_gb > 0):
            raise InputError("cpu_gb", f"--cpu-gb must be a number > 0, got {self.cpu_gb!r}")
        if self.router is not None and self.router not in ROUTERS:
            raise InputError(
                "router", f"--router must be one of {', '.join(ROUTERS)}, got {self.router!r}"
            )
        for key, weight in (self.scorer_weights or {}).items():
            if key not in SCORER_KEYS:
                raise InputError(
                    "scorer_weights",
                    f"--scorer-weights: {key}: unknown key (known: {', '.join(SCORER_KEYS)})",
                )
            if not (math.isfinite(weight) and weight >= 0):
                raise InputError(
                    "scorer_weights",
                    f"--scorer-weights: {key} must be a number >= 0, got {weight!r}",
                )
        if not any(self.scorer_config().values()):
            raise InputError(
                "scorer_weights",
                f"--scorer-weights: {', '.join(SCORER_KEYS)} are all 0: nothing to score",
            )
        try:
            configs.parse_vllm_version(self.vllm_version)
            model, gpu = get_model(self.model), get_gpu(self.gpu)
            costmodel.hbm_kv_capacity_tokens(model, gpu, self.tp)
        except ConfigError as exc:
            raise InputError("model", f"--model/--gpu/--tp/--vllm-version: {exc}") from exc
