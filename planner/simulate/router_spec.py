"""`cluster.scorer`: the weights and prefix index of the scorer router (router.py).

The defaults are llm-d's "optimized baseline" endpoint picker: queue-scorer 2,
kv-cache-utilization-scorer 2, prefix-cache-scorer 3, no-hit-lru-scorer 2, the prefix scorer
reading the approximate index of what the picker itself routed where
(approx-prefix-cache-producer, autoTune: one index per engine as large as its GPU KV cache,
maxPrefixBlocksToMatch 256) [source: llm-d-inference-scheduler-config]. `cpu_prefix` is the
second prefix scorer of llm-d's tiered-prefix-cache guide (an index of the engine's CPU tier;
weight 0 = absent) [source: llm-d-tiered-prefix-cache]. `prefix_index: cached` reads the
engines' real caches instead (llm-d's precise-prefix-cache-scorer, fed by vLLM KV events).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.simulate.spec import Section

SCORER_KEYS = ("prefix", "kv", "queue", "no_hit_lru", "cpu_prefix")
SCORER_DEFAULTS = {"prefix": 3.0, "kv": 2.0, "queue": 2.0, "no_hit_lru": 2.0, "cpu_prefix": 0.0}
PREFIX_INDEXES = ("routed", "cached")
MAX_PREFIX_BLOCKS = 256  # llm-d approx-prefix-cache-producer maxPrefixBlocksToMatch default
SRC_SCORER = "default: llm-d optimized baseline [source: llm-d-inference-scheduler-config]"


@dataclass(frozen=True, slots=True)
class ScorerSpec:
    """The scorer router's weights and where its prefix scorers look."""

    prefix: float = 3.0  # matched leading prompt blocks / prompt blocks, GPU index
    kv: float = 2.0  # 1 - KV cache usage
    queue: float = 2.0  # (max - waiting) / (max - min) waiting over the engines
    no_hit_lru: float = 2.0  # a request no index matches: engines least recently sent one
    cpu_prefix: float = 0.0  # matched blocks / prompt blocks, CPU-tier index
    prefix_index: str = "routed"  # routed (llm-d approximate) | cached (precise)
    max_prefix_blocks: int = MAX_PREFIX_BLOCKS  # prompt blocks a prefix scorer considers
    cpu_index_blocks: int | None = None  # routed CPU index capacity; None: the engine's tier

    @property
    def weights(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in SCORER_KEYS}


def parse_scorer(sec: Section, router: str) -> ScorerSpec:
    """cluster.scorer, only with router scorer (recorded only then, so other routers'
    parameter lists are unchanged); weights >= 0 and not all 0."""
    if router != "scorer":
        if sec.has("scorer"):
            raise sec.fail("scorer", f"applies only with router: scorer (router is {router})")
        sec.raw("scorer")
        return ScorerSpec()
    s = sec.section("scorer")
    w = {k: s.number(k, SCORER_DEFAULTS[k], low=0.0, source=SRC_SCORER) for k in SCORER_KEYS}
    index = s.choice("prefix_index", "routed", PREFIX_INDEXES, source=SRC_SCORER)
    max_blocks = s.integer("max_prefix_blocks", MAX_PREFIX_BLOCKS, low=1, source=SRC_SCORER)
    cpu_blocks = s.optional_integer("cpu_index_blocks", source="default: the engine's CPU tier")
    s.finish()
    if not any(w.values()):
        raise sec.fail(
            "scorer", f"the weights {', '.join(SCORER_KEYS)} are all 0: nothing to score"
        )
    return ScorerSpec(
        **w, prefix_index=index, max_prefix_blocks=max_blocks, cpu_index_blocks=cpu_blocks
    )
