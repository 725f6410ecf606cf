"""Synthetic Prometheus history of vLLM 0.33 engines, as OpenMetrics text for promtool backfill.

benchmarks/bench_prometheus_mode.py writes it into a fresh TSDB with ``promtool tsdb
create-blocks-from openmetrics``; this module only makes the text and knows the values.

The series an engine has are those of vLLM 0.33's own default exposition
(tests/fixtures/metrics/vllm-0.33.0-metrics-default.txt, rendered by vLLM's metric code) that
kvscope reads: every family of core.catalog it holds (counters, gauges, histograms with
their buckets and ``le`` spellings) and ``cache_config_info``; the families kvscope does not
read (python_*, process_*, mm_cache, estimated_flops, ``_created``) are left out. Labels are
the fixture's (``engine="0"``, ``finished_reason``, ``source``, ``reason``, ``le``, the cache
config) with ``model_name`` set per engine and ``job`` / ``instance`` as a Prometheus scrape
adds them. Sample names come from core.catalog (no vendor name is spelled here).

Values move as a loaded engine's do, one engine's all derived from a few drivers: a request
rate following a sine over the span (phase per engine) with AR(1) noise; requests finished
per scrape Poisson; prompt / generation / prefix-hit tokens from it; KV-cache usage rising
with load, preemptions and waiting requests above 80-85 % of it; histograms as multinomial
draws of each scrape's observations over lognormal bucket probabilities whose median grows
with KV pressure. Every ``RESTART_EVERY``-th engine restarts once (counters and histograms
back to 0, the scrape at the restart missing). Scrapes are every 15 s at a per-engine offset
with a few ms of jitter, so no sample lies on a window edge. Deterministic for a seed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
from numpy.typing import NDArray
from scipy.special import erf

from core import catalog

FIXTURE = (
    Path(__file__).resolve().parents[1] / "tests/fixtures/metrics/vllm-0.33.0-metrics-default.txt"
)
SCRAPE_S = 15.0
JOB = "vllm"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
RESTART_EVERY = 10  # engines 3, 13, 23, … restart once
ENGINES_PER_NODE = 8
_SAMPLE = re.compile(r"^([^\s{]+)(?:\{([^}]*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

# Histogram shapes: lognormal median (in the signal's unit) and sigma; observations per scrape
# interval are the requests finished in it unless named (per token, per engine step).
_MEDIAN = {
    "ttft_seconds": (0.15, 0.9), "inter_token_latency_seconds": (0.025, 0.5),
    "request_tpot_seconds": (0.028, 0.4), "e2e_latency_seconds": (6.0, 0.8),
    "queue_time_seconds": (0.04, 1.2), "inference_time_seconds": (5.5, 0.8),
    "prefill_time_seconds": (0.12, 0.9), "decode_time_seconds": (5.2, 0.8),
    "request_prompt_tokens": (1800.0, 0.9), "request_generation_tokens": (180.0, 0.8),
    "request_prefill_kv_computed_tokens": (900.0, 1.0), "request_num_preemptions": (0.2, 1.0),
    "iteration_tokens": (256.0, 1.2),
}  # fmt: skip
_CONGESTED = {"ttft_seconds", "queue_time_seconds", "e2e_latency_seconds", "prefill_time_seconds"}


@dataclass
class Series:
    """One series of the template: ``signal`` and its labels beyond the common ones; for a
    histogram its bucket ``le`` spellings (the fixture's, ending with +Inf)."""

    signal: str
    kind: str
    labels: tuple[tuple[str, str], ...]
    les: list[str] = field(default_factory=list)


@dataclass
class Family:
    """One metric family of the template, in the fixture's order."""

    name: str  # the family name (# TYPE line)
    kind: str  # counter | gauge | histogram
    sample: str  # the sample name (counters: name_total; histograms: the base name)
    series: list[Series]


def _names() -> dict[str, tuple[str, str]]:
    """sample name -> (signal, part) for every vLLM signal's current spelling."""
    out: dict[str, tuple[str, str]] = {}
    for name, sig in catalog.SIGNALS.items():
        if sig.source != "vllm":
            continue
        parts: tuple[catalog.Part, ...] = ("bucket", "count", "sum")
        for part in parts if sig.kind == "histogram" else parts[:1]:
            for sample in catalog.exposed_names(name, part):
                out.setdefault(sample, (name, part))
    return out


def template(path: Path = FIXTURE) -> list[Family]:
    """The families of the vLLM 0.33 default exposition that kvscope reads (module docstring)."""
    names = _names()
    fact = catalog.FACTS["cache_config"]
    families: dict[str, Family] = {}
    hist: dict[tuple[str, tuple[tuple[str, str], ...]], Series] = {}
    for line in path.read_text().splitlines():
        m = _SAMPLE.match(line)
        if m is None or line.startswith("#"):
            continue
        sample, raw = m.group(1), m.group(2) or ""
        labels = dict(_LABEL.findall(raw))
        labels.pop("model_name", None)
        if sample == fact:
            fam = families.setdefault(fact, Family(fact, "gauge", fact, []))
            fam.series.append(Series("", "info", tuple(sorted(labels.items()))))
            continue
        if sample not in names or sample.endswith("_created"):
            continue
        signal, part = names[sample]
        sig = catalog.SIGNALS[signal]
        if sig.kind != "histogram":
            family = sample.removesuffix("_total") if sig.kind == "counter" else sample
            fam = families.setdefault(family, Family(family, sig.kind, sample, []))
            fam.series.append(Series(signal, sig.kind, tuple(sorted(labels.items()))))
            continue
        base = sample.removesuffix("_" + part)
        le = labels.pop("le", None)
        key = (base, tuple(sorted(labels.items())))
        if key not in hist:
            hist[key] = Series(signal, "histogram", key[1])
            fam = families.setdefault(base, Family(base, "histogram", base, []))
            fam.series.append(hist[key])
        if part == "bucket" and le is not None:
            hist[key].les.append(le)
    return list(families.values())


def instance(i: int) -> str:
    """Engine ``i``'s scrape address: 8 engines (one per GPU) per node, a port each."""
    return f"gpu-node-{i // ENGINES_PER_NODE:03d}:{8000 + i % ENGINES_PER_NODE}"


class Engine:
    """Every value of one engine's series over ``steps`` scrapes (deterministic per seed)."""

    def __init__(self, index: int, start: float, steps: int, seed: int = 0) -> None:
        self.index = index
        self.steps = steps
        self.seed = seed
        rng = np.random.default_rng([seed, index])
        offset = 0.05 + (index * 0.977) % (SCRAPE_S - 0.1)  # Prometheus spreads targets out
        jitter = rng.integers(-4, 5, steps) / 1000
        self.ts = np.round(start + offset + SCRAPE_S * np.arange(steps) + jitter, 3)
        span = steps * SCRAPE_S
        t = np.arange(steps) * SCRAPE_S
        phase = rng.uniform(0, 2 * math.pi)
        noise = np.zeros(steps)
        shocks = rng.normal(0, 0.08, steps)
        for k in range(1, steps):  # AR(1): load wanders, it does not jump
            noise[k] = 0.97 * noise[k - 1] + shocks[k]
        base = rng.uniform(2.0, 6.0)  # requests/s
        wave = 1 + 0.45 * np.sin(2 * math.pi * t / max(span, 1) + phase)
        load = np.clip(base * wave, 0.1, None)
        load = load * np.exp(noise)
        self.requests = rng.poisson(load * SCRAPE_S)
        peak = base * 1.6
        self.kv = np.clip(0.2 + 0.72 * load / peak + rng.normal(0, 0.02, steps), 0.0, 1.0)
        self.pressure = np.clip(self.kv - 0.8, 0.0, None)
        self.prompt = rng.poisson(self.requests * 1800.0)
        hit_ratio = 0.45 + 0.2 * np.sin(t / 3000 + phase) + rng.normal(0, 0.03, steps)
        hit_ratio = np.clip(hit_ratio, 0, 1)
        self.hits = np.minimum(np.round(self.prompt * hit_ratio), self.prompt).astype(np.int64)
        self.generation = rng.poisson(self.requests * 180.0)
        self.preemptions = rng.poisson(self.pressure * 60.0)
        self.running = rng.poisson(load * 6.0)
        self.waiting = rng.poisson(self.pressure * 80.0)
        self.restart = int(rng.integers(steps // 4, 3 * steps // 4)) if (
            index % RESTART_EVERY == 3 and steps >= 8
        ) else None  # fmt: skip
        self.present = np.ones(steps, dtype=bool)
        if self.restart is not None:
            self.present[self.restart] = False  # the scrape while it restarted
        self._hist_state: dict[tuple[str, int], tuple[NDArray[np.int64], float]] = {}

    def _cum(self, inc: NDArray[np.int64] | NDArray[np.float64]) -> NDArray[np.float64]:
        """A counter from its increments, back to 0 at the restart (its first value there is
        that step's increment)."""
        c = np.cumsum(inc, axis=0).astype(np.float64)
        if self.restart is not None:
            c[self.restart :] -= c[self.restart - 1]
        return c

    def counter(self, signal: str, labels: dict[str, str]) -> NDArray[np.float64]:
        zero = np.zeros(self.steps, dtype=np.int64)
        inc = {
            "preemptions_total": self.preemptions,
            "prefix_cache_queries_total": self.prompt,
            "prefix_cache_hits_total": self.hits,
            "prompt_tokens_total": self.prompt,
            "generation_tokens_total": self.generation,
            "prompt_tokens_cached_total": self.hits,
        }.get(signal)
        if signal == "prompt_tokens_by_source_total":
            inc = {"local_compute": self.prompt - self.hits, "local_cache_hit": self.hits}.get(
                labels.get("source", ""), zero
            )
        elif signal == "prompt_tokens_cached_by_source_total":
            inc = self.hits if labels.get("source") == "device" else zero
        elif signal == "request_success_total":
            stop = np.round(self.requests * 0.93).astype(np.int64)
            inc = {"stop": stop, "length": self.requests - stop}.get(
                labels.get("finished_reason", ""), zero
            )
        return self._cum(zero if inc is None else inc)

    def gauge(self, signal: str, labels: dict[str, str]) -> NDArray[np.float64]:
        out: NDArray[np.float64] = np.zeros(self.steps)
        if signal == "kv_cache_usage_ratio":
            out = np.round(self.kv, 4)
        elif signal == "requests_running":
            out = self.running.astype(np.float64)
        elif signal == "requests_waiting":
            out = self.waiting.astype(np.float64)
        elif signal == "requests_waiting_by_reason":
            capacity = np.round(self.waiting * 0.8)
            out = capacity if labels.get("reason") == "capacity" else self.waiting - capacity
        return out

    def histogram(
        self, signal: str, les: list[str], salt: int, k0: int, k1: int
    ) -> tuple[list[list[int]], list[float]]:
        """Scrapes ``[k0, k1)`` of one histogram: cumulative bucket counts (one row per scrape,
        +Inf last) and sums. Each scrape's observations are Poisson per bucket around the
        expected count; drawn per call and carried over (``_hist_state``), so a chunk costs
        its own scrapes only and consecutive chunks continue each other."""
        rng = np.random.default_rng([self.seed, self.index, 1000 + salt, k0])
        median, sigma = _MEDIAN.get(signal, (1.0, 1.0))
        rate = self.requests[k0:k1].astype(np.float64)
        if signal == "inter_token_latency_seconds":
            rate = self.generation[k0:k1].astype(np.float64)
        elif signal == "iteration_tokens":
            rate = np.full(k1 - k0, SCRAPE_S * 40.0)  # engine steps
        elif signal == "request_num_preemptions":
            median = median * (1 + 20 * float(self.pressure.mean()))
        bounds = np.array([float(le) for le in les[:-1]])
        med = np.full(k1 - k0, median)
        if signal in _CONGESTED:
            med = med * (1 + 8 * self.pressure[k0:k1])
        z = (np.log(bounds)[None, :] - np.log(med)[:, None]) / sigma
        cdf = 0.5 * (1 + _erf(z / math.sqrt(2)))
        ones = np.ones((k1 - k0, 1))
        pvals = np.clip(np.diff(np.concatenate([0 * ones, cdf, ones], axis=1), axis=1), 0, None)
        counts = rng.poisson(rate[:, None] * pvals)  # scrapes × buckets(+Inf)
        upper = np.concatenate([bounds, [bounds[-1] * 2 if len(bounds) else 1.0]])
        lower = np.concatenate([[0.0], bounds])
        mid = np.where(lower > 0, np.sqrt(np.maximum(lower, 1e-12) * upper), upper / 2)
        obs = np.cumsum(counts, axis=1)  # cumulative over buckets
        sums = counts @ mid
        key = (signal, salt)
        base_b, base_s = self._hist_state.get(key, (np.zeros(obs.shape[1], np.int64), 0.0))
        cb, cs = np.cumsum(obs, axis=0), np.cumsum(sums)
        if self.restart is not None and k0 <= self.restart < k1:  # back to 0 there
            r = self.restart - k0
            if r > 0:
                cb[r:] -= cb[r - 1]
                cs[r:] -= cs[r - 1]
                cb[:r] += base_b
                cs[:r] += base_s
        else:
            cb += base_b
            cs += base_s
        self._hist_state[key] = (cb[-1].copy(), float(cs[-1]))
        return cb.tolist(), cs.tolist()


def _erf(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """Vectorised erf (math.erf per element is too slow at this size)."""
    out: NDArray[np.float64] = erf(x)
    return out


def _fmt(v: float) -> str:
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


def write_chunk(
    out: IO[str], families: list[Family], engines: list[Engine], k0: int, k1: int
) -> int:
    """Write scrapes ``[k0, k1)`` of every engine as OpenMetrics (families contiguous, each
    series' points in time order, ``# EOF`` last); return the samples written."""
    written = 0
    ts_str = {e.index: [f" {t:.3f}\n" for t in e.ts.tolist()] for e in engines}
    for fam in families:
        out.write(f"# TYPE {fam.name} {fam.kind}\n")
        for e in engines:
            common = {"engine": "0", "instance": instance(e.index), "job": JOB, "model_name": MODEL}
            ts = ts_str[e.index]
            keep = [k for k in range(k0, k1) if e.present[k]]
            for salt, s in enumerate(fam.series):
                labels = dict(s.labels)
                lab = ",".join(f'{k}="{v}"' for k, v in sorted((common | labels).items()))
                if s.kind == "info":
                    info = ",".join(
                        f'{k}="{v}"' for k, v in sorted((labels | {"instance": instance(e.index),
                                                          "job": JOB}).items())
                    )  # fmt: skip
                    out.writelines(f"{fam.sample}{{{info}}} 1{ts[k]}" for k in keep)
                    written += len(keep)
                    continue
                if s.kind in ("counter", "gauge"):
                    values = (e.counter if s.kind == "counter" else e.gauge)(s.signal, labels)
                    prefix = f"{fam.sample}{{{lab}}} "
                    vals = values.tolist()
                    out.writelines(f"{prefix}{_fmt(vals[k])}{ts[k]}" for k in keep)
                    written += len(keep)
                    continue
                rows, sm = e.histogram(s.signal, s.les, salt + 31 * len(fam.name), k0, k1)
                pre = [f'{fam.sample}_bucket{{{lab},le="{le}"}} ' for le in s.les]
                count_pre, sum_pre = f"{fam.sample}_count{{{lab}}} ", f"{fam.sample}_sum{{{lab}}} "
                for k in keep:
                    row, tk = rows[k - k0], ts[k]
                    out.write("".join([p + str(c) + tk for p, c in zip(pre, row, strict=True)]))
                    out.write(f"{count_pre}{row[-1]}{tk}{sum_pre}{sm[k - k0]!r}{tk}")
                written += len(keep) * (len(s.les) + 2)
    out.write("# EOF\n")
    return written


def chunks(start: float, steps: int, block_s: float, max_steps: int) -> Iterator[tuple[int, int]]:
    """Scrape index ranges ``[k0, k1)`` that stay inside one ``block_s``-aligned range (what
    promtool cuts a block at), each at most ``max_steps`` long; offsets below SCRAPE_S keep
    every scrape of a range inside it."""
    k = 0
    while k < steps:
        t = start + k * SCRAPE_S
        edge = (math.floor(t / block_s) + 1) * block_s
        room = max(1, math.floor((edge - SCRAPE_S - start) / SCRAPE_S) - k + 1)
        k1 = min(steps, k + min(max_steps, room))
        yield k, k1
        k = k1
