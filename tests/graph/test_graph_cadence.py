"""The advisor thread's schedule (tiercache.graph.cadence): a cycle soon after a change, none without one
until `interval_s`, and at most 1 / (1 + BUSY_FACTOR) of the time busy however fast the graph changes.
Each of these tests fails on a fixed `interval_s` schedule."""

import threading
import time

import pytest

from tiercache.graph import GraphEvictionAdvisor, KVCacheGraph
from tiercache.graph.cadence import BUSY_FACTOR, MIN_GAP_S

PICKUP_S = 1.0  # a change is in a snapshot within this (typically MIN_GAP_S + one cycle: ~10 ms)


def wait_until(predicate, timeout: float) -> float | None:
    """Seconds until `predicate()` held, polled every ms; None if it did not within `timeout`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if predicate():
            return time.monotonic() - t0
        time.sleep(0.001)
    return None


def small_graph() -> KVCacheGraph:
    """a → b → c in VRAM under request r1, and a root x."""
    g = KVCacheGraph(tiers=("vram", "dram"))
    g.on_store(b"a", None, "r1", source="user")
    g.on_store(b"b", b"a", "r1", source="user")
    g.on_store(b"c", b"b", "r1", source="user")
    g.on_store(b"x", None, "r2", source="user")
    return g


# Each change a ranking depends on: (apply it to small_graph(), what a snapshot after it shows, not before).
VT = 4  # small_graph's block requests
CHANGES = {
    "store": (lambda g: g.on_store(b"d", b"c", "r3"), lambda s: b"d" in s.rankings["vram"]),
    "hit": (lambda g: g.on_hit(b"x", "r3"), lambda s: s.vt == VT + 1),
    "same request again": (lambda g: g.on_hit(b"c", "r1"), lambda s: s.rankings["vram"][-1] == b"c"),
    "move": (lambda g: g.on_move(b"c", "vram", "dram"), lambda s: b"c" in s.rankings["dram"]),
    "remove": (lambda g: g.on_remove(b"c"), lambda s: b"b" in s.rankings["vram"]),
    "decline": (lambda g: g.on_decline(b"y", None), lambda s: s.vt == VT + 1),
}
NOT_CHANGES = {  # edges only: no ranking reads them
    "step": lambda g: g.on_step([b"a", b"x"]),
    "sketch": lambda g: g.on_sketch(b"x", 7),
}


@pytest.mark.parametrize("kind", list(CHANGES))
def test_changes_counts_every_update_a_ranking_reads(kind):
    g = small_graph()
    before = g.changes
    CHANGES[kind][0](g)
    assert g.changes > before


@pytest.mark.parametrize("kind", list(NOT_CHANGES))
def test_changes_ignores_edges(kind):
    g = small_graph()
    before = g.changes
    NOT_CHANGES[kind](g)
    assert g.changes == before


@pytest.mark.parametrize("kind", list(CHANGES))
def test_a_change_is_ranked_soon_with_a_long_interval(kind):
    g = small_graph()
    apply, shows = CHANGES[kind]
    with GraphEvictionAdvisor(g, interval_s=30.0, max_stale_s=60.0) as adv:
        assert wait_until(lambda: adv.cycles >= 1, PICKUP_S) is not None
        assert not shows(adv.snapshot)
        apply(g)
        took = wait_until(lambda: shows(adv.snapshot), PICKUP_S)
        assert took is not None, f"a {kind} not ranked within {PICKUP_S}s (interval 30s)"


def test_no_change_no_cycle_until_the_interval():
    g = small_graph()
    with GraphEvictionAdvisor(g, interval_s=30.0, max_stale_s=60.0) as adv:
        assert wait_until(lambda: adv.cycles >= 1, PICKUP_S) is not None
        g.on_store(b"d", b"c", "r3")
        assert wait_until(lambda: b"d" in adv.snapshot.rankings["vram"], PICKUP_S) is not None
        cycles = adv.cycles
        for touch in NOT_CHANGES.values():
            touch(g)
        time.sleep(0.5)  # 50 × MIN_GAP_S of polling
        assert adv.cycles == cycles


def test_an_idle_graph_is_still_ranked_every_interval():
    interval, window = 0.4, 1.2
    g = small_graph()
    with GraphEvictionAdvisor(g, interval_s=interval, max_stale_s=2.0) as adv:
        assert wait_until(lambda: adv.cycles >= 1, PICKUP_S) is not None
        g.on_store(b"d", b"c", "r3")
        took = wait_until(lambda: b"d" in adv.snapshot.rankings["vram"], PICKUP_S)
        assert took is not None and took < interval / 2  # the change, not the interval, ran it
        cycles = adv.cycles
        time.sleep(window)
        assert window / interval - 1 <= adv.cycles - cycles <= window / interval + 1
        assert adv.snapshot_age() < interval + 0.2


class SlowAdvisor(GraphEvictionAdvisor):
    """A cycle that takes `cycle_s` longer (the real graph, the real ranking)."""

    cycle_s = 0.05

    def refresh(self):
        time.sleep(self.cycle_s)
        return super().refresh()


def store_continuously(g: KVCacheGraph, stop: threading.Event) -> None:
    i = 0
    while not stop.is_set():
        g.on_store(i.to_bytes(8, "little"), None, f"s{i}")
        i += 1
        time.sleep(0.002)


@pytest.mark.parametrize("cycle_s", [0.0, SlowAdvisor.cycle_s])
def test_continuous_changes_keep_the_thread_busy_a_bounded_share(cycle_s):
    window = 1.5
    g = small_graph()
    adv = SlowAdvisor(g, interval_s=1.0, max_stale_s=2.0)  # above the rest: changes, not the interval, rule
    adv.cycle_s = cycle_s
    stop = threading.Event()
    writer = threading.Thread(target=store_continuously, args=(g, stop))
    with adv:
        writer.start()
        try:
            assert wait_until(lambda: adv.cycles >= 1, PICKUP_S) is not None
            cycles, t0 = adv.cycles, time.monotonic()
            time.sleep(window)
            ran, window = adv.cycles - cycles, time.monotonic() - t0
        finally:
            stop.set()
            writer.join()
    period = max(cycle_s * (1 + BUSY_FACTOR), MIN_GAP_S)  # the shortest from one cycle's start to the next
    assert ran <= window / period + 1, f"{ran} cycles of {cycle_s}s in {window}s: busy too much"
    # and it keeps up: half that rate at least, allowing each cycle MIN_GAP_S of lateness (a fixed 1 s: ≤ 2)
    assert ran >= window / (2 * (period + MIN_GAP_S)), f"{ran} cycles of {cycle_s}s in {window}s: too few"
