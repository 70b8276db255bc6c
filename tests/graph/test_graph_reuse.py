"""The learned reuse statistic: classes, counters, ghosts, halving, and how KVCacheGraph feeds them."""

import math

import pytest

from tiercache.graph import GraphEvictionAdvisor, KVCacheGraph, ScoreWeights
from tiercache.graph.reuse import N_CLASSES, ReuseStats, chain_level, class_label, reuse_class, run_level

CHAIN_LEVELS = [
    (0, 0),
    (0.25, 1),
    (0.999, 1),
    (1, 2),
    (1.9, 2),
    (2, 3),
    (3, 3),
    (4, 4),
    (7.5, 4),
    (8, 5),
    (1e6, 5),
]
RUN_LEVELS = [(1, 1), (2, 2), (3, 2), (4, 3), (7, 3), (8, 4), (15, 4), (16, 5), (400, 5)]


@pytest.mark.parametrize("chain_hits,level", CHAIN_LEVELS)
def test_chain_level(chain_hits, level):
    assert chain_level(chain_hits) == level


@pytest.mark.parametrize("run,level", RUN_LEVELS)
def test_run_level(run, level):
    assert run_level(run) == level


def test_classes_are_distinct_codes_with_labels():
    codes = {reuse_class(c, r, b) for c, _ in CHAIN_LEVELS for r, _ in RUN_LEVELS for b in (False, True)}
    assert codes == set(range(N_CLASSES))
    assert class_label(reuse_class(0.5, 20, True)) == "chain <1 run 16+ branch"
    assert class_label(reuse_class(3, 1, False)) == "chain 2-3 run 1"


def test_probability_is_laplace_over_lifetimes():
    stats = ReuseStats()
    for _ in range(3):
        stats.start(7)
    stats.reused(7)
    assert stats.probability(7) == (1 + 1) / (3 + 2)
    assert stats.probability(8) == 0.5  # never seen: 1/2
    probs = stats.probabilities()
    assert probs.shape == (N_CLASSES,) and probs[7] == 0.4 and probs[8] == 0.5


def test_ghosts_are_a_fifo_and_credit_a_recent_return():
    stats = ReuseStats(ghosts=1.0)
    stats.evicted("a", 5, cached=2, last_vt=10)
    stats.evicted("b", 6, cached=2, last_vt=11, bucket=9, loop=True)
    stats.evicted("c", 7, cached=2, last_vt=12)  # a is forgotten: the FIFO holds ghosts × cached
    assert list(stats.ghosts) == ["b", "c"]
    assert stats.stored("a", cached=2) is None and sum(stats.reuses) == 0  # forgotten: teaches nothing
    assert stats.ghost("b", cached=2) == (6, 11, 9, True, True)
    assert stats.stored("b", cached=2).code == 6 and stats.reuses[6] == 1
    assert stats.stored("b", cached=2) is None and stats.reuses[6] == 1  # a ghost counts once


def test_an_old_ghost_gives_its_distance_but_no_credit():
    # Ghosts are kept `ghosts` times the cache, so a loop larger than the cache is seen to come back; only
    # a return within as many evictions as there are cached blocks counts for the class, as before.
    stats = ReuseStats(ghosts=3.0)
    stats.evicted("old", 4, cached=2, last_vt=100)
    for i in range(3):
        stats.evicted(i, 0, cached=2)
    ghost = stats.stored("old", cached=2)
    assert ghost is not None and ghost.last_vt == 100 and not ghost.recent and stats.reuses[4] == 0
    stats.start_loop(9)
    stats.loop_back(9)
    assert stats.loop_probability(9) == (1 + 1) / (1 + 2) and stats.loop_probabilities()[9] == 2 / 3


def test_window_halves_every_counter():
    stats = ReuseStats(window=4)
    for _ in range(3):
        stats.start(0)
    stats.reused(0)
    stats.reused(0)
    stats.start(1)  # the 4th lifetime: everything halves
    assert (stats.lifetimes[0], stats.reuses[0], stats.lifetimes[1], stats.total) == (1.5, 1.0, 0.5, 2.0)
    assert stats.halvings == 1 and stats.probability(0) == (1.0 + 1) / (1.5 + 2)
    with pytest.raises(ValueError, match="window"):
        ReuseStats(window=1)


def lifetimes(g: KVCacheGraph) -> dict[int, tuple[float, float]]:
    return {c: (n, r) for c, (n, r) in enumerate(zip(g.reuse.lifetimes, g.reuse.reuses, strict=True)) if n}


def test_graph_classes_runs_and_lifetimes_by_hand():
    g = KVCacheGraph(tiers=("vram",))
    g.on_store(b"s", None, "r1", source="system")
    g.on_store(b"u1", b"s", "r1", source="user")
    g.on_store(b"u2", b"u1", "r1", source="user")
    # s: a root (opens a branch), run 1. u1: under a protected parent (opens a branch), inherits the
    # fraction of s's branches hit (0/1), run 2 (s was never reused). u2: linear under u1, run 3.
    expect = {b"s": (1, reuse_class(0, 1, True)), b"u1": (2, reuse_class(0, 2, True))}
    expect[b"u2"] = (3, reuse_class(0, 3, False))
    assert {h: (g.info(h)["run"], g.info(h)["reuse_class"]) for h in expect} == expect
    root, first, deep = (expect[h][1] for h in (b"s", b"u1", b"u2"))
    assert lifetimes(g) == {root: (1, 0), first: (1, 0), deep: (1, 0)}

    g.on_hit(b"s", "r2")  # s's lifetime in `root` is reused; s opens one in chain level 2
    g.on_hit(b"s", "r2")  # the same request looking again: no new hit, no new lifetime
    g.on_store(b"v1", b"s", "r2", source="user")  # after a reused block: run 1; s now branches
    hot = reuse_class(1, 1, True)
    assert g.info(b"s")["reuse_class"] == hot and g.info(b"v1")["run"] == 1
    assert (g.info(b"s")["hits"], g.info(b"s")["requests"]) == (1, 2)  # r2's second look is no new hit
    assert g.info(b"v1")["reuse_class"] == root
    assert lifetimes(g) == {root: (2, 1), first: (1, 0), deep: (1, 0), hot: (1, 0)}

    g.on_remove(b"u2")  # evicted: a ghost of class `deep`
    assert list(g.reuse.ghosts) == [b"u2"] and g.reuse.ghost(b"u2", len(g)).code == deep
    g.on_store(b"u2", b"u1", "r3", source="user")  # it came back: its evicted lifetime counts as reused
    assert lifetimes(g) == {root: (2, 1), first: (1, 0), deep: (2, 1), hot: (1, 0)} and not g.reuse.ghosts
    g.check_invariants()

    adv = GraphEvictionAdvisor(g)
    assert adv.explain(b"u1").reuse == pytest.approx(math.log2((0 + 1) / (1 + 2)))
    assert adv.explain(b"s").reuse == pytest.approx(math.log2(1 / 3))
    assert adv.explain(b"v1").reuse == pytest.approx(math.log2((1 + 1) / (2 + 2)))


@pytest.mark.parametrize("factor", [1.0, 3.0])
def test_ghost_list_holds_factor_times_the_cache(factor):
    g = KVCacheGraph(tiers=("vram",), weights=ScoreWeights(ghosts=factor))
    for i in range(6):
        g.on_store(bytes([i]), None, f"r{i}")
    for i in range(5):
        g.on_remove(bytes([i]))
    assert list(g.reuse.ghosts) == [bytes([i]) for i in range(5 - int(factor), 5)]  # one block cached
    g.check_invariants()


def test_learned_term_moves_a_never_returning_class_out_first():
    # Ten one-off 8-block prompts were stored and evicted unreused; ten 1-block prompts came back once
    # (and were evicted after). A fresh long prompt's deep block then goes before an older short prompt:
    # its class (run 8-15) has 11 lifetimes, none reused (p = 1/13); the short one's class (a root, run 1)
    # has 22 (the one-offs' heads, the short prompts, `old`, the new head), 10 reused (p = 11/24).
    g = KVCacheGraph(tiers=("vram",), weights=ScoreWeights(requests=0.0))
    for i in range(10):
        names = [b"o%d/%d" % (i, k) for k in range(8)]
        for k, h in enumerate(names):
            g.on_store(h, names[k - 1] if k else None, f"o{i}")
        for h in reversed(names):
            g.on_remove(h)
        g.on_store(b"q%d" % i, None, f"q{i}")
        g.on_hit(b"q%d" % i, f"again{i}")
        g.on_remove(b"q%d" % i)
    g.on_store(b"old", None, "r-old")
    names = [b"new/%d" % k for k in range(8)]
    for k, h in enumerate(names):
        g.on_store(h, names[k - 1] if k else None, "r-new")
    adv = GraphEvictionAdvisor(g)
    adv.refresh()
    assert adv.suggest_eviction(1, "vram") == [b"new/7"]
    assert adv.explain(b"new/7").reuse == pytest.approx(math.log2(1 / 13))
    assert adv.explain(b"old").reuse == pytest.approx(math.log2(11 / 24))
    assert adv.suggest_eviction(1, "vram") != [b"old"]
    no_learning = GraphEvictionAdvisor(KVCacheGraph(tiers=("vram",), weights=ScoreWeights(reuse=0.0)))
    no_learning.graph.on_store(b"old", None, "r-old")
    for k, h in enumerate(names):
        no_learning.graph.on_store(h, names[k - 1] if k else None, "r-new")
    no_learning.refresh()
    assert no_learning.suggest_eviction(1, "vram") == [b"old"]  # LRU order without the learned term
