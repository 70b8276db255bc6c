"""The connector's worker side refuses a load whose stored bytes changed, before any byte of the changed piece
reaches vLLM's cache: offload mode (lossless and TurboQuant, VRAM and DRAM slots) and primary mode
(byte-copied pages). The refusal is a load error for vLLM (it recomputes the block, never reading it) and a
LoadFailure whose reason the scheduler counts as checksum_mismatch. Where the decode verifies each piece
itself (TurboQuant on CUDA) the refused block's intact pieces may be written; elsewhere (a separate pass
before the decode or copy) none of the block is."""

from __future__ import annotations

import pytest
import torch

from tiercache.config import TierCacheConfig
from tiercache.connectors.common import Geometry
from tiercache.connectors.worker import ConnectorWorker
from tiercache.scheduler.events import cause_of
from tiercache.wire import DRAM, VRAM, LoadItem, StepPlan, StoreItem

LAYERS, HEADS, HEAD_DIM, BS, NB = 2, 2, 64, 16, 12
NAMES = tuple(f"model.layers.{i}.self_attn.attn" for i in range(LAYERS))
SAVED = [(VRAM, 0, 1), (VRAM, 1, 2), (DRAM, 0, 3), (DRAM, 1, 4)]  # (tier, slot, vLLM block saved)
LOAD_INTO = [7, 8, 9, 10]  # the vLLM blocks the four are loaded back into


def worker_for(codec: str, primary: bool, device: str) -> tuple[ConnectorWorker, dict[str, torch.Tensor]]:
    config = TierCacheConfig.from_dict(
        {"codec": codec, "tiers": {"vram": f"{4 * BS} tokens", "dram": f"{4 * BS} tokens"}}
    )
    gen = torch.Generator().manual_seed(0)
    if primary:
        geometry = Geometry(NAMES, HEADS, HEAD_DIM, BS, torch.uint8, primary=True)
        page = geometry.page_format(config.codec).page_bytes
        caches = {n: torch.randint(0, 256, (NB, page), generator=gen, dtype=torch.uint8) for n in NAMES}
        caches = {n: c.to(device) for n, c in caches.items()}
        backends = dict.fromkeys(NAMES, "CUSTOM")
    else:
        geometry = Geometry(NAMES, HEADS, HEAD_DIM, BS, torch.float32)
        caches = {  # FLASH_ATTN's logical [NB, H, BS, 2·D] over physical [NB, BS, H, 2·D]
            n: torch.randn(NB, BS, HEADS, 2 * HEAD_DIM, generator=gen).to(device).transpose(1, 2)
            for n in NAMES
        }
        backends = dict.fromkeys(NAMES, "FLASH_ATTN")
    worker = ConnectorWorker(config, geometry)
    worker.register(caches, backends)
    return worker, caches


def run(worker: ConnectorWorker, plan: StepPlan) -> None:
    worker.start_step(plan)
    worker.finish_step(plan)


def corrupt(worker: ConnectorWorker, tier: str, slot: int, section: str, layer: int) -> None:
    pool = worker.tiers.vram if tier == VRAM else worker.tiers.dram
    piece = getattr(pool, section)[layer, slot]
    piece = piece if piece.dtype == torch.uint8 else piece.view(torch.uint8)
    piece.view(-1)[-1] ^= 0x01


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("codec,primary", [("none", False), ("tq4", False), ("k8v4", False), ("tq4", True)])
@pytest.mark.parametrize("bad", [(VRAM, 1, "k_norms", 1), (DRAM, 0, "v_packed", 0), (DRAM, 1, "k_packed", 1)])
def test_a_changed_byte_is_refused_before_it_reaches_vllms_cache(codec, primary, bad, device):
    """On CUDA: the Triton encode, checksum and dequantize kernels, pinned DRAM."""
    worker, caches = worker_for(codec, primary, device)
    hashes = [bytes([i]) * 32 for i in range(len(SAVED))]
    stores = tuple(StoreItem(h, t, s, b) for h, (t, s, b) in zip(hashes, SAVED, strict=True))
    run(worker, StepPlan(0, stores=stores))
    tier, slot, section, layer = bad
    corrupt(worker, tier, slot, section, layer)
    before = {n: c.clone() for n, c in caches.items()}
    loads = tuple(
        LoadItem(h, t, s, dst) for h, (t, s, _), dst in zip(hashes, SAVED, LOAD_INTO, strict=True)
    )  # fmt: skip
    run(worker, StepPlan(1, loads=loads))
    wrong = next(i for i, (t, s, _) in enumerate(SAVED) if (t, s) == (tier, slot))
    assert worker.take_load_errors() == {LOAD_INTO[wrong]}
    report = worker.take_report()
    step = report.steps[-1]
    assert step.loads_ok == tuple(i != wrong for i in range(len(SAVED)))
    (failure,) = step.load_failures
    assert failure.index == wrong and failure.reason.startswith(f"checksum mismatch: {tier} slot {slot} ")
    assert cause_of(f"load failed ({failure.reason})") == "checksum_mismatch"  # as the manager words it
    assert any("checksum mismatch" in e for e in report.errors)  # logged, with its tier
    dst = LOAD_INTO[wrong]
    if device == "cuda" and codec != "none" and not primary:  # verified piece by piece in the decode
        side = slice(None, HEAD_DIM) if section.startswith("k") else slice(HEAD_DIM, None)
        name = NAMES[layer]
        assert torch.equal(
            caches[name][dst].transpose(0, 1)[..., side], before[name][dst].transpose(0, 1)[..., side]
        )
    else:
        for name, cache in caches.items():  # a separate pass: the whole refused block is untouched
            assert torch.equal(cache[dst], before[name][dst])
    for name, cache in caches.items():  # the others were written
        for i, dst in enumerate(LOAD_INTO):
            if i != wrong:
                assert not torch.equal(cache[dst], before[name][dst])
    if codec == "none" or primary:  # exact codecs: the intact loads are the saved blocks, byte for byte
        for cache in caches.values():
            for i, (_, _, src) in enumerate(SAVED):
                if i != wrong:
                    assert torch.equal(cache[LOAD_INTO[i]], cache[src])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_refusals_are_known_when_vllm_asks_before_wait_for_save(device):
    """vLLM reads a step's load errors before wait_for_save when it defers finalizing (speculative decoding):
    the checksum verdicts settle there too, and the step's result still reports them."""
    worker, _ = worker_for("tq4", False, device)
    hashes = [bytes([i]) * 32 for i in range(len(SAVED))]
    run(
        worker,
        StepPlan(0, stores=tuple(StoreItem(h, t, s, b) for h, (t, s, b) in zip(hashes, SAVED, strict=True))),
    )
    corrupt(worker, DRAM, 1, "k_packed", 1)
    plan = StepPlan(
        1, loads=tuple(LoadItem(h, t, s, d) for h, (t, s, _), d in zip(hashes, SAVED, LOAD_INTO, strict=True))
    )
    worker.start_step(plan)
    assert worker.take_load_errors() == {LOAD_INTO[3]}
    worker.finish_step(plan)
    step = worker.take_report().steps[-1]
    assert step.loads_ok == (True, True, True, False) and [f.index for f in step.load_failures] == [3]


def test_a_verdict_that_cannot_be_read_refuses_every_load_of_its_step(monkeypatch):
    worker, _ = worker_for("tq4", False, "cpu")
    hashes = [bytes([i]) * 32 for i in range(len(SAVED))]
    run(
        worker,
        StepPlan(0, stores=tuple(StoreItem(h, t, s, b) for h, (t, s, b) in zip(hashes, SAVED, strict=True))),
    )

    def broken(items, check):
        raise RuntimeError("device lost")

    monkeypatch.setattr(worker.tiers, "refusals", broken)
    plan = StepPlan(
        1, loads=tuple(LoadItem(h, t, s, d) for h, (t, s, _), d in zip(hashes, SAVED, LOAD_INTO, strict=True))
    )
    run(worker, plan)
    assert worker.take_load_errors() == set(LOAD_INTO)
    step = worker.take_report().steps[-1]
    assert step.loads_ok == (False,) * 4
    assert all(
        "verdict could not be read (RuntimeError: device lost)" in f.reason for f in step.load_failures
    )


def test_a_step_replaced_before_its_end_still_reports_its_refusals():
    """A step whose finish never came (the next plan arrived first) has its verdicts settled when it is
    replaced: its refused load is still a load error for vLLM."""
    worker, _ = worker_for("tq4", False, "cpu")
    hashes = [bytes([i]) * 32 for i in range(len(SAVED))]
    run(
        worker,
        StepPlan(0, stores=tuple(StoreItem(h, t, s, b) for h, (t, s, b) in zip(hashes, SAVED, strict=True))),
    )
    corrupt(worker, VRAM, 0, "v_norms", 0)
    loads = tuple(LoadItem(h, t, s, d) for h, (t, s, _), d in zip(hashes, SAVED, LOAD_INTO, strict=True))
    worker.start_step(StepPlan(1, loads=loads))
    worker.finish_step(StepPlan(2))  # another plan: step 1 is replaced
    assert worker.take_load_errors() == {LOAD_INTO[0]}
