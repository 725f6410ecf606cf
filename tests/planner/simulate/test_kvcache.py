"""GPU block pool and CPU prefix LRU: hits, sharing, eviction order, accounting."""

from __future__ import annotations

from planner.simulate.kvcache import BlockPool, PrefixLRU
from planner.simulate.workload import ContentTree, Req


def _req(rid: int, path: list[int], prompt: int, output: int = 10) -> Req:
    return Req(rid, 0.0, path, prompt, output, affinity=0)


def test_block_pool_shared_prefix_blocks_counted_once() -> None:
    tree = ContentTree()
    prefix = tree.shared(-1, "sys", 160)  # 10 blocks
    pool = BlockPool(100, 16, tree, prefix_caching=True)
    a = _req(1, [prefix, tree.new(prefix, 40), tree.new(prefix, 10)], 200)
    a.path[2] = tree.new(a.path[1], 10)
    assert pool.reserve(a, 200)
    assert pool.used == 13  # 12 full blocks + 1 partial (200 = 12·16 + 8)
    b_q = tree.new(prefix, 32)
    b = _req(2, [prefix, b_q, tree.new(b_q, 5)], 192)
    hit = pool.lookup(b.path, (192 - 1) // 16)
    assert hit == 10  # the whole shared prefix
    assert pool.reserve(b, 192)
    assert pool.used == 13 + 2  # only b's own two question blocks
    pool.check()
    pool.release(a)
    pool.release(b)
    assert pool.used == 0
    assert pool.cached_total == 14  # 10 prefix + 2 (a) + 2 (b) full blocks stay cached
    pool.check()


def test_block_pool_reserve_fails_without_side_effects() -> None:
    tree = ContentTree()
    pool = BlockPool(10, 16, tree, prefix_caching=True)
    a = _req(1, [tree.new(-1, 200)], 200)
    a.path.append(tree.new(a.path[0], 5))
    before = (pool.cached_total, pool.pinned_total, pool.private_total)
    assert not pool.reserve(a, 200)  # 13 blocks > 10
    assert (pool.cached_total, pool.pinned_total, pool.private_total) == before
    assert a.hold_idx == 0 and a.hold_blocks == 0 and a.private == 0
    assert pool.reserve(a, 150)  # 10 blocks: 9 full + 1 partial
    assert pool.available == 0
    pool.check()


def test_block_pool_evicts_least_recently_released_tail_first() -> None:
    tree = ContentTree()
    pool = BlockPool(20, 16, tree, prefix_caching=True)
    old = _req(1, [tree.new(-1, 160)], 160)  # 10 full blocks
    old.path.append(tree.new(old.path[0], 1))
    new = _req(2, [tree.new(-1, 160)], 160)
    new.path.append(tree.new(new.path[0], 1))
    assert pool.reserve(old, 160)
    pool.release(old)
    assert pool.reserve(new, 160)
    pool.release(new)
    third = _req(3, [tree.new(-1, 64)], 64)  # 4 blocks: evicted from `old`, its tail first
    third.path.append(tree.new(third.path[0], 1))
    assert pool.reserve(third, 64)
    assert pool.lookup(old.path, 100) == 6
    assert pool.lookup(new.path, 100) == 10
    assert pool.evicted_total == 4
    pool.check()


def test_block_pool_prefix_caching_off_drops_blocks_on_release() -> None:
    tree = ContentTree()
    pool = BlockPool(50, 16, tree, prefix_caching=False)
    a = _req(1, [tree.new(-1, 160)], 160)
    a.path.append(tree.new(a.path[0], 1))
    assert pool.reserve(a, 160)
    assert pool.lookup(a.path, 100) == 0
    pool.release(a)
    assert pool.cached_total == 0 and pool.used == 0
    pool.check()


def test_prefix_lru_stores_units_and_evicts_lru_segment() -> None:
    tree = ContentTree()
    lru = PrefixLRU(capacity_units=8, unit_tokens=256, tree=tree)
    a = [tree.new(-1, 1024)]  # 4 chunks
    b = [tree.new(-1, 1024)]
    c = [tree.new(-1, 1024)]
    assert lru.store(a, 0, 1024) == 4
    assert lru.store(a, 0, 1024) == 0  # already there
    assert lru.store(b, 0, 1000) == 3  # only full chunks
    lru.touch(a, 4)  # a is now the most recent
    assert lru.store(c, 0, 1024) == 4  # over capacity: b (least recent) loses its tail
    assert lru.used == 8
    assert lru.lookup(a, 100) == 4
    assert lru.lookup(c, 100) == 4
    assert lru.lookup(b, 100) == 0
    assert lru.evicted == 3
