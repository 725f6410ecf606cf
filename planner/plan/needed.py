"""The signals `kvscope plan` reads, named once: the frame's, the demand forecasts', the
re-prefill counters' and LMCache health's.

Kept apart from the stages that use them (planner/plan/observe.py, forecast.py) so that the
reading child (planner/plan/readahead.py) starts with the store and the frame's modules
only, before this process imports the fits.
"""

from __future__ import annotations

from planner.frames.frames import SIGNALS as FRAME_SIGNALS

KV_SIGNAL = "kv_cache_usage_ratio"
RATE_SIGNAL = "request_success_total"
RUNNING_SIGNAL = "requests_running"
RECOMPUTED = "prompt_tokens_recomputed_total"
PROMPT_TOKENS = "prompt_tokens_total"
PROMPT_HIST = "request_prompt_tokens"
LMCACHE_HEALTHY = "lmcache_healthy"
# Every signal `kvscope plan` reads (the frame's, plus re-prefill and LMCache health).
NEEDED_SIGNALS: frozenset[str] = FRAME_SIGNALS | {RECOMPUTED, PROMPT_TOKENS, LMCACHE_HEALTHY}
