"""POST /v1/advise: the what-if of `kvscope advise`, on the bounded pool, cached.

The body is `kvscope advise`'s flags (same names, same meaning) and the answer its ``--json``
object. Simulations run on the heavy-work pool (429 with Retry-After when it is full); an
identical question within the cache's TTL, or while the first is still computing, is
answered from that one computation (header ``X-Kvscope-Cache: hit``).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from api.deps import State, await_shared, busy, require_read
from api.error_responses import ApiError, responses
from api.pool import Busy
from api.respond import json_ok
from api.schemas import AdviceOut, WhatIfIn
from core.errors import ConfigError, InputError
from planner.advise import WhatIf, advise

router = APIRouter(prefix="/v1", tags=["advise"], dependencies=[Depends(require_read)])

CACHE_HEADER = "X-Kvscope-Cache"


def whatif_of(body: WhatIfIn) -> WhatIf:
    return WhatIf(
        model=body.model,
        gpu=body.gpu,
        tp=body.tp,
        prompt_tokens=body.prompt_tokens,
        output_tokens=body.output_tokens,
        qps=body.qps,
        prefix_share=body.prefix_share,
        engines=body.engines,
        prefix_tokens=body.prefix_tokens,
        cpu_gb=body.cpu_gb,
        vllm_version=body.vllm_version,
        duration_s=body.duration_s,
        seed=body.seed,
        router=body.router,
        scorer_weights=body.scorer_weights.model_dump() if body.scorer_weights else None,
        compare_routers=body.compare_routers,
    )


def field_of(exc: ConfigError) -> str | None:
    """The body field a ConfigError of the advise path is about (an InputError's field)."""
    return exc.field if isinstance(exc, InputError) else None


def run_advise(whatif: WhatIf) -> dict[str, Any]:
    """One advise call (on a pool thread): the `kvscope advise --json` object."""
    result: dict[str, Any] = advise(whatif).to_dict()
    return result


_HEAVY = responses(400, 401, 422, 429, 503)


@router.post(
    "/advise",
    response_model=AdviceOut,
    responses={
        **_HEAVY,
        200: {
            "headers": {
                CACHE_HEADER: {
                    "description": "hit: answered from an earlier or in-flight identical "
                    "request; miss: simulated for this one",
                    "schema": {"type": "string", "enum": ["hit", "miss"]},
                }
            }
        },
    },
)
async def advise_route(body: WhatIfIn, state: State) -> Response:
    """none / native / lmcache for a described workload, without history (cost model and
    one short simulation per mode)."""
    whatif = whatif_of(body)
    try:
        whatif.check()
    except ConfigError as exc:
        raise ApiError(422, str(exc), field_of(exc)) from exc
    key = json.dumps(body.model_dump(mode="json"), sort_keys=True)
    try:
        future, hit = state.cache.get_or_submit(
            key, lambda: state.pool.submit(lambda: run_advise(whatif))
        )
    except Busy as exc:
        raise busy(exc, "what-if simulations") from exc
    try:
        payload = await await_shared(future)
    except ConfigError as exc:
        raise ApiError(422, str(exc), field_of(exc)) from exc
    return json_ok(payload, headers={CACHE_HEADER: "hit" if hit else "miss"})
