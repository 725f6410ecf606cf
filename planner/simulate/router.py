"""Which engine a request goes to: round_robin, least_loaded, prefix_affinity, scorer.

`round_robin` with `cluster.load_shares` is nginx's smooth weighted round robin. `scorer` is
llm-d's endpoint picker: a weighted sum of prefix, CPU-prefix, KV, queue and no-hit-LRU
scores (weights and indexes in router_spec.py), over a `routed` or `cached` prefix index;
ties go to a start that rotates per request, so a run stays a function of its seed.

Design: planner/simulate/METHODS.md#router
"""

from __future__ import annotations

from typing import Any

from planner.simulate.engine import Engine
from planner.simulate.kvcache import PrefixLRU, leading_cached
from planner.simulate.lmcache import LMCacheConnector
from planner.simulate.offload import NativeOffload
from planner.simulate.request import Req
from planner.simulate.scenario import ClusterSpec


class Router:
    """Picks an engine for each request (METHODS.md#router)."""

    def __init__(self, policy: str, engines: list[Engine], spec: ClusterSpec) -> None:
        self.policy = policy
        self.engines = engines
        self.n = len(engines)
        self._next = 0
        sc = spec.scorer
        self.sc = sc
        self.bs = spec.block_size
        self.routed = sc.prefix_index == "routed"
        # per engine: (its block pool, GPU store, CPU store, CPU store's unit)
        self._stores: list[tuple[Any, Any, Any, int]] = []
        self._gpu_index: list[PrefixLRU] = []
        self._cpu_index: list[PrefixLRU] = []
        # engines by when they last got a no-hit request: never first (index order), then oldest
        self._cold_order: list[int] = list(range(self.n))
        self._lru_rank = [1.0 - r / (self.n - 1) for r in range(self.n)] if self.n > 1 else [1.0]
        self.prefix_caching = spec.enable_prefix_caching
        for e in engines:
            if self.routed:
                self._gpu_index.append(PrefixLRU(spec.num_gpu_blocks, self.bs, e.tree))
                if sc.cpu_prefix:
                    cap = sc.cpu_index_blocks or _cpu_tier_blocks(e, self.bs, spec)
                    self._cpu_index.append(PrefixLRU(cap, self.bs, e.tree))
            self._stores.append(self._store_of(e))
        # load_shares: smooth weighted round robin (nginx's), deterministic, the engines'
        # turns interleaved in proportion to their weights
        self.shares = spec.load_shares
        self._total_share = sum(spec.load_shares) if spec.load_shares is not None else 0.0
        self._credit = [0.0] * self.n
        if self.shares is not None and policy == "round_robin":
            self.policy = "weighted"

    def _store_of(self, e: Engine) -> tuple[Any, Any, Any, int]:
        """(its block pool, GPU store, CPU store, CPU store's unit) the scorer reads."""
        gpu: Any = e.pool.cached if self.prefix_caching else None
        cpu: Any = None
        unit = self.bs
        if self.routed:
            gpu = self._gpu_index[e.idx].cached
            if self._cpu_index:
                cpu = self._cpu_index[e.idx].cached
        elif isinstance(e.conn, NativeOffload):
            cpu = e.conn.pool.cached
        elif isinstance(e.conn, LMCacheConnector) and len(e.conn.pool.engines) == 1:
            cpu, unit = e.conn.pool.l1.cached, e.conn.cs
        return (e.pool, gpu, cpu, unit)

    def refresh(self, i: int) -> None:
        """Engine i restarted (new block pool and connector): read its new stores. The routed
        indexes are the picker's own memory and stay (llm-d's approximate producer does not
        see a restart either)."""
        self._stores[i] = self._store_of(self.engines[i])

    def pick(self, req: Req) -> Engine:
        if self.policy == "round_robin":
            eng = self.engines[self._next]
            self._next = (self._next + 1) % self.n
            return eng
        if self.policy == "weighted":
            return self._weighted()
        if self.policy == "least_loaded":
            return min(self.engines, key=lambda e: (e.load_estimate(), e.idx))
        if self.policy == "scorer":
            return self._score(req)
        key = (req.affinity * 2654435761) & 0xFFFFFFFF  # Knuth multiplicative hash
        return self.engines[key % self.n]

    def _weighted(self) -> Engine:
        """Smooth weighted round robin: every engine gains its weight, the richest (first on
        ties) is picked and pays the total."""
        shares, credit = self.shares, self._credit
        assert shares is not None
        best = 0
        for i, w in enumerate(shares):
            credit[i] += w
            if credit[i] > credit[best]:
                best = i
        credit[best] -= self._total_share
        return self.engines[best]

    def _score(self, req: Req) -> Engine:
        sc, bs = self.sc, self.bs
        w_p, w_c, w_kv, w_q, w_lru = sc.prefix, sc.cpu_prefix, sc.kv, sc.queue, sc.no_hit_lru
        if self.routed:  # the prompt's full blocks the producer hashes, at most max_prefix_blocks
            limit = min(req.prompt_len // bs, sc.max_prefix_blocks)
        else:  # blocks a hit can cover (vLLM recomputes the last token)
            limit = min((req.prompt_len - 1) // bs, sc.max_prefix_blocks)
        waits = [len(e.waiting) + len(e.loading) for e in self.engines]  # vLLM num_waiting
        hi = max(waits)
        span = hi - min(waits)
        path = req.path
        n0 = path[0]
        n = self.n
        first = self._next
        self._next = (first + 1) % n
        gpu_hits = [0] * n
        cpu_hits = [0] * n
        if limit > 0 and (w_p or w_c or w_lru):
            for i, (pool, gpu, cpu, unit) in enumerate(self._stores):
                if gpu is not None and n0 in gpu:
                    gpu_hits[i] = leading_cached(
                        path, pool.start, pool.end, gpu, unit=bs, limit=limit
                    )
                if w_c and cpu is not None and n0 in cpu:
                    got = leading_cached(
                        path, pool.start, pool.end, cpu, unit=unit, limit=limit * bs // unit
                    )
                    cpu_hits[i] = got * unit // bs
        cold = not any(gpu_hits)
        lru_score = self._lru_scores() if cold and w_lru else None
        best = first
        best_s = -1.0
        for j in range(n):
            i = first + j
            if i >= n:
                i -= n
            pool = self._stores[i][0]
            score = w_q * (hi - waits[i]) / span if span else w_q
            if w_kv:
                score += w_kv * (1.0 - (pool.pinned_total + pool.private_total) / pool.total)
            if limit > 0:
                score += (w_p * gpu_hits[i] + w_c * cpu_hits[i]) / limit
            if w_lru:
                score += w_lru * (lru_score[i] if lru_score is not None else 0.5)
            if score > best_s:
                best, best_s = i, score
        self._record(req, best, cold)
        return self.engines[best]

    def _lru_scores(self) -> list[float]:
        """no-hit-lru-scorer: engines never sent a no-hit request first (in index order),
        then from the least recently sent; score 1 − rank / (n − 1)."""
        out = [0.0] * self.n
        for i, score in zip(self._cold_order, self._lru_rank, strict=True):
            out[i] = score
        return out

    def _record(self, req: Req, i: int, cold: bool) -> None:
        """What the picker learns from its own decision (llm-d's PreRequest hooks)."""
        if cold:
            order = self._cold_order
            order.remove(i)
            order.append(i)
        if self.routed and self.sc.max_prefix_blocks:
            upto = min(req.prompt_len // self.bs, self.sc.max_prefix_blocks) * self.bs
            self._gpu_index[i].store(req.path, 0, upto)
            if self._cpu_index:
                self._cpu_index[i].store(req.path, 0, upto)


def _cpu_tier_blocks(eng: Engine, bs: int, spec: ClusterSpec) -> int:
    """The capacity, in GPU blocks, of the engine's own CPU tier (0 without one); a switchback
    canary off at the start: the tier it has when on."""
    conn = eng.conn
    if isinstance(conn, NativeOffload):
        return int(conn.pool.capacity)
    if isinstance(conn, LMCacheConnector):
        return int(conn.pool.l1.capacity * conn.cs // bs)
    sb = spec.switchback
    if sb is not None and eng.idx in sb.engines:
        per_token = spec.kv_bytes_per_token_engine
        if sb.mode == "native":  # as NativeOffload's pool
            return int(spec.cpu_cache_bytes / (spec.block_size * per_token))
        cs = spec.lmcache.chunk_size  # as LMCachePool's L1
        return int(spec.cpu_cache_bytes / (cs * per_token) * cs // bs)
    return 0
