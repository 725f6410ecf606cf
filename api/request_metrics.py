"""The API's own metrics: requests by route template, method and status, their latency,
and the build (BUILD_INFO); names from core.kvscope_metrics (API_METRICS).

:class:`ApiTelemetry` holds a prometheus_client registry of its own; EdgeMiddleware
(api/app.py) records every HTTP request and GET /metrics appends :meth:`render` to the
planner gauges. The route label is the matched route's template (``/v1/clusters/{cluster}/
plan``), never the raw path, so the series stay bounded whatever paths clients send.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from core.kvscope_metrics import API_REQUEST_DURATION, API_REQUESTS, BUILD_INFO

UNMATCHED = "unmatched"  # no route matched (a 404 or 405 of the router)
REFUSED = "refused"  # turned away by EdgeMiddleware before routing
# seconds: fast reads (a cached plan) to heavy work (an advise run, an HTML report)
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ApiTelemetry:
    """The API's request counters and latency histogram (module docstring)."""

    def __init__(self, version: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._requests = Counter(
            API_REQUESTS.name, API_REQUESTS.help, API_REQUESTS.labels, registry=r
        )
        self._duration = Histogram(API_REQUEST_DURATION.name, API_REQUEST_DURATION.help,
                                   API_REQUEST_DURATION.labels, buckets=BUCKETS,
                                   registry=r)  # fmt: skip
        build = Gauge(BUILD_INFO.name, BUILD_INFO.help, BUILD_INFO.labels, registry=r)
        build.labels(version=version).set(1)

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        """Count one answered request and its duration."""
        self._requests.labels(route=route, method=method, code=str(status)).inc()
        self._duration.labels(route=route, method=method).observe(max(0.0, seconds))

    def render(self) -> bytes:
        """The registry in the Prometheus text format (version 0.0.4)."""
        return generate_latest(self.registry)
