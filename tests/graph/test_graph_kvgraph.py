"""KVCacheGraph: each edge type from its signal, counters, leaves-first bookkeeping, clean removal."""

import random

import numpy as np
import pytest

from tiercache.graph import EDGE_TYPES, KVCacheGraph
from tiercache.graph.sketches import SketchIndex
from tiercache.scheduler.recency import RecencyOrder


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def chain(g: KVCacheGraph, names: list[bytes], request_id: str, tier: str = "vram", source: str = "user"):
    parent = None
    for h in names:
        if h in g:
            g.on_hit(h, request_id)
        else:
            g.on_store(h, parent, request_id, tier=tier, source=source)
        parent = h


def _signal_prefix_share(g):
    chain(g, [b"a", b"b"], "r1")
    chain(g, [b"a", b"b"], "r2")
    return b"a", b"b", 2


def _signal_temporal(g):
    chain(g, [b"a", b"b"], "r1")
    return b"a", b"b", 1


def _signal_co_attend(g):
    chain(g, [b"a"], "r1")
    chain(g, [b"b"], "r2")
    g.on_step([b"a", b"b", b"unknown-block"])
    return b"a", b"b", 1


def _signal_semantic(g):
    chain(g, [b"a"], "r1")
    chain(g, [b"b"], "r2")
    g.on_sketch(b"a", 0xDEADBEEF12345678)
    g.on_sketch(b"b", 0xDEADBEEF12345678 ^ 0b101)  # 2 bits apart
    return b"a", b"b", 1


def _signal_spill_link(g):
    chain(g, [b"a"], "r1")
    g.on_move(b"a", "vram", "dram")
    g.on_move(b"a", "dram", "vram")
    return b"a", b"a", 2


SIGNALS = {
    "prefix_share": _signal_prefix_share,
    "temporal": _signal_temporal,
    "co_attend": _signal_co_attend,
    "semantic": _signal_semantic,
    "spill_link": _signal_spill_link,
}


@pytest.mark.parametrize("kind", EDGE_TYPES)
def test_each_edge_type_created_from_its_signal(kind):
    g = KVCacheGraph(clock=FakeClock())
    u, v, count = SIGNALS[kind](g)
    assert g.edge_types(u, v)[kind] == count
    others = [k for k in EDGE_TYPES if k != kind and k != "temporal"]
    assert not any(k in data for _, _, data in g.nx.edges(data=True) for k in others)
    g.check_invariants()


def test_no_edge_without_signal():
    g = KVCacheGraph()
    chain(g, [b"a", b"b"], "r1")
    chain(g, [b"a", b"b"], "r1")  # the same request again: not shared
    g.on_sketch(b"a", 0)
    g.on_sketch(b"b", (1 << 64) - 1)  # far apart
    assert g.edge_types(b"a", b"b") == {"temporal": 1}


def test_counters_and_attributes():
    clock = FakeClock()
    g = KVCacheGraph(clock=clock)
    g.on_store(b"s", None, "r1", token_span=(0, 16), source="system")
    clock.t = 5.0
    g.on_store(b"u", b"s", "r1", token_span=(16, 32), source="user")
    chain(g, [b"s"], "r2")
    info = g.info(b"u")
    assert info["source"] == "user" and info["token_span"] == (16, 32) and info["created"] == 5.0
    assert info["parent"] == b"s" and info["tier"] == "vram" and info["hits"] == 0
    s = g.info(b"s")
    assert (s["hits"], s["requests"], s["children"]) == (1, 2, {"vram": 1, "dram": 0})
    assert s["chain_hits"] == 1 and s["last_access"] == 5.0


def test_chain_hits_inherited_from_linear_parents_and_branch_rates():
    g = KVCacheGraph()
    chain(g, [b"s"], "r0", source="system")
    chain(g, [b"s", b"a1"], "r1")
    chain(g, [b"s", b"a1"], "r2")  # a1 reused once
    chain(g, [b"s", b"a1", b"a2"], "r3")  # the conversation continues
    assert g.info(b"a1")["chain_hits"] == 2
    assert g.info(b"a2")["chain_hits"] == 2  # inherits from its linear parent
    chain(g, [b"s", b"b1"], "r4")
    # A branch off the protected system prompt inherits how often its branches came back: a1 did, b1 is new.
    assert g.info(b"b1")["chain_hits"] == 0.5
    chain(g, [b"s", b"c1"], "r5")
    assert g.info(b"c1")["chain_hits"] == pytest.approx(1 / 3)
    assert g.info(b"s")["branches"] == 3


def test_leaf_bookkeeping_across_tiers():
    g = KVCacheGraph()
    chain(g, [b"a", b"b", b"c"], "r1")
    assert [g.is_evictable(h, "vram") for h in (b"a", b"b", b"c")] == [False, False, True]
    g.on_move(b"c", "vram", "dram")
    assert g.is_evictable(b"b", "vram") and not g.is_evictable(b"c", "vram")
    assert g.is_evictable(b"c", "dram")
    g.on_move(b"b", "vram", "dram")  # parent spilled while its child is in a slower-or-equal tier
    assert not g.is_evictable(b"b", "dram")  # its child c is still cached in dram
    g.check_invariants()
    with pytest.raises(ValueError, match="not 'vram'"):
        g.on_move(b"c", "vram", "dram")
    with pytest.raises(ValueError, match="valid: vram, dram"):
        g.tier_index("hbm")


def test_removal_leaves_nothing():
    rng = random.Random(0)
    g = KVCacheGraph()
    names = []
    for r in range(60):
        blocks = [bytes([rng.randrange(4)]) + bytes([i]) for i in range(rng.randint(1, 6))]
        chain(g, blocks, f"r{r}", source=rng.choice(["system", "user", "tool"]))
        names.extend(blocks)
        g.on_step(rng.sample(names, min(5, len(names))))
        g.on_sketch(blocks[-1], rng.getrandbits(64) & 0xFFFF)
        if rng.random() < 0.3:
            h = rng.choice(names)
            if h in g and g.tier_of(h) == "vram":
                g.on_move(h, "vram", "dram")
    assert {k for _, _, d in g.nx.edges(data=True) for k in d} == set(EDGE_TYPES)
    g.check_invariants()
    nodes = list(g.nx.nodes)
    rng.shuffle(nodes)  # parents before children too: children become roots
    for h in nodes:
        g.on_remove(h)
        g.check_invariants()
    assert len(g) == 0 and g.nx.number_of_nodes() == 0 and g.nx.number_of_edges() == 0
    assert len(g._sketches) == 0 and g._sketches.bucket_count() == 0
    assert all(g.tier_size(t) == 0 and g.lru_fallback_order(t) == [] for t in g.tiers)
    assert not g.table.uid.any() and not g.table.children.any()
    assert all(h is None for h in g._hashes)


def test_removing_a_block_removes_its_edges_and_updates_its_parent():
    g = KVCacheGraph()
    chain(g, [b"a", b"b"], "r1")
    chain(g, [b"a", b"c"], "r2")
    g.on_step([b"b", b"c"])
    g.on_remove(b"b")
    assert b"b" not in g.nx and g.edge_types(b"a", b"b") == {}
    assert g.info(b"a")["children"]["vram"] == 1
    g.on_store(b"b", b"a", "r3")  # stored again: a fresh block, no old counters
    assert g.info(b"b")["hits"] == 0 and g.info(b"a")["children"]["vram"] == 2
    g.check_invariants()


def test_slots_recycled_and_columns_grow():
    g = KVCacheGraph()
    for i in range(3000):
        g.on_store(i.to_bytes(4, "little"))
    for i in range(0, 3000, 2):
        g.on_remove(i.to_bytes(4, "little"))
    high = g.table.high
    for i in range(3000, 4500):
        g.on_store(i.to_bytes(4, "little"))
    assert g.table.high == high and len(g) == 3000
    state = g.export()
    assert np.count_nonzero(state.uid) == 3000 and state.tier_sizes == [3000, 0]
    g.check_invariants()


def random_ops(g: KVCacheGraph, seed: int, n_ops: int = 600):
    """Random stores (new, and stored again in either tier), hits by new and by the same request, moves and
    removals; yields after each op the reference recency order per tier, kept in `RecencyOrder` as the tier
    manager keeps it (store, hit and move-in make a block the most recent of its tier)."""
    rng = random.Random(seed)
    ref = {t: RecencyOrder() for t in g.tiers}
    names: list[int] = []
    last_request: dict[int, str] = {}
    for i in range(n_ops):
        op = rng.random()
        if op < 0.35 or not names:
            known = names and rng.random() < 0.25  # stored again, maybe into another tier
            h, tier = rng.choice(names) if known else rng.randrange(10_000), rng.choice(g.tiers)
            parent = rng.choice(names) if names and rng.random() < 0.7 else None
            if h in g and g.tier_of(h) != tier:
                ref[g.tier_of(h)].discard(h)
            g.on_store(h, parent, f"r{i}", tier=tier)
            ref[tier].add(h)
            names.append(h)
            last_request[h] = f"r{i}"
        elif op < 0.6:
            h = rng.choice(names)
            request = last_request[h] if rng.random() < 0.3 else f"r{i}"  # the same request again: a touch
            g.on_hit(h, request)
            ref[g.tier_of(h)].touch(h)
            last_request[h] = request
        elif op < 0.8 and len(g.tiers) > 1:
            h = rng.choice(names)
            src = g.tier_of(h)
            dst = rng.choice([t for t in g.tiers if t != src])
            g.on_move(h, src, dst)
            ref[src].discard(h)
            ref[dst].add(h)
        else:
            h = names.pop(rng.randrange(len(names)))
            ref[g.tier_of(h)].discard(h)
            g.on_remove(h)
        names = [h for h in dict.fromkeys(names) if h in g]
        yield ref


@pytest.mark.parametrize("tiers", [("vram",), ("vram", "dram"), ("hbm", "vram", "dram")])
@pytest.mark.parametrize("seed", [0, 1])
def test_lru_fallback_order_is_exact_lru_and_tier_sizes_count(tiers, seed):
    g = KVCacheGraph(tiers=tiers, clock=FakeClock())
    for k, ref in enumerate(random_ops(g, seed)):
        for t in tiers:
            assert g.lru_fallback_order(t) == list(ref[t])
            assert g.tier_size(t) == len(ref[t])
        if k % 50 == 0:
            g.check_invariants()
    assert g.export().tier_sizes == [len(ref[t]) for t in tiers] and sum(map(len, ref.values())) == len(g)
    for t in tiers:
        for h in ref[t]:
            assert g.score_inputs(h)[1] == max(len(ref[t]), 1)  # the score's horizon: its tier's size


def test_tier_sizes_after_moves_and_removals_by_hand():
    g = KVCacheGraph()
    chain(g, [b"a", b"b", b"c"], "r1")
    chain(g, [b"x"], "r2", tier="dram")
    assert (g.tier_size("vram"), g.tier_size("dram")) == (3, 1)
    g.on_move(b"c", "vram", "dram")
    g.on_store(b"b", b"a", "r3", tier="dram")  # stored again in the other tier: a move plus a hit
    assert (g.tier_size("vram"), g.tier_size("dram")) == (1, 3) and g.tier_of(b"b") == "dram"
    assert g.lru_fallback_order("dram") == [b"x", b"c", b"b"] and g.lru_fallback_order("vram") == [b"a"]
    g.on_remove(b"x")
    g.on_remove(b"x")  # twice: nothing happens
    g.on_remove(b"a")
    assert g.export().tier_sizes == [0, 2] and g.score_inputs(b"c")[1] == 2.0
    g.check_invariants()


def test_check_invariants_catches_counter_drift():
    g = KVCacheGraph()
    chain(g, [b"a", b"b"], "r1")
    g.check_invariants()
    g._size[1] += 1  # a tier size that no longer counts the blocks
    with pytest.raises(AssertionError):
        g.check_invariants()
    g._size[1] -= 1
    g.table.seq[g._slot[b"a"]] = g.table.seq[g._slot[b"b"]]  # two blocks with the same recency
    with pytest.raises(AssertionError):
        g.check_invariants()


def test_sketch_index_bounds():
    idx = SketchIndex(bands=4, max_hamming=2, bucket_cap=3)
    for i in range(10):
        idx.add(i, 0xABCD)
    assert len(idx) == 10 and len(idx.add(99, 0xABCD)) == 3  # buckets capped
    with pytest.raises(ValueError, match="divide 64"):
        SketchIndex(bands=5)
