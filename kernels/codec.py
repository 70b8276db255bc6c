"""TurboQuant codec (Zandieh et al., arXiv:2504.19874), pure PyTorch.

Provides:
    TurboQuantCodec(head_dim, bits, seed, rotation, codebook)   encode / decode of [..., head_dim] vectors
    SUPPORTED_HEAD_DIMS, CODEBOOK_KINDS ("lloyd", "uniform")

Encode x ∈ R^d: γ = ‖x‖, u = x/γ, y = Π·u, each y_j → index of the nearest centroid (Lloyd-Max, or the
best affine codebook c_k = step·(k − (2^bits − 1)/2) with codebook="uniform"), pack the indices; store
(packed, s) with the unbiased scale s = γ/⟨y, ŷ⟩ (format 2). Decode: ŷ = c[idx], x̂ = s·Πᵀ·ŷ.
The scale makes x̂'s component along x exactly x: x̂ = x + e with e ⟂ x, so ⟨q, x̂⟩ is unbiased over the
rotation (format 1 stored γ, which shrinks every decoded vector by ⟨y, ŷ⟩ ≈ 1 − D on average: attention
scores of 4-bit keys by ~1 %). On SmolLM2 it cuts ΔPPL from +8.2 % to +7.6 % (K4V4) and from +1.37 % to
+1.12 % (K6V4) at no cost in bytes or in the decode (benchmarks/RESULTS.md, issue 35). ⟨y, ŷ⟩ > 0 for every
unit vector: each ŷ_j has y_j's sign and |ŷ_j| ≥ the smallest centroid magnitude (no codebook here has a zero
centroid). This is the reference every Triton kernel is checked against and the CPU path of the tiers and
the connector.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .codebook import CODEBOOKS
from .packing import VALID_BITS, group_shape, pack_indices, unpack_indices
from .rotation import ROTATIONS, haar_rotation, hadamard_rotation

SUPPORTED_HEAD_DIMS = (64, 80, 96, 112, 128, 160, 192, 256)
CODEBOOK_KINDS = tuple(CODEBOOKS)  # ("lloyd", "uniform")
CODEC_FORMAT_VERSION = 2  # 2: the stored norm is the unbiased scale γ/⟨y, ŷ⟩ (1: γ)


class TurboQuantCodec:
    """One TurboQuant quantizer: fixed head_dim, bit width, rotation kind, seed and codebook kind.

    codebook="lloyd" (Lloyd-Max, lowest MSE) or "uniform" (affine: codebook[k] = float32(step·(k − (n−1)/2)),
    n = 2**bits, exact in float32, so a kernel may compute centroids instead of looking them up).

    Attributes (float32, CPU; device copies are made on first use and cached):
        codebook    [2**bits]            centroids, ascending, for a rotated unit-vector coordinate
        codebook_kind                    "lloyd" or "uniform"
        boundaries  [2**bits − 1]        midpoints between neighbouring centroids
        rotation    [head_dim, head_dim] orthogonal Π; y = rotation @ u
        packed_dim  head_dim * bits // 8 bytes per vector
        expected_mse                     E‖u − û‖² for a uniformly random unit vector u, from the density's
                                         per-coordinate MSE D·d = δ: δ/(1 − δ) with the unbiased scale (to
                                         first order in the spread of ⟨y, ŷ⟩)
        codec_id                         stable string naming (format, head_dim, bits, rotation, seed,
                                         codebook: "-uniform" appended; Lloyd-Max ids carry no suffix)
    """

    def __init__(
        self,
        head_dim: int = 128,
        bits: int = 4,
        seed: int = 0,
        rotation: str = "haar",
        codebook: str = "lloyd",
    ) -> None:
        _validate(head_dim, bits, seed, rotation, codebook)
        self.head_dim = head_dim
        self.bits = bits
        self.seed = seed
        self.rotation_kind = rotation
        self.codebook_kind = codebook
        self.packed_dim = head_dim * bits // 8
        centroids, boundaries, mse_per_coordinate = CODEBOOKS[codebook](head_dim, bits)
        shrunk_mse = head_dim * mse_per_coordinate  # E‖u − Πᵀŷ‖²: the error of γ·Πᵀŷ on unit vectors
        self.expected_mse = shrunk_mse / (1.0 - shrunk_mse)
        matrix = haar_rotation(head_dim, seed) if rotation == "haar" else hadamard_rotation(head_dim, seed)
        with torch.device("cpu"):  # host copies, whatever the caller's default device (vLLM's is CUDA)
            self.codebook = torch.tensor(centroids, dtype=torch.float32)
            self.boundaries = torch.tensor(boundaries, dtype=torch.float32)
            self.rotation = torch.tensor(matrix, dtype=torch.float32)
        self._tables: dict[torch.device, _DeviceTables] = {}

    @property
    def codec_id(self) -> str:
        return codec_id(self.head_dim, self.bits, self.rotation_kind, self.seed, self.codebook_kind)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TurboQuantCodec) and other.codec_id == self.codec_id

    def __hash__(self) -> int:
        return hash(self.codec_id)

    def __repr__(self) -> str:
        return (
            f"TurboQuantCodec(head_dim={self.head_dim}, bits={self.bits}, seed={self.seed}, "
            f"rotation={self.rotation_kind!r}, codebook={self.codebook_kind!r})"
        )

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., head_dim] float → (packed [..., packed_dim] uint8, scales [...] float32), on x's device.
        The scale is γ/⟨y, ŷ⟩ (module docstring); pools and pages call it the vector's norm."""
        self._check_input(x)
        tables = self.tables(x.device)
        x32 = x.to(torch.float32)
        norms = torch.linalg.vector_norm(x32, dim=-1)
        # A zero vector gets u = 0, which quantizes to the centre cells and decodes to 0·(…) = 0.
        unit = x32 / norms.clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(-1)
        rotated = unit @ tables.rotation_t
        idx = tables.quantize(rotated)
        return pack_indices(idx, self.bits), unbiased_scale(norms, rotated, tables.codebook[idx.long()])

    def decode(
        self, packed: torch.Tensor, norms: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """(packed [..., packed_dim] uint8, norms [...]) → x̂ [..., head_dim] of `dtype`."""
        if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
            got = getattr(packed, "dtype", type(packed).__name__)
            raise ValueError(f"decode: packed must be a uint8 tensor, got {got}")
        if packed.shape[-1] != self.packed_dim:
            raise ValueError(
                f"decode: packed last dimension is {packed.shape[-1]}, expected packed_dim={self.packed_dim} "
                f"({self.bits}-bit, head_dim {self.head_dim}); was it encoded by another codec?"
            )
        if tuple(norms.shape) != tuple(packed.shape[:-1]):
            expected = tuple(packed.shape[:-1])
            raise ValueError(f"decode: norms shape {tuple(norms.shape)} must equal {expected}")
        tables = self.tables(packed.device)
        rotated = self.dequantize_rotated(packed, tables)
        return ((rotated @ tables.rotation) * norms.to(torch.float32).unsqueeze(-1)).to(dtype)

    def dequantize_rotated(self, packed: torch.Tensor, tables: _DeviceTables | None = None) -> torch.Tensor:
        """Codebook values ŷ = c[idx] in the rotated domain: [..., packed_dim] uint8 → [..., head_dim] f32."""
        tables = tables or self.tables(packed.device)
        if tables.byte_lut is not None:
            # Widths dividing 8: each byte maps to 8/bits whole centroids, one embedding lookup per byte.
            values = F.embedding(packed.to(torch.int64), tables.byte_lut)
            return values.reshape(*packed.shape[:-1], self.head_dim)
        return tables.codebook[unpack_indices(packed, self.bits, self.head_dim)]

    def tables(self, device: torch.device | str) -> _DeviceTables:
        """Rotation, codebook and lookup tables on `device` (built once per device)."""
        device = torch.device(device)
        if device not in self._tables:
            with torch.device("cpu"):  # built on the host, then moved: independent of the default device
                self._tables[device] = _DeviceTables.build(self, device)
        return self._tables[device]

    def _check_input(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"encode: x must be a torch.Tensor, got {type(x).__name__}")
        if not x.dtype.is_floating_point:
            raise ValueError(f"encode: x must be float16, bfloat16, float32 or float64, got {x.dtype}")
        if x.ndim == 0 or x.shape[-1] != self.head_dim:
            raise ValueError(
                f"encode: x last dimension must be head_dim={self.head_dim}, got shape {tuple(x.shape)}"
            )


class _DeviceTables:
    """Per-device copies of the codec's constant tensors."""

    def __init__(
        self,
        rotation: torch.Tensor,
        codebook: torch.Tensor,
        boundaries: torch.Tensor,
        byte_lut: torch.Tensor | None,
        grid: _UniformGrid,
    ) -> None:
        self.rotation = rotation  # [d, d]  Π
        self.rotation_t = rotation.t().contiguous()  # [d, d]  Πᵀ, so row vectors rotate as u @ Πᵀ
        self.codebook = codebook  # [2**bits]
        self.boundaries = boundaries  # [2**bits − 1]
        self.byte_lut = byte_lut  # [256, 8 // bits] centroid per index within a byte, or None
        self.grid = grid

    def quantize(self, rotated: torch.Tensor) -> torch.Tensor:
        """Index of the nearest centroid (number of boundaries strictly below each value), uint8."""
        grid = self.grid
        cell = torch.addcmul(grid.offset, rotated, grid.inv_width).clamp_(0, grid.cells - 1).to(torch.int32)
        cell = cell.reshape(-1)
        above = rotated > grid.bound.index_select(0, cell).view_as(rotated)
        return grid.base.index_select(0, cell).view_as(rotated).add_(above.view(torch.uint8))

    @classmethod
    def build(cls, codec: TurboQuantCodec, device: torch.device) -> _DeviceTables:
        per_group, bytes_per_group = group_shape(codec.bits)
        byte_lut = None
        if bytes_per_group == 1:
            byte_values = torch.arange(256, dtype=torch.uint8).unsqueeze(-1)
            byte_lut = codec.codebook[unpack_indices(byte_values, codec.bits, per_group)].to(device)
        return cls(
            codec.rotation.to(device),
            codec.codebook.to(device),
            codec.boundaries.to(device),
            byte_lut,
            _UniformGrid.build(codec.boundaries, device),
        )


class _UniformGrid:
    """Exact nearest-centroid search by table lookup instead of binary search.

    The line is cut into uniform cells no wider than half the smallest gap between boundaries, so a cell
    holds at most one boundary. For cell k: base[k] = number of boundaries below the cell, bound[k] = the
    boundary inside it (+inf if none). Then index(y) = base[cell(y)] + (y > bound[cell(y)]), which equals
    bucketize(y, boundaries) except where y lies within float rounding of a cell edge and a boundary.
    """

    def __init__(self, offset, inv_width, cells, base, bound) -> None:
        self.offset = offset  # [] float32: cell(y) = floor(y · inv_width + offset)
        self.inv_width = inv_width  # [] float32
        self.cells = cells
        self.base = base  # [cells] uint8
        self.bound = bound  # [cells] float32

    @classmethod
    def build(cls, boundaries: torch.Tensor, device: torch.device) -> _UniformGrid:
        b = boundaries.to(torch.float64)
        gaps = torch.diff(b)
        width = float(gaps.min()) / 2 if len(gaps) else 1.0
        start = float(b[0]) - width
        cells = int((float(b[-1]) - start) / width) + 2
        lower_edges = start + width * torch.arange(cells, dtype=torch.float64)
        base = torch.searchsorted(b, lower_edges, right=False)  # boundaries strictly below each edge
        inside = base < len(b)
        candidate = b[base.clamp(max=len(b) - 1)]
        holds = inside & (candidate < lower_edges + width)
        bound = torch.where(holds, candidate, torch.full_like(candidate, float("inf")))
        return cls(
            torch.tensor(-start / width, dtype=torch.float32, device=device),
            torch.tensor(1.0 / width, dtype=torch.float32, device=device),
            cells,
            base.to(torch.uint8).to(device),
            bound.to(torch.float32).to(device),
        )


def unbiased_scale(norms: torch.Tensor, rotated: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """γ/⟨y, ŷ⟩ per vector: norms [...] γ, rotated [..., d] y = Π·x/γ, centroids [..., d] ŷ (float32).
    A zero vector (γ = 0, so y = 0 and ⟨y, ŷ⟩ = 0) keeps scale 0; an infinite γ stays infinite."""
    dot = (rotated * centroids).sum(-1)
    return torch.where(norms > 0, norms / dot.clamp_min(torch.finfo(torch.float32).tiny), norms)


def codec_id(head_dim: int, bits: int, rotation: str, seed: int, codebook: str = "lloyd") -> str:
    """TurboQuantCodec.codec_id without building the codec (Lloyd-Max ids predate the codebook choice)."""
    suffix = "" if codebook == "lloyd" else f"-{codebook}"
    return f"tq{CODEC_FORMAT_VERSION}-d{head_dim}-b{bits}-{rotation}-s{seed}{suffix}"


def _validate(head_dim: int, bits: int, seed: int, rotation: str, codebook: str) -> None:
    if not isinstance(bits, int) or isinstance(bits, bool) or bits not in VALID_BITS:
        raise ValueError(f"bits must be an integer in 1..8, got {bits!r}")
    if rotation not in ROTATIONS:
        raise ValueError(f"rotation must be one of {ROTATIONS}, got {rotation!r}")
    if not isinstance(head_dim, int) or head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim!r}")
    if rotation == "hadamard" and head_dim & (head_dim - 1):
        powers = tuple(d for d in SUPPORTED_HEAD_DIMS if not d & (d - 1))
        raise ValueError(
            f"rotation='hadamard' needs head_dim a power of two {powers}, got {head_dim}; use rotation='haar'"
        )
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if not isinstance(codebook, str) or codebook not in CODEBOOK_KINDS:
        raise ValueError(f"codebook must be one of {CODEBOOK_KINDS}, got {codebook!r}")
