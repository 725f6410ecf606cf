"""The API's own metrics on GET /metrics: requests by route template (never the raw path),
method and code, their latency histogram, and the build; names from
core.kvscope_metrics."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from api.request_metrics import BUCKETS, REFUSED, UNMATCHED, ApiTelemetry
from core import kvscope_metrics as sm


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _requests(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], **labels: str) -> float:
    return samples.get((sm.API_REQUESTS.name, frozenset(labels.items())), 0.0)


def test_metrics_count_requests_by_route_template_code_and_refusal(
    sqlite_url: str, make_client: Callable[..., TestClient]
) -> None:
    c = make_client(sqlite_url)
    for name in ("a", "b", "c"):  # three clusters, one route template
        assert c.get(f"/v1/clusters/{name}/plan").status_code == 404
    assert c.get("/no/such/path/42").status_code == 404
    assert c.get("/v1/clusters", params={"token": "x"}).status_code == 400
    resp = c.get("/metrics")
    assert resp.status_code == 200
    s = _samples(resp.text)
    plan = "/v1/clusters/{cluster}/plan"
    assert _requests(s, route=plan, method="GET", code="404") == 3
    assert _requests(s, route=UNMATCHED, method="GET", code="404") == 1
    assert _requests(s, route=REFUSED, method="GET", code="400") == 1
    assert not [k for k in s if ("route", "/no/such/path/42") in k[1]]  # no raw paths
    count = s[(f"{sm.API_REQUEST_DURATION}_count", frozenset({("route", plan), ("method", "GET")}))]
    assert count == 3
    build = [k for k in s if k[0] == sm.BUILD_INFO.name]
    assert len(build) == 1 and s[build[0]] == 1.0
    # the scrape itself is counted once it is answered
    again = _samples(c.get("/metrics").text)
    assert _requests(again, route="/metrics", method="GET", code="200") == 1


def test_telemetry_observe_fills_buckets_and_clamps_negative_durations() -> None:
    t = ApiTelemetry("1.2.3")
    t.observe("/x", "GET", 200, 0.007)
    t.observe("/x", "GET", 500, -1.0)  # a clock step: counted as 0 s
    s = _samples(t.render().decode())
    key = frozenset({("route", "/x"), ("method", "GET")})
    assert s[(f"{sm.API_REQUEST_DURATION}_count", key)] == 2
    assert s[(f"{sm.API_REQUEST_DURATION}_sum", key)] == pytest.approx(0.007)
    le = {float(dict(k[1])["le"]): v for k, v in s.items()
          if k[0] == f"{sm.API_REQUEST_DURATION}_bucket"}  # fmt: skip
    assert le[BUCKETS[0]] == 1 and le[BUCKETS[1]] == 2  # 0 s ≤ 0.005; 0.007 ≤ 0.01
    assert _requests(s, route="/x", method="GET", code="500") == 1
    assert s[(sm.BUILD_INFO.name, frozenset({("version", "1.2.3")}))] == 1.0
