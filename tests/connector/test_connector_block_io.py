"""The connector's save and load on the kernels' in-place paths (the serving path on CUDA; forced on without
CUDA, through the Triton interpreter): a VRAM-tier store encodes vLLM's blocks straight into its slots, a load
decodes VRAM slots in place and DRAM blocks from their staging rows straight into vLLM's blocks. vLLM's cache
is a FLASH_ATTN-layout view ([NB, H, BS, 2·D] logical over [NB, BS, H, 2·D]: K and V strided). Checked: the
stored indices are tq_encode_store's for those blocks' tokens (norms to float rounding: the products are cut
into other tiles), with the checksums of the stored bytes; each loaded block is
exactly the decode of its stored bytes, in the block the plan names, and nothing else changes; a block whose
bytes changed at rest is refused, its changed piece (layer and side) verified and skipped by the decode itself
so that none of its bytes reach vLLM's block, the reason names the piece, and the other blocks still land."""

from __future__ import annotations

import pytest
import torch

from tiercache.config import TierCacheConfig
from tiercache.connectors.common import Geometry
from tiercache.connectors.worker import ConnectorWorker, codec_io
from tiercache.kernels import tq_encode_store
from tiercache.wire import DRAM, VRAM, LoadItem, StepPlan, StoreItem
from tiercache.worker.integrity import checksums_of
from tiercache.worker.pools import KVBlocks

LAYERS, HEADS, HEAD_DIM, BS, NB = 2, 2, 64, 16, 12
SAVED = [(3, VRAM, 5), (0, VRAM, 1), (7, DRAM, 2), (9, VRAM, 0), (4, DRAM, 6)]  # (vLLM block, tier, slot)
LOADED_INTO = [10, 2, 11, 6, 8]  # vLLM blocks the saved blocks are loaded back into, in SAVED's order


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def kernels_on(monkeypatch):
    if DEVICE == "cpu":  # tests/conftest.py set TRITON_INTERPRET=1 before the kernels were imported
        monkeypatch.setattr(codec_io, "_use_kernels", lambda device: True)


def hashes() -> list[bytes]:
    return [bytes([i + 1]) * 32 for i in range(len(SAVED))]


def saved_worker(preset: str, dtype: torch.dtype) -> tuple[ConnectorWorker, dict[str, torch.Tensor]]:
    names = tuple(f"model.layers.{i}.self_attn.attn" for i in range(LAYERS))
    geometry = Geometry(names, HEADS, HEAD_DIM, BS, dtype)
    config = TierCacheConfig.from_dict(
        {"codec": preset, "tiers": {"vram": f"{8 * BS} tokens", "dram": f"{8 * BS} tokens"}}
    )
    gen = torch.Generator().manual_seed(len(preset))
    caches = {
        n: (torch.randn(NB, BS, HEADS, 2 * HEAD_DIM, generator=gen) * 2).to(DEVICE, dtype).transpose(1, 2)
        for n in names
    }
    worker = ConnectorWorker(config, geometry)
    worker.register(caches, dict.fromkeys(caches, "FLASH_ATTN"))
    stores = tuple(StoreItem(h, tier, slot, b) for h, (b, tier, slot) in zip(hashes(), SAVED, strict=True))
    worker.finish_step(StepPlan(0, stores=stores))
    return worker, caches


def sides(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    per_token = cache.transpose(1, 2)  # [NB, BS, H, 2·D]
    return per_token[..., :HEAD_DIM], per_token[..., HEAD_DIM:]


def stored(worker: ConnectorWorker, tier: str, slot: int) -> KVBlocks:
    pool = worker.tiers.vram if tier == VRAM else worker.tiers.dram
    return pool.read([slot]).to("cpu")


def load_back(worker: ConnectorWorker) -> None:
    """One step loading every saved block into its LOADED_INTO block."""
    loads = tuple(
        LoadItem(h, tier, slot, dst)
        for h, (_, tier, slot), dst in zip(hashes(), SAVED, LOADED_INTO, strict=True)
    )
    plan = StepPlan(1, loads=loads)
    worker.start_step(plan)
    worker.finish_step(plan)


def expected_blocks(worker: ConnectorWorker, caches: dict[str, torch.Tensor]) -> KVBlocks:
    """tq_encode_store of each saved block's tokens (token by token, the cache-update kernel)."""
    layout, n = worker.layout, len(SAVED)
    out = KVBlocks(
        torch.empty(LAYERS, n, BS, HEADS, layout.k_packed_dim, dtype=torch.uint8, device=DEVICE),
        torch.empty(LAYERS, n, BS, HEADS, layout.v_packed_dim, dtype=torch.uint8, device=DEVICE),
        torch.empty(LAYERS, n, BS, HEADS, device=DEVICE),
        torch.empty(LAYERS, n, BS, HEADS, device=DEVICE),
    )
    src = torch.tensor([b for b, _, _ in SAVED], device=DEVICE)
    slots = torch.arange(n * BS, device=DEVICE)
    for layer, cache in enumerate(caches.values()):
        k, v = (side[src].reshape(n * BS, HEADS, HEAD_DIM) for side in sides(cache))
        tq_encode_store(k, v, slots, out.k_packed[layer], out.k_norms[layer], out.v_packed[layer],
                        out.v_norms[layer], worker.codec.keys, worker.codec.values)  # fmt: skip
    return out.to("cpu")


@pytest.mark.parametrize("preset,dtype", [("tq4", torch.bfloat16), ("k8v4", torch.float32)])
def test_stores_write_the_cache_update_kernels_bytes_and_their_checksums(preset, dtype):
    worker, caches = saved_worker(preset, dtype)
    want = expected_blocks(worker, caches)
    for i, (_, tier, slot) in enumerate(SAVED):
        got, block = stored(worker, tier, slot), want.select([i])
        assert torch.equal(got.k_packed, block.k_packed) and torch.equal(got.v_packed, block.v_packed), i
        torch.testing.assert_close(got.k_norms, block.k_norms, rtol=2e-6, atol=0)
        torch.testing.assert_close(got.v_norms, block.v_norms, rtol=2e-6, atol=0)
        recorded = worker.tiers.checksums.get(tier, [slot]).cpu()
        assert torch.equal(recorded, checksums_of(got))
    report = worker.take_report()
    assert report is not None and all(report.steps[0].stores_ok)


@pytest.mark.parametrize("preset,dtype", [("tq4", torch.bfloat16), ("k8v4", torch.float32)])
def test_loads_decode_each_stored_block_into_its_destination_only(preset, dtype):
    worker, caches = saved_worker(preset, dtype)
    before = {n: c.clone() for n, c in caches.items()}
    load_back(worker)
    assert not worker.take_load_errors()
    codec = worker.codec
    for layer, (name, cache) in enumerate(caches.items()):
        k_side, v_side = sides(cache)
        for (_, tier, slot), dst in zip(SAVED, LOADED_INTO, strict=True):
            block = stored(worker, tier, slot)
            k = codec.keys.decode(block.k_packed[layer], block.k_norms[layer], torch.float64)
            v = codec.values.decode(block.v_packed[layer], block.v_norms[layer], torch.float64)
            for got, want in ((k_side[dst].cpu(), k[0]), (v_side[dst].cpu(), v[0])):
                err = float((got.double() - want).norm() / want.norm())
                assert err <= (1e-6 if dtype == torch.float32 else 8e-3), f"{name} block {dst}: {err}"
        untouched = [b for b in range(NB) if b not in LOADED_INTO]
        assert torch.equal(cache[untouched], before[name][untouched])


def test_a_block_changed_at_rest_is_refused_and_its_destination_kept():
    worker, caches = saved_worker("tq4", torch.bfloat16)
    worker.tiers.vram.k_packed[1, 5, 3, 1, 7] ^= 0x10  # SAVED[0]: VRAM slot 5
    worker.tiers.dram.buffer[6, 11] ^= 0x01  # SAVED[4]: DRAM slot 6
    before = {n: c.clone() for n, c in caches.items()}
    load_back(worker)
    assert worker.take_load_errors() == {LOADED_INTO[0], LOADED_INTO[4]}
    (step,) = [s for s in worker.take_report().steps if s.step == 1]
    assert step.loads_ok == (False, True, True, True, False)
    assert [f.index for f in step.load_failures] == [0, 4]
    assert all("checksum mismatch" in f.reason for f in step.load_failures)
    # the changed pieces: K of layer 1 (VRAM byte) and K of layer 0 (the DRAM row's byte 11: k_packed first)
    assert "(K of layer 1: sums" in step.load_failures[0].reason
    assert "(K of layer 0: sums" in step.load_failures[1].reason
    names = list(caches)
    for layer, dst in ((1, LOADED_INTO[0]), (0, LOADED_INTO[4])):
        assert torch.equal(sides(caches[names[layer]])[0][dst], sides(before[names[layer]])[0][dst])
    for name, cache in caches.items():
        assert not torch.equal(cache[LOADED_INTO[1]], before[name][LOADED_INTO[1]])
