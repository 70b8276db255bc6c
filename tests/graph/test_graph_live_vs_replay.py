"""The policy the advisor ships is the policy the replay measures: driving KVCacheGraph + advisor the way
a manager would gives the same hits as `replay(policy="graph")` on the same trace, evicts the same blocks in
the same order, and both learn the same reuse statistics (classes, counters, ghosts)."""

import random

import pytest

from tiercache.graph import GraphEvictionAdvisor, KVCacheGraph, ScoreWeights, replay
from tiercache.graph.replay import split_request
from tiercache.graph.scoring import source_code
from tiercache.graph.simulators import GraphCache


def make_trace(seed: int, n: int = 200) -> list[list]:
    rng = random.Random(seed)
    sessions = [[("sys", "system"), (("sys", 1), "system")] for _ in range(6)]
    trace = []
    for r in range(n):
        k = rng.randrange(len(sessions))
        if rng.random() < 0.1:
            trace.append([((r, i), "user") for i in range(rng.randint(5, 15))])  # one-off
            continue
        sessions[k] = sessions[k] + [((r, i), "user") for i in range(rng.randint(1, 4))]
        trace.append(list(sessions[k]))
        if rng.random() < 0.2:
            sessions[k] = sessions[k][:2]  # the conversation ends; a new one starts
    return trace


class Unpinned:
    """The manager's candidates: any block outside the current request."""

    def __init__(self, pinned: set) -> None:
        self.pinned = pinned

    def __contains__(self, block) -> bool:
        return block not in self.pinned


def live_hits(
    trace: list[list],
    capacity: int,
    weights: ScoreWeights | None = None,
    evicted: list | None = None,
    declined: list | None = None,
) -> tuple[int, KVCacheGraph]:
    """Drive a graph + advisor as a manager would: when the cache is full, each missing block is offered to
    the advisor's admission (a declined block, and the rest of its request, is not stored), then each
    eviction takes the advisor's top-ranked block that is not part of the current request (appended to
    `evicted` / `declined` when given)."""
    ticks = iter(range(1, 10**9))
    g = KVCacheGraph(tiers=("vram",), clock=lambda: float(next(ticks)), weights=weights)
    adv = GraphEvictionAdvisor(g, max_stale_s=1e12)
    total = 0
    for rid, request in enumerate(trace):
        blocks = [h for h, _ in request][:capacity]
        hit = 0
        while hit < len(blocks) and blocks[hit] in g:
            hit += 1
        total += hit
        g.on_request(blocks)
        for b in blocks:
            if b in g:
                g.on_hit(b, rid)
        pinned, stop = set(blocks), False
        for i, (b, source) in enumerate(request[:capacity]):
            if b in g:
                continue
            parent = blocks[i - 1] if i else None
            while not stop and len(g) >= capacity:
                adv.refresh()
                if adv.admission(b, parent, "vram", Unpinned(pinned), source_code(source)) is not None:
                    stop = True
                    break
                decisions = adv.choose_victims(len(pinned) + 1, "vram")
                victims = [d for d in decisions if d.block_hash not in pinned]
                assert victims[0].policy_used == "graph"
                g.on_remove(victims[0].block_hash)
                if evicted is not None:
                    evicted.append(victims[0].block_hash)
            if stop:
                g.on_decline(b, parent)
                if declined is not None:
                    declined.append(b)
                continue
            g.on_store(b, parent, rid, source=source)
    return total, g


@pytest.mark.parametrize("seed,capacity", [(0, 20), (1, 40), (2, 80), (3, 30)])
def test_live_advisor_matches_replay(seed, capacity):
    trace = make_trace(seed)
    hits, _ = live_hits(trace, capacity)
    assert hits == replay(trace, policy="graph", capacity_blocks=capacity).blocks_hit


@pytest.mark.parametrize("window", [1 << 20, 64])  # 64: the counters halve many times along the trace
def test_live_and_replay_learn_the_same_statistics(window):
    trace, weights = make_trace(4, n=300), ScoreWeights(reuse_window=window)
    hits, g = live_hits(trace, 40, weights)
    cache = GraphCache(40, weights)
    assert hits == sum(cache.process(*split_request(request)) for request in trace)
    assert g.reuse.halvings == cache.reuse.halvings and (window > 1000) == (g.reuse.halvings == 0)
    assert g.reuse.lifetimes == cache.reuse.lifetimes and g.reuse.reuses == cache.reuse.reuses
    assert list(g.reuse.ghosts.items()) == list(cache.reuse.ghosts.items()) and g.reuse.ghosts
    assert sum(g.reuse.reuses) > 0 and len({cache.graph.info(h)["reuse_class"] for h in cache.graph.nx}) > 3


@pytest.mark.parametrize("seed,capacity", [(0, 20), (5, 25), (6, 60)])
def test_replay_evicts_the_advisors_first_choice(seed, capacity):
    # Not only the same hit count: the same victims in the same order, and the replay's graph (driven with a
    # new request id per request) is consistent and counts requests as hits + 1.
    trace, live = make_trace(seed), []
    live_hits(trace, capacity, evicted=live)
    cache, replayed = GraphCache(capacity), []
    remove = cache.graph.on_remove
    cache.graph.on_remove = lambda h: (replayed.append(h), remove(h))
    for request in trace:
        cache.process(*split_request(request))
    assert replayed == live and len(live) == cache.evictions > 50
    cache.graph.check_invariants()
    assert all(cache.graph.info(h)["requests"] == cache.graph.info(h)["hits"] + 1 for h in cache.graph.nx)


def loop_trace(seed: int, users: int = 8, n: int = 240) -> list[list]:
    """Users taking turns (two neighbours swap places each round), each turn adding a question to the
    user's context; 10 % one-off prompts between them. The loop outgrows the capacities used below."""
    rng = random.Random(seed)
    contexts = [
        [(f"sys{u % 2}", "system"), *((f"ctx/{u}/{i}", "user") for i in range(rng.randint(6, 14)))]
        for u in range(users)
    ]
    order, trace = list(range(users)), []
    for r in range(n):
        if r % users == 0:
            i = rng.randrange(users - 1)
            order[i], order[i + 1] = order[i + 1], order[i]
        u = order[r % users]
        contexts[u] = [*contexts[u], (f"q/{u}/{r}", "user")]
        trace.append(list(contexts[u]))
        if rng.random() < 0.1:
            trace.append([(f"once/{r}/{i}", "user") for i in range(rng.randint(3, 9))])
    return trace


@pytest.mark.parametrize("seed,capacity", [(0, 40), (1, 60), (2, 80)])
def test_live_admission_and_loops_match_replay(seed, capacity):
    # Admission (the advisor's, against its snapshot) declines the blocks the replay declines, and the
    # loop-ranked evictions are the same.
    trace, evicted, declined = loop_trace(seed), [], []
    hits, g = live_hits(trace, capacity, evicted=evicted, declined=declined)
    cache, replayed, refused = GraphCache(capacity), [], []
    remove, decline = cache.graph.on_remove, cache.graph.on_decline
    cache.graph.on_remove = lambda h: (replayed.append(h), remove(h))
    cache.graph.on_decline = lambda h, p=None: (refused.append(h), decline(h, p))[1]
    assert hits == sum(cache.process(*split_request(request)) for request in trace)
    assert hits > replay(trace, policy="lru", capacity_blocks=capacity).blocks_hit
    assert replayed == evicted and refused == declined and len(declined) == cache.declined > 0
    assert g.table.loop.any() and g.reuse.loops_back == cache.reuse.loops_back
    g.check_invariants()
    cache.graph.check_invariants()
