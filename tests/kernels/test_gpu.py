"""GPU checks at realistic sizes (skipped without CUDA): the references, plus CUDA-graph capture/replay."""

from dataclasses import replace

import pytest
import torch
from kernel_cases import (
    BIT_PAIRS,
    codec,
    near_boundary,
    random_block_tables,
    random_cache,
    rel_err,
    scales_of,
)

from tiercache.kernels import (
    DecodeLaunchConfig,
    DecodeWorkspace,
    PagedLayers,
    TurboQuantCodec,
    decode_lut,
    piece_checksums,
    tq_decode_attention,
    tq_dequantize_blocks,
    tq_dequantize_layers,
    tq_encode_blocks,
    tq_encode_layers,
    tq_encode_store,
)
from tiercache.kernels import decode_attention as decode_module
from tiercache.kernels.packing import unpack_indices
from tiercache.kernels.reference import decode_attention_reference, piece_checksums_reference

pytestmark = pytest.mark.gpu
DEV = "cuda"
SHAPES = [(128, 16, 4), (64, 32, 8), (128, 32, 1)]


def decode_case(k_bits, v_bits, head_dim, block_size, group, dtype, lens, heads=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    kc, vc = codec(head_dim, k_bits, 1), codec(head_dim, v_bits, 2)
    num_blocks = sum(-(-n // block_size) for n in lens) + 16
    kp, kn = random_cache(num_blocks, block_size, heads, kc, gen, DEV)
    vp, vn = random_cache(num_blocks, block_size, heads, vc, gen, DEV)
    tables = random_block_tables(lens, block_size, num_blocks, gen).to(DEV)
    query = (torch.randn(len(lens), heads * group, head_dim, generator=gen) * 2).to(DEV, dtype)
    return query, kp, kn, vp, vn, tables, torch.tensor(lens, dtype=torch.int32, device=DEV), kc, vc


@pytest.mark.parametrize("k_bits,v_bits", BIT_PAIRS)
@pytest.mark.parametrize("head_dim,block_size,group", SHAPES)
def test_decode_gpu(k_bits, v_bits, head_dim, block_size, group):
    lens = [1, 17, 333, 4099]
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 1e-2)):
        args = decode_case(k_bits, v_bits, head_dim, block_size, group, dtype, lens, seed=k_bits + group)
        out = torch.full_like(args[0], float("nan"))
        tq_decode_attention(*args, out=out)
        ref = decode_attention_reference(args[0].double(), *args[1:], compute_dtype=torch.float64)
        assert rel_err(out, ref) <= tol, dtype


TRITON_CONFIGS = [  # the Triton kernel (the Gluon kernel has its own tests below)
    {"lut": "prmt", "lut_kernel": False},
    {"lut": "prmt", "rotate_in_split": True, "lut_kernel": False},
    {"lut": "gather", "tile": 32, "lut_kernel": False},
    {"lut": "none", "rotate_in_split": False, "lut_kernel": False},
    {"lut": "prmt", "lut_kernel": False, "merge_rows": 16},  # 16 rows a merge program (tl.dot, tf32x3)
]
LUT_CONFIGS = [  # the Gluon kernel (at every size): the default, and other shapes of its launch configuration
    {"lut_min_work": 0},
    {"lut_min_work": 0, "lut_combine_max_steps": 1 << 30},  # the warps' partials always combined
    {"lut_min_work": 0, "lut_combine_max_steps": 0},  # ... never
    {"lut_min_work": 0, "lut_warps": 4, "lut_tile": 64, "lut_maxnreg": None},
    {"lut_min_work": 0, "lut_warps": 8, "lut_tile": 32, "lut_maxnreg": 128},
    {"lut_min_work": 0, "lut_warps": 4, "lut_tile": 32, "lut_maxnreg": 168},
    {"lut_min_work": 0, "lut_tma": False},  # staging by cp.async (sm_80, and caches TMA cannot address)
    {"lut_min_work": 0, "lut_pdl_max_steps": 0},  # launched after the query rotation, not dependent on it
    {"lut_min_work": 0, "merge_rows": 16},  # 16 rows a merge program
    {"lut_min_work": 0, "merge_rows": 1},  # one row a merge program
    # 2 warps, one program per SM: many items per program (the combine's bytes reused between items), each
    # waiting for the query rotation (a no-op after the first)
    {
        "lut_min_work": 0,
        "lut_pdl_max_steps": None,
        "lut_warps": 2,
        "lut_tile": 32,
        "lut_maxnreg": 168,
        "lut_programs_per_sm": 1,
        "lut_combine_max_steps": 1 << 30,
    },
]


@pytest.mark.parametrize("config", TRITON_CONFIGS)
@pytest.mark.parametrize("k_bits,v_bits", BIT_PAIRS)
def test_decode_gpu_triton_configs(config, k_bits, v_bits):
    """Every launch choice of the Triton kernel (the inline-PTX lookups included, which the interpreter
    cannot run) on the GPU, at every width."""
    launch = replace(DecodeLaunchConfig(), **config)
    for head_dim, group in ((128, 4), (64, 8)):
        for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 1e-2)):
            args = decode_case(k_bits, v_bits, head_dim, 16, group, dtype, [1, 17, 333, 4099], seed=k_bits)
            out = torch.full_like(args[0], float("nan"))
            tq_decode_attention(*args, out=out, config=launch)
            ref = decode_attention_reference(args[0].double(), *args[1:], compute_dtype=torch.float64)
            assert rel_err(out, ref) <= tol, (head_dim, dtype)


@pytest.mark.parametrize("k_bits,v_bits", BIT_PAIRS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_encode_dequantize_gpu(k_bits, v_bits, dtype):
    kc, vc = codec(128, k_bits, 1), codec(128, v_bits, 2)
    tokens, heads, block_size, num_blocks = 3000, 8, 16, 256
    key = torch.randn(tokens, heads, 128, device=DEV).to(dtype)
    value = torch.randn(tokens, heads, 128, device=DEV).to(dtype)
    slots = torch.randperm(num_blocks * block_size, device=DEV)[:tokens]
    slots[::7] = -1
    cache = [torch.full((num_blocks, block_size, heads, c.packed_dim), 0xA5, dtype=torch.uint8, device=DEV)
             for c in (kc, vc)]  # fmt: skip
    norms = [torch.full((num_blocks, block_size, heads), float("nan"), device=DEV) for _ in range(2)]
    tq_encode_store(key, value, slots, cache[0], norms[0], cache[1], norms[1], kc, vc)
    keep = slots >= 0
    blocks, offsets = slots[keep] // block_size, slots[keep] % block_size
    for x, c, packed, n in ((key, kc, cache[0], norms[0]), (value, vc, cache[1], norms[1])):
        want_packed, _ = c.encode(x[keep])
        got = unpack_indices(packed[blocks, offsets].contiguous(), c.bits, c.head_dim)
        bad = (got != unpack_indices(want_packed, c.bits, c.head_dim)) & ~near_boundary(x[keep], c)
        assert not bad.any(), f"{int(bad.sum())} indices differ away from a codebook boundary"
        stored = packed[blocks, offsets].contiguous()
        scales = n[blocks, offsets].double()
        torch.testing.assert_close(scales, scales_of(x[keep], stored, c), rtol=1e-5, atol=0)
        n.nan_to_num_(1.0)  # slots never written keep their poison; give them a finite norm
        ids = torch.randperm(num_blocks, device=DEV)[:100].int()
        for out_dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 8e-3)):
            out = torch.full((100, block_size, heads, 128), float("nan"), device=DEV, dtype=out_dtype)
            tq_dequantize_blocks(packed, n, ids, c, out)
            ref = c.decode(packed[ids.long()], n[ids.long()], torch.float64)
            assert rel_err(out, ref) <= tol


@pytest.mark.parametrize("k_bits,v_bits", [(4, 4), (8, 4), (2, 3)])
@pytest.mark.parametrize("dtype,shift", [(torch.bfloat16, 0), (torch.bfloat16, 3), (torch.float32, 0)])
def test_layered_encode_and_dequantize_gpu_equal_the_one_layer_kernels(k_bits, v_bits, dtype, shift):
    """One launch over 5 separately allocated FLASH_ATTN-style layers (shift: layer l starts l · shift
    elements into its allocation, so the layers' starts are not 16 bytes apart) writes the bytes the one-layer
    kernels write layer by layer; the dequantize skips the blocks whose ok flag is False."""
    kc, vc = codec(128, k_bits, 1), codec(128, v_bits, 2)
    layers, nb, bs, heads = 5, 300, 16, 8
    caches = []
    for layer in range(layers):
        flat = torch.randn(layer * shift + nb * bs * heads * 256, device=DEV).to(dtype)
        caches.append(flat[layer * shift :].view(nb, bs, heads, 256))
    k_sides, v_sides = [c[..., :128] for c in caches], [c[..., 128:] for c in caches]
    src = torch.randperm(nb, device=DEV)[:129]
    dst = torch.randperm(200, device=DEV)[:129]
    pages = [torch.full((layers, 200, bs, heads, c.packed_dim), 0xA5, dtype=torch.uint8, device=DEV)
             for c in (kc, vc)]  # fmt: skip
    norms = [torch.full((layers, 200, bs, heads), float("nan"), device=DEV) for _ in range(2)]
    tq_encode_layers(PagedLayers(k_sides), PagedLayers(v_sides), src, dst, pages[0], norms[0], pages[1],
                     norms[1], kc, vc)  # fmt: skip
    for layer in range(layers):
        want = [t[layer].clone().fill_(0xA5 if t.dtype == torch.uint8 else float("nan"))
                for t in (pages[0], norms[0], pages[1], norms[1])]  # fmt: skip
        tq_encode_blocks(k_sides[layer], v_sides[layer], src, dst, *want, kc, vc)
        for got, w in zip(
            (pages[0][layer], norms[0][layer], pages[1][layer], norms[1][layer]), want, strict=True
        ):
            assert torch.equal(got.nan_to_num(), w.nan_to_num()), f"layer {layer}"
    ok = torch.rand(129, device=DEV) > 0.2
    out_blocks = torch.randperm(nb, device=DEV)[:129]
    for side, c, packed, n in ((k_sides, kc, pages[0], norms[0]), (v_sides, vc, pages[1], norms[1])):
        want = [t.clone() for t in side]
        tq_dequantize_layers(packed, n, dst, c, PagedLayers(side), out_blocks, ok=ok)
        for layer in range(layers):
            tq_dequantize_blocks(packed[layer], n[layer], dst[ok], c, want[layer], out_blocks=out_blocks[ok])
            assert torch.equal(side[layer], want[layer]), f"layer {layer}"
    # verified in the decode: three pieces changed after their sums were taken are not written
    for side, c, packed, n in ((k_sides, kc, pages[0], norms[0]), (v_sides, vc, pages[1], norms[1])):
        expected = piece_checksums([[packed, n]], dst)[:, 0].clone()
        packed[1, dst[4], 3, 2, 5] ^= 0x40
        n[3, dst[70]].view(torch.uint8).view(-1)[9] ^= 0x02
        expected[128, 4, 0] += 1
        bad = {(4, 1), (70, 3), (128, 4)}
        got = torch.empty_like(expected)
        want = [t.clone() for t in side]
        tq_dequantize_layers(packed, n, dst, c, PagedLayers(side), out_blocks, verify=(expected, got))
        assert torch.equal(got.cpu(), piece_checksums_reference([[packed.cpu(), n.cpu()]], dst.cpu())[:, 0])
        for layer in range(layers):
            keep = torch.tensor([(i, layer) not in bad for i in range(129)], device=DEV)
            tq_dequantize_blocks(
                packed[layer], n[layer], dst[keep], c, want[layer], out_blocks=out_blocks[keep]
            )
            assert torch.equal(side[layer], want[layer]), f"verify, layer {layer}"


def lut_case(key, block_size, group, dtype, lens, seed, offset=16, v_bits=4, head_dim=128):
    """A decode problem the Gluon kernel takes: head_dim 128 or 64, strided caches viewed out of wider
    buffers at byte `offset` (16: aligned for its 16-byte copies; 4: it must decline them): each head's row
    in a wider one, or (rows not a multiple of 16 bytes, which TMA boxes take only with the heads dense) each
    token's row of heads in a wider one."""
    gen = torch.Generator().manual_seed(seed)
    bits, codebook = key
    kc = TurboQuantCodec(head_dim, bits, seed=1, codebook=codebook)
    vc = TurboQuantCodec(head_dim, v_bits, seed=2)
    num_blocks = sum(-(-n // block_size) for n in lens) + 16

    def cache(c):
        p = c.packed_dim
        dense = p % 16 != 0  # the heads of a token dense, the token rows strided
        inner = (8 * p + 16,) if dense else (8, p + 16)
        wide = torch.randint(0, 256, (num_blocks, block_size, *inner), generator=gen).to(torch.uint8).to(DEV)
        norms = torch.rand(num_blocks, block_size, 8, generator=gen) * 4 + 0.5
        if dense:
            return wide[..., offset : offset + 8 * p].view(num_blocks, block_size, 8, p), norms.to(DEV)
        return wide[..., offset : offset + p], norms.to(DEV)

    (kp, kn), (vp, vn) = cache(kc), cache(vc)
    tables = random_block_tables(lens, block_size, num_blocks, gen).to(DEV)
    query = (torch.randn(len(lens), 8 * group, head_dim, generator=gen) * 2).to(DEV, dtype)
    return query, kp, kn, vp, vn, tables, torch.tensor(lens, dtype=torch.int32, device=DEV), kc, vc


LUT_KEYS = {(4, "lloyd"): 4, (8, "lloyd"): 8, (8, "uniform"): 9}  # key (bits, codebook) → kernel key mode


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("config", LUT_CONFIGS)
@pytest.mark.parametrize("key", list(LUT_KEYS))
@pytest.mark.parametrize("v_bits", [4, 8])  # value modes 4 and 8 at their native widths
@pytest.mark.parametrize("block_size,group", [(16, 4), (32, 1), (8, 8)])
def test_decode_gpu_gluon_kernel(config, key, v_bits, block_size, group, head_dim):
    """The Gluon kernel against the float64 reference; the call must really take it (key mode checked)."""
    if not decode_lut.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    launch = replace(DecodeLaunchConfig(), **config, lut_head_dims=BOTH_HEAD_DIMS)
    for dtype in (torch.bfloat16, torch.float16):
        lens, seed = [1, 17, 333, 4099, 64], block_size + group + v_bits + head_dim
        args = lut_case(key, block_size, group, dtype, lens, seed=seed, v_bits=v_bits, head_dim=head_dim)
        mode = decode_lut.lut_mode_of(args[0], args[1], args[3], args[7], args[8], group, block_size, launch)
        assert mode == LUT_KEYS[key]
        out = torch.full_like(args[0], float("nan"))
        tq_decode_attention(*args, out=out, config=launch)
        assert not decode_lut.lut_compile_failed(
            args[0].device, launch, (key[0], v_bits), head_dim
        )  # no fallback
        ref = decode_attention_reference(args[0].double(), *args[1:], compute_dtype=torch.float64)
        assert rel_err(out, ref) <= 1e-2, dtype


EVERY_WIDTH = [(k, v) for k in range(1, 9) for v in range(1, 9)]
BOTH_HEAD_DIMS = (64, 128)  # the default (DecodeLaunchConfig.lut_head_dims), named for the tests that need it


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("k_bits,v_bits", EVERY_WIDTH)
def test_decode_gpu_gluon_kernel_every_width(k_bits, v_bits, head_dim):
    """Every width the Gluon kernel serves (keys and values of 1–8 bits at head_dim 128 and 64) against the
    float64 reference, forced onto it at a small shape (block sizes 16 and 32, G 4 and 1, float16 and
    bfloat16); widths other than its native K4V4, K8V4, K4V8 and K8V8 spread their packed bits into its 4-
    and 8-bit words and need TMA staging (sm_90+); odd widths at head_dim 64 (rows of 8·bits bytes) come by
    flat-form TMA boxes of a token's row of heads (lut_case packs those caches' heads densely)."""
    if not decode_lut.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    native = (k_bits, v_bits) in decode_lut.NATIVE_WIDTHS
    if not native and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("widths other than K4V4, K8V4, K4V8 and K8V8 take the Gluon kernel on sm_90+ only")
    served = decode_lut.lut_serves(k_bits, v_bits, head_dim)
    launch = DecodeLaunchConfig(lut_min_work=0, lut_head_dims=BOTH_HEAD_DIMS)
    for (block_size, group), dtype in zip([(16, 4), (32, 1)], [torch.bfloat16, torch.float16], strict=True):
        lens, seed = [1, 17, 333, 1030], k_bits * 8 + v_bits + head_dim
        args = lut_case((k_bits, "lloyd"), block_size, group, dtype, lens, seed=seed, v_bits=v_bits,
                        head_dim=head_dim)  # fmt: skip
        mode = decode_lut.lut_mode_of(args[0], args[1], args[3], args[7], args[8], group, block_size, launch)
        assert mode == ((4 if k_bits <= 4 else 8) if served else 0)
        out = torch.full_like(args[0], float("nan"))
        tq_decode_attention(*args, out=out, config=launch)
        assert not decode_lut.lut_compile_failed(args[0].device, launch, (k_bits, v_bits), head_dim)
        ref = decode_attention_reference(args[0].double(), *args[1:], compute_dtype=torch.float64)
        assert rel_err(out, ref) <= 1e-2, (block_size, group, dtype)
    # without TMA (sm_80, lut_tma off) the native widths stage by cp.async, the others take the Triton kernel
    no_tma = replace(launch, lut_tma=False)
    want = (4 if k_bits <= 4 else 8) if native and served else 0
    assert decode_lut.lut_mode_of(args[0], args[1], args[3], args[7], args[8], 1, 32, no_tma) == want


@pytest.mark.parametrize("head_dim", [128, 64])
def test_decode_gpu_unaligned_cache_declines_gluon(head_dim):
    """Caches the Gluon kernel cannot copy in its pieces (4-byte aligned) and blocks of fewer than 8 tokens
    take the Triton kernel, with the same result."""
    launch = DecodeLaunchConfig(lut_min_work=0, lut_head_dims=BOTH_HEAD_DIMS)
    for block_size, offset in ((16, 4), (4, 16)):
        lens = [1, 17, 333, 4099]
        args = lut_case(
            (4, "lloyd"), block_size, 4, torch.bfloat16, lens, 3, offset=offset, head_dim=head_dim
        )
        assert decode_lut.lut_mode_of(args[0], args[1], args[3], args[7], args[8], 4, block_size, launch) == 0
        out = torch.full_like(args[0], float("nan"))
        tq_decode_attention(*args, out=out, config=launch)
        ref = decode_attention_reference(args[0].double(), *args[1:], compute_dtype=torch.float64)
        assert rel_err(out, ref) <= 1e-2


GRAPH_CASES = [(TRITON_CONFIGS[0], (8, 4), 128), (TRITON_CONFIGS[1], (8, 4), 128)]
GRAPH_CASES += [({}, widths, 128) for widths in BIT_PAIRS[2:]]  # every width, through the launcher's dispatch
_GLUON = {"lut_kernel": True, "lut_min_work": 0, "lut_head_dims": BOTH_HEAD_DIMS}
_ALWAYS = {"lut_combine_max_steps": 1 << 30, "lut_pdl_max_steps": None}  # combine, dependent launch
GRAPH_CASES += [
    (_GLUON, (8, 4), 128),
    ({**_GLUON, **_ALWAYS}, (8, 4), 128),
    ({**_GLUON, "lut_pdl_max_steps": 0}, (8, 4), 128),
    (_GLUON, (6, 4), 128),  # spread widths: the presets balanced and capacity
    (_GLUON, (5, 3), 128),
    (_GLUON, (8, 8), 128),  # value mode 8
    (_GLUON, (6, 5), 128),
    # head_dim 64: K8V4, K4V4 combined and dependent, the balanced preset (spread keys), K4V8 by cp.async,
    # K2V6 (spread keys and values)
    (_GLUON, (8, 4), 64),
    ({**_GLUON, **_ALWAYS}, (4, 4), 64),
    (_GLUON, (6, 4), 64),
    ({**_GLUON, "lut_tma": False}, (4, 8), 64),
    (_GLUON, (2, 6), 64),
]


@pytest.mark.parametrize("config,widths,head_dim", GRAPH_CASES)
def test_decode_cuda_graph_capture_and_replay(config, widths, head_dim):
    launch = replace(DecodeLaunchConfig(), **config)
    longest = [900, 64, 3000]
    if config.get("lut_kernel"):
        args = lut_case((widths[0], "lloyd"), 16, 4, torch.bfloat16, longest, seed=9, v_bits=widths[1],
                        head_dim=head_dim)  # fmt: skip
        mode = decode_lut.lut_mode_of(args[0], args[1], args[3], args[7], args[8], 4, 16, launch)
        assert mode == (4 if widths[0] <= 4 else 8)
    else:
        args = decode_case(*widths, head_dim, 16, 4, torch.bfloat16, longest, seed=9)
    query = args[0]
    ws = DecodeWorkspace.allocate(query, args[5], 16, 8, config=launch)
    out = torch.empty_like(query)
    tq_decode_attention(*args, workspace=ws, out=out, config=launch)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tq_decode_attention(*args, workspace=ws, out=out, config=launch)
    for _ in range(2):
        query.copy_(torch.randn_like(query))
        args[6].copy_(torch.tensor([int(torch.randint(1, n + 1, ())) for n in longest], dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        want = tq_decode_attention(*args, config=launch)
        torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_encode_and_dequantize_cuda_graph():
    kc = codec(128, 4, 0)
    key = torch.randn(512, 8, 128, device=DEV, dtype=torch.bfloat16)
    slots = torch.randperm(64 * 16, device=DEV)[:512]
    packed = torch.zeros(64, 16, 8, kc.packed_dim, dtype=torch.uint8, device=DEV)
    norms = torch.zeros(64, 16, 8, device=DEV)
    ids = torch.arange(64, device=DEV, dtype=torch.int32)
    out = torch.empty(64, 16, 8, 128, device=DEV, dtype=torch.bfloat16)
    tq_encode_store(key, key, slots, packed, norms, packed, norms, kc, kc)
    tq_dequantize_blocks(packed, norms, ids, kc, out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tq_encode_store(key, key, slots, packed, norms, packed, norms, kc, kc)
        tq_dequantize_blocks(packed, norms, ids, kc, out)
    key.copy_(torch.randn_like(key))
    graph.replay()
    want_packed, want_norms = kc.encode(key)
    blocks, offsets = slots // 16, slots % 16
    assert (packed[blocks, offsets] != want_packed).any(-1).float().mean().item() < 2e-3
    assert rel_err(out[blocks, offsets], kc.decode(want_packed, want_norms, torch.float64)) < 1e-2


UNIFORM = [(8, "uniform", 4, "lloyd"), (8, "uniform", 4, "uniform"), (4, "lloyd", 4, "uniform")]


@pytest.mark.parametrize("codebooks", UNIFORM)
@pytest.mark.parametrize("head_dim,block_size,group", SHAPES)
def test_decode_gpu_uniform_codebooks(codebooks, head_dim, block_size, group):
    """Uniform 8-bit keys take the arithmetic path (inline PTX, LUT mode 3) with 16-bit queries, uniform 4-bit
    values the register-permute lookup; float32 queries the IEEE path. All against the float64 reference."""
    from tiercache.kernels import TurboQuantCodec
    from tiercache.kernels._tables import kernel_tables

    k_bits, k_book, v_bits, v_book = codebooks
    gen = torch.Generator().manual_seed(group)
    kc = TurboQuantCodec(head_dim, k_bits, seed=1, codebook=k_book)
    vc = TurboQuantCodec(head_dim, v_bits, seed=2, codebook=v_book)
    lut = DecodeLaunchConfig().lut
    assert (decode_module._lut_mode(kernel_tables(kc, DEV), False, True, lut) == 3) == (k_book == "uniform")
    lens = [1, 17, 333, 4099]
    num_blocks = sum(-(-n // block_size) for n in lens) + 16
    kp, kn = random_cache(num_blocks, block_size, 8, kc, gen, DEV)
    vp, vn = random_cache(num_blocks, block_size, 8, vc, gen, DEV)
    tables = random_block_tables(lens, block_size, num_blocks, gen).to(DEV)
    ctx = torch.tensor(lens, dtype=torch.int32, device=DEV)
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 1e-2)):
        query = (torch.randn(len(lens), 8 * group, head_dim, generator=gen) * 2).to(DEV, dtype)
        args = (query, kp, kn, vp, vn, tables, ctx, kc, vc)
        out = torch.full_like(query, float("nan"))
        tq_decode_attention(*args, out=out)
        ref = decode_attention_reference(query.double(), *args[1:], compute_dtype=torch.float64)
        assert rel_err(out, ref) <= tol, dtype


@pytest.mark.parametrize("pk,pv", [(64, 64), (128, 64), (256, 256), (30, 40)])
def test_piece_checksums_gpu_equal_reference_and_capture(pk, pv):
    """Realistic blocks (32 layers, block 16, 8 KV heads): the kernel's sums equal the CPU reference bit for
    bit, for the word path and the byte path (pk=30), and a captured graph recomputes them on replay."""
    gen = torch.Generator().manual_seed(pk)
    shape = (32, 48, 16, 8)
    sections = [
        torch.randint(0, 256, (*shape, pk), generator=gen, dtype=torch.uint8),
        torch.randint(0, 256, (*shape, pv), generator=gen, dtype=torch.uint8),
        torch.randn(*shape, generator=gen),
        torch.randn(*shape, generator=gen),
    ]
    groups = [[sections[0], sections[2]], [sections[1], sections[3]]]
    want = piece_checksums_reference(groups)
    on_gpu = [[t.to(DEV) for t in group] for group in groups]
    assert torch.equal(piece_checksums(on_gpu).cpu(), want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = piece_checksums(on_gpu)
    on_gpu[0][0][3, 7, 0, 0, 0] ^= 1
    graph.replay()
    sections[0][3, 7, 0, 0, 0] ^= 1
    again = piece_checksums_reference(groups)
    assert torch.equal(out.cpu(), again) and not torch.equal(again[7], want[7])
