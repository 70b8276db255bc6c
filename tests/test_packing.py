"""pack_indices / unpack_indices: exact round trips and the documented little-endian bit layout."""

import pytest
import torch

from tiercache.kernels import pack_indices, unpack_indices
from tiercache.kernels.packing import group_shape

BITS = list(range(1, 9))
LEADING_SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 4)]
HEAD_DIMS = [64, 80, 128, 256]


def reference_pack(idx: list[int], bits: int) -> bytes:
    """Plain-Python bitstream: index j at bits j·b … j·b+b−1, byte 0 holding bits 0–7."""
    stream = 0
    for j, value in enumerate(idx):
        stream |= value << (j * bits)
    return stream.to_bytes(len(idx) * bits // 8, "little")


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("lead", LEADING_SHAPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_round_trip_is_exact(bits, lead, head_dim):
    gen = torch.Generator().manual_seed(bits * 1000 + head_dim)
    idx = torch.randint(0, 2**bits, (*lead, head_dim), generator=gen)
    packed = pack_indices(idx, bits)
    assert packed.dtype == torch.uint8
    assert packed.shape == (*lead, head_dim * bits // 8)
    assert torch.equal(unpack_indices(packed, bits, head_dim), idx)


@pytest.mark.parametrize("bits", BITS)
def test_layout_matches_little_endian_bitstream(bits):
    gen = torch.Generator().manual_seed(bits)
    idx = torch.randint(0, 2**bits, (4, 64), generator=gen)
    packed = pack_indices(idx, bits)
    for row in range(idx.shape[0]):
        assert bytes(packed[row].tolist()) == reference_pack(idx[row].tolist(), bits)


def test_known_bytes():
    assert pack_indices(torch.tensor([1, 2]), 4).tolist() == [0x21]
    assert pack_indices(torch.tensor([1, 2, 3, 0]), 2).tolist() == [0b00_11_10_01]
    # 3-bit: eight indices 0..7 fill three bytes
    assert pack_indices(torch.arange(8), 3).tolist() == list(reference_pack(list(range(8)), 3))


@pytest.mark.parametrize(
    "bits,expected",
    [(1, (8, 1)), (2, (4, 1)), (3, (8, 3)), (4, (2, 1)), (5, (8, 5)), (6, (4, 3)), (7, (8, 7)), (8, (1, 1))],
)
def test_group_shape(bits, expected):
    assert group_shape(bits) == expected


@pytest.mark.parametrize("bits", [0, 9, -1, 2.0, True])
def test_bad_bits(bits):
    with pytest.raises(ValueError, match="bits must be an integer in 1..8"):
        pack_indices(torch.zeros(8, dtype=torch.int64), bits)


def test_bad_inputs_name_the_fix():
    with pytest.raises(ValueError, match="integer tensor"):
        pack_indices(torch.zeros(8), 4)
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_indices(torch.zeros(12, dtype=torch.int64), 3)
    with pytest.raises(ValueError, match="uint8"):
        unpack_indices(torch.zeros(4, dtype=torch.int32), 4, 8)
    with pytest.raises(ValueError, match="expected 64"):
        unpack_indices(torch.zeros(63, dtype=torch.uint8), 4, 128)
