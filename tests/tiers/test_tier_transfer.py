"""Pools and transfer engine: byte-exact VRAM → DRAM → VRAM round trips of random block sets."""

import random

import pytest
import torch
from tier_blocks import random_blocks

from tiercache.codecs import KVCodecSpec
from tiercache.errors import PoolAllocationError
from tiercache.layout import BlockLayout
from tiercache.wire import DRAM, VRAM, TransferJob
from tiercache.worker.pools import DramPool, KVBlocks, VramPool
from tiercache.worker.transfer import TransferEngine

# (layers, block_size, kv_heads, k_packed_dim, v_packed_dim): TQ4 d64, K8V4 d128, odd, raw fp32 d64
LAYOUTS = [(2, 16, 2, 32, 32), (3, 16, 1, 128, 64), (1, 3, 3, 30, 40), (2, 4, 2, 256, 256)]


def move(job_id: int, src_tier: str, dst_tier: str, src, dst) -> TransferJob:
    """A job between two tiers (the block hashes only name the pairs: the engine moves bytes)."""
    names = tuple(i.to_bytes(4, "little") for i in range(len(src)))
    return TransferJob(job_id, src_tier, dst_tier, tuple(src), tuple(dst), names)


def test_layout_bytes_and_alignment():
    layout = BlockLayout.from_spec(
        KVCodecSpec(4, 4), num_layers=32, num_kv_heads=8, head_dim=128, block_size=16
    )
    assert layout.block_bytes == 32 * 16 * 8 * (64 + 64 + 8) == 557_056
    assert layout.bytes_per_token == KVCodecSpec(4, 4).bytes_per_token(32, 8, 128)
    for lay in [BlockLayout(*shape) for shape in LAYOUTS]:
        offsets = [offset for _, offset, _, _ in lay.sections()]
        assert offsets[2] % 4 == 0 and offsets[3] % 4 == 0
        assert lay.dram_stride % 64 == 0 and lay.dram_stride >= lay.block_bytes


@pytest.mark.parametrize("shape", LAYOUTS)
def test_dram_views_match_vram_format(shape):
    layout = BlockLayout(*shape)
    vram, dram = VramPool(layout, 5, "cpu"), DramPool(layout, 7, pin=False)
    for name, view in dram.views().items():
        ref = getattr(vram, name)
        assert view.dtype == ref.dtype and view.shape[0] == ref.shape[0] and view.shape[2:] == ref.shape[2:]
        assert view.shape[1] == 7
    blocks = random_blocks(layout, 3, 0)
    dram.write([6, 0, 3], blocks)
    assert dram.read([6, 0, 3]).equal(blocks)
    # block 3 is one contiguous byte range of the buffer
    one = dram.read([3])
    assert torch.equal(dram.buffer[3, : one.k_packed.numel()], one.k_packed.transpose(0, 1).reshape(-1))


@pytest.mark.parametrize("shape", LAYOUTS)
@pytest.mark.parametrize("max_batch", [1, 5, 1024])
def test_spill_then_warm_roundtrip_is_byte_exact(shape, max_batch):
    layout = BlockLayout(*shape)
    rng = random.Random(hash((shape, max_batch)) & 0xFFFF)
    vram = VramPool(layout, 24, "cpu")
    dram = DramPool(layout, 40, pin=False, chunk_bytes=layout.dram_stride * 7)  # runs split at chunk ends
    engine = TransferEngine(vram, dram, max_batch_blocks=max_batch)
    original = random_blocks(layout, 24, seed=1)
    vram.write(range(24), original)
    src = rng.sample(range(24), 13)
    dst = rng.sample(range(40), 13)  # scattered DRAM slots: many runs
    engine.submit(move(1, VRAM, DRAM, tuple(src), tuple(dst)))
    (result,) = engine.poll()
    assert (
        result.ok and result.blocks == 13 and result.bytes == 13 * layout.block_bytes and result.seconds >= 0
    )
    expected = vram.read(src)
    assert dram.read(dst).equal(expected)
    vram.write(src, random_blocks(layout, 13, seed=2))  # overwrite the sources
    back = rng.sample(range(24), 13)
    engine.submit(move(2, DRAM, VRAM, tuple(dst), tuple(back)))
    assert engine.wait()[0].ok
    assert vram.read(back).equal(expected)


@pytest.mark.parametrize("preset", ["tq4", "k8v4", "k3v4", "none"])
def test_encoded_kv_survives_spill_and_warm(preset):
    head_dim, L, BS, H, n = 64, 2, 16, 2, 6
    codec = KVCodecSpec.from_preset(preset).build(head_dim, torch.float32)
    layout = BlockLayout(L, BS, H, codec.k_packed_dim, codec.v_packed_dim)
    vram, dram = VramPool(layout, n, "cpu"), DramPool(layout, n, pin=False)
    engine = TransferEngine(vram, dram)
    g = torch.Generator().manual_seed(3)
    k, v = torch.randn(L, n, BS, H, head_dim, generator=g), torch.randn(L, n, BS, H, head_dim, generator=g)
    (kp, kn), (vp, vn) = codec.keys.encode(k), codec.values.encode(v)
    vram.write(range(n), KVBlocks(kp, vp, kn, vn))
    engine.submit(move(1, VRAM, DRAM, tuple(range(n)), tuple(reversed(range(n)))))
    vram.write(range(n), random_blocks(layout, n, 9))
    engine.submit(move(2, DRAM, VRAM, tuple(reversed(range(n))), tuple(range(n))))
    assert all(r.ok for r in engine.poll())
    got = vram.read(range(n))
    assert torch.equal(codec.keys.decode(got.k_packed, got.k_norms), codec.keys.decode(kp, kn))
    assert torch.equal(codec.values.decode(got.v_packed, got.v_norms), codec.values.decode(vp, vn))
    if preset == "none":
        assert torch.equal(codec.keys.decode(got.k_packed, got.k_norms), k)


def test_read_and_write_dram_any_order():
    layout = BlockLayout(*LAYOUTS[0])
    vram, dram = VramPool(layout, 4, "cpu"), DramPool(layout, 10, pin=False)
    engine = TransferEngine(vram, dram)
    blocks = random_blocks(layout, 4, 5)
    engine.write_dram([7, 2, 9, 3], blocks)
    assert dram.read([7, 2, 9, 3]).equal(blocks)
    assert engine.read_dram([7, 2, 9, 3]).equal(blocks)
    assert engine.read_dram([2, 3]).equal(dram.read([2, 3]))


def test_bad_job_is_a_failed_result_not_an_exception():
    layout = BlockLayout(*LAYOUTS[0])
    engine = TransferEngine(VramPool(layout, 4, "cpu"), DramPool(layout, 4, pin=False))
    engine.submit(move(7, VRAM, DRAM, (0, 9), (0, 1)))
    (result,) = engine.poll()
    assert not result.ok and result.job_id == 7 and "out of range" in result.error


def test_dram_allocation_failure_states_both_numbers():
    layout = BlockLayout(32, 16, 8, 64, 64)
    with pytest.raises(PoolAllocationError) as info:
        DramPool(layout, 10**9, pin=False)  # ~520 TiB
    message = str(info.value)
    assert "asked" in message and "available" in message and "tiers.dram" in message


@pytest.mark.gpu
@pytest.mark.parametrize("shape", LAYOUTS)
def test_gpu_spill_warm_roundtrip(shape):
    layout = BlockLayout(*shape)
    vram, dram = VramPool(layout, 64, "cuda"), DramPool(layout, 96)
    assert dram.pinned
    engine = TransferEngine(vram, dram, max_batch_blocks=16)
    vram.write(range(64), random_blocks(layout, 64, 1, "cuda"))
    rng = random.Random(0)
    src, dst = rng.sample(range(64), 40), rng.sample(range(96), 40)
    engine.submit(move(1, VRAM, DRAM, tuple(src), tuple(dst)))
    assert engine.wait()[0].ok
    expected = vram.read(src)
    assert dram.read(dst).equal(expected)
    back = rng.sample(range(64), 40)
    engine.submit(move(2, DRAM, VRAM, tuple(dst), tuple(back)))
    results = engine.wait()
    assert results[0].ok and results[0].seconds > 0
    assert vram.read(back).equal(expected)
    assert engine.read_dram(dst).equal(expected)
