"""piece_checksums: the Triton kernel (interpreter on CPU) equals the reference bit for bit, the reference
equals the definition computed with Python integers (wrapping included), and the guarantee holds: every
single flipped byte — packed bytes or norms, any layer — and every swap of two different words is detected;
fold_pieces gives the definition's sums over a whole block's words, pieces in (group, layer) order."""

import itertools

import pytest
import torch

from tiercache.kernels import fold_pieces, piece_checksums, piece_checksums_host, piece_words
from tiercache.kernels.reference import piece_checksums_reference

MASK = 2**64 - 1
# (layers, block_size, kv_heads, k_packed_dim, v_packed_dim): packed dims of every bit width 1–8 at d64 (8·b),
# raw float32 and bfloat16 d64, K8V4 d128, and odd pieces (not whole words: the kernel's byte path)
LAYOUTS = [(2, 16, 2, 8 * kb, 8 * vb) for kb, vb in [(4, 4), (8, 4), (2, 3), (3, 2), (4, 8), (1, 5), (6, 7)]]
LAYOUTS += [(2, 4, 2, 256, 256), (2, 4, 2, 128, 128), (3, 16, 1, 128, 64), (1, 3, 3, 30, 40), (2, 1, 1, 3, 5)]


def blocks_of(layout, n: int, seed: int) -> list[torch.Tensor]:
    """Random [L, n, …] sections like KVBlocks: k_packed, v_packed uint8, k_norms, v_norms float32."""
    layers, bs, heads, pk, pv = layout
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, 256, (layers, n, bs, heads, pk), generator=g, dtype=torch.uint8),
        torch.randint(0, 256, (layers, n, bs, heads, pv), generator=g, dtype=torch.uint8),
        torch.randn(layers, n, bs, heads, generator=g) * 3,
        torch.randn(layers, n, bs, heads, generator=g),
    ]


def kv_groups(sections):
    """KVBlocks' pieces: K = (k_packed, k_norms), V = (v_packed, v_norms)."""
    return [[sections[0], sections[2]], [sections[1], sections[3]]]


def piece_data(group, layer: int, block: int) -> bytes:
    data = b""
    for section in group:
        piece = section[layer, block].contiguous().view(torch.uint8).flatten().numpy().tobytes()
        data += piece + b"\0" * (-len(piece) % 4)
    return data


def sums_of(data: bytes) -> tuple[int, int]:
    words = [int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data), 4)]
    return sum(words) & MASK, sum((i + 1) * w for i, w in enumerate(words)) & MASK


def definition(groups, block: int) -> list[list[tuple[int, int]]]:
    """The checksums of one block's pieces [G][L] from checksum.py's definition, with Python integers."""
    return [[sums_of(piece_data(g, layer, block)) for layer in range(g[0].shape[0])] for g in groups]


def as_unsigned(sums: torch.Tensor) -> list:
    """[n, G, L, 2] int64 → [n][G][L] (s1, s2) as unsigned Python integers."""
    return [[[(a & MASK, b & MASK) for a, b in layers] for layers in block] for block in sums.tolist()]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kernel_equals_reference_and_definition(layout):
    groups = kv_groups(blocks_of(layout, 5, seed=sum(layout)))
    got = piece_checksums(groups)
    assert got.dtype == torch.int64 and got.shape == (5, 2, layout[0], 2)
    assert torch.equal(got, piece_checksums_reference(groups))
    assert as_unsigned(got) == [definition(groups, b) for b in range(5)]


@pytest.mark.parametrize("shape", ["one section", "three sections", "words and bytes"])
def test_groups_of_every_shape_equal_the_definition(shape):
    """Groups of one section, of three, and a group whose section is odd bytes beside one of whole words:
    the definition's sums, listed blocks included."""
    sections = blocks_of((2, 3, 3, 32, 30), 4, seed=11)  # v_packed: 3 · 3 · 30 bytes, not whole words
    groups = {
        "one section": [[sections[0]], [sections[2]]],
        "three sections": [[sections[0], sections[2], sections[3]], [sections[2]]],
        "words and bytes": [[sections[0], sections[2]], [sections[1], sections[3]]],
    }[shape]
    got = piece_checksums(groups)
    assert as_unsigned(got) == [definition(groups, b) for b in range(4)]
    listed = torch.tensor([3, 1, 1])
    assert torch.equal(piece_checksums(groups, listed), got[listed])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_host_path_equals_reference(layout):
    """The CPU path (two reductions per section) gives the reference's bits: all blocks, listed blocks."""
    groups = kv_groups(blocks_of(layout, 6, seed=sum(layout) + 1))
    assert torch.equal(piece_checksums_host(groups), piece_checksums_reference(groups))
    listed = torch.tensor([5, 0, 0, 3])
    assert torch.equal(piece_checksums_host(groups, listed), piece_checksums_reference(groups, listed))


@pytest.mark.parametrize("layout", LAYOUTS[::3])
def test_fold_pieces_is_the_checksum_of_the_whole_block(layout):
    """A block's checksum from its pieces' sums equals the definition over all its words, pieces in (group,
    layer) order."""
    groups = kv_groups(blocks_of(layout, 3, seed=sum(layout) + 2))
    folded = fold_pieces(piece_checksums_reference(groups), piece_words(groups))
    for b in range(3):
        data = b"".join(piece_data(g, layer, b) for g in groups for layer in range(layout[0]))
        assert tuple(x & MASK for x in folded[b].tolist()) == sums_of(data)


def test_strided_sections_and_dram_like_views():
    """Sections that are views with gaps between blocks (a DRAM pool's rows) give the same sums as copies."""
    layout = (2, 16, 2, 32, 24)
    dense = blocks_of(layout, 4, seed=3)
    rows = torch.zeros(2, 4, 7000, dtype=torch.uint8)  # [L, n, row]: each piece sits inside a longer row
    views = []
    offset = 0
    for t in dense:
        raw = t.reshape(2, 4, -1).view(torch.uint8)
        width = raw.shape[2]
        rows[:, :, offset : offset + width] = raw
        view = rows[:, :, offset : offset + width]
        views.append(view.view(t.dtype).view(t.shape) if t.dtype != torch.uint8 else view.view(t.shape))
        offset += width + 20  # keeps 4-byte alignment: the word path, with strides
    want = piece_checksums_reference(kv_groups(dense))
    assert torch.equal(piece_checksums(kv_groups(views)), want)
    assert torch.equal(piece_checksums_host(kv_groups(views)), want)
    odd = [[dense[0], rows[:, :, 1:37]]]  # starts off a word boundary: the byte path
    assert torch.equal(piece_checksums(odd), piece_checksums_reference(odd))
    assert torch.equal(piece_checksums_host(odd), piece_checksums_reference(odd))


def test_host_path_split_over_threads_and_read_in_place(monkeypatch):
    """Block-major DRAM rows (each section a strided view, read without a copy), split over threads by
    blocks: the reference's bits, for every block and for listed ones."""
    from tiercache.kernels import checksum_host
    from tiercache.layout import BlockLayout
    from tiercache.worker.pools import SECTIONS, block_views

    monkeypatch.setattr(checksum_host, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    layout = BlockLayout(3, 16, 2, 36, 20)
    g = torch.Generator().manual_seed(7)
    values = torch.randint(0, 256, (7, 256 + layout.dram_stride), generator=g, dtype=torch.uint8)
    blocks = block_views(values[:, 256:], layout)  # rows 256 bytes apart past a header, as a fetch's
    groups = kv_groups([getattr(blocks, name) for name in SECTIONS])
    copies = [[t.contiguous() for t in group] for group in groups]
    assert torch.equal(piece_checksums_host(groups), piece_checksums_reference(copies))
    listed = torch.tensor([6, 2, 2, 0, 5])
    assert torch.equal(piece_checksums_host(groups, listed), piece_checksums_reference(copies, listed))


def test_sums_wrap_like_the_definition():
    """Words of 0xFFFFFFFF over more than 2^16 positions: S2 exceeds 2^64 and wraps the same everywhere."""
    section = torch.full((1, 2, 70000 * 4), 255, dtype=torch.uint8)
    section[0, 1, ::7] = 3
    groups = [[section]]
    got = piece_checksums(groups)
    assert torch.equal(got, piece_checksums_reference(groups))
    assert torch.equal(piece_checksums_host(groups), got)
    assert as_unsigned(got) == [definition(groups, 0), definition(groups, 1)]


@pytest.mark.parametrize("layout", [(2, 2, 1, 4, 8), (2, 1, 2, 3, 5)])
def test_every_single_byte_flip_is_detected(layout):
    """Each byte of the block (packed bytes and norms, every layer), flipped by one bit, by 0x80 and by 0xFF,
    in copies of the block batched as n blocks: every copy's checksum differs from the original's."""
    one = blocks_of(layout, 1, seed=11)
    sizes = [piece_numel(t) for t in one]
    flips = [(s, pos, x) for s, size in enumerate(sizes) for pos in range(size) for x in (0x01, 0x80, 0xFF)]
    copies = [t.expand(t.shape[0], len(flips), *t.shape[2:]).contiguous() for t in one]
    raw = [c.view(torch.uint8).view(c.shape[0], len(flips), -1) for c in copies]  # [L, n, bytes per layer]
    for b, (s, pos, x) in enumerate(flips):
        per_layer = raw[s].shape[2]
        raw[s][pos // per_layer, b, pos % per_layer] ^= x
    sums = piece_checksums_reference(kv_groups(copies))
    original = piece_checksums_reference(kv_groups(one))
    assert (sums != original).flatten(1).any(1).all()
    sample = torch.arange(0, len(flips), 17)  # the kernel on a sample (it equals the reference above)
    picked = [c.index_select(1, sample) for c in copies]
    assert torch.equal(piece_checksums(kv_groups(picked)), sums[sample])


def test_every_swap_of_two_different_words_is_detected():
    """All pairs of words of a small block (within a piece, across layers and sections) swapped."""
    one = blocks_of((2, 2, 1, 4, 8), 1, seed=5)
    words = [t.contiguous().view(torch.uint8).view(t.shape[0], -1).view(torch.int32) for t in one]  # [L, w]
    where = [(s, *at) for s, w in enumerate(words) for at in itertools.product(*map(range, w.shape))]
    pairs = [(a, b) for a, b in itertools.combinations(where, 2) if words[a[0]][a[1:]] != words[b[0]][b[1:]]]
    n = len(pairs)
    copies = [w.unsqueeze(1).expand(w.shape[0], n, w.shape[1]).contiguous() for w in words]
    for k, (a, b) in enumerate(pairs):
        x, y = copies[a[0]][a[1], k, a[2]].clone(), copies[b[0]][b[1], k, b[2]].clone()
        copies[a[0]][a[1], k, a[2]], copies[b[0]][b[1], k, b[2]] = y, x
    sums = piece_checksums_reference(kv_groups(copies))
    original = piece_checksums_reference(kv_groups([w.unsqueeze(1) for w in words]))
    assert n > 150 and (sums != original).flatten(1).any(1).all()


def test_random_two_byte_changes_are_detected():
    one = blocks_of((3, 4, 2, 16, 8), 1, seed=9)
    flat = torch.cat([t.contiguous().view(torch.uint8).flatten() for t in one])
    g = torch.Generator().manual_seed(1)
    n = 2000
    copies = flat.expand(n, -1).clone()
    pos = torch.stack([torch.randperm(flat.numel(), generator=g)[:2] for _ in range(n)])
    delta = torch.randint(1, 256, (n, 2), generator=g, dtype=torch.uint8)
    rows = torch.arange(n).unsqueeze(1)
    copies[rows, pos] ^= delta
    sections, offset = [], 0
    for t in one:
        size = t.numel() * t.element_size()
        part = copies[:, offset : offset + size].reshape(n, t.shape[0], -1).transpose(0, 1)
        sections.append(part)
        offset += size
    original = piece_checksums_reference(kv_groups(one))
    unchanged = [s.index_select(1, torch.tensor([0])).clone() for s in sections]
    for s, t in zip(unchanged, one, strict=True):  # the byte views are laid out as the sections are
        s.view(-1).copy_(t.contiguous().view(torch.uint8).view(-1))
    assert torch.equal(piece_checksums_reference(kv_groups(unchanged)), original)
    assert (piece_checksums_reference(kv_groups(sections)) != original).flatten(1).any(1).all()


def test_bad_sections_are_refused():
    with pytest.raises(ValueError, match="at least one group"):
        piece_checksums([])
    with pytest.raises(ValueError, match="at least one group"):
        piece_checksums([[]])
    a = torch.zeros(2, 3, 4, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"section 1 of group 0 must be \[2, 3, …\]"):
        piece_checksums([[a, torch.zeros(2, 4, 4)]])
    with pytest.raises(ValueError, match=r"section 0 of group 1 must be \[2, 3, …\]"):
        piece_checksums([[a], [torch.zeros(3, 3, 4)]])
    with pytest.raises(ValueError, match="1-D int tensor"):
        piece_checksums([[a]], torch.tensor([0.0]))
    assert piece_checksums([[a[:, :0]]]).shape == (0, 1, 2, 2)
    with pytest.raises(ValueError, match="2 piece sizes for 1 groups"):
        fold_pieces(torch.zeros(1, 1, 2, 2, dtype=torch.int64), [3, 4])


def piece_numel(t: torch.Tensor) -> int:
    """Bytes of one block of a section, all layers."""
    return t.shape[0] * t[0, 0].numel() * t.element_size()
