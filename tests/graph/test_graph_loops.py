"""Loops larger than the cache: recency evicts each block just before it comes back; the graph policy tells
such blocks apart by their reuse distance (ghosts remember when an evicted block was last used), keeps a
stable subset of them and declines the rest, near the offline bound (Belady with bypass)."""

import random

import pytest

from tiercache.graph import GraphEvictionAdvisor, offline_bound, replay
from tiercache.graph.replay import split_request
from tiercache.graph.simulators import GraphCache


def turns(users: int, context: int, rounds: int) -> list[list]:
    """Users taking turns in a fixed order; each prompt is the user's context (a fixed run of blocks)."""
    return [[f"{u}/{i}" for i in range(context)] for _ in range(rounds) for u in range(users)]


@pytest.mark.parametrize("users,capacity", [(8, 40), (10, 60), (12, 40)])
def test_recency_gets_nothing_and_the_graph_keeps_a_stable_subset(users, capacity):
    context, rounds = 10, 12
    trace = turns(users, context, rounds)
    assert users * context > capacity  # the loop outgrows the cache
    assert replay(trace, "lru", capacity).blocks_hit == 0 == replay(trace, "arc", capacity).blocks_hit
    bound = offline_bound(trace, capacity)
    cache = GraphCache(capacity)
    hits = [cache.process(*split_request(r)) for r in trace]
    assert sum(hits) >= 0.75 * bound.blocks_hit > 0
    late = [[u for u in range(users) if hits[r * users + u]] for r in range(rounds // 2, rounds)]
    assert all(users_hit == late[0] for users_hit in late) and late[0]  # the same users, round after round
    assert cache.declined > 0 and cache.graph.reuse.loops_back[:] != [0.0] * len(cache.graph.reuse.loops)


def test_a_loop_block_is_explained_by_its_loop():
    cache = GraphCache(20)
    for request in turns(4, 10, 4):
        cache.process(*split_request(request))
    adv = GraphEvictionAdvisor(cache.graph, max_stale_s=1e12)
    adv.refresh()
    (decision,) = adv.choose_victims(1, "cache")
    assert decision.components.gap > 0 and "ranked by its loop" in decision.reason
    assert "the newest arrival of a loop goes first" in decision.reason


def test_offline_bound_by_hand():
    # Capacity 2, requests [a], [b], [a], [c], [a], [b]: Belady keeps a; with admission c is not stored
    # (used never again), so b is still cached at the end.
    trace = [["a"], ["b"], ["a"], ["c"], ["a"], ["b"]]
    assert offline_bound(trace, 2, admission=False).blocks_hit == 2  # a, a
    assert offline_bound(trace, 2).blocks_hit == 3  # a, a, b
    with pytest.raises(ValueError, match="capacity_blocks"):
        offline_bound(trace, 0)


@pytest.mark.parametrize("seed", range(4))
def test_offline_bound_is_above_the_policies_on_random_prefix_traces(seed):
    rng = random.Random(seed)
    roots = [[f"{r}/{i}" for i in range(rng.randint(2, 12))] for r in range(12)]
    trace = []
    for n in range(300):
        chain = roots[rng.randrange(len(roots))] if rng.random() < 0.8 else [f"x{n}/{i}" for i in range(6)]
        trace.append(chain[: rng.randint(1, len(chain))])
    for capacity in (8, 24, 48):
        bound = offline_bound(trace, capacity).blocks_hit
        assert bound >= offline_bound(trace, capacity, admission=False).blocks_hit
        assert bound >= max(replay(trace, p, capacity).blocks_hit for p in ("lru", "arc", "graph"))
