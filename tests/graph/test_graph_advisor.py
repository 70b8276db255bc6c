"""GraphEvictionAdvisor: leaves first, protected sources, staleness fallback, explain, prefetch, lifecycle."""

import gc
import math
import threading
import time

import pytest

from tiercache.graph import GraphEvictionAdvisor, KVCacheGraph, ScoreComponents, ScoreWeights


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def chain(g, names, request_id, tier="vram", source="user"):
    parent = None
    for h in names:
        if h in g:
            g.on_hit(h, request_id)
        else:
            g.on_store(h, parent, request_id, tier=tier, source=source)
        parent = h


def evict_all(adv: GraphEvictionAdvisor, tier: str = "vram") -> list[bytes]:
    """Evict one block at a time as a manager would (dropping it), refreshing the snapshot each time."""
    order = []
    while len(adv.graph):
        adv.refresh()
        (d,) = adv.choose_victims(1, tier)
        assert d.policy_used == "graph"
        order.append(d.block_hash)
        adv.graph.on_remove(d.block_hash)
    return order


def test_leaves_evicted_before_parents():
    # Without the learned reuse term: three requests are too few to learn from (see test_graph_reuse).
    g = KVCacheGraph(clock=FakeClock(), weights=ScoreWeights(reuse=0.0))
    chain(g, [b"a", b"b", b"c"], "r1")
    chain(g, [b"a", b"b", b"c"], "r2")  # the chain is hot; its leaf still goes before its parents
    chain(g, [b"x", b"y"], "r3")
    adv = GraphEvictionAdvisor(g)
    adv.refresh()
    assert set(adv.snapshot.rankings["vram"]) == {b"c", b"y"}  # only leaves are ranked
    order = evict_all(adv)
    for child, parent in [(b"c", b"b"), (b"b", b"a"), (b"y", b"x")]:
        assert order.index(child) < order.index(parent)
    assert order[:2] == [b"y", b"x"]  # the cold chain goes first, leaf first


def test_protected_sources_kept():
    g = KVCacheGraph(clock=FakeClock())
    chain(g, [b"s1", b"s2"], "r1", source="system")
    for r in range(5):  # later one-off user blocks, each more recent than the system prompt
        chain(g, [bytes([r])], f"u{r}")
    adv = GraphEvictionAdvisor(g)
    order = evict_all(adv)
    assert order[-2:] == [b"s2", b"s1"]


def test_shared_blocks_outlive_unshared_ones():
    g = KVCacheGraph(clock=FakeClock())
    chain(g, [b"shared"], "r1")
    for r in range(2, 6):
        chain(g, [b"shared"], f"r{r}")
    chain(g, [b"once"], "r9")  # stored after the last use of `shared`
    adv = GraphEvictionAdvisor(g)
    adv.refresh()
    assert adv.suggest_eviction(2, "vram") == [b"once", b"shared"]
    ex = adv.explain(b"shared")
    assert isinstance(ex, ScoreComponents) and ex.requests == pytest.approx(0.5 * math.log2(5))
    # its class (hit 4 times, opens a branch) has one lifetime open and none reused yet: p = 1/3
    assert ex.reuse == pytest.approx(math.log2(1 / 3)) and ex.hits == 0.0
    assert ex.total == pytest.approx(ex.tick + ex.horizon * (ex.reuse + ex.requests + ex.source))


def test_staleness_fallback_recorded():
    clock = FakeClock()
    g = KVCacheGraph(clock=clock)
    chain(g, [b"old"], "r1")
    chain(g, [b"new"], "r2", source="system")
    adv = GraphEvictionAdvisor(g, max_stale_s=1.0)
    (d,) = adv.choose_victims(1, "vram")
    assert d.policy_used == "lru-fallback" and "no snapshot" in d.reason and d.snapshot_age_s is None
    adv.refresh()
    clock.t = 0.5
    (d,) = adv.choose_victims(1, "vram")
    assert (d.policy_used, d.tier_to, d.snapshot_age_s) == ("graph", "dram", 0.5)
    clock.t = 2.5
    (d,) = adv.choose_victims(1, "vram")
    assert d.policy_used == "lru-fallback" and d.snapshot_age_s == 2.5 and "> max_stale 1.0s" in d.reason
    assert d.block_hash == b"old" and d.components is not None and d.score == d.components.total
    (d,) = adv.choose_victims(1, "vram", candidates_lru_order=[b"new", b"old"])  # the manager's order
    assert d.block_hash == b"new"
    g.on_move(b"old", "vram", "dram")
    (d,) = adv.choose_victims(1, "dram")
    assert d.tier_to is None  # dropping from the last tier


def test_standalone_fallback_is_the_least_recently_used_leaf():
    # No tier manager's order passed: the fallback sorts the tier by the graph's access counter, so every
    # store, hit (a new request's or the same one's) and move-in makes a block the most recent of its tier.
    g = KVCacheGraph(clock=FakeClock())
    for h, r in [(b"a", "r1"), (b"b", "r2"), (b"c", "r3")]:
        g.on_store(h, None, r)
    g.on_hit(b"b", "r2")  # the same request looking again: recency only
    g.on_hit(b"a", "r9")
    g.on_store(b"d", b"c", "r3")  # c has a child now: not evictable
    adv = GraphEvictionAdvisor(g)
    decisions = adv.choose_victims(4, "vram")
    assert [d.block_hash for d in decisions] == [b"b", b"a", b"d"]
    assert all(d.policy_used == "lru-fallback" and "no snapshot" in d.reason for d in decisions)
    g.on_move(b"b", "vram", "dram")
    g.on_move(b"b", "dram", "vram")  # moved back in: the most recent of vram
    assert [d.block_hash for d in adv.choose_victims(4, "vram")] == [b"a", b"d", b"b"]
    g.on_remove(b"d")  # c is a leaf again, and older than everything left
    assert adv.suggest_eviction(1, "vram") == [] and adv.choose_victims(1, "vram")[0].block_hash == b"c"


def test_exhausted_snapshot_tops_up_from_lru():
    g = KVCacheGraph(clock=FakeClock())
    chain(g, [b"a"], "r1")
    adv = GraphEvictionAdvisor(g)
    adv.refresh()
    chain(g, [b"b"], "r2")  # stored after the snapshot: not ranked yet
    d1, d2 = adv.choose_victims(3, "vram")
    assert (d1.block_hash, d1.policy_used) == (b"a", "graph")
    assert (d2.block_hash, d2.policy_used) == (b"b", "lru-fallback") and "ranks no more" in d2.reason


def test_suggestions_skip_blocks_changed_since_the_snapshot():
    g = KVCacheGraph(clock=FakeClock())
    for i in range(4):
        chain(g, [bytes([i])], f"r{i}")
    adv = GraphEvictionAdvisor(g)
    adv.refresh()
    first = adv.suggest_eviction(2, "vram")
    g.on_remove(first[0])
    g.on_store(b"child", first[1], "r9")  # no longer a leaf
    assert adv.suggest_eviction(4, "vram") == [bytes([2]), bytes([3])]


def test_hot_path_takes_no_lock():
    g = KVCacheGraph(clock=FakeClock())
    chain(g, [b"a", b"b"], "r1")
    adv = GraphEvictionAdvisor(g)
    adv.refresh()
    with g.lock:  # as if the advisor or a notification held it
        done = []
        t = threading.Thread(target=lambda: done.append(adv.suggest_eviction(1, "vram")))
        t.start()
        t.join(2.0)
    assert done == [[b"b"]]


def test_suggest_prefetch_follows_links_to_slower_tiers():
    g = KVCacheGraph(clock=FakeClock())
    chain(g, [b"p", b"q"], "r1")
    chain(g, [b"z"], "r2")
    g.on_step([b"q", b"z"])
    g.on_move(b"p", "vram", "dram")
    g.on_move(b"z", "vram", "dram")
    adv = GraphEvictionAdvisor(g)
    assert adv.suggest_prefetch([b"q"], 5) == [b"p", b"z"]  # the parent first: a hit needs the chain
    assert adv.suggest_prefetch([b"q"], 1) == [b"p"]
    assert adv.suggest_prefetch([b"missing"], 3) == []


def _advisor_threads():
    return [t for t in threading.enumerate() if t.name == "tiercache-advisor"]


def test_start_stop_clean_and_no_thread_outlives_its_owner():
    g = KVCacheGraph()
    chain(g, [b"a"], "r1")
    with GraphEvictionAdvisor(g, interval_s=0.005) as adv:
        deadline = time.monotonic() + 2
        while adv.cycles < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert adv.running and adv.cycles >= 2 and adv.snapshot_age() < 1.0
    assert not adv.running and not _advisor_threads()
    adv = GraphEvictionAdvisor(g, interval_s=0.005)
    adv.start()
    del adv  # dropped without stop(): the thread notices and ends
    gc.collect()
    deadline = time.monotonic() + 2
    while _advisor_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _advisor_threads()


def test_bad_configuration():
    with pytest.raises(ValueError, match="must be > 0"):
        GraphEvictionAdvisor(KVCacheGraph(), interval_s=0)
    with pytest.raises(ValueError, match="distinct"):
        KVCacheGraph(tiers=("vram", "vram"))
