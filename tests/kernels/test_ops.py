"""The torch.library ops: same results as the launchers, and opaque to torch.compile."""

import torch
from kernel_cases import codec, random_block_tables, random_cache, rel_err

import tiercache.kernels.ops  # noqa: F401  (registers torch.ops.tiercache.*)
from tiercache.kernels import tq_decode_attention
from tiercache.kernels.ops import codec_args


def test_decode_op_compiles_as_one_op():
    gen = torch.Generator().manual_seed(0)
    kc, vc = codec(64, 8, 1), codec(64, 4, 2)
    kp, kn = random_cache(6, 16, 2, kc, gen)
    vp, vn = random_cache(6, 16, 2, vc, gen)
    tables = random_block_tables([20, 33], 16, 6, gen)
    lens = torch.tensor([20, 33], dtype=torch.int32)
    query = torch.randn(2, 8, 64, generator=gen)

    def attend(q):
        return torch.ops.tiercache.tq_decode_attention(
            q * 2, kp, kn, vp, vn, tables, lens, 64, *codec_args(kc), *codec_args(vc), 0.125
        )

    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)
    want = tq_decode_attention(query * 2, kp, kn, vp, vn, tables, lens, kc, vc, 0.125)
    assert rel_err(compiled(query), want) <= 1e-6


def test_encode_and_dequantize_ops_round_trip():
    c = codec(64, 4, 0)
    key = torch.randn(16, 1, 64)
    packed = torch.zeros(1, 16, 1, c.packed_dim, dtype=torch.uint8)
    norms = torch.zeros(1, 16, 1)
    slots = torch.arange(16)
    cache = (packed, norms, packed, norms)
    torch.ops.tiercache.tq_encode_store(key, key, slots, *cache, 64, *codec_args(c), *codec_args(c))
    out = torch.empty(1, 16, 1, 64)
    torch.ops.tiercache.tq_dequantize_blocks(packed, norms, torch.tensor([0]), out, 64, *codec_args(c))
    expect = c.decode(*c.encode(key))
    assert rel_err(out[0], expect) <= 1e-5
