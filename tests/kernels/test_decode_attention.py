"""tq_decode_attention against softmax attention in float64 over the dequantized cache."""

import logging
from dataclasses import replace

import pytest
import torch
from kernel_cases import BIT_PAIRS, codec, random_block_tables, random_cache, rel_err

from tiercache.kernels import DecodeLaunchConfig, DecodeWorkspace, decode_lut, tq_decode_attention
from tiercache.kernels import decode_attention as decode_module
from tiercache.kernels.reference import decode_attention_reference

CONTEXT_LENS = [1, 17, 333]
SHAPES = [(d, bs, g) for d in (64, 128) for bs in (16, 32) for g in (1, 4, 8)]
CASES = [(4, 4, *shape) for shape in SHAPES] + [(8, 4, *shape) for shape in SHAPES[::2]]
OTHER_SHAPES = [(64, 16, 4), (128, 32, 1), (64, 32, 8)]
CASES += [(kb, vb, *OTHER_SHAPES[i % len(OTHER_SHAPES)]) for i, (kb, vb) in enumerate(BIT_PAIRS[2:])]
CASES += [(kb, vb, 128, 16, 4) for kb, vb in BIT_PAIRS[2:]]


def make_case(k_bits, v_bits, head_dim, block_size, group, dtype, seed, lens=CONTEXT_LENS, heads=2):
    gen = torch.Generator().manual_seed(seed)
    kc, vc = codec(head_dim, k_bits, 1), codec(head_dim, v_bits, 2)
    num_blocks = sum(-(-n // block_size) for n in lens) + 4
    k_packed, k_norms = random_cache(num_blocks, block_size, heads, kc, gen)
    v_packed, v_norms = random_cache(num_blocks, block_size, heads, vc, gen)
    tables = random_block_tables(lens, block_size, num_blocks, gen)
    query = (torch.randn(len(lens), heads * group, head_dim, generator=gen) * 2).to(dtype)
    context_lens = torch.tensor(lens, dtype=torch.int32)
    return query, k_packed, k_norms, v_packed, v_norms, tables, context_lens, kc, vc


@pytest.mark.parametrize("k_bits,v_bits,head_dim,block_size,group", CASES)
def test_decode_matches_float64_reference(k_bits, v_bits, head_dim, block_size, group):
    args = make_case(k_bits, v_bits, head_dim, block_size, group, torch.float32, seed=k_bits * 97 + group)
    out = torch.full_like(args[0], float("nan"))
    tq_decode_attention(*args, out=out)
    ref = decode_attention_reference(args[0].double(), *args[1:], compute_dtype=torch.float64)
    assert rel_err(out, ref) <= 1e-4


@pytest.mark.parametrize("k_bits,v_bits", BIT_PAIRS)
def test_decode_bf16_query(k_bits, v_bits):
    args = make_case(k_bits, v_bits, 128, 16, 4, torch.bfloat16, seed=5)
    out = tq_decode_attention(*args, scale=0.1)
    assert out.dtype == torch.bfloat16
    ref = decode_attention_reference(args[0].double(), *args[1:], scale=0.1, compute_dtype=torch.float64)
    assert rel_err(out, ref) <= 2e-2


def test_decode_reuses_workspace_and_cpu_fallback(monkeypatch):
    args = make_case(4, 4, 64, 16, 4, torch.float32, seed=11, lens=[40, 7])
    ws = DecodeWorkspace.allocate(args[0], args[5], 16, 2)
    ws.partial_out.fill_(float("nan"))
    first = tq_decode_attention(*args, workspace=ws)
    second = tq_decode_attention(*args, workspace=ws)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # CPU product path: the PyTorch reference
    fallback = tq_decode_attention(*args)
    assert rel_err(fallback, first) <= 1e-5


def test_decode_rejects_bad_gqa():
    args = list(make_case(4, 4, 64, 16, 1, torch.float32, seed=3, lens=[5]))
    args[0] = torch.randn(1, 3, 64)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        tq_decode_attention(*args)


@pytest.mark.parametrize(
    "config",
    [
        {"rotate_in_split": True},
        {"lut": "prmt", "rotate_in_split": False},
        {"lut": "gather", "tile": 32},
        {"lut": "none"},
        {"merge_preload": False},  # the merge loads the rotation back in column chunks
        {"merge_preload": True},  # ... whole, first
        {"merge_rows": 16},  # 16 rows a merge program (the last one's rows partly past the end)
        {"merge_rows": 16, "lut": "none"},
        {"merge_rows": 1},
    ],
)
@pytest.mark.parametrize("k_bits,v_bits", [(2, 3), (8, 4), (4, 2), (7, 5)])
def test_decode_launch_variants(config, k_bits, v_bits):
    """Every launch choice of the Triton kernels computes the same attention (f32 and bf16)."""
    launch = replace(DecodeLaunchConfig(), **config)
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        args = make_case(k_bits, v_bits, 64, 16, 4, dtype, seed=21, lens=[1, 17, 70])
        out = tq_decode_attention(*args, config=launch)
        ref = decode_attention_reference(args[0].double(), *args[1:], compute_dtype=torch.float64)
        assert rel_err(out, ref) <= tol


UNIFORM = [(8, "uniform", 4, "lloyd"), (8, "uniform", 4, "uniform"), (4, "lloyd", 4, "uniform")]


@pytest.mark.parametrize("codebooks", UNIFORM)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_decode_uniform_codebooks(codebooks, dtype, tol):
    """Uniform codebooks (8-bit keys take an arithmetic path on the GPU; here the centroids come from tables)
    against the float64 reference."""
    from tiercache.kernels import TurboQuantCodec

    k_bits, k_book, v_bits, v_book = codebooks
    gen = torch.Generator().manual_seed(3)
    kc = TurboQuantCodec(128, k_bits, seed=1, codebook=k_book)
    vc = TurboQuantCodec(128, v_bits, seed=2, codebook=v_book)
    lens, block_size, heads = [1, 17, 333], 16, 2
    num_blocks = sum(-(-n // block_size) for n in lens) + 4
    kp, kn = random_cache(num_blocks, block_size, heads, kc, gen)
    vp, vn = random_cache(num_blocks, block_size, heads, vc, gen)
    tables = random_block_tables(lens, block_size, num_blocks, gen)
    query = (torch.randn(len(lens), heads * 4, 128, generator=gen) * 2).to(dtype)
    args = (query, kp, kn, vp, vn, tables, torch.tensor(lens, dtype=torch.int32), kc, vc)
    out = tq_decode_attention(*args)
    ref = decode_attention_reference(query.double(), *args[1:], compute_dtype=torch.float64)
    assert rel_err(out, ref) <= tol


def test_gluon_compile_failure_is_remembered_for_its_config(monkeypatch, caplog):
    """A launch configuration whose Gluon kernel fails its compile check falls back to the Triton kernels
    with the same result, one warning, and no second try on this device; a configuration with another
    compiled form still tries it, one that differs only in fields its compile does not depend on does not."""
    tries = []

    def failing_launch(*args):
        tries.append(args[-1])
        raise decode_lut.LutUnsupported("_decode_lut_kernel compiled to 1 bytes of shared memory (test)")

    monkeypatch.setattr(decode_module, "lut_mode_of", lambda *args: 4)  # the Gluon kernel applies
    monkeypatch.setattr(decode_module, "launch_lut", failing_launch)
    monkeypatch.setattr(decode_lut, "_FAILED_COMPILES", {})
    args = make_case(4, 4, 64, 16, 4, torch.bfloat16, seed=8, lens=[1, 17, 70])
    ref = decode_attention_reference(args[0].double(), *args[1:], compute_dtype=torch.float64)
    failing = DecodeLaunchConfig(lut_min_work=0)
    with caplog.at_level(logging.WARNING, logger=decode_lut.__name__):
        for config in (failing, failing, replace(failing, lut_min_work=1, tile=32)):
            assert rel_err(tq_decode_attention(*args, config=config), ref) <= 2e-2
    assert tries == [failing]
    assert len(caplog.records) == 1 and "lut_tile=16" in caplog.records[0].getMessage()
    assert decode_lut.lut_compile_failed(args[0].device, failing, (4, 4), 64)
    other = replace(failing, lut_tile=32)
    assert not decode_lut.lut_compile_failed(args[0].device, other, (4, 4), 64)
    assert not decode_lut.lut_compile_failed(
        args[0].device, failing, (5, 3), 64
    )  # other widths: their own key
    assert not decode_lut.lut_compile_failed(args[0].device, failing, (4, 4), 128)  # another head_dim too
    tq_decode_attention(*args, config=other)
    assert tries == [failing, other]
