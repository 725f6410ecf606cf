"""POST /v1/costmodel/compare-tiers and /v1/costmodel/savings: the answers of
`kvscope costmodel compare-tiers --json` and `kvscope costmodel savings --json` (same inputs,
same objects; tests/api/test_costmodel.py holds them equal)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from api.deps import require_read
from api.error_responses import ApiError, responses
from api.respond import json_ok
from api.schemas import CompareTiersIn, CompareTiersOut, SavingsIn, SavingsOut
from core.errors import InputError
from planner import domain

router = APIRouter(prefix="/v1/costmodel", tags=["costmodel"], dependencies=[Depends(require_read)])
_ERRORS = responses(400, 401, 422, 503)


@contextmanager
def _fields() -> Iterator[None]:
    """An InputError of the planner's domain checks becomes a 422 naming the body field."""
    try:
        yield
    except InputError as exc:
        raise ApiError(422, str(exc), exc.field) from exc


@router.post("/compare-tiers", response_model=CompareTiersOut, responses=_ERRORS)
def compare_tiers(body: CompareTiersIn) -> Response:
    """Re-read a prompt's KV from each tier, or re-prefill it? One row per KV dtype × tier."""
    with _fields():
        payload = domain.payloads.compare_tiers_payload(
            model=body.model,
            gpu=body.gpu,
            tp=body.tp,
            tokens=body.tokens,
            tiers=body.tiers,
            kv_dtype=body.kv_dtype,
        )
    return json_ok(payload)


@router.post("/savings", response_model=SavingsOut, responses=_ERRORS)
def savings(body: SavingsIn) -> Response:
    """What caching a tenant's shared prefix saves: GPU-seconds (and USD) per hour."""
    with _fields():
        payload = domain.payloads.savings_payload(
            model=body.model,
            gpu=body.gpu,
            tp=body.tp,
            tier=body.tier,
            kv_dtype=body.kv_dtype,
            prefix_tokens=body.prefix_tokens,
            queries_per_hour=body.queries_per_hour,
            gpu_hour_usd=body.gpu_hour_usd,
            mfu=body.mfu,
            hit_probability=body.hit_probability,
            cache_lifetime_s=body.cache_lifetime_s,
        )
    return json_ok(payload)
