"""JSON responses written once, without a second pass through pydantic.

Routes declare their response model for the OpenAPI document and return :func:`json_ok`:
FastAPI does not re-validate a Response, so a large plan document is serialised once. JSON
has no NaN or infinity: a non-finite number becomes null (the planner's own rule,
planner.domain.values).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import Response

from planner.domain import json_ready


def dumps(payload: Any) -> bytes:
    """Compact JSON; non-finite numbers as null."""
    try:
        text = json.dumps(payload, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except ValueError:
        text = json.dumps(json_ready(payload), separators=(",", ":"), ensure_ascii=False)
    return text.encode()


def json_ok(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(payload), status, headers, media_type="application/json")
