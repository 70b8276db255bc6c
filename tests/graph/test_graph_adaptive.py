"""The graph policy proves itself online against a shadow ARC (`tiercache.graph.arc`): where its predictions
lose, the cache follows ARC; where they win, the graph keeps the cache."""

import random

import pytest

from tiercache.graph import GraphEvictionAdvisor, KVCacheGraph, arc, replay
from tiercache.graph.arc import ModeSelector
from tiercache.graph.replay import split_request
from tiercache.graph.simulators import GraphCache


def wrong_trace(seed: int, n: int = 1200, users: int = 30) -> list[list]:
    """Recency is right, the graph's prediction is wrong: half the requests are one-off prompts labelled
    "system" (protected by the score: kept for turnovers, never used again), half are 30 users' short
    contexts reused within the cache's reach."""
    rng, trace = random.Random(seed), []
    for r in range(n):
        if rng.random() < 0.5:
            trace.append([((f"sys{r}", i), "system") for i in range(8)])
        else:
            u = rng.randrange(users)
            trace.append([((f"u{u}", i), "user") for i in range(4)])
    return trace


def hits(trace: list[list], capacity: int) -> tuple[int, GraphCache]:
    cache = GraphCache(capacity)
    return sum(cache.process(*split_request(r)) for r in trace), cache


def graph_only(monkeypatch, trace, capacity) -> int:
    with monkeypatch.context() as m:
        m.setattr(arc, "Z", float("inf"))  # never significant: the graph keeps the cache
        return hits(trace, capacity)[0]


@pytest.mark.parametrize("seed,capacity", [(0, 100), (0, 140), (1, 140)])
def test_the_cache_follows_arc_where_the_graph_is_wrong(monkeypatch, seed, capacity):
    trace = wrong_trace(seed)
    adaptive, cache = hits(trace, capacity)
    alone = graph_only(monkeypatch, trace, capacity)
    best = max(replay(trace, "lru", capacity).blocks_hit, replay(trace, "arc", capacity).blocks_hit)
    assert alone < 0.8 * best  # the prediction is wrong here
    assert cache.graph.modes.switches > 0 and cache.graph.modes.arc_hits > cache.graph.modes.cache_hits
    assert adaptive >= 1.25 * alone  # measured: +30 % to +45 %
    assert adaptive >= 0.92 * best  # measured 0.94-0.96 of ARC: the cold start, and the graph's retrials


@pytest.mark.parametrize("capacity", [100, 200])
def test_following_arc_is_arc(monkeypatch, capacity):
    # Held in "arc" mode, the cache evicts first what the shadow ARC dropped: it holds ARC's blocks.
    trace = wrong_trace(2)
    update = ModeSelector.update

    def always_arc(self, *args):
        update(self, *args)
        self.mode = "arc"

    monkeypatch.setattr(ModeSelector, "update", always_arc)
    got, cache = hits(trace, capacity)
    assert got == pytest.approx(replay(trace, "arc", capacity).blocks_hit, rel=0.01)
    assert cache.declined == 0  # ARC stores every block


def turns(users: int, context: int, rounds: int) -> list[list]:
    return [[f"{u}/{i}" for i in range(context)] for _ in range(rounds) for u in range(users)]


@pytest.mark.parametrize("users,capacity", [(8, 40), (12, 40)])
def test_the_graph_keeps_the_cache_where_it_wins(monkeypatch, users, capacity):
    trace = turns(users, 10, 12)  # a loop larger than the cache: ARC and LRU get nothing
    adaptive, cache = hits(trace, capacity)
    assert adaptive == graph_only(monkeypatch, trace, capacity) > 0
    assert cache.graph.modes.switches == 0 and cache.graph.mode == "graph"


def test_mode_selector_switches_on_a_significant_loss_and_tries_the_graph_again():
    m = ModeSelector(warmup=1)
    for _ in range(10):
        m.update(0, 10, 10, 100)  # far behind, but during the cold start (the first turnover)
    assert m.mode == "graph" and m.turnovers == 1 and m.switches == 0 and m.diff == 0  # forgotten
    for _ in range(3):
        m.update(2, 3, 10, 100)  # behind by one block a request: noise at first
    assert m.mode == "graph"
    for _ in range(10):
        m.update(0, 3, 10, 1000)
    assert m.mode == "arc" and m.z < -2 and m.backoff == 2
    steps = 0
    while m.mode == "arc" and steps < 1000:
        m.update(3, 3, 10, 1000)  # no evidence is taken while ARC leads; a turnover: 1000 misses
        steps += 1
    assert 0 < steps <= 143 and m.switches == 2  # at the next turnover (backoff 1): tried again
    for _ in range(400):
        m.update(5, 3, 10, 1000)  # the graph wins: it keeps the cache, and a later loss backs off less
    assert m.mode == "graph" and m.backoff == 1 and m.z > 2


def test_the_advisor_follows_arc_in_arc_mode():
    # The live advisor ranks first the blocks the shadow ARC dropped and its admission stores everything.
    trace = wrong_trace(0, n=600)
    cache = GraphCache(140)
    for r in trace:
        cache.process(*split_request(r))
        if cache.graph.mode == "arc" and cache.graph.table.arc_out[: cache.graph.table.high].any():
            break
    g = cache.graph
    assert g.mode == "arc"
    adv = GraphEvictionAdvisor(g, max_stale_s=1e12)
    snap = adv.refresh()
    assert snap.mode == "arc"
    (decision,) = adv.choose_victims(1, "cache")
    assert g.table.arc_out[g._slot[decision.block_hash]] == 1 and "following ARC" in decision.reason
    assert adv.admission(("new", 0), None, "cache", source=1) is None


def test_admission_bets_settle_on_the_first_request_of_either_block():
    g = KVCacheGraph(tiers=("cache",))
    g.on_store("f", None, "r1")
    g.bet("x", "f")  # judged not worth storing against f, then declined
    g.on_decline("x")
    g.on_hit("f", "r2")  # f first: declining x was right
    assert (g.modes.admit_right, g.modes.admit_wrong) == (1, 0)
    g.bet("y", "f")
    g.on_decline("y")
    g.on_decline("y")  # y first: it would have been a hit
    assert (g.modes.admit_right, g.modes.admit_wrong) == (1, 1) and g.modes.admit
    for i in range(12):  # a run of wrong declines: significant, admission stops declining
        g.bet(("z", i), "f")
        g.on_decline(("z", i))
        g.on_decline(("z", i))
    assert g.modes.admit_wrong == 13 and not g.modes.admit


def test_admission_that_keeps_losing_its_bets_stores_everything(monkeypatch):
    # The loop trace where admission declines (tests/graph/test_graph_loops.py): with its bets forced to
    # lose, the graph stores every block, and keeps recording the bets.
    trace = turns(8, 10, 12)
    _, declining = hits(trace, 40)
    assert declining.declined > 0
    monkeypatch.setattr(ModeSelector, "admit", property(lambda self: False))
    _, storing = hits(trace, 40)
    assert storing.declined == 0 and storing.graph._bets
