"""The `workload:` section of a scenario: kind, arrivals and length distributions.

Kinds: synthetic, shared_prefix, multi_turn, rag, trace. Arrivals: `concurrency` (closed
loop) or `qps` with poisson / bursty / diurnal arrivals; `stages` is a rate ramp as
inference-perf runs one [source: inference-perf-loadgen].

Design: planner/simulate/METHODS.md#workload_spec
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError
from planner.simulate.spec import Param, Section

KINDS = ("synthetic", "shared_prefix", "multi_turn", "rag", "trace")
STAGED_KINDS = ("synthetic", "shared_prefix", "rag")  # one request per arrival, no follow-ups
ARRIVALS = ("poisson", "bursty", "diurnal")
DISTS = ("fixed", "uniform", "normal", "lognormal", "exponential")


@dataclass(frozen=True, slots=True)
class LengthDist:
    """Token-count distribution; samples are integers clipped to [low, high]."""

    dist: str
    a: float  # value | min | mean
    b: float  # 0 | max | std (normal) | sigma (lognormal, of the log)
    low: int
    high: int

    def sample(self, rng: random.Random) -> int:
        if self.dist == "fixed":
            x = self.a
        elif self.dist == "uniform":
            x = rng.uniform(self.a, self.b + 1.0)
        elif self.dist == "normal":
            x = rng.gauss(self.a, self.b)
        elif self.dist == "lognormal":
            # parameterised by the mean of the samples: mu = ln(mean) - sigma²/2
            x = rng.lognormvariate(math.log(self.a) - self.b * self.b / 2.0, self.b)
        else:
            x = rng.expovariate(1.0 / self.a)
        n = int(x)  # clipped to [low, high] (integers: no max()/min() calls per sample)
        n = n if n < self.high else self.high
        return n if n > self.low else self.low

    @property
    def minimum(self) -> int:
        """The smallest value `sample` can return."""
        if self.dist in ("fixed", "uniform"):
            return max(self.low, min(self.high, int(self.a)))
        return self.low

    @property
    def mean(self) -> float:
        if self.dist == "uniform":
            return (self.a + self.b) / 2.0
        return self.a


@dataclass(frozen=True, slots=True)
class TraceRecord:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_group: str | None
    prefix_tokens: int


@dataclass(frozen=True, slots=True)
class Stage:
    """One step of a rate ramp: `requests` = int(qps · duration_s) open-loop arrivals."""

    qps: float
    duration_s: float

    @property
    def requests(self) -> int:
        return int(self.qps * self.duration_s)  # inference-perf: int(rate * duration)


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    kind: str
    concurrency: int | None  # closed loop when set
    qps: float | None  # open loop when set
    arrival: str
    burstiness: float
    diurnal_period_s: float
    diurnal_amplitude: float
    think_time_s: float
    num_requests: int | None
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    question_tokens: LengthDist
    system_prompt_tokens: int
    groups: int
    prompts_per_group: int
    popularity: str
    zipf_s: float
    order: str
    repeat: bool
    turns: int
    documents: int
    doc_tokens: int
    docs_per_request: int
    trace: tuple[TraceRecord, ...]
    stages: tuple[Stage, ...] = ()
    stage_gap_s: float = 0.0
    stage_dataset: str = "restart"


def min_request_tokens(spec: WorkloadSpec) -> int:
    """The shortest request (prompt + output) the workload can produce."""
    out = spec.output_tokens.minimum
    if spec.kind == "synthetic":
        return spec.system_prompt_tokens + spec.prompt_tokens.minimum + out
    if spec.kind == "trace":
        return min(r.prompt_tokens + r.output_tokens for r in spec.trace)
    if spec.kind == "rag":
        docs = spec.docs_per_request * spec.doc_tokens
        return spec.system_prompt_tokens + docs + spec.question_tokens.minimum + out
    return spec.system_prompt_tokens + spec.question_tokens.minimum + out


def _length(sec: Section, name: str, default: int | None, *, low: int = 1) -> LengthDist:
    value = sec.raw(name)
    if value is None:
        if default is None:
            raise sec.fail(name, "is required")
        value = default
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < low or not math.isfinite(value):
            raise sec.fail(name, f"must be >= {low}, got {value!r}")
        dist = LengthDist("fixed", float(int(value)), 0.0, low, max(low, int(value)))
        sec.params.append(
            Param(sec.key(name), int(value), "scenario" if sec.has(name) else "default")
        )
        return dist
    sub = Section(value, sec.key(name), sec.where, sec.params)
    kind = sub.choice("dist", "fixed", DISTS)
    if kind == "fixed":
        v = sub.integer("value", required=True, low=low)
        a, b = float(v), 0.0
    elif kind == "uniform":
        a = float(sub.integer("min", required=True, low=low))
        b = float(sub.integer("max", required=True, low=low))
        if b < a:
            raise sub.fail("max", f"must be >= min ({a:g})")
    else:
        a = sub.number("mean", required=True, low=float(low))
        b = 0.0
        if kind == "normal":
            b = sub.number("std", required=True, low=0.0)
        elif kind == "lognormal":
            b = sub.number("sigma", required=True, low=0.0)
    lo = sub.integer("min", low, low=low) if kind != "uniform" else int(a)
    hi = sub.integer("max", 1_000_000, low=lo) if kind != "uniform" else int(b)
    sub.finish()
    return LengthDist(kind, a, b, lo, hi)


def parse_workload(sec: Section, base_dir: Path | None) -> WorkloadSpec:
    kind = sec.choice("kind", "synthetic", KINDS, source="default: synthetic")
    conc, qps, stages = _rate(sec, kind)
    arrival, burst, period, amp = _arrival(sec, qps, stages)
    think = sec.number("think_time_s", 0.0, low=0.0, source="default: no think time")
    num = sec.optional_integer("num_requests", source="default: unlimited (duration-bound)")
    if num is not None and stages:
        raise sec.fail("num_requests", "each stage sends int(qps x duration_s) requests")
    gap, stage_dataset = _stage_options(sec, stages)
    need_prompt = kind == "synthetic"
    prompt = _length(sec, "prompt_tokens", None if need_prompt else 1)
    output = _length(sec, "output_tokens", 256)
    question = _length(sec, "question_tokens", 256 if kind != "synthetic" else 1)
    sys_default = 0 if kind in {"multi_turn", "rag", "synthetic", "trace"} else None
    sys_tokens = sec.integer(
        "system_prompt_tokens", sys_default, low=0, required=sys_default is None
    )
    groups = sec.integer("groups", 1, low=1)
    per_group = sec.integer("prompts_per_group", 1, low=1)
    popularity = sec.choice("popularity", "uniform", ("uniform", "zipf"))
    zipf_s = sec.number("zipf_s", 1.0, low=0.0)
    order = sec.choice(
        "order",
        "shuffled",
        ("shuffled", "grouped"),
        source="default: shuffled (SGLang bench_serving shuffles the dataset)",
    )
    repeat = sec.boolean("repeat", False, source="default: a finite dataset runs once")
    turns = sec.integer("turns", 5, low=1)
    documents = sec.integer("documents", 1000, low=1)
    doc_tokens = sec.integer("doc_tokens", 1024, low=1)
    k_docs = sec.integer("docs_per_request", 3, low=1)
    if kind == "rag" and k_docs > documents:
        raise sec.fail("docs_per_request", f"must be <= documents ({documents})")
    trace = _trace(sec, kind, base_dir)
    sec.finish()
    return WorkloadSpec(
        kind,
        conc,
        qps,
        arrival,
        burst,
        period,
        amp,
        think,
        num,
        prompt,
        output,
        question,
        sys_tokens,
        groups,
        per_group,
        popularity,
        zipf_s,
        order,
        repeat,
        turns,
        documents,
        doc_tokens,
        k_docs,
        trace,
        stages,
        gap,
        stage_dataset,
    )


def _rate(sec: Section, kind: str) -> tuple[int | None, float | None, tuple[Stage, ...]]:
    """(concurrency, qps, stages): exactly one sets the load, except for a trace, which
    replays its own arrival times."""
    conc = sec.optional_integer("concurrency")
    qps = sec.number("qps", record=False) if sec.has("qps") else None
    if qps is not None:
        if qps <= 0:
            raise sec.fail("qps", f"must be > 0, got {qps!r}")
        sec.params.append(Param(sec.key("qps"), qps, "scenario"))
    else:
        sec.raw("qps")
    stages = _stages(sec)
    if kind == "trace" and (conc is not None or qps is not None):
        raise sec.fail(
            "concurrency" if conc is not None else "qps", "a trace replays its own arrival times"
        )
    if stages:
        if kind not in STAGED_KINDS:
            raise sec.fail("stages", f"a rate ramp needs kind {', '.join(STAGED_KINDS)}")
        if conc is not None or qps is not None:
            raise sec.fail(
                "concurrency" if conc is not None else "qps",
                "stages set the rate of each step: give no qps or concurrency with them",
            )
    elif kind != "trace" and (conc is None) == (qps is None):
        raise sec.fail("concurrency", "give exactly one of concurrency (closed loop) or qps")
    return conc, qps, stages


def _arrival(
    sec: Section, qps: float | None, stages: tuple[Stage, ...]
) -> tuple[str, float, float, float]:
    """(arrival, burstiness, diurnal_period_s, diurnal_amplitude)."""
    arrival = sec.choice("arrival", "poisson", ARRIVALS, source="default: poisson")
    if stages and arrival == "diurnal":
        raise sec.fail("arrival", "a stage's rate is constant: poisson or bursty")
    if arrival != "poisson" and qps is None and not stages:
        raise sec.fail("arrival", "needs qps (open loop)")
    burst = sec.number(
        "burstiness",
        0.25 if arrival == "bursty" else 1.0,
        low=0.0,
        low_open=True,
        source="default: gamma shape 0.25 (vLLM benchmark_serving --burstiness)"
        if arrival == "bursty"
        else "default: 1 (Poisson)",
    )
    period = sec.number(
        "diurnal_period_s", 86_400.0, low=0.0, low_open=True, source="default: one day"
    )
    amp = sec.number("diurnal_amplitude", 0.5, low=0.0, high=1.0, source="default: ±50 %")
    return arrival, burst, period, amp


def _stage_options(sec: Section, stages: tuple[Stage, ...]) -> tuple[float, str]:
    """(stage_gap_s, stage_dataset): given only with stages."""
    gap, stage_dataset = 0.0, "restart"
    if stages:  # recorded only with stages, so other workloads' parameter lists are unchanged
        gap = sec.number(
            "stage_gap_s", 0.0, low=0.0, source="default: 0 (inference-perf load.interval)"
        )
        stage_dataset = sec.choice(
            "stage_dataset",
            "restart",
            ("restart", "continue"),
            source="default: restart (inference-perf numbers each stage's requests from 0)",
        )
    else:
        for key in ("stage_gap_s", "stage_dataset"):
            if sec.has(key):
                raise sec.fail(key, "applies only with stages")
            sec.raw(key)
    return gap, stage_dataset


def _trace(sec: Section, kind: str, base_dir: Path | None) -> tuple[TraceRecord, ...]:
    """The records a trace workload replays (relative paths from ``base_dir``); none for the
    other kinds."""
    if kind != "trace":
        sec.raw("path")
        sec.raw("time_scale")
        return ()
    path = Path(sec.string("path", "trace.jsonl"))
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    scale = sec.number("time_scale", 1.0, low=0.0, low_open=True)
    return load_trace(path, scale)


def _stages(sec: Section) -> tuple[Stage, ...]:
    value = sec.raw("stages")
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise sec.fail("stages", "must be a non-empty list of {qps, duration_s}")
    out: list[Stage] = []
    for i, item in enumerate(value):
        sub = Section(item, f"{sec.key('stages')}[{i}]", sec.where, sec.params)
        qps = sub.number("qps", required=True, low=0.0, low_open=True)
        duration = sub.number("duration_s", required=True, low=0.0, low_open=True)
        sub.finish()
        if int(qps * duration) < 1:
            raise sub.fail("qps", f"qps x duration_s must be >= 1 request, got {qps * duration:g}")
        out.append(Stage(qps, duration))
    return tuple(out)


def load_trace(path: Path, time_scale: float = 1.0) -> tuple[TraceRecord, ...]:
    """JSONL: one object per line with arrival_s, prompt_tokens, output_tokens and optional
    prefix_group (shared-prefix key) + prefix_tokens (its length, <= prompt_tokens)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read trace: {exc.strerror or exc}") from exc
    out: list[TraceRecord] = []
    allowed = {"arrival_s", "prompt_tokens", "output_tokens", "prefix_group", "prefix_tokens"}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{n}: not valid JSON: {exc.msg}") from exc
        if not isinstance(obj, dict):
            raise ConfigError(f"{path}:{n}: each line must be a JSON object")
        unknown = sorted(set(obj) - allowed)
        if unknown:
            raise ConfigError(f"{path}:{n}: unknown key {unknown[0]!r}")
        rec = _trace_record(obj, path, n, time_scale)
        if out and rec.arrival_s < out[-1].arrival_s:
            raise ConfigError(f"{path}:{n}: arrival_s goes backwards")
        out.append(rec)
    if not out:
        raise ConfigError(f"{path}: trace has no records")
    return tuple(out)


def _trace_record(obj: dict[str, object], path: Path, n: int, scale: float) -> TraceRecord:
    def need_int(key: str, low: int) -> int:
        v = obj.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ConfigError(f"{path}:{n}: key {key!r} must be an integer >= {low}, got {v!r}")
        return v

    t = obj.get("arrival_s")
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
        raise ConfigError(f"{path}:{n}: key 'arrival_s' must be a number >= 0, got {t!r}")
    prompt, output = need_int("prompt_tokens", 1), need_int("output_tokens", 1)
    group = obj.get("prefix_group")
    prefix = 0
    if group is not None:
        if not isinstance(group, str | int) or isinstance(group, bool):
            raise ConfigError(f"{path}:{n}: key 'prefix_group' must be a string or integer")
        prefix = need_int("prefix_tokens", 1)
        if prefix > prompt:
            raise ConfigError(f"{path}:{n}: key 'prefix_tokens' exceeds prompt_tokens")
    elif "prefix_tokens" in obj:
        raise ConfigError(f"{path}:{n}: key 'prefix_tokens' needs prefix_group")
    return TraceRecord(
        float(t) * scale, prompt, output, None if group is None else str(group), prefix
    )
