"""The advisor runs while 100k random notifications and evictions apply: no deadlock, invariants hold."""

import random
import time

import pytest

from tiercache.graph import GraphEvictionAdvisor, KVCacheGraph

SOURCES = ["system", "user", "assistant", "tool", None]


def run_random_ops(n_ops: int, seed: int, cap: int = 1500) -> tuple[KVCacheGraph, GraphEvictionAdvisor, dict]:
    rng = random.Random(seed)
    g = KVCacheGraph(tiers=("vram", "dram"))
    adv = GraphEvictionAdvisor(g, interval_s=0.001, max_stale_s=0.05)
    blocks: list[bytes] = []
    counts = {"graph": 0, "lru-fallback": 0}
    next_id = 0
    with adv:
        for i in range(n_ops):
            op = rng.random()
            if op < 0.35 or not blocks:
                parent = rng.choice(blocks) if blocks and rng.random() < 0.8 else None
                h = next_id.to_bytes(8, "little")
                next_id += 1
                tier = rng.choice(g.tiers)
                g.on_store(h, parent, f"r{rng.randrange(50)}", tier=tier, source=rng.choice(SOURCES))
                blocks.append(h)
            elif op < 0.6:
                g.on_hit(rng.choice(blocks), f"r{rng.randrange(50)}")
            elif op < 0.7:
                g.on_step(rng.sample(blocks, min(len(blocks), rng.randint(2, 8))))
            elif op < 0.75:
                g.on_sketch(rng.choice(blocks), rng.getrandbits(64))
            elif op < 0.85:
                h = rng.choice(blocks)
                src = g.tier_of(h)
                g.on_move(h, src, g.tiers[1 - g.tier_index(src)])
            elif op < 0.87:  # an invalidation: the manager drops any block, even a parent
                h = blocks.pop(rng.randrange(len(blocks)))
                g.on_remove(h)
            else:
                tier = rng.choice(g.tiers)
                for d in adv.choose_victims(rng.randint(1, 4), tier):
                    assert g.is_evictable(d.block_hash, tier)  # leaves first, even from a stale snapshot
                    counts[d.policy_used] += 1
                    g.on_remove(d.block_hash)
                    blocks.remove(d.block_hash)
            while len(blocks) > cap:
                g.on_remove(blocks.pop(0))
            if i % 20_000 == 0:
                g.check_invariants()
    return g, adv, counts


def check_final(g: KVCacheGraph, adv: GraphEvictionAdvisor) -> None:
    assert not adv.running
    g.check_invariants()
    snap = adv.refresh()
    for tier in g.tiers:
        ranked = set(snap.rankings[tier])
        evictable = {h for h in g.nx.nodes if g.is_evictable(h, tier)}
        assert ranked == evictable


def test_stress_100k_ops_with_advisor_running():
    t0 = time.monotonic()
    g, adv, counts = run_random_ops(100_000, seed=1)
    check_final(g, adv)
    assert adv.cycles > 10 and counts["graph"] > 0
    assert time.monotonic() - t0 < 60


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2, 3, 4])
def test_stress_more_seeds(seed):
    g, adv, _ = run_random_ops(300_000, seed=seed, cap=5000)
    check_final(g, adv)
