"""TierManager's remote-tier verbs: which blocks go up and when (write: through, at the store; reused, at the
first hit; evicted, at the DRAM drop; off), and fetches (prepare_fetch reserves pinned DRAM slots;
complete_fetch makes them ready or releases them)."""

import pytest
from test_manager import h
from test_manager import make as manager

from tiercache.scheduler.events import MissEvent, StoreEvent
from tiercache.scheduler.manager import TierManager
from tiercache.wire import DRAM, VRAM, RemoteItem


def make(vram=2, dram=2, write="evicted") -> TierManager:
    return manager(vram, dram, remote_write=write)


def store(m: TierManager, ids) -> None:
    out = m.prepare_store([h(i) for i in ids])
    m.complete_store(out.block_hashes)


def fill_then_overflow(m: TierManager) -> dict[bytes, int]:
    """Blocks 0, 1 in VRAM, 2, 3 in DRAM; then 4, 5 drop 2 and 3 from DRAM. Returns 2's and 3's slots."""
    store(m, [0, 1])
    store(m, [2, 3])
    slots = {h(i): m.info(h(i)).slot for i in (2, 3)}
    assert {m.info(h(i)).tier for i in (2, 3)} == {DRAM}
    store(m, [4, 5])
    assert m.info(h(2)) is None and m.info(h(3)) is None
    return slots


def test_write_evicted_uploads_every_block_dropped_from_dram_with_its_slot():
    m = make()
    slots = fill_then_overflow(m)
    assert sorted(m.take_uploads(), key=lambda x: x.block_hash) == [
        RemoteItem(h, s) for h, s in slots.items()
    ]
    assert m.take_uploads() == []  # taken once
    m.check()


def test_write_through_uploads_every_block_once_stored_from_its_tier_and_slot():
    m = make(vram=2, dram=2, write="through")
    out = m.prepare_store([h(0), h(1), h(2)])  # two in VRAM, one in DRAM
    assert m.take_uploads() == []  # not before the store completes: its bytes are not written yet
    m.complete_store(out.block_hashes)
    placed = zip(out.block_hashes, out.slots, out.tiers, strict=True)
    assert m.take_uploads() == [RemoteItem(b, s, t) for b, s, t in placed]
    assert {t for t in out.tiers} == {VRAM, DRAM}
    store(m, [3, 4])  # drops from DRAM: already up, not queued again
    assert m.take_uploads() == [RemoteItem(h(i), m.info(h(i)).slot, m.info(h(i)).tier) for i in (3, 4)]
    m.complete_fetch(m.prepare_fetch([h(7)]).block_hashes)  # from the store: never written back
    assert m.take_uploads() == []
    out = m.prepare_store([h(5)])
    m.complete_store(out.block_hashes, ok=False)  # a failed store is not uploaded
    assert m.take_uploads() == []
    m.check()


def test_write_reused_uploads_a_block_at_its_first_hit_while_it_is_held():
    m = make(vram=1, dram=2, write="reused")
    store(m, [0])  # VRAM
    store(m, [1, 2])  # DRAM
    assert m.take_uploads() == []  # stored, never reused: not up
    slot = m.info(h(1)).slot
    assert m.prepare_load([h(1)]) is not None  # the first hit (no warm: VRAM has no free slot)
    assert m.take_uploads() == [RemoteItem(h(1), slot, DRAM)]  # while it is held, pinned by its load
    m.complete_load([h(1)])
    assert m.prepare_load([h(0), h(1)]) is not None  # 0's first hit (VRAM); 1's second: not again
    assert m.take_uploads() == [RemoteItem(h(0), m.info(h(0)).slot, VRAM)]
    m.complete_load([h(0), h(1)])
    store(m, [3, 4])  # drops from DRAM go nowhere
    assert m.take_uploads() == []
    m.check()


def test_an_unknown_write_policy_is_refused():
    with pytest.raises(ValueError, match="through"):
        make(write="all")  # the config maps its old name to "evicted"


@pytest.mark.parametrize("write", [None, "evicted"])
def test_no_uploads_without_a_remote_tier_or_from_vram_drops(write):
    m = make(dram=0, write=write)  # no DRAM tier: the last-resort VRAM drops never go up
    store(m, [0, 1])
    store(m, [2, 3])
    assert m.info(h(0)) is None and m.take_uploads() == []
    m = make(write=None)
    fill_then_overflow(m)
    assert m.take_uploads() == []


def test_fetch_reserves_a_pinned_dram_slot_then_becomes_ready():
    m = make()
    out = m.prepare_fetch([h(7), h(8)])
    assert out.tiers == (DRAM, DRAM) and len(set(out.slots)) == 2
    assert m.lookup([h(7)], record=False) == 0  # not readable until the fetch completes
    m.quick_check()
    m.complete_fetch([h(7), h(8)])
    assert m.lookup([h(7), h(8)], record=False) == 2
    assert any(isinstance(e, StoreEvent) and "remote" in e.reason for e in m.take_events())
    m.check()


def test_a_fetched_block_is_not_uploaded_again_when_dropped():
    m = make(vram=1, dram=2)
    store(m, [0])
    m.complete_fetch(m.prepare_fetch([h(7), h(8)]).block_hashes)
    store(m, [1, 2])  # DRAM full of fetched blocks: both dropped
    assert m.info(h(7)) is None and m.take_uploads() == []


def test_failed_fetch_frees_its_slot_with_the_reason():
    m = make()
    m.prepare_fetch([h(7)])
    m.complete_fetch([h(7)], ok=False, reason="checksum mismatch")
    assert m.info(h(7)) is None and m.stats()["dram_free"] == 2
    assert any("checksum mismatch" in e.reason for e in m.take_events() if isinstance(e, StoreEvent))
    with pytest.raises(ValueError, match="no fetch in flight"):
        m.complete_fetch([h(7)])
    m.check()


def test_fetch_refused_for_a_known_block_or_without_room():
    m = make()
    store(m, [0])
    assert m.prepare_fetch([h(9), h(0)]) is None  # 0 is stored here
    m.prepare_fetch([h(7), h(8)])  # DRAM now all pinned by fetches
    assert m.prepare_fetch([h(9)]) is None
    misses = [e.reason for e in m.take_events() if isinstance(e, MissEvent)]
    assert any("already stored" in r for r in misses) and any("no DRAM room" in r for r in misses)
    assert m.info(h(9)) is None
    m.check()


def test_a_fetch_in_flight_is_never_an_eviction_victim():
    m = make(vram=1, dram=1)
    m.prepare_fetch([h(7)])
    store(m, [0])  # VRAM
    out = m.prepare_store([h(1)])  # DRAM's only block is pinned: the last resort drops 0 from VRAM
    assert out.block_hashes == (h(1),) and m.info(h(0)) is None
    assert m.info(h(7)).tier == DRAM and m.take_uploads() == []
    m.complete_store(out.block_hashes)
    m.complete_fetch([h(7)])
    m.check()
