"""TierManager verbs: lookup, load, store, spill and warm planning, in-flight protection, events, policy."""

import logging

import msgpack
import pytest

from tiercache.scheduler.abstract import PrepareStoreOutput
from tiercache.scheduler.events import DropEvent, EvictionEvent, HitEvent, MissEvent, MoveEvent
from tiercache.scheduler.manager import TierManager
from tiercache.scheduler.moves import JobBook, Mover
from tiercache.scheduler.policies import EvictionPolicy, VictimDecision
from tiercache.wire import DRAM, VRAM, TransferJob, decode, encode


def h(i: int) -> bytes:
    return i.to_bytes(8, "little")


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 1.0
        return self.t


def make(vram=8, dram=8, **kw) -> TierManager:
    return TierManager(vram, dram, "codec-A", clock=Clock(), spill_watermark=kw.pop("watermark", 0.0), **kw)


def store(m: TierManager, ids) -> PrepareStoreOutput:
    out = m.prepare_store([h(i) for i in ids])
    m.complete_store(out.block_hashes)
    return out


def kinds(events):
    return [e.kind for e in events]


def test_store_lookup_load_roundtrip():
    m = make()
    out = store(m, range(4))
    assert out.tiers == (VRAM,) * 4 and len(set(out.slots)) == 4
    assert m.lookup([h(0), h(1), h(2), h(3), h(4)]) == 4
    events = m.take_events()
    assert kinds(events) == ["store"] * 4 + ["hit"] * 4 + ["miss"]
    assert isinstance(events[-1], MissEvent) and events[-1].reason == "not stored"
    assert m.lookup([h(0), h(9)], record=False) == 1 and m.take_events() == []
    load = m.prepare_load([h(0), h(1)])
    assert load.tiers == (VRAM, VRAM) and load.slots == out.slots[:2]
    info = m.info(h(0))
    assert info.tier == VRAM and info.slot == out.slots[0] and info.hits == 1 and m.info(h(9)) is None
    m.complete_load([h(0), h(1)])
    m.check()


def test_store_skips_known_and_duplicates():
    m = make()
    store(m, [1, 2])
    out = m.prepare_store([h(1), h(3), h(3), h(2), h(4)])
    assert out.block_hashes == (h(3), h(4)) and out.skipped == (h(1), h(3), h(2))
    m.complete_store(out.block_hashes)
    assert m.prepare_store([h(1)]) == PrepareStoreOutput((), (), (), (h(1),))
    m.check()


def test_store_in_flight_and_codec_mismatch_are_misses():
    m = make()
    m.prepare_store([h(1)])
    assert m.lookup([h(1)]) == 0
    assert m.take_events()[-1].reason == "store in flight"
    m.complete_store([h(1)])
    assert m.lookup([h(1)], codec_id="codec-B") == 0
    assert "codec mismatch" in m.take_events()[-1].reason
    assert m.prepare_load([h(2)]) is None


def test_failed_store_releases_the_slot():
    m = make()
    out = m.prepare_store([h(1), h(2)])
    m.complete_store(out.block_hashes, ok=False)
    assert m.lookup([h(1)]) == 0 and m.view().tier(VRAM).free_slots == 8
    assert [e.stored for e in m.take_events() if e.kind == "store"] == [False, False]
    with pytest.raises(ValueError, match="no store in flight"):
        m.complete_store([h(1)])
    m.check()


def test_vram_full_spills_cold_blocks_to_dram_not_drops():
    m = make(vram=4, dram=8, watermark=0.25)  # keep 1 VRAM slot free
    store(m, range(3))
    m.touch([h(0)])  # h(1) is now the coldest
    m.take_events()
    out = m.prepare_store([h(10)])  # takes the last free VRAM slot: one cold block spills
    assert out.tiers == (VRAM,)
    jobs = m.take_jobs()
    assert len(jobs) == 1 and jobs[0].kind == "spill" and len(jobs[0]) == 1
    events = m.take_events()
    evictions = [e for e in events if isinstance(e, EvictionEvent)]
    assert (
        evictions[0].block_hash == h(1)
        and evictions[0].tier_to == DRAM
        and "least recently" in evictions[0].reason
    )
    assert any(isinstance(e, MoveEvent) and e.kind == "spill" and e.stage == "planned" for e in events)
    assert m.lookup([h(1)]) == 1  # still readable from VRAM while the spill runs
    m.complete_transfer(jobs[0].job_id)
    entry = m.view().block(h(1))
    assert entry.tier == DRAM and entry.slot == jobs[0].dst_slots[0]
    assert m.view().tier(VRAM).free_slots == 1
    m.check()


def test_vram_full_stores_go_straight_to_dram():
    m = make(vram=2, dram=8)
    store(m, range(2))
    out = m.prepare_store([h(5), h(6)])
    assert out.tiers == (DRAM, DRAM) and m.take_jobs() == []


def test_spill_destinations_are_one_dram_run():
    m = make(vram=64, dram=64, watermark=0.25)
    store(m, range(64))
    m.prepare_store([h(100)])
    (job,) = m.take_jobs()
    assert len(job) >= 16
    assert list(job.dst_slots) == list(range(job.dst_slots[0], job.dst_slots[0] + len(job)))


def test_dram_full_evicts_dram_victims():
    m = make(vram=2, dram=4)
    for i in range(0, 12, 2):
        out = m.prepare_store([h(i), h(i + 1)])
        m.complete_store(out.block_hashes)
        for job in m.take_jobs():
            m.complete_transfer(job.job_id)
        m.check()
    drops = [e for e in m.take_events() if isinstance(e, EvictionEvent) and e.tier_to is None]
    assert drops and all(e.tier_from == DRAM for e in drops)
    assert len(m.view()) == 6


def test_blocks_in_flight_are_never_evicted():
    m = make(vram=2, dram=0)
    store(m, [1, 2])
    m.prepare_load([h(1), h(2)])
    assert m.prepare_store([h(3)]) is None  # everything pinned by loads, no DRAM tier
    m.complete_load([h(1)])
    out = m.prepare_store([h(3)])  # no DRAM tier: the only idle block is dropped for the store
    assert out.tiers == (VRAM,) and m.lookup([h(1)]) == 0 and m.lookup([h(2)]) == 1
    drops = [e for e in m.take_events() if isinstance(e, EvictionEvent)]
    assert [(e.block_hash, e.tier_to) for e in drops] == [(h(1), None)]
    m.complete_load([h(2)])
    m.check()


def test_out_of_room_is_none_and_one_log_line(caplog):
    m = make(vram=2, dram=1)
    m.prepare_store([h(1), h(2), h(3)])  # all three in flight: nothing evictable
    with caplog.at_level(logging.WARNING, logger="tiercache.scheduler.manager"):
        assert m.prepare_store([h(4)]) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "store of 1 blocks got 0" in lines[0] and "VRAM 0/2 free" in lines[0]
    assert "DRAM 0/1 free" in lines[0]


def test_partial_store_keeps_the_leading_blocks():
    m = make(vram=2, dram=1)
    out = m.prepare_store([h(i) for i in range(5)])
    assert out.block_hashes == (h(0), h(1), h(2)) and out.not_stored == (h(3), h(4))
    assert out.tiers == (VRAM, VRAM, DRAM)


def test_load_from_dram_plans_a_warm_and_retires_the_old_slot():
    m = make(vram=4, dram=4, watermark=0.25)
    store(m, range(4))  # spills h(0) to keep a slot free
    (spill,) = m.take_jobs()
    m.complete_transfer(spill.job_id)
    assert m.view().block(h(0)).tier == DRAM
    load = m.prepare_load([h(0)])
    assert load.tiers == (DRAM,)  # read where it is now
    warm, spill_again = m.take_jobs()  # the warm takes the free slot; a cold block spills to restore it
    assert warm.kind == "warm" and warm.src_slots == load.slots and spill_again.kind == "spill"
    m.complete_transfer(warm.job_id)
    assert m.view().block(h(0)).tier == VRAM
    assert m.view().slot_used(DRAM, load.slots[0])  # the load still reads the old DRAM slot
    m.check()
    m.complete_load([h(0)])
    assert not m.view().slot_used(DRAM, load.slots[0])
    assert any(isinstance(e, MoveEvent) and e.kind == "warm" and e.stage == "done" for e in m.take_events())
    m.check()


def test_failed_transfer_keeps_the_block_and_failed_load_drops_it():
    m = make(vram=2, dram=4, watermark=0.5)
    store(m, [1, 2])
    (spill,) = m.take_jobs()
    m.complete_transfer(spill.job_id, ok=False)
    assert m.view().block(spill_hash := h(1)).tier == VRAM and m.lookup([spill_hash]) == 1
    with pytest.raises(ValueError, match="not in flight"):
        m.complete_transfer(spill.job_id)
    m.prepare_load([h(2)])
    m.complete_load([h(2)], ok=False)
    assert m.lookup([h(2)]) == 0
    assert any(isinstance(e, DropEvent) and "load failed" in e.reason for e in m.take_events())
    m.check()


def test_prefetch_warms_dram_blocks_above_the_watermark():
    m = make(vram=4, dram=8, watermark=0.25)
    store(m, [1, 2, 3])
    assert m.spill(3) == 3
    for job in m.take_jobs():
        m.complete_transfer(job.job_id)
    assert m.view().tier(VRAM).free_slots == 4
    assert m.prefetch([h(1), h(2), h(3), h(99)]) == 3  # keeps 1 slot free
    (warm,) = m.take_jobs()
    assert warm.kind == "warm" and m.prefetch([h(1)]) == 0  # already moving
    m.complete_transfer(warm.job_id)
    assert m.lookup([h(1), h(2), h(3)]) == 3 and {m.view().block(h(i)).tier for i in (1, 2, 3)} == {VRAM}
    m.check()


class PickyPolicy(EvictionPolicy):
    """Proposes a block that is not a candidate, a duplicate, and fewer than asked."""

    name = "picky"

    def __init__(self):
        self.seen = 0

    def choose_victims(self, tier, n, candidates):
        first = next(iter(candidates))
        return [
            VictimDecision(b"nope", "not a candidate", policy="picky"),
            VictimDecision(first, "picked", score=0.5, components=(("x", 1.0),), policy="picky"),
            VictimDecision(first, "duplicate", policy="picky"),
        ]

    def observe(self, event):
        self.seen += 1


def test_policy_seam_validates_and_fills():
    policy = PickyPolicy()
    m = TierManager(4, 8, "c", policy=policy, clock=Clock(), spill_watermark=0.0)
    store(m, range(4))
    m.spill(3)
    ev = [e for e in m.take_events() if isinstance(e, EvictionEvent)]
    assert [e.policy for e in ev] == ["picky", "lru", "lru"]
    assert ev[0].score == 0.5 and ev[0].components == (("x", 1.0),)
    assert ev[1].reason == "lru fill after picky returned 1 of 3"
    assert policy.seen > 0


def test_plain_data_roundtrips_through_msgpack():
    m = make(vram=2, dram=4, watermark=0.5)
    store(m, [1, 2])
    m.prepare_store([h(3)])
    job = m.take_jobs()[0]
    assert decode(encode(job), TransferJob) == job and job.block_hashes == (h(1),)
    assert (job.src_tier, job.dst_tier, job.kind) == (VRAM, DRAM, "spill")
    m.prepare_load([h(1)])
    for event in m.take_events():
        msgpack.packb(event.to_dict())
    assert isinstance(HitEvent(1, 0.0, b"x", "c", "r").to_dict()["block_hash"], bytes)


def test_duplicate_hashes_in_one_load():
    m = make(vram=4, dram=4, watermark=0.25)
    store(m, [1, 2, 3])
    m.spill(1)
    (spill,) = m.take_jobs()
    m.complete_transfer(spill.job_id)
    cold = next(b.block_hash for b in m.view().blocks(DRAM))
    out = m.prepare_load([cold, cold])
    assert out.tiers == (DRAM, DRAM)
    jobs = m.take_jobs()
    assert sum(len(j) for j in jobs if j.kind == "warm") == 1
    for job in jobs:
        m.complete_transfer(job.job_id)
    m.complete_load([cold, cold])
    m.check()


def test_abort_store_releases_exactly_the_prepared_slots():
    m = make(vram=4, dram=4)
    out = m.prepare_store([h(1), h(2), h(3)])
    store(m, [4])
    with pytest.raises(ValueError, match="abort_store: .* no store in flight"):
        m.abort_store([h(1), h(4)], "x")  # h(4) is stored: nothing is released
    assert m.view().tier(VRAM).free_slots == 0
    m.take_events()
    m.abort_store([h(1), h(2), h(2)], "store aborted: the step failed")
    assert m.view().tier(VRAM).free_slots == 2 and m.lookup([h(1)], record=False) == 0
    events = m.take_events()
    assert [(e.block_hash, e.stored, e.reason) for e in events] == [
        (h(1), False, "store aborted: the step failed"), (h(2), False, "store aborted: the step failed"),
    ]  # fmt: skip
    assert (events[0].tier, events[0].slot) == (VRAM, out.slots[0])
    m.complete_store([h(3)])  # the store not aborted completes as usual
    assert m.prepare_store([h(1)]).block_hashes == (h(1),)  # an aborted block can be stored again
    m.check()


def failing(*_args, **_kwargs):
    raise RuntimeError("injected")


def test_a_failing_prepare_store_reserves_nothing(monkeypatch):
    m = make(vram=4, dram=4, watermark=0.25)
    store(m, [1])
    monkeypatch.setattr(Mover, "vram_room", failing)  # after the store's slots are allocated
    with pytest.raises(RuntimeError, match="injected"):
        m.prepare_store([h(2), h(3), h(4)])
    monkeypatch.undo()
    assert len(m.view()) == 1 and m.view().tier(VRAM).free_slots == 3
    failed = [e for e in m.take_events() if e.kind == "store" and not e.stored]
    assert [e.block_hash for e in failed] == [h(2), h(3), h(4)] and "injected" in failed[0].reason
    m.check()
    assert len(store(m, [2, 3, 4]).block_hashes) == 3
    m.check()


def test_a_failing_prepare_load_keeps_no_pins(monkeypatch):
    m = make(vram=4, dram=4, watermark=0.25)
    store(m, [1, 2, 3])
    m.spill(2)
    for job in m.take_jobs():
        m.complete_transfer(job.job_id)
    cold = [b.block_hash for b in m.view().blocks(DRAM)]
    monkeypatch.setattr(JobBook, "start", failing)  # the warm of the DRAM-resident blocks
    with pytest.raises(RuntimeError, match="injected"):
        m.prepare_load(cold)
    monkeypatch.undo()
    assert all(m.view().block(b).loads_in_flight == 0 and m.view().block(b).evictable for b in cold)
    m.check()
    assert m.prepare_load(cold).tiers == (DRAM, DRAM)
    m.complete_load(cold)
    m.check()


class BrokenObserver(EvictionPolicy):
    name = "broken"

    def choose_victims(self, tier, n, candidates):
        return []

    def observe(self, event):
        raise RuntimeError("observer bug")


def test_event_log_survives_a_failing_observer_and_bounds_undrained_events(caplog):
    m = TierManager(8, 0, "c", policy=BrokenObserver(), clock=Clock(), max_events=3)
    with caplog.at_level(logging.WARNING, logger="tiercache"):
        store(m, range(5))
    assert [e.seq for e in m.take_events()] == [1, 2, 3] and m.events_dropped == 2
    assert "failed to observe" in caplog.text and caplog.text.count("not drained") == 1
    m.lookup([h(0)])
    assert [e.seq for e in m.take_events()] == [6]
