"""Windows from a Prometheus-compatible HTTP API (Prometheus, Thanos, Mimir: /api/v1/query_range).

Each signal is one range query whose step is the window, its statistics joined with ``or``
and tagged by ``kvscope_stat`` (PromQL from the catalogue's ``promql_expr``); long ranges are
split below Prometheus' 11,000 points per series. Every failed query is a ScrapeError whose
``kind`` says why (``partial`` for a ``warnings`` entry that means missing data; PromQL
annotations and Thanos' "No StoreAPIs matched" are accepted).

Design, and how its windows differ from the direct path's: collector/DESIGN.md#promsource
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.exceptions import MaxRetryError, NewConnectionError, ResponseError
from urllib3.exceptions import TimeoutError as Urllib3Timeout
from urllib3.util.retry import Retry

from collector.rollup import per_bucket, ratio_window
from core.catalog import (
    DCGM_GPU_FAMILY,
    DERIVED_RATIOS,
    FACTS,
    SIGNALS,
    fact_selector,
    promql_expr,
)
from core.errors import ConfigError, ScrapeError
from core.records import Kind, Labels, Window

log = logging.getLogger(__name__)

STAT_LABEL = "kvscope_stat"
BUCKET_STAT = "le="  # a cell's per-bucket increases: stat "le=<bound>" (keep_buckets signals)
# the DCGM labels collector.dcgm joins on (grouped by, so a GPU is one series whatever
# else the exporter labels it with)
GPU_LABELS = ("modelName", "gpu", "UUID", "Hostname", "instance", "pod", "namespace",
              "exported_pod", "exported_namespace")  # fmt: skip
DROPPED_LABELS = frozenset({"__name__", "instance", "job", STAT_LABEL})
# Prometheus' hard limit is 11,000 points per series (promql/engine: "exceeded maximum
# resolution of 11,000 points per timeseries"); stay below it.
MAX_POINTS = 10_000
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
SourceFrom = Literal["instance", "job/instance"]
# Warnings that are no missing data (DESIGN.md#promsource): PromQL's annotations (promql/
# annotations: "PromQL info" / "PromQL warning" prefixes) and Thanos' ErrorNoStoresMatched.
ANNOTATION_PREFIXES = ("PromQL info:", "PromQL warning:")
NO_STORE_MATCHED = "no storeapis matched for this query"
RETRIES = 2  # urllib3 retries of a refused connection, a timeout or a 502/503/504


class _Partial(Exception):
    """An answer whose ``warnings`` say it lacks data (raised by the session's hook)."""


def missing_data_warnings(warnings: Iterable[object]) -> tuple[list[str], list[str]]:
    """(warnings that say data is missing, warnings that do not: annotations and "no store
    matched") of a query answer's ``warnings`` (DESIGN.md#promsource)."""
    missing, benign = [], []
    for w in map(str, warnings):
        text = w.strip()
        if text.startswith(ANNOTATION_PREFIXES) or text.lower() == NO_STORE_MATCHED:
            benign.append(text)
        else:
            missing.append(text)
    return missing, benign


def _tag(expr: str, stat: str) -> str:
    return f'label_replace({expr}, "{STAT_LABEL}", "{stat}", "", "")'


def signal_query(signal: str, window_s: int, matchers: str = "") -> str:
    """The one PromQL query that yields every statistic of ``signal`` per window."""
    sig = SIGNALS[signal]
    w = f"{window_s}s"

    def e(fn: str, part: Literal["bucket", "count", "sum"] = "bucket") -> str:
        return f"({promql_expr(signal, matchers, part=part, range_fn=fn, window=w)})"

    terms: list[tuple[str, str]]
    if sig.kind == "counter":
        terms = [
            ("delta", e("increase")),
            ("resets", e("resets")),
            ("samples", e("count_over_time")),
            ("last", e("last_over_time")),
        ]
    elif sig.kind == "gauge":
        terms = [(stat, e(f"{stat}_over_time")) for stat in ("avg", "min", "max", "last", "count")]
    else:
        terms = [(name, f"histogram_quantile({q}, {e('rate')})") for name, q in QUANTILES]
        if sig.keep_buckets:
            terms.append(("bucket", e("increase")))  # one series per le
        terms += [
            ("delta", e("increase", "count")),
            ("sum_delta", e("increase", "sum")),
            ("samples", e("count_over_time", "count")),
            ("last", e("last_over_time", "count")),
        ]
    return " or ".join(_tag(expr, stat) for stat, expr in terms)


class PrometheusSource:
    """Reads canonical windows from a Prometheus-compatible query API."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        source_from: SourceFrom = "instance",
        matchers: str = "",
        max_points: int = MAX_POINTS,
        headers: dict[str, str] | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"prometheus URL must start with http:// or https://: {url!r}")
        if max_points < 2:
            raise ConfigError(f"max_points must be >= 2, got {max_points}")
        self.url = url.rstrip("/")
        self.source_from = source_from
        self.matchers = matchers
        self.max_points = max_points
        self.timeout_s = timeout_s
        self._noted: set[str] = set()  # warnings accepted and logged once
        # A few quick retries on a flaky network, not the client's default 3 × exponential.
        retry = Retry(total=RETRIES, backoff_factor=0.1, status_forcelist=(502, 503, 504))
        # Our own session, for its response hook: the client returns data.result only and
        # drops the answer's warnings, which say whether the result is partial.
        session = requests.Session()
        session.hooks["response"].append(self._check_warnings)
        self._prom = PrometheusConnect(
            url=self.url,
            headers=headers,
            retry=retry,
            timeout=timeout_s,
            session=session,
        )

    def close(self) -> None:
        self._prom.close()

    def __enter__(self) -> PrometheusSource:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _call(self, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except _Partial as exc:
            raise ScrapeError(self.url, "partial", f"{what}: partial answer: {exc}") from exc
        except requests.RequestException as exc:
            kind, why = self._transport_error(exc)
            raise ScrapeError(self.url, kind, f"{what}: {why}") from exc
        except PrometheusApiClientException as exc:
            raise ScrapeError(self.url, "http_status", f"{what}: {exc}") from exc
        except (ValueError, KeyError, TypeError) as exc:  # not a Prometheus API answer
            raise ScrapeError(
                self.url, "parse", f"{what}: not a Prometheus API response ({exc})"
            ) from exc

    def _transport_error(self, exc: Exception) -> tuple[str, str]:
        """(kind, why) of a requests error. After urllib3's retries a timeout arrives as a
        ConnectionError around MaxRetryError(ReadTimeoutError) and too many 5xx as a
        RetryError; their text repeats the whole URL (the PromQL), left out here."""
        reason: object = exc.args[0] if exc.args else exc
        tries = ""
        if isinstance(reason, MaxRetryError):
            reason, tries = reason.reason, f" ({1 + RETRIES} tries)"
        if isinstance(exc, requests.exceptions.JSONDecodeError):
            return "parse", f"not a Prometheus API response (not JSON: {exc})"
        if isinstance(reason, NewConnectionError):  # a subclass of urllib3's ConnectTimeout
            return "connect", f"cannot connect{tries}: {reason}"
        if isinstance(exc, requests.Timeout) or isinstance(reason, Urllib3Timeout):
            return "timeout", f"no answer in {self.timeout_s:g} s{tries}"
        if isinstance(exc, requests.exceptions.RetryError) or isinstance(reason, ResponseError):
            return "http_status", f"{reason}{tries}"
        return "connect", f"{type(exc).__name__}: {reason}"

    def _check_warnings(self, response: Any, *_args: Any, **_kw: Any) -> None:
        """requests' response hook: raise _Partial when the answer's ``warnings`` say data
        is missing (DESIGN.md#promsource); log each accepted warning once. The byte search
        keeps the JSON parse off the answers without warnings (nearly all)."""
        if response.status_code != 200 or b'"warnings"' not in response.content:
            return
        try:
            doc = response.json()
        except ValueError:
            return  # the client's own parse reports it
        warnings = doc.get("warnings") if isinstance(doc, dict) else None
        if not isinstance(warnings, list) or not warnings:
            return
        missing, benign = missing_data_warnings(warnings)
        for text in benign:
            if text not in self._noted and len(self._noted) < 100:
                self._noted.add(text)
                level = logging.WARNING if text.startswith("PromQL warning:") else logging.INFO
                log.log(level, "prometheus %s: %s (accepted: no data missing)", self.url, text)
        if missing:
            text = "; ".join(missing[:3]) + (
                f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
            )
            raise _Partial(text[:500])

    def check(self) -> None:
        """Raise ScrapeError unless the query API answers a trivial query."""
        result = self._call("checking the query API", self._prom.custom_query, "vector(1)")
        if not isinstance(result, list) or not result:
            raise ScrapeError(self.url, "parse", "query API answered vector(1) with no sample")

    def windows(
        self,
        start: float,
        end: float,
        window_s: float,
        signals: Iterable[str] | None = None,
    ) -> list[Window]:
        """Every complete window ``[s, s + window_s)`` with ``start <= s <= end - window_s``.

        Window starts are multiples of ``window_s`` (as the rollup's); ``window_s`` must be a
        whole number of seconds (the query API takes whole-second bounds).
        """
        if not (math.isfinite(window_s) and window_s >= 1 and float(window_s).is_integer()):
            raise ConfigError(
                f"Prometheus windows must be a whole number of seconds >= 1, got {window_s}"
            )
        w = int(window_s)
        names = list(SIGNALS) if signals is None else list(signals)
        for name in names:
            if name not in SIGNALS:
                raise ConfigError(f"unknown signal {name!r} (see core.catalog.SIGNALS)")
        first = math.ceil(start / w) * w  # first window start
        last = math.floor(end / w) * w - w  # last window start
        if last < first:
            return []
        out: list[Window] = []
        for name in names:
            query = signal_query(name, w, self.matchers)
            cells: dict[tuple[str, Labels, float], dict[str, float]] = {}
            for t0, t1 in self._chunks(first + w, last + w, w):
                for series in self._range(name, query, t0, t1, w):
                    self._collect(series, w, cells)
            out.extend(self._build(name, w, cells))
        out.extend(derive_ratios(out))
        out.sort(key=lambda x: (x.source, x.start, x.signal, x.labels))
        return out

    def facts(
        self, at: float, lookback_s: float, keys: Iterable[str] = tuple(FACTS)
    ) -> dict[str, dict[str, list[dict[str, str]]]]:
        """source -> fact key -> label rows: the info families ``keys`` (of catalog.FACTS) as
        Prometheus last saw them in ``[at - lookback_s, at]`` (one instant query per family).
        The value is 1 by convention; the facts are the labels (job/instance dropped)."""
        out: dict[str, dict[str, list[dict[str, str]]]] = {}
        window = f"{max(1, int(lookback_s))}s"
        for key in keys:
            query = f"last_over_time({fact_selector(key, self.matchers)}[{window}])"
            result = self._call(
                f"instant query for {key}", self._prom.custom_query, query,
                params={"time": f"{at:.3f}"},
            )  # fmt: skip
            if not isinstance(result, list):
                raise ScrapeError(self.url, "parse", f"instant query for {key}: no vector result")
            for series in result:
                metric: dict[str, str] = series.get("metric", {})
                row = {k: v for k, v in sorted(metric.items()) if k not in DROPPED_LABELS}
                out.setdefault(self._source(metric), {}).setdefault(key, []).append(row)
        return out

    def facts_history(
        self, start: float, end: float, step_s: float, keys: Iterable[str] = tuple(FACTS)
    ) -> list[tuple[float, dict[str, dict[str, list[dict[str, str]]]]]]:
        """The info families ``keys`` as they were at each ``step_s`` from ``start`` to ``end``
        (one range query per family and time chunk): [(t, source -> key -> label rows)],
        oldest first, only the instants where some source's facts differ from the instant
        before (the first always). A back-fill reads it to date each regime (a restart with
        offload switched on changes the info series' labels) instead of stamping the whole
        history with the facts of its last instant. A source with no fact series at an
        instant (down, not yet started) is absent from it, not factless."""
        step = max(1, int(step_s))
        t0, t1 = int(start // step * step), int(end // step * step)
        at: dict[int, dict[str, dict[str, list[dict[str, str]]]]] = {}
        for key in keys:
            query = f"last_over_time({fact_selector(key, self.matchers)}[{step}s])"
            for c0, c1 in self._chunks(t0, t1, step):
                for series in self._range(f"facts {key}", query, c0, c1, step):
                    metric: dict[str, str] = series.get("metric", {})
                    row = {k: v for k, v in sorted(metric.items()) if k not in DROPPED_LABELS}
                    source = self._source(metric)
                    for t, _value in series.get("values", []):
                        by = at.setdefault(int(float(t)), {}).setdefault(source, {})
                        by.setdefault(key, []).append(row)
        out: list[tuple[float, dict[str, dict[str, list[dict[str, str]]]]]] = []
        last: dict[str, dict[str, list[dict[str, str]]]] = {}
        for t in sorted(at):
            facts = {
                s: {k: sorted(rows, key=str) for k, rows in f.items()} for s, f in at[t].items()
            }
            if not out or any(last.get(s) != f for s, f in facts.items()):
                out.append((float(t), facts))
            last |= facts
        return out

    def gpu_series(self, at: float, lookback_s: float) -> list[dict[str, str]]:
        """The label sets of DCGM's per-GPU series Prometheus saw in ``[at - lookback_s, at]``
        (collector.dcgm joins them to engines); the source's matchers do not apply: the
        exporter is another job. Empty when no DCGM exporter is scraped."""
        window = f"{max(1, int(lookback_s))}s"
        query = f"group by ({', '.join(GPU_LABELS)}) (last_over_time({DCGM_GPU_FAMILY}[{window}]))"
        result = self._call(
            "instant query for DCGM GPUs", self._prom.custom_query, query,
            params={"time": f"{at:.3f}"},
        )  # fmt: skip
        if not isinstance(result, list):
            raise ScrapeError(self.url, "parse", "instant query for DCGM GPUs: no vector result")
        return [dict(series.get("metric", {})) for series in result]

    # -- internals ----------------------------------------------------------------------------

    def _chunks(self, t_first: int, t_last: int, w: int) -> list[tuple[int, int]]:
        span = (self.max_points - 1) * w
        chunks = []
        t = t_first
        while t <= t_last:
            chunks.append((t, min(t + span, t_last)))
            t += span + w
        return chunks

    def _range(self, signal: str, query: str, t0: int, t1: int, w: int) -> list[dict[str, Any]]:
        result = self._call(
            f"range query for {signal}",
            self._prom.custom_query_range,
            query,
            start_time=datetime.fromtimestamp(t0, UTC),
            end_time=datetime.fromtimestamp(t1, UTC),
            step=f"{w}s",
        )
        if not isinstance(result, list):
            raise ScrapeError(self.url, "parse", f"range query for {signal}: no matrix result")
        return result

    def _source(self, metric: dict[str, str]) -> str:
        instance = metric.get("instance", "")
        job = metric.get("job", "")
        if self.source_from == "job/instance" and job:
            return f"{job}/{instance}" if instance else job
        return instance or job or self.url

    def _collect(
        self,
        series: dict[str, Any],
        w: int,
        cells: dict[tuple[str, Labels, float], dict[str, float]],
    ) -> None:
        metric: dict[str, str] = series.get("metric", {})
        stat = metric.get(STAT_LABEL)
        if stat is None:
            return
        source = self._source(metric)
        if stat == "bucket":  # the cell of the series' other statistics, the bound as stat
            try:
                stat = f"{BUCKET_STAT}{float(metric['le'])!r}"
            except (KeyError, ValueError):
                return  # no numeric le: skipped, as histogram_quantile skips it
        labels: Labels = tuple(
            sorted((k, v) for k, v in metric.items() if k not in DROPPED_LABELS and k != "le")
        )
        for ts, raw in series.get("values", []):
            value = float(raw)
            if math.isnan(value) or math.isinf(value):
                continue  # no observations in the window (quantile NaN), or a broken exporter
            cell = cells.setdefault((source, labels, float(ts) - w), {})
            cell.setdefault(stat, value)  # duplicate spellings: keep the first

    def _build(
        self, signal: str, w: int, cells: dict[tuple[str, Labels, float], dict[str, float]]
    ) -> list[Window]:
        """One Window per cell, built by one constructor call (a ``dataclasses.replace`` per
        statistic cost 2.4 s of 4.9 CPU-s for 103 k windows in benchmarks/
        bench_prometheus_mode.py)."""
        kind: Kind = SIGNALS[signal].kind
        keep = SIGNALS[signal].keep_buckets
        length = float(w)
        out = []
        for (source, labels, start), st in cells.items():
            samples = int(st.get("count" if kind == "gauge" else "samples", 0))
            if samples == 0:
                continue
            last = st.get("last")
            if kind == "gauge":
                out.append(Window(
                    source, signal, labels, start, length, kind, samples, last=last,
                    mean=st.get("avg"), min=st.get("min"), max=st.get("max"),
                ))  # fmt: skip
                continue
            delta = st.get("delta")
            rate = None if delta is None else delta / w
            if kind == "counter":
                out.append(Window(
                    source, signal, labels, start, length, kind, samples, delta=delta,
                    rate=rate, resets=int(st.get("resets", 0)), last=last,
                ))  # fmt: skip
                continue
            sum_delta = st.get("sum_delta")
            bounds, counts = _buckets(st) if keep else ((), ())
            out.append(Window(
                source, signal, labels, start, length, kind, samples, delta=delta, rate=rate,
                last=last, sum_delta=sum_delta,
                mean=sum_delta / delta if sum_delta is not None and delta else None,
                p50=st.get("p50"), p90=st.get("p90"), p99=st.get("p99"),
                bucket_bounds=bounds, bucket_counts=counts,
            ))  # fmt: skip
        return out


def _buckets(stats: dict[str, float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(finite bounds, counts per bucket) of a cell's per-``le`` increases, ((), ()) without
    a +Inf bucket (a histogram without it is no histogram: the rollup skips it too)."""
    cumulative = sorted(
        (float(k[len(BUCKET_STAT) :]), v) for k, v in stats.items() if k.startswith(BUCKET_STAT)
    )
    if not cumulative or cumulative[-1][0] != math.inf:
        return (), ()
    bounds = tuple(b for b, _ in cumulative[:-1])
    return bounds, per_bucket([c for _, c in cumulative])


def derive_ratios(
    windows: Sequence[Window], ratios: Sequence[tuple[str, str, str]] = DERIVED_RATIOS
) -> list[Window]:
    """Ratio windows (numerator delta / denominator delta) as collector.rollup derives them."""
    counters = {(x.source, x.signal, x.labels, x.start): x for x in windows if x.kind == "counter"}
    out = []
    for ratio, numerator, denominator in ratios:
        for (source, signal, labels, start), den in counters.items():
            if signal != denominator:
                continue
            num = counters.get((source, numerator, labels, start))
            if num is not None:
                out.append(ratio_window(ratio, num, den))
    return out
