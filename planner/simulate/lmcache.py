"""LMCache: an L1 CPU-DRAM pool shared by engines (per engine, node or cluster), in chunks of
256 tokens with LRU eviction, plus an optional L2 tier, so one engine's prefill serves
another engine's hit.

Models LMCache 0.3–0.5 with vLLM's LMCache connector [source: lmcache-0.3.3-source]: a
lookup is an access (blocking ``lookup_overhead_s``), loads L1/L2 -> GPU (blocking unless
``async_load``), stores written through asynchronously, the MP server's sampled L1 chunk
reuse-gap histogram.

Design: planner/simulate/METHODS.md#lmcache
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from planner.domain.costmodel import transfer_seconds
from planner.simulate.content import ContentTree
from planner.simulate.kvcache import PrefixLRU
from planner.simulate.offload import Connector
from planner.simulate.request import Req
from planner.simulate.residency import L1_REUSE_GAP, LMCACHE_METRICS_SAMPLE_RATE, L1Lifecycle
from planner.simulate.scenario import ClusterSpec
from planner.simulate.telemetry import PoolTelemetry


class LMCachePool:
    """One LMCache server: L1 (CPU DRAM) and optionally L2, shared by `engines`."""

    def __init__(
        self,
        idx: int,
        scope: str,
        engines: tuple[int, ...],
        spec: ClusterSpec,
        tree: ContentTree,
        *,
        l1_sample_rate: float = LMCACHE_METRICS_SAMPLE_RATE,
    ) -> None:
        self.idx = idx
        self.scope = scope
        self.engines = engines
        lmc = spec.lmcache
        self.cs = lmc.chunk_size
        self.chunk_bytes = lmc.chunk_size * spec.kv_bytes_per_token_engine
        self.l1 = PrefixLRU(spec.cpu_cache_bytes / self.chunk_bytes, lmc.chunk_size, tree)
        self.l2 = (
            PrefixLRU(lmc.l2.size_bytes / self.chunk_bytes, lmc.chunk_size, tree)
            if lmc.l2 is not None
            else None
        )
        self.l2_spec = lmc.l2
        self.tel = PoolTelemetry()
        # L1LifecycleSubscriber (the MP server registers it with its metrics)
        self.lifecycle = L1Lifecycle(
            l1_sample_rate, self.tel.hist[L1_REUSE_GAP], tree.start, tree.end, self.cs
        )
        self.l1.watch = self.lifecycle
        self._l1_evicted = 0
        self._l2_evicted = 0

    def lookup(self, path: list[int], max_chunks: int) -> tuple[int, int]:
        """(chunks from L1, chunks in total) of path's longest stored prefix, capped."""
        cs, start, end = self.cs, self.l1.start, self.l1.end
        c1map = self.l1.cached
        c2map = self.l2.cached if self.l2 is not None else {}
        l1 = total = 0
        for n in path:
            nb = end[n] // cs - start[n] // cs
            c1 = c1map.get(n, 0)
            c2 = c2map.get(n, 0) if c2map else 0
            avail = c1 if c1 >= c2 else c2
            if avail < nb:
                total += avail
                l1 += c1
                break
            total += nb
            l1 += c1 if c1 < nb else nb
            if total >= max_chunks:
                break
        total = min(total, max_chunks)
        return min(l1, total), total

    def store(self, path: list[int], from_tokens: int, to_tokens: int) -> int:
        written = self.l1.store(path, from_tokens, to_tokens)
        tel = self.tel
        if written:
            tel.add("lmcache_l1_write_chunks_total", written)
        if self.l2 is not None:
            w2 = self.l2.store(path, from_tokens, to_tokens)  # write-through
            if w2:
                tel.add("lmcache_l2_store_completed_chunks_total", w2)
        self._sync_evictions()
        return written

    def store_unfull(self, tokens: int) -> None:
        """Keep a prompt's unfull last chunk of `tokens` (< chunk size) in L1 and L2."""
        units = tokens / self.cs
        if self.l1.store_partial(units):
            self.tel.add("lmcache_l1_write_chunks_total", 1)
        if self.l2 is not None and self.l2.store_partial(units):
            self.tel.add("lmcache_l2_store_completed_chunks_total", 1)
        self._sync_evictions()

    def touch(self, path: list[int], l1_chunks: int, total_chunks: int) -> None:
        """A lookup found `total_chunks` leading chunks, the first `l1_chunks` of them in L1."""
        if l1_chunks:
            self.l1.touch(path, l1_chunks)
        if self.l2 is not None and total_chunks > l1_chunks:
            self.l2.touch(path, total_chunks)

    def _sync_evictions(self) -> None:
        if self.l1.evicted != self._l1_evicted:
            self.tel.add("lmcache_l1_evicted_chunks_total", self.l1.evicted - self._l1_evicted)
            self._l1_evicted = self.l1.evicted
        if self.l2 is not None and self.l2.evicted != self._l2_evicted:
            self.tel.add("lmcache_l2_evicted_chunks_total", self.l2.evicted - self._l2_evicted)
            self._l2_evicted = self.l2.evicted

    def nodes(self) -> Iterator[int]:
        """Every node L1 or L2 has an entry for (ContentTree.prune keeps them)."""
        yield from self.l1.nodes()
        if self.l2 is not None:
            yield from self.l2.nodes()

    def gauges(self) -> dict[str, float]:
        used = self.l1.used * self.chunk_bytes
        cap = self.l1.capacity * self.chunk_bytes
        out = {"lmcache_l1_usage_bytes": used, "lmcache_l1_usage_ratio": used / cap if cap else 0.0}
        if self.l2 is not None:
            out["lmcache_l2_usage_bytes"] = self.l2.used * self.chunk_bytes
        return out


class LMCacheConnector(Connector):
    """An engine's view of its LMCache pool."""

    mode = "lmcache"

    def __init__(self, spec: ClusterSpec, pool: LMCachePool) -> None:
        lmc = spec.lmcache
        self.pool = pool
        self.cs = lmc.chunk_size
        self.is_async = lmc.async_load
        self.lookup_overhead_s = lmc.lookup_overhead_s
        self.store_overhead_s = lmc.store_overhead_s
        self.read_Bps = lmc.read_Bps
        self.latency = lmc.latency_s
        self.kv_gpu = spec.kv_bytes_per_token_gpu
        self.kv_engine = spec.kv_bytes_per_token_engine
        self.link_free = 0.0
        self._l1_chunks: dict[int, int] = {}  # rid -> L1 chunks of the last lookup
        self._hit: dict[int, int] = {}  # rid -> LMCache's hit (tokens) at its last lookup
        self.save_decode = lmc.save_decode_cache
        self.save_unfull = lmc.save_unfull_chunk
        self.l2_promote = lmc.l2_promote
        self.sync_store = lmc.sync_store

    def lookup(self, req: Req, p_eff: int, hit_tokens: int, count: bool = True) -> int:
        cs, pool = self.cs, self.pool
        tel = pool.tel
        l1, total = pool.lookup(req.path, (p_eff - 1) // cs)
        if total:
            pool.touch(req.path, l1, total)
        self._hit[req.rid] = total * cs
        if count:
            tel.add("lmcache_lookups_total", 1)
            tel.add("lmcache_requested_tokens_total", p_eff)
            tel.add("lmcache_hit_tokens_total", total * cs)
            tel.add("lmcache_hit_l1_tokens_total", l1 * cs)
            tel.add("lmcache_hit_l2_tokens_total", (total - l1) * cs)
        ext = total * cs - hit_tokens
        if ext <= 0:
            self._l1_chunks.pop(req.rid, None)
            return 0
        self._l1_chunks[req.rid] = l1
        return ext

    def load(self, req: Req, hit_tokens: int, ext_tokens: int, now: float) -> float:
        pool, cs = self.pool, self.cs
        pool.lifecycle.now = now
        l1 = self._l1_chunks.pop(req.rid, 0)
        end_tokens = hit_tokens + ext_tokens
        l1_tokens = max(0, min(ext_tokens, l1 * cs - hit_tokens))
        l2_tokens = ext_tokens - l1_tokens
        secs = 0.0
        if l1_tokens:
            chunks = math.ceil(l1_tokens / cs)
            secs += transfer_seconds(
                l1_tokens * self.kv_gpu, self.read_Bps, latency_s=self.latency, objects=chunks
            )
            pool.tel.add("lmcache_l1_read_chunks_total", chunks)
        if l2_tokens and pool.l2_spec is not None:
            l2 = pool.l2_spec
            chunks = math.ceil(l2_tokens / cs)
            l2_bytes = l2_tokens * self.kv_engine
            l2_secs = transfer_seconds(
                l2_bytes, l2.read_Bps, latency_s=l2.latency_s, objects=chunks,
                concurrency=l2.concurrency,
            )  # fmt: skip
            secs += l2_secs
            if l2_secs > 0:  # one L2 -> L1 load task, as LMCache's MP server observes it
                pool.tel.observe("lmcache_l2_load_throughput_gbps", l2_bytes / l2_secs / 1e9)
            secs += transfer_seconds(l2_tokens * self.kv_gpu, self.read_Bps)  # L1 -> GPU
            pool.tel.add("lmcache_l2_load_completed_chunks_total", chunks)
            if self.l2_promote:
                pool.l1.store(req.path, hit_tokens + l1_tokens, end_tokens)  # promoted to L1
            else:
                pool.l1.make_room(chunks)  # transient buffers in L1's allocator
            pool._sync_evictions()
        pool.l1.touch(req.path, end_tokens // cs)
        # the chunks read from L1 (with l2_promote, those just promoted too)
        pool.lifecycle.read(req.path, hit_tokens // cs, -(-end_tokens // cs))
        if not self.is_async:
            return secs
        self.link_free = max(now, self.link_free) + secs
        return self.link_free

    def store(self, req: Req, from_tokens: int, to_tokens: int, now: float) -> int:
        hit = self._hit.pop(req.rid, from_tokens)  # the first chunk stores from LMCache's hit
        self.pool.lifecycle.now = now
        written = self.pool.store(req.path, hit if hit < from_tokens else from_tokens, to_tokens)
        if self.save_unfull and to_tokens == req.prompt_len + req.generated:
            tail = to_tokens % self.cs  # the last prefill step keeps the unfull chunk
            if tail:
                self.pool.store_unfull(tail)
        return written

    def store_seconds(self, chunks: list[tuple[Req, int]]) -> float:
        """The blocking GPU->CPU copy of a step's stores (0.3.x): each request's stored span,
        from LMCache's hit (first step) or its last stored chunk boundary, to the last full
        chunk it computed (its last prefill step: its end, with `save_unfull_chunk`), at the
        L1 bandwidth plus the per-chunk latency. Chunks already in L1 are copied too (LMCache
        allocates and copies before it finds them present)."""
        cs, tokens, objects = self.cs, 0, 0
        for req, n in chunks:
            c0 = req.computed
            c1 = c0 + n
            hit = self._hit.get(req.rid, c0)
            lo = (hit if hit < c0 else c0) // cs * cs
            last = c1 == req.prompt_len + req.generated
            hi = c1 if last and self.save_unfull else c1 // cs * cs
            if hi > lo:
                tokens += hi - lo
                objects += -(-(hi - lo) // cs)
        if not tokens:
            return 0.0
        return transfer_seconds(
            tokens * self.kv_gpu, self.read_Bps, latency_s=self.latency, objects=objects
        )

    def store_on_release(self, req: Req, computed: int, now: float) -> None:
        self._hit.pop(req.rid, None)
        if self.save_decode and computed > req.prompt_len:
            self.pool.lifecycle.now = now
            self.pool.store(req.path, req.prompt_len, computed)

    def usage_ratio(self) -> float:
        cap = self.pool.l1.capacity
        return min(1.0, self.pool.l1.used / cap) if cap else 0.0
