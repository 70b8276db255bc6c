"""Per-device constant tables for the Triton kernels, in the kernels' field-major coordinate order.

Provides:
    kernel_tables(codec, device) -> KernelTables    (built once per codec and device, then cached)
    field_layout(bits, head_dim) -> (per_group, bytes_per_group, num_groups)

The kernels unpack a packed vector group by group: `num_groups` groups of `per_group` indices in
`bytes_per_group` bytes. Field k of group g is index j = g·per_group + k. Inside a kernel the unpacked
indices sit in *field-major* order, position p = k·num_groups + g, which needs no shuffle after the shifts.
Attention and rotation are invariant under a common permutation of the rotated coordinates, so the
permutation is folded into the rotation matrices here instead of being applied to data:
    y_perm = u @ rot_t_perm        (encode; rot_t_perm = Πᵀ[:, perm])
    x̂      = ŷ_perm @ rot_perm     (decode; rot_perm = Π[perm, :])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .codec import TurboQuantCodec
from .packing import group_shape


def field_layout(bits: int, head_dim: int) -> tuple[int, int, int]:
    """(indices per group, bytes per group, groups per vector) for a bit width and head_dim."""
    per_group, bytes_per_group = group_shape(bits)
    return per_group, bytes_per_group, head_dim // per_group


def split_16bit(x: torch.Tensor, dtype: torch.dtype, pieces: int) -> torch.Tensor:
    """x (float32) as a sum of `pieces` 16-bit terms, largest first: [pieces, *x.shape] of `dtype`."""
    out, rest = [], x.to(torch.float64)
    for _ in range(pieces):
        term = rest.to(dtype)
        out.append(term)
        rest = rest - term.to(torch.float64)
    return torch.stack(out)


@dataclass(frozen=True)
class KernelTables:
    bits: int
    head_dim: int
    per_group: int
    bytes_per_group: int
    num_groups: int
    perm: torch.Tensor  # [D] int64: field-major position p holds natural coordinate perm[p]
    rot_t_perm: torch.Tensor  # [D, D] f32  Πᵀ[:, perm]
    rot_perm: torch.Tensor  # [D, D] f32  Π[perm, :]
    rot_t_perm_bf16x3: torch.Tensor  # [3, D, D] bf16, sums to rot_t_perm (encode of bf16 input)
    rot_t_perm_f16x2: torch.Tensor  # [2, D, D] f16, sums to rot_t_perm (encode of f16 input)
    rot_perm_f16: torch.Tensor  # [D, D] f16 (dequantize to a 16-bit cache)
    codebook: torch.Tensor  # [2**bits] f32
    codebook_f16: torch.Tensor  # [2**bits] f16
    codebook_bf16: torch.Tensor  # [2**bits] bf16
    grid: torch.Tensor  # [cells] int32: the nearest-centroid search words, see search_line
    grid_scale: float  # y's position on the cell line (2^-GRID_FRAC_BITS cells): y · grid_scale + grid_origin
    grid_origin: float
    grid_last: int  # cells · 2^GRID_FRAC_BITS − 1, the last position on the search line
    rot_t: torch.Tensor  # [D, D] f32  Πᵀ (natural order: decode attention)
    rot_t_bf16x3: torch.Tensor  # [3, D, D] bf16, sums to rot_t (decode attention of 16-bit queries)
    rot: torch.Tensor  # [D, D] f32  Π
    byte_lut_bf16: torch.Tensor  # [256] bf16 centroids of each byte's 8/bits indices (16 bits each, packed)
    prmt_asm: str  # 4-bit: PTX for the two bf16 fields of 4 packed bytes, in registers; else ""
    uniform_step: float | None  # 8-bit symmetric uniform codebook: codebook[k] = step·(k − 127.5); else None


_CACHE: dict[tuple[str, torch.device], KernelTables] = {}
GRID_FRAC_BITS = 20  # fixed-point bits of a position inside a search cell (search_line)


def kernel_tables(codec: TurboQuantCodec, device: torch.device | str) -> KernelTables:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (codec.codec_id, device)
    if key not in _CACHE:
        with torch.device("cpu"):  # built on the host, then moved: independent of the default device
            _CACHE[key] = _build(codec, device)
    return _CACHE[key]


def _build(codec: TurboQuantCodec, device: torch.device) -> KernelTables:
    d = codec.head_dim
    per_group, bytes_per_group, num_groups = field_layout(codec.bits, d)
    k = torch.arange(per_group).repeat_interleave(num_groups)
    g = torch.arange(num_groups).repeat(per_group)
    perm = g * per_group + k
    rot = codec.rotation
    rot_t_perm = rot.t()[:, perm].contiguous()
    rot_perm = rot[perm, :].contiguous()
    cb = codec.codebook
    words, scale, origin, last = search_line(codec)
    return KernelTables(
        bits=codec.bits,
        head_dim=d,
        per_group=per_group,
        bytes_per_group=bytes_per_group,
        num_groups=num_groups,
        perm=perm.to(device),
        rot_t_perm=rot_t_perm.to(device),
        rot_perm=rot_perm.to(device),
        rot_t_perm_bf16x3=split_16bit(rot_t_perm, torch.bfloat16, 3).to(device),
        rot_t_perm_f16x2=split_16bit(rot_t_perm, torch.float16, 2).to(device),
        rot_perm_f16=rot_perm.to(torch.float16).to(device),
        codebook=cb.to(device),
        codebook_f16=cb.to(torch.float16).to(device),
        codebook_bf16=cb.to(torch.bfloat16).to(device),
        grid=words.to(device),
        grid_scale=scale,
        grid_origin=origin,
        grid_last=last,
        rot_t=rot.t().contiguous().to(device),
        rot_t_bf16x3=split_16bit(rot.t().contiguous(), torch.bfloat16, 3).to(device),
        rot=rot.contiguous().to(device),
        byte_lut_bf16=_byte_lut(codec).to(device),
        prmt_asm=prmt_fields_asm(cb) if codec.bits == 4 else "",
        uniform_step=uniform_step(cb),
    )


def search_line(codec: TurboQuantCodec) -> tuple[torch.Tensor, float, float, int]:
    """The codec's uniform-cell search table (codec._UniformGrid) for a search in fixed point: (words: one
    int32 per cell, scale, origin, last), the KernelTables grid fields. With F = GRID_FRAC_BITS, the position
    of y on the cell line in units of 2^-F cell is U = y · scale + origin (scale = inv_width · 2^F and
    origin = offset · 2^F: exactly 2^F times the codec's cell coordinate), clamped to
    [0, last = cells · 2^F − 1];
        index = (word[U >> F] + (U & (2^F − 1))) >> F
    word[k] = (base[k] << F) + 2^F − t[k], where t[k] is the first in-cell position above the boundary inside
    cell k (2^F: none), so the low sum carries into the count exactly when y is past that boundary. Equal
    to codec.encode's search except within about 2^-F cell (and the f32 rounding of U) of a boundary:
    |Δy| ≤ 1e-7 for every codebook here."""
    grid = codec.tables("cpu").grid
    frac = 2**GRID_FRAC_BITS
    if grid.cells * frac >= 2**31:
        raise ValueError(
            f"{grid.cells} search cells do not fit int32 positions with {GRID_FRAC_BITS} fraction bits; "
            f"lower GRID_FRAC_BITS in kernels/_tables.py"
        )
    scale = float(grid.inv_width) * frac  # exact: f32 times a power of two
    origin = float(grid.offset) * frac
    lower = torch.arange(grid.cells, dtype=torch.float64) * frac
    first_above = torch.floor(grid.bound.to(torch.float64) * scale + origin) + 1 - lower
    t = torch.where(torch.isfinite(first_above), first_above, torch.tensor(float(frac)))
    t = t.clamp(0, frac).to(torch.int64)
    words = ((grid.base.to(torch.int64) << GRID_FRAC_BITS) + frac - t).to(torch.int32)
    return words, scale, origin, grid.cells * frac - 1


def _byte_lut(codec: TurboQuantCodec) -> torch.Tensor:
    """For widths 2, 4, 8: entry `byte` packs the bf16 bit patterns of its 8/bits centroids, index k of the
    byte at bits 16k (int64 for 2-bit, int32 for 4-bit, the bf16 codebook itself for 8-bit).
    Other widths: the bf16 codebook (unused by the LUT path)."""
    bf16 = codec.codebook.to(torch.bfloat16)
    if codec.bits not in (2, 4):
        return bf16
    pattern = bf16.view(torch.int16).to(torch.int64) & 0xFFFF
    byte = torch.arange(256, dtype=torch.int64)
    per_byte, mask = 8 // codec.bits, (1 << codec.bits) - 1
    lut = torch.zeros(256, dtype=torch.int64)
    for k in range(per_byte):
        lut |= pattern[(byte >> (k * codec.bits)) & mask] << (16 * k)
    if codec.bits == 4:
        lut = torch.where(lut >= 2**31, lut - 2**32, lut).to(torch.int32)
    return lut


def prmt_fields_asm(codebook: torch.Tensor) -> str:
    """PTX for tl.inline_asm_elementwise(pack=4) with two bf16 outputs: 4 bytes of 4-bit indices ($4) →
    the bf16 centroids of their low nibbles ($0, $1: bytes 0–1, 2–3) and of their high nibbles ($2, $3).

    The low and high bytes of the 16 bf16 centroids are two 16-byte tables in four registers each. For the
    8 nibbles of the input, `prmt` picks bytes from entries 0–7 and from entries 8–15 (3-bit selectors), a
    third `prmt` keeps one of the two per nibble (bit 3), and four more pair low and high bytes.
    """
    pattern = [int(b) & 0xFFFF for b in codebook.to(torch.bfloat16).view(torch.int16).tolist()]
    assert len(pattern) == 16

    def words(table: list[int]) -> list[str]:
        return [hex(sum(table[4 * w + i] << (8 * i) for i in range(4))) for w in range(4)]

    lines = ["{", ".reg .b32 s, m, s1, m1, a, b, t0, t1, t2, t3, l0, l1, h0, h1;",
             "and.b32 s, $4, 0x77777777;", "and.b32 m, $4, 0x88888888;", "shr.u32 m, m, 1;",
             "or.b32 m, m, 0x32103210;", "shr.u32 s1, s, 16;", "shr.u32 m1, m, 16;"]  # fmt: skip
    for name, table in (("l", [p & 0xFF for p in pattern]), ("h", [p >> 8 for p in pattern])):
        lines += [f"mov.b32 t{i}, {w};" for i, w in enumerate(words(table))]
        for half, (sel, pick) in enumerate((("s", "m"), ("s1", "m1"))):
            lines += [f"prmt.b32 a, t0, t1, {sel};", f"prmt.b32 b, t2, t3, {sel};",
                      f"prmt.b32 {name}{half}, a, b, {pick};"]  # fmt: skip
    lines += ["prmt.b32 $0, l0, h0, 0x6240;", "prmt.b32 $1, l1, h1, 0x6240;",
              "prmt.b32 $2, l0, h0, 0x7351;", "prmt.b32 $3, l1, h1, 0x7351;", "}"]  # fmt: skip
    return " ".join(lines)


def uniform_step(codebook: torch.Tensor) -> float | None:
    """For a symmetric uniform 8-bit codebook — codebook[k] = step·(k − 127.5) to within 2 float32 ulps of its
    largest magnitude — the step, else None."""
    c = codebook.to(torch.float64)
    if c.numel() != 256:
        return None
    step = (c[-1] - c[0]).item() / 255
    k = torch.arange(256, dtype=torch.float64)
    err = (c - step * (k - 127.5)).abs().max().item()
    return step if err <= 2 * torch.finfo(torch.float32).eps * c.abs().max().item() else None


# One word of 8-bit indices k ($2) → k − 128 as two packed float16 pairs ($0: bytes 0–1, $1: bytes 2–3, low
# half first), exactly. `prmt` writes each byte under the float16 exponent of 1024 (0x64XX = 1024 + k), one
# subtraction of 1152 per pair centres it. The Triton perfield kernel calls it with pack=4 over uint8 indices;
# the Gluon kernel with pack=2 over a duplicated word axis ($3: the same word, $4, $5: its probe, unused).
# The decode kernels multiply the query by the codebook step and add step · 0.5 · Σ q to the scores:
# Σ q·c[k] = step·(Σ q·(k − 128) + Σ q/2).
UNIFORM8_ASM = " ".join([
    "{", ".reg .b32 m, c, h0, h1;", "mov.b32 m, 0x64646464;", "mov.b32 c, 0x64806480;",
    "prmt.b32 h0, $2, m, 0x4140;", "prmt.b32 h1, $2, m, 0x4342;",
    "sub.f16x2 $0, h0, c;", "sub.f16x2 $1, h1, c;", "}",
])  # fmt: skip


def _f16_bits(codebook: torch.Tensor) -> torch.Tensor:
    return codebook.to(torch.float16).view(torch.int16).to(torch.int64) & 0xFFFF


def f16_pair_lut(codebook: torch.Tensor) -> torch.Tensor:
    """Codebook of 2^b ≤ 16 centroids → int32 [256]: entry e packs float16 c[e & m] (low half) and
    c[(e >> 4) & m] (high half), m = 2^b − 1: a byte of two nibbles, each index in its nibble's low bits."""
    bits, m = _f16_bits(codebook), _index_mask(codebook, 16)
    e = torch.arange(256)
    return _as_int32(bits[e & m] | (bits[(e >> 4) & m] << 16))


def f16_byte_lut(codebook: torch.Tensor) -> torch.Tensor:
    """Codebook of 2^b ≤ 256 centroids → int32 [256]: entry e holds float16 c[e & (2^b − 1)] in its low half
    (a byte whose low bits are the index)."""
    return _as_int32(_f16_bits(codebook)[torch.arange(256) & _index_mask(codebook, 256)])


def _index_mask(codebook: torch.Tensor, most: int) -> int:
    n = codebook.numel()
    if n > most or n & (n - 1):
        raise ValueError(f"a {most}-entry table takes a power-of-two codebook of at most {most}, not {n}")
    return n - 1


def _as_int32(words: torch.Tensor) -> torch.Tensor:
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


_LUT_CACHE: dict[tuple, tuple[torch.Tensor, int, int]] = {}


def decode_lut_table(
    k_codec: TurboQuantCodec, v_codec: TurboQuantCodec, key_mode: int, device: torch.device
) -> tuple[torch.Tensor, int, int]:
    """The Gluon decode kernel's two 256-entry tables as int32 [256, 2] (column 0: the value table, 1: the key
    table, or the values' again), and the byte offsets (0 or 128) of the key and value tables in its
    shared-memory layout. Values: 1–4 bits (value mode 4) → f16_pair_lut, 5–8 bits (value mode 8) →
    f16_byte_lut. Keys: key_mode 4 (1–4 bits) → f16_pair_lut, 8 (5–8 bits) → f16_byte_lut, each sharing the
    values' column when equal; 9 (uniform 8-bit, arithmetic) → none."""
    key = (k_codec.codec_id, v_codec.codec_id, key_mode, device)
    if key not in _LUT_CACHE:
        v = f16_pair_lut(v_codec.codebook) if v_codec.bits <= 4 else f16_byte_lut(v_codec.codebook)
        if key_mode == 4:
            k = f16_pair_lut(k_codec.codebook)
        elif key_mode == 8:
            k = f16_byte_lut(k_codec.codebook)
        else:
            k = v  # no key table: the second one repeats the values'
        k_off = 0 if torch.equal(k, v) else 128
        _LUT_CACHE[key] = (torch.stack([v, k], dim=1).contiguous().to(device), k_off, 0)
    return _LUT_CACHE[key]
