"""The cluster: engines, LMCache pools, the router and the global event loop.

One heap of events ordered by (time, insertion sequence), so a run is a pure function of the
scenario and its seed; SWITCH events restart switchback canaries, LOOP events start a looping
run's next loop. `Simulation.advance_to(t)` runs up to simulated time t (repeatable, for a
server); `run()` goes to the end and returns the summary. A served cluster
(``retain_requests=False``) keeps no per-request record, so its memory stays bounded.

Design: planner/simulate/METHODS.md#cluster
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
import random
import time as _time
from collections import deque
from collections.abc import Mapping
from typing import Any, cast

from core.errors import ConfigError
from planner.simulate.content import ContentTree
from planner.simulate.engine import IDLE, Engine, StepCost
from planner.simulate.lmcache import LMCacheConnector, LMCachePool
from planner.simulate.offload import Connector, NativeOffload
from planner.simulate.request import Req
from planner.simulate.residency import RESIDENCY_HISTOGRAMS, KVResidency, Sampler
from planner.simulate.results import SimResult, summarize
from planner.simulate.router import Router
from planner.simulate.scenario import Scenario
from planner.simulate.switchback import Schedule, Switch
from planner.simulate.telemetry import (
    SERVED_BUFFER,
    EngineSnapshot,
    EngineTelemetry,
    LMCacheSnapshot,
    default_buckets,
)
from planner.simulate.workload import Workload
from planner.simulate.workload_spec import min_request_tokens

ARRIVAL, ENGINE, LOOP, SWITCH = 0, 1, 2, 3
# a served (looping) run keeps its last switches only (a switch a period; a batch run: all)
MAX_SWITCHES = 4096
# A sparse content tree is pruned once this many nodes (or as many as the last pruning kept,
# if more) were created since: amortised O(1) per node, held <= 2 x live + this.
PRUNE_MIN_NODES = 16_384


class Simulation:
    def __init__(
        self,
        scenario: Scenario,
        buckets: Mapping[str, tuple[float, ...]] | None = None,
        *,
        max_jump: int | None = None,
        loop: bool = False,
        retain_requests: bool = True,
    ) -> None:
        """`max_jump` caps the decode steps an engine advances per event (1 = a naive per-step
        loop, the benchmark's baseline); None = as far as the next event. `loop`: repeat the
        workload every `duration_s`, forever. `retain_requests=False`: keep no per-request
        record (`completed` stays empty, `run()` refuses), prune the content tree and bucket
        telemetry in small batches, so memory stays bounded (METHODS.md#cluster)."""
        self.scenario = scenario
        self.loop = loop
        self.retain_requests = retain_requests
        spec = scenario.cluster
        self.tree = ContentTree(sparse=not retain_requests)
        shortest = min_request_tokens(scenario.workload)
        capacity = spec.num_gpu_blocks * spec.block_size
        if shortest > capacity:
            raise ConfigError(
                f"{scenario.name}: cluster.num_gpu_blocks: the KV cache holds {capacity} tokens, "
                f"less than the shortest request of the workload ({shortest} tokens)"
            )
        if shortest > spec.max_model_len:
            raise ConfigError(
                f"{scenario.name}: cluster.max_model_len: {spec.max_model_len} tokens is less "
                f"than the shortest request of the workload ({shortest} tokens)"
            )
        self.too_long = 0  # refused by the frontend: prompt + output > max_model_len
        period = scenario.duration_s if loop else None
        self.workload = Workload(scenario.workload, scenario.seed, self.tree, period=period)
        self.end_time = math.inf if loop else scenario.duration_s
        self.now = 0.0
        self.last_event = 0.0
        self.events = 0
        self.wall_s = 0.0
        self.pools: list[LMCachePool] = []
        pool_of = self._build_pools()
        cost = StepCost(spec)
        self.engines: list[Engine] = []
        bounds = default_buckets(spec.max_model_len) if buckets is None else buckets
        self._pool_of = pool_of
        for i, mode in enumerate(spec.engines_offload):
            kvm = spec.kv_cache_metrics
            tel = (
                EngineTelemetry(bounds, kv_residency=kvm)
                if retain_requests
                else EngineTelemetry(bounds, buffer=SERVED_BUFFER, bounded=True, kv_residency=kvm)
            )
            node = i // spec.engines_per_node
            self.engines.append(
                Engine(
                    i,
                    node,
                    spec,
                    self.tree,
                    connector=self._connector(i, mode, tel),
                    tel=tel,
                    cost=cost,
                    on_finish=self._on_finish,
                    horizon=self.end_time,
                    residency=self._residency(i, tel) if kvm else None,
                )
            )
            if max_jump is not None:
                self.engines[-1].max_jump = max(1, max_jump)
        self.router = Router(spec.router, self.engines, spec)
        self.version = [0] * len(self.engines)
        self.heap: list[tuple[float, int, int, object, int]] = []
        self._seq = 0
        self.outstanding = 0
        # completed requests: (arrival, first token, finish, prompt, output, engine, rid)
        self.completed: list[tuple[float, float, float, int, int, int, int]] = []
        for req in self.workload.initial():
            self._push(req.arrival, ARRIVAL, req, 0)
        if loop:
            self._push(self.workload.loop_end, LOOP, None, 0)
        # switchback (switchback.py): the canaries' regimes, and the first switch
        self.schedule = Schedule(spec.switchback) if spec.switchback is not None else None
        self.switches: deque[Switch] = deque(maxlen=None if retain_requests else MAX_SWITCHES)
        if self.schedule is not None:
            sb = self.schedule.spec
            self.switches.extend(Switch(0.0, i, spec.engines_offload[i]) for i in sb.engines)
            self._push_switch(0)
        self._prune_at = math.inf if retain_requests else float(PRUNE_MIN_NODES)
        self.prunes = 0  # content-tree prunings so far

    def _residency(self, i: int, tel: EngineTelemetry) -> KVResidency:
        """Engine i's --kv-cache-metrics collector: its block sampling draws from a stream of
        its own (seeded by the scenario seed and the engine), so every other draw of the run
        is what it is without the metrics."""
        spec = self.scenario.cluster
        rng = random.Random(f"kv-cache-metrics/{self.scenario.seed}/{i}")
        hists = {name: tel.hist[name] for name in RESIDENCY_HISTOGRAMS}
        sampler = Sampler(spec.kv_cache_metrics_sample, rng)
        return KVResidency(sampler, hists, spec.block_size, self.tree.start)

    def _connector(self, i: int, mode: str, tel: EngineTelemetry) -> Connector:
        """Engine i's KV connector for offload `mode` (a new one: empty engine-local state)."""
        spec = self.scenario.cluster
        if mode == "native":
            return NativeOffload(spec, self.tree, tel)
        if mode == "lmcache":
            return LMCacheConnector(spec, self.pools[self._pool_of[i]])
        return Connector()

    def _build_pools(self) -> dict[int, int]:
        spec = self.scenario.cluster
        sb = spec.switchback
        # a switchback canary on LMCache belongs to its pool whether on or off at the start
        canaries = sb.engines if sb is not None and sb.mode == "lmcache" else ()
        members: dict[int, list[int]] = {}
        for i, mode in enumerate(spec.engines_offload):
            if mode != "lmcache" and i not in canaries:
                continue
            scope = spec.lmcache_scope
            key = i if scope == "engine" else (i // spec.engines_per_node if scope == "node" else 0)
            members.setdefault(key, []).append(i)
        pool_of: dict[int, int] = {}
        for key in sorted(members):
            idx = len(self.pools)
            self.pools.append(
                LMCachePool(idx, spec.lmcache_scope, tuple(members[key]), spec, self.tree)
            )
            for i in members[key]:
                pool_of[i] = idx
        return pool_of

    # --- event loop -------------------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: object, version: int) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq, kind, payload, version))

    def _schedule(self, eng: Engine) -> None:
        self.version[eng.idx] += 1
        if eng.seg != IDLE:
            self._push(eng.seg_end, ENGINE, eng.idx, self.version[eng.idx])

    def _arrive(self, req: Req, t: float) -> None:
        self.outstanding += 1
        if req.prompt_len + req.output_len > self.scenario.cluster.max_model_len:
            # vLLM's frontend answers HTTP 400 (prompt + max_tokens > max_model_len): no
            # engine sees the request, no engine metric counts it
            self.too_long += 1
        else:
            eng = self.router.pick(req)
            if eng.on_arrival(req, t):
                self._schedule(eng)
        if req.engine < 0:
            self._refused(req, t)
        nxt = self.workload.after_arrival(req)
        if nxt is not None:
            self._push(nxt.arrival, ARRIVAL, nxt, 0)

    def _refused(self, req: Req, t: float) -> None:
        """req was refused (too long, or longer than the engine's KV capacity): the client
        gets its error at once and goes on."""
        self.outstanding -= 1
        again = self.workload.after_completion(req, t + 1e-3)  # the error's round trip
        if again is not None:
            self._push(again.arrival, ARRIVAL, again, 0)

    # --- switchback -------------------------------------------------------------------------
    def _push_switch(self, period: int) -> None:
        assert self.schedule is not None
        nxt = self.schedule.next_switch(period)
        if nxt is not None:
            self._push(nxt * self.schedule.spec.period_s, SWITCH, nxt, 0)

    def _switch(self, period: int, t: float) -> None:
        """Period `period` starts at t with another state: restart every canary with its new
        connector (Engine.restart), then send the requests they aborted again, through the
        router, oldest first (the clients retry; a retry may reach a restarted canary)."""
        assert self.schedule is not None
        mode = self.schedule.mode(period)
        aborted: list[Req] = []
        for i in self.schedule.spec.engines:
            eng = self.engines[i]
            held = eng.restart(t, self._connector(i, mode, eng.tel))
            self._schedule(eng)  # invalidates the event of the step it lost
            self.router.refresh(i)
            self.switches.append(Switch(t, i, mode, len(held)))
            aborted += held
        for req in sorted(aborted, key=lambda r: (r.arrival, r.rid)):
            req.retry(t)
            eng = self.router.pick(req)
            if eng.on_arrival(req, t):
                self._schedule(eng)
            if req.engine < 0:
                self._refused(req, t)
        self._push_switch(period)

    def _on_finish(self, req: Req, t: float) -> None:
        self.outstanding -= 1
        if self.retain_requests:
            first, engine = req.first_token, req.engine
            self.completed.append(
                (req.arrival, first, t, req.prompt_len, req.output_len, engine, req.rid)
            )
        nxt = self.workload.after_completion(req, t)
        if nxt is not None:
            self._push(nxt.arrival, ARRIVAL, nxt, 0)

    def advance_to(self, t: float, *, settle: bool = False) -> None:
        """Process every event at or before simulated time t (capped at the scenario end).

        settle=True also commits the decode steps engines finished by t inside a longer jump,
        so counters read afterwards are current to within one step.
        """
        t = min(t, self.end_time)
        started = _time.perf_counter()
        # The event loop allocates millions of short-lived acyclic objects (heap entries,
        # requests): reference counting frees them, the cyclic collector only costs ~10 %.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            self._loop(t, settle)
        finally:
            if was_enabled:
                gc.enable()
        self.now = max(self.now, t)
        self.wall_s += _time.perf_counter() - started

    def _loop(self, t: float, settle: bool) -> None:  # noqa: PLR0912 - the simulator's event loop, one function as vLLM's scheduler
        # the hottest loop of a run: _schedule and _push are inlined, and the event count and
        # last event time are kept in locals (written back however the loop ends)
        heap, engines, version, tree = self.heap, self.engines, self.version, self.tree
        pop, push = heapq.heappop, heapq.heappush
        events, last = self.events, self.last_event
        payload: Any  # an engine's index (ENGINE), a Req (ARRIVAL) or a switchback period (SWITCH)
        try:
            while True:
                while heap and heap[0][0] <= t:
                    when, _, kind, payload, ver = pop(heap)
                    if kind == SWITCH and not heap:
                        continue  # nothing else left to happen: the run is over, no restart
                    events += 1
                    last = when
                    if kind == ENGINE:
                        if ver != version[payload]:
                            continue
                        eng = engines[payload]
                        eng.on_event(when)
                        ver += 1
                        version[payload] = ver
                        if eng.seg != IDLE:
                            self._seq += 1
                            push(heap, (eng.seg_end, self._seq, ENGINE, payload, ver))
                    elif kind == ARRIVAL:
                        payload.arrival = when
                        self._arrive(payload, when)
                        if tree.created >= self._prune_at:  # never in a batch run
                            self._prune()
                    elif kind == LOOP:
                        self._next_loop()
                    else:
                        self._switch(payload, when)
                if not settle:
                    break
                settle = False
                for eng in engines:
                    if eng.split(t):
                        self._schedule(eng)
        finally:
            self.events, self.last_event = events, last

    def _next_loop(self) -> None:
        for req in self.workload.next_loop():
            self._push(req.arrival, ARRIVAL, req, 0)
        self._push(self.workload.loop_end, LOOP, None, 0)

    def _prune(self) -> None:
        """Drop the content nodes nothing can reach any more: roots are the paths of every
        request not finished (queued arrivals, waiting, loading, running), every node a
        cache has an entry for, and the workload's catalogue (ContentTree.prune)."""
        roots: list[int] = self.workload.durable_nodes()
        for entry in self.heap:
            if entry[2] == ARRIVAL:
                roots.extend(cast(Req, entry[3]).path)
        for eng in self.engines:
            for req in itertools.chain(eng.waiting, eng.loading, eng.running.values()):
                roots.extend(req.path)
            roots.extend(eng.pool.nodes())
            roots.extend(eng.conn.nodes())
        for pool in self.pools:
            roots.extend(pool.nodes())
        self.tree.prune(roots)
        self.prunes += 1
        self._prune_at = self.tree.created + max(PRUNE_MIN_NODES, len(self.tree))

    @property
    def loop_index(self) -> int:
        """The workload's current loop (0 without looping)."""
        return self.workload.loop

    @property
    def done(self) -> bool:
        """No event left (a finite workload has completed) or the end time is reached."""
        return not self.heap or self.now >= self.end_time

    def run(self) -> SimResult:
        """Simulate to the end and summarize the run."""
        if self.loop or not self.retain_requests:
            raise ConfigError(
                f"{self.scenario.name}: a summary needs a finite run that keeps its requests "
                "(loop=False, retain_requests=True)"
            )
        self.advance_to(self.end_time)
        return summarize(self)

    # --- observation ------------------------------------------------------------------------
    def engine_snapshots(self) -> list[EngineSnapshot]:
        return [e.snapshot(self.now) for e in self.engines]

    def lmcache_snapshots(self) -> list[LMCacheSnapshot]:
        return [
            LMCacheSnapshot(
                p.idx,
                p.scope,
                p.engines,
                self.now,
                dict(p.tel.counters),
                p.gauges(),
                p.tel.histograms(),
            )
            for p in self.pools
        ]
