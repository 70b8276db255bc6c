"""Slot allocator: contiguity, coalescing, out of room, double free, randomized invariants."""

import random

import pytest

from tiercache.layout import contiguous_runs
from tiercache.scheduler.allocator import SlotAllocator


def test_contiguous_runs():
    assert contiguous_runs([3, 4, 5, 9, 10, 2]) == [(3, 3), (9, 2), (2, 1)]
    assert contiguous_runs([]) == []


def test_first_allocations_are_one_run():
    alloc = SlotAllocator(100)
    a = alloc.allocate(30)
    b = alloc.allocate(30)
    assert len(contiguous_runs(a)) == 1 and len(contiguous_runs(b)) == 1
    assert alloc.num_free == 40 and alloc.num_used == 60
    alloc.check()


def test_prefers_a_single_run_over_fragments():
    alloc = SlotAllocator(100)
    slots = alloc.allocate(100)
    alloc.free(slots[0:10] + slots[20:25] + slots[50:90])  # free runs of 10, 5, 40
    got = alloc.allocate(30)
    assert contiguous_runs(got) == [(got[0], 30)] and 50 <= got[0] <= 60
    alloc.check()


def test_fragmented_takes_largest_runs_first():
    alloc = SlotAllocator(64)
    slots = alloc.allocate(64)
    alloc.free(slots[0:4] + slots[10:18] + slots[30:32])
    got = alloc.allocate(11)
    assert got[:8] == list(range(10, 18)) and len(got) == 11
    alloc.check()


def test_coalescing_restores_one_run():
    alloc = SlotAllocator(50)
    slots = alloc.allocate(50)
    random.Random(0).shuffle(slots)
    for i in range(0, 50, 7):
        alloc.free(slots[i : i + 7])
    assert alloc.runs() == [(0, 50)]
    alloc.check()


def test_out_of_room_and_zero():
    alloc = SlotAllocator(8)
    assert alloc.allocate(9) is None and alloc.num_free == 8
    assert alloc.allocate(0) == []
    assert alloc.allocate(8) is not None and alloc.allocate(1) is None


def test_double_free_and_range():
    alloc = SlotAllocator(8)
    slots = alloc.allocate(2)
    alloc.free(slots[:1])
    with pytest.raises(ValueError, match="not in use"):
        alloc.free(slots[:1])
    with pytest.raises(ValueError, match="not in use"):
        alloc.free([slots[1], slots[1]])
    with pytest.raises(ValueError, match="not in use"):
        alloc.free([8])
    alloc.check()


def test_randomized_against_a_set():
    rng = random.Random(1)
    alloc = SlotAllocator(500)
    held: set[int] = set()
    for step in range(5000):
        if rng.random() < 0.5:
            got = alloc.allocate(rng.randint(0, 40))
            if got is not None:
                assert not held.intersection(got) and len(set(got)) == len(got)
                held.update(got)
        elif held:
            drop = rng.sample(sorted(held), rng.randint(1, min(40, len(held))))
            alloc.free(drop)
            held.difference_update(drop)
        assert alloc.num_used == len(held) and alloc.num_free + alloc.num_used == 500
        if step % 500 == 0:
            alloc.check()
    alloc.check()
