"""Why the GKE tiered-cache rows of calibrate_sim miss (issue 14): the checks behind
benchmarks/README.md, "Simulator calibration".

    .venv/bin/python benchmarks/gke_tier_diagnostics.py                  # ~1-2 min
    .venv/bin/python benchmarks/gke_tier_diagnostics.py --fragmentation  # + ~3 min

1. Absolute figures of every simulated GKE case (HBM only and the published best set-up):
   input tokens/s, mean TTFT and E2E, GPU and LMCache hit rates.
2. TTFT share: in a closed loop E2E = TTFT + decode time, so a published pair (TTFT change
   t, E2E change e) bounds the HBM-only run's TTFT / E2E by (1 + e) / (1 + t) whenever the
   decode time does not turn negative; the simulated HBM-only share is set against it.
3. L2 bandwidth: the SSD rows with the disk read at 9.6 (the `local-nvme` tier), 4, 2 and
   1 GB/s: does any bandwidth make TTFT rise while throughput rises, as published?
4. Batch budget: the GKE rows' throughput changes at vLLM's default 8192 and at the GKE
   set-up's 2048 [source: gke-lmcache-local-disk-tutorial].
5. Past the first token: in every HBM-only case, the preemptions that hit a decoding request
   against those that hit one still in prefill, how many distinct prefixes HBM holds, and
   the mean number of the 200 clients' requests past their first token, 200 x (1 - TTFT /
   E2E), simulated and as the published pair needs it (Little's law on the closed loop).
6. (--fragmentation) One TP rank's LMCache 0.3.3 L1 (128 GiB) under Test 3's 5k workload,
   replayed through a first-fit allocator with 512-byte alignment that evicts LRU chunks
   until an allocation fits, as LocalCPUBackend.allocate does [source: lmcache-0.3.3-source],
   against a byte-counted LRU: prefix-chunk hit rate and fill.
"""

from __future__ import annotations

import argparse
import bisect
import random
import sys
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.calibrate_sim import GKE_TESTS, gke_raw
from planner.simulate.cluster import Simulation
from planner.simulate.decode import DECODE
from planner.simulate.scenario import ClusterSpec, parse_scenario


def _share_bound(ttft: float, e2e: float) -> float:
    """The HBM-only TTFT / E2E a published (TTFT change, E2E change) pair allows (check 2)."""
    return (1 + e2e) / (1 + ttft)


def _summary(raw: dict[str, Any]) -> dict[str, Any]:
    return Simulation(parse_scenario(raw, where="gke_tier_diagnostics")).run().summary


def _cases() -> list[tuple[str, float, int, str, tuple[float, float, float]]]:
    out = []
    for test, (cache, cases) in GKE_TESTS.items():
        if test == "Test 1":
            continue
        for prefix, (best, tput, ttft, e2e) in cases.items():
            if best != "HBM":
                out.append((test, cache, prefix, best, (tput, ttft, e2e)))
    return out


def absolute_and_share() -> None:
    print("| case | set-up | input tok/s | TTFT s | E2E s | TTFT/E2E | bound | GPU | LMCache |")
    print("|---|---|---|---|---|---|---|---|---|")  # GPU, LMCache: prefix / external hit rates
    for test, cache, prefix, best, (_, ttft, e2e) in _cases():
        bound = _share_bound(ttft, e2e)
        for setup in ("HBM", best):
            s = _summary(gke_raw(prefix, setup, cache))
            share = s["ttft_mean_s"] / s["e2e_mean_s"]
            b = f"<= {bound:.2f}" if setup == "HBM" and bound < 1 else "–"
            print(
                f"| {test} {prefix // 1000}k | {setup} | {s['input_tokens_per_s']:,.0f} | "
                f"{s['ttft_mean_s']:.1f} | {s['e2e_mean_s']:.1f} | {share:.2f} | {b} | "
                f"{s['prefix_hit_rate']:.2f} | {s['external_hit_rate']:.2f} |"
            )


def _change(raw_base: dict[str, Any], raw_tier: dict[str, Any]) -> tuple[float, float, float]:
    b, t = _summary(raw_base), _summary(raw_tier)
    return (
        t["input_tokens_per_s"] / b["input_tokens_per_s"] - 1,
        t["ttft_mean_s"] / b["ttft_mean_s"] - 1,
        t["e2e_mean_s"] / b["e2e_mean_s"] - 1,
    )


def l2_bandwidth() -> None:
    ssd = [c for c in _cases() if c[3] == "HBM+CPU+SSD"]
    head = " | ".join(f"{t} {p // 1000}k" for t, _, p, _, _ in ssd)
    print(f"| L2 GB/s | {head} |\n|---|" + "---|" * len(ssd))
    pub = " | ".join(f"{a:+.0%} / {b:+.0%} / {c:+.0%}" for *_, (a, b, c) in ssd)
    print(f"| published | {pub} |")
    for bw in (9.6, 4.0, 2.0, 1.0):
        cells = []
        for _, cache, prefix, best, _ in ssd:
            tier = gke_raw(prefix, best, cache)
            tier["cluster"]["lmcache"]["l2"]["bandwidth_gbps"] = bw
            a, b, c = _change(gke_raw(prefix, "HBM", cache), tier)
            cells.append(f"{a:+.0%} / {b:+.0%} / {c:+.0%}")
        print(f"| {bw:g} | " + " | ".join(cells) + " |")
    print("(cells: input throughput / mean TTFT / mean E2E change vs HBM only)")


def budget() -> None:
    print("| case | published | 8192 | 2048 |\n|---|---|---|---|")
    for test, cache, prefix, best, (tput, _, _) in _cases():
        cells = []
        for tokens in (8192, 2048):
            base, tier = gke_raw(prefix, "HBM", cache), gke_raw(prefix, best, cache)
            for raw in (base, tier):
                raw["cluster"]["max_num_batched_tokens"] = tokens
            cells.append(f"{_change(base, tier)[0]:+.1%}")
        print(f"| {test} {prefix // 1000}k {best} | {tput:+.0%} | " + " | ".join(cells) + " |")


# --- 5. who is preempted, and how many requests are past their first token ---------------
def _victims(raw: dict[str, Any]) -> tuple[dict[str, Any], ClusterSpec, int, int]:
    """(summary, cluster, preemptions of decoding requests, of requests in prefill) of one
    run."""
    counts = {"decode": 0, "prefill": 0}
    sim = Simulation(parse_scenario(raw, where="gke_tier_diagnostics"))
    for eng in sim.engines:
        preempt = eng._preempt_newest

        def counted(now: float, eng: Any = eng, preempt: Any = preempt) -> Any:
            newest = eng.running[next(reversed(eng.running))]
            counts["decode" if newest.state == DECODE else "prefill"] += 1
            return preempt(now)

        eng._preempt_newest = counted  # type: ignore[method-assign]
    summary = sim.run().summary
    return summary, sim.scenario.cluster, counts["decode"], counts["prefill"]


def past_first_token() -> None:
    print(
        "| case | groups | prefixes in HBM | preempted decoding / in prefill | "
        "past first token, simulated | needed by the published pair |\n|---|---|---|---|---|---|"
    )
    for test, cache, prefix, _, (_, ttft, e2e) in _cases():
        raw = gke_raw(prefix, "HBM", cache)
        summary, spec, dec, pre = _victims(raw)
        hbm = spec.num_gpu_blocks * spec.block_size
        clients = raw["workload"]["concurrency"]
        sim_past = clients * (1 - summary["ttft_mean_s"] / summary["e2e_mean_s"])
        bound = _share_bound(ttft, e2e)
        need = f">= {clients * (1 - bound):.0f}" if bound < 1 else "–"
        print(
            f"| {test} {prefix // 1000}k | {raw['workload']['groups']} | {hbm // prefix} | "
            f"{dec} / {pre} | {sim_past:.0f} | {need} |"
        )


# --- 6. fragmentation of LMCache 0.3.3's L1 allocator ------------------------------------
CAP = 128 * 1024**3  # one TP rank's L1 (8 x 128 GiB in the GKE set-up)
TOKEN_BYTES = 40_960  # Llama-3.3-70B bf16 KV per token on one of 8 ranks
CHUNK = 256


class _FirstFit:
    """TensorMemoryAllocator: address-sorted free list, first fit, neighbours coalesced."""

    def __init__(self, cap: int) -> None:
        self.free: list[tuple[int, int]] = [(0, cap)]

    def alloc(self, size: int) -> int | None:
        size = -(-size // 512) * 512
        for i, (start, n) in enumerate(self.free):
            if n >= size:
                if n == size:
                    self.free.pop(i)
                else:
                    self.free[i] = (start + size, n - size)
                return start
        return None

    def release(self, start: int, size: int) -> None:
        size = -(-size // 512) * 512
        free = self.free
        i = bisect.bisect_left(free, (start, 0))
        free.insert(i, (start, size))
        if i + 1 < len(free) and free[i][0] + free[i][1] == free[i + 1][0]:
            free[i] = (free[i][0], free[i][1] + free[i + 1][1])
            free.pop(i + 1)
        if i > 0 and free[i - 1][0] + free[i - 1][1] == free[i][0]:
            free[i - 1] = (free[i - 1][0], free[i - 1][1] + free[i][1])
            free.pop(i)


class _Bytes:
    """A byte-counted LRU: what the simulator's chunk-counted L1 amounts to."""

    def __init__(self, cap: int) -> None:
        self.left = cap

    def alloc(self, size: int) -> int | None:
        if size <= self.left:
            self.left -= size
            return 0
        return None

    def release(self, start: int, size: int) -> None:
        self.left += size


def replay(
    first_fit: bool, groups: int = 646, prefix: int = 5000, seed: int = 1
) -> tuple[float, float]:
    """(prefix-chunk hit rate, L1 fill) of one rank under 0.3.3's stores: per request the
    missing prefix chunks, its own full chunks, its unfull chunk and (200 requests later,
    when it finishes) its two decode chunks; a lookup touches the prefix chunks it finds."""
    alloc: _FirstFit | _Bytes = _FirstFit(CAP) if first_fit else _Bytes(CAP)
    hot: OrderedDict[tuple[Any, ...], tuple[int, int]] = OrderedDict()

    def put(key: tuple[Any, ...], size: int) -> None:
        at = alloc.alloc(size)
        while at is None and hot:
            _, (s, n) = hot.popitem(last=False)
            alloc.release(s, n)
            at = alloc.alloc(size)
        if at is None:
            return
        if key in hot:  # allocated and copied before the duplicate is found
            alloc.release(at, size)
        else:
            hot[key] = (at, size)

    items = [(g, i) for g in range(groups) for i in range(20)]
    random.Random(seed).shuffle(items)
    prompt, full = prefix + 256, CHUNK * TOKEN_BYTES
    shared = prefix // CHUNK
    pending: deque[int] = deque()
    hit = asked = 0
    for uid, (g, _) in enumerate(items):
        keys = [("p", g, c) for c in range(shared)]
        h = 0
        while h < shared and keys[h] in hot:
            h += 1
        for k in reversed(keys[:h]):
            hot.move_to_end(k)
        hit, asked = hit + h, asked + shared
        for k in keys[h:]:
            put(k, full)
        for c in range(shared, prompt // CHUNK):
            put(("q", uid, c), full)
        put(("t", uid), (prompt % CHUNK) * TOKEN_BYTES)
        pending.append(uid)
        if len(pending) > 200:
            done = pending.popleft()
            for c in range(prompt // CHUNK, (prompt + 511) // CHUNK):
                put(("d", done, c), full)
    used = sum(n for _, n in hot.values())
    return hit / asked, used / CAP


def fragmentation() -> None:
    for first_fit in (False, True):
        h, fill = replay(first_fit)
        name = "first-fit allocator" if first_fit else "byte-counted LRU"
        print(f"{name}: prefix-chunk hit rate {h:.3f}, L1 fill {fill:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fragmentation", action="store_true", help="also run check 6 (~3 min)")
    args = parser.parse_args()
    for title, fn in (
        ("1-2. absolute figures and TTFT share", absolute_and_share),
        ("3. L2 (SSD) read bandwidth", l2_bandwidth),
        ("4. vLLM batch budget", budget),
        ("5. preemption victims and requests past their first token (HBM only)", past_first_token),
    ):
        print(f"\n## {title}\n", flush=True)
        fn()
    if args.fragmentation:
        print("\n## 6. LMCache 0.3.3 L1 allocator, Test 3 5k, one rank\n", flush=True)
        fragmentation()


if __name__ == "__main__":
    main()
