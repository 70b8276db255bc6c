"""Replay on small hand-made traces whose results are computed by hand (in the comments)."""

import pytest

from tiercache.graph import replay
from tiercache.graph.simulators import ARCCache, GraphCache, LRUCache

POLICIES = ["lru", "arc", "graph"]

# Capacity 2. One block per request; p is reused, q and r are one-offs until q returns.
# LRU: [p] · p hit · [p,q] · r evicts p → [q,r] · p misses, evicts q → [r,p] · q misses.  Hits: 1.
# ARC: p → T1, p hit → T2, q → T1, r: replace takes T1's LRU q (→ B1), p hit in T2; q is a ghost hit in B1:
#      p=1, replace takes T2's LRU p, q → T2, but q itself was a miss.                    Hits: 2.
# Graph (tick = insertions, horizon 2; every block is a root: run 1, opens a branch): p stored at tick 1
#      in class K0 (chain 0); p hit: K0 reused, p moves to K1 (chain 1); q stored at tick 2 in K0.
#      r: K0 has 2 lifetimes, 1 reused → p = 2/4; K1 has 1 open, 0 reused → p = 1/3.
#      p: 1 + 2·(log2(1/3) + 0.5·log2(2)) = −1.17; q: 2 + 2·log2(1/2) = 0 → p is evicted (a ghost).
#      p returns: q (tick 2) goes before r (tick 3), same class; the ghost list keeps as many ghosts as
#      cached blocks (1): p is forgotten, so its return teaches nothing. q returns: r (3) goes before p (4).
#      Hits: 1 — with one request of history the learned term has nothing to go on yet.
TRACE_FREQ = [["p"], ["p"], ["q"], ["r"], ["p"], ["q"]]
EXPECTED_FREQ = {"lru": 1, "arc": 2, "graph": 1}

# Capacity 3, the full-prefix rule: in request 2, b is cached but its prefix x is not, so it is no hit.
TRACE_PREFIX = [["a", "b"], ["x", "b"], ["a", "b"]]
EXPECTED_PREFIX = {"lru": 2, "arc": 2, "graph": 2}


@pytest.mark.parametrize("policy", POLICIES)
def test_frequency_trace_by_hand(policy):
    r = replay(TRACE_FREQ, policy=policy, capacity_blocks=2)
    assert (r.blocks_hit, r.blocks_requested, r.requests) == (EXPECTED_FREQ[policy], 6, 6)
    assert r.hit_rate == pytest.approx(EXPECTED_FREQ[policy] / 6)


@pytest.mark.parametrize("policy", POLICIES)
def test_full_prefix_rule_by_hand(policy):
    r = replay(TRACE_PREFIX, policy=policy, capacity_blocks=3)
    assert (r.blocks_hit, r.blocks_requested, r.evictions) == (EXPECTED_PREFIX[policy], 6, 0)


def test_lru_chat_trace_by_hand():
    # Capacity 4. s is a system prompt; LRU order after each request (LRU first):
    # R1 [a1,s] · R2 hit s → [a1,b1,s] · R3 x3,x2,x1 evict a1,b1 → [s,x3,x2,x1]
    # R4 hit s, a2,a1 evict x3,x2 → [x1,a2,a1,s] · R5 hit s, b1 evicts x1.  Hits 3 of 12, 5 evictions.
    trace = [["s", "a1"], ["s", "b1"], ["x1", "x2", "x3"], ["s", "a1", "a2"], ["s", "b1"]]
    r = replay(trace, policy="lru", capacity_blocks=4)
    assert (r.blocks_hit, r.blocks_requested, r.evictions, r.requests_with_hit) == (3, 12, 5, 3)


@pytest.mark.parametrize("policy", POLICIES)
def test_labelled_requests_and_capacity_one(policy):
    trace = [[("s", "system"), ("u", "user")], [("s", "system")], [("s", "system"), ("v", "user")]]
    r = replay(trace, policy=policy, capacity_blocks=1)
    assert r.blocks_requested == 5 and 0 <= r.blocks_hit <= 2


MAKERS = {
    "lru": LRUCache,
    "arc": ARCCache,
    "graph": GraphCache,
    "graph-store-all": lambda n: GraphCache(n, admission=False),
}


@pytest.mark.parametrize("policy", list(MAKERS))
def test_capacity_never_exceeded_and_request_blocks_kept(policy):
    import random

    rng = random.Random(0)
    cache = MAKERS[policy](16)
    for _ in range(300):
        root = rng.randrange(5)
        blocks = [(root, i) for i in range(rng.randint(1, 24))]
        before = {b for b in blocks if b in cache}
        cache.process(blocks, [0] * len(blocks))
        assert cache.size <= 16
        assert before <= {b for b in blocks if b in cache}  # the request's blocks are never the victims
        new = [b in cache for b in blocks[:16] if b not in before]
        if policy == "graph":  # admission stores a prefix of the missing blocks (the rest is useless)
            assert new == sorted(new, reverse=True)
        else:
            assert all(new)


def test_bad_arguments():
    with pytest.raises(ValueError, match="valid: 'graph', 'lru', 'arc'"):
        replay([["a"]], policy="lfu")
    with pytest.raises(ValueError, match="capacity_blocks"):
        replay([["a"]], capacity_blocks=0)
    with pytest.raises(ValueError, match="valid: unknown, system"):
        replay([[("a", "bot")]])
