"""TurboQuant presets end to end (issue test 2): a request sharing a 5-block prefix loads it from the tiers,
and the KV written into vLLM's blocks equals codec.decode(codec.encode(original)) per side within 1e-5; a
changed byte in a stored TurboQuant block is refused as a checksum mismatch (issue 26)."""

from __future__ import annotations

import pytest
import torch
from helpers import BLOCK, SHARED, connector_config, engine, generate, scheduler_side, tokens, worker_side

PREFIX_BLOCKS = 5


@pytest.fixture(scope="module", params=["tq4", "k8v4"])
def llm(request, tiny_model, baseline):  # baseline first: its engine is freed before this one is built
    with engine(tiny_model, connector_config(request.param)) as llm:
        yield llm


def test_loaded_kv_is_the_codec_round_trip(llm):
    worker = worker_side()
    original: dict[bytes, list] = {}
    loaded: dict[bytes, list] = {}
    real_store, real_load = worker._store, worker._load

    def read(block_id: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        ids = torch.tensor([block_id])
        return [
            (k.read(ids).clone(), v.read(ids).clone())
            for k, v in zip(worker.k_views, worker.v_views, strict=True)
        ]

    def store(step):
        for item in step.plan.stores:
            original[item.block_hash] = read(item.block_id)
        return real_store(step)

    def load(step):
        real_load(step)
        worker._settle(step)  # the checksum verdicts, which the worker otherwise learns later in the step
        for item, done in zip(step.plan.loads, step.loads_ok, strict=True):
            if done:
                loaded[item.block_hash] = read(item.block_id)

    worker._store, worker._load = store, load
    try:
        first, second = SHARED["codec"]
        outs = generate(llm, [first, second])
    finally:
        del worker._store, worker._load
    assert [o.num_cached_tokens for o in outs] == [0, PREFIX_BLOCKS * BLOCK]
    assert len(loaded) == PREFIX_BLOCKS and set(loaded) <= set(original)
    codec = worker.codec
    for block_hash, layers in loaded.items():
        for (k, v), (k0, v0) in zip(layers, original[block_hash], strict=True):
            for got, x, side in ((k, k0, codec.keys), (v, v0, codec.values)):
                expect = side.decode(*side.encode(x), x.dtype)
                torch.testing.assert_close(got, expect, atol=1e-5, rtol=0)
                assert not torch.equal(got, x)  # lossy: the load really went through the codec
    sched = scheduler_side(llm)
    assert sched.codec_id == codec.codec_id and sched.counters["load_failures"] == 0


def test_a_changed_byte_in_a_stored_tq_block_is_recomputed(llm, baseline):
    """The first block of a stored prefix gets one norm's exponent changed in its VRAM slot: the load is
    refused, and vLLM recomputes the prefix from that block on, so the tokens are exactly those without the
    connector (a TurboQuant-served prefix need not be)."""
    first, second = SHARED["corrupted_codec"]
    sched, worker = scheduler_side(llm), worker_side()
    before = set(sched.manager.view().hashes())
    generate(llm, [first])
    head = next(h for h in sched.manager.view().hashes() if h not in before)  # stored first: block 0
    info = sched.manager.info(head)
    assert info.tier == "vram"
    worker.tiers.vram.k_norms[1, info.slot].view(torch.uint8).view(-1)[3] ^= 0x40
    counted = sched.inspection.counters.get("failures_checksum_mismatch", 0)
    outs = generate(llm, [second])
    assert tokens(outs) == [baseline[second]]
    assert sched.inspection.counters["failures_checksum_mismatch"] == counted + 1
