"""Key/value codec pairs: TurboQuant presets and a lossless raw codec, one pool format for all.

Provides:
    PRESETS                      name → (key bits, value bits); None bits = lossless raw bytes
    WIDTHS_NAME                  "k<bits>v<bits>": any TurboQuant widths by name, e.g. k5v3
    PRESET_CODEBOOKS             name → (key codebook, value codebook) where not Lloyd-Max for both
    CODEBOOKS                    ("lloyd", "uniform"): Lloyd-Max, or affine centroids a kernel can compute
    KVCodecSpec                  frozen description (from a preset name or {keys: 8, values: 4}); no tensors;
                                 .codec_id(head_dim, dtype) without building anything;
                                 .exact_layers (primary mode: layers kept exact, negative = from the end)
                                 resolved for a model by .exact_layer_indices(num_layers)
    RawCodec(head_dim, dtype)    lossless: packed = the raw bytes of `dtype`, norms = zeros
    KVCodec                      a built pair: .keys, .values, .codec_id, .k_packed_dim, .v_packed_dim

Both codecs share one shape contract, so pools hold either without knowing which:
    encode(x [..., head_dim]) -> (packed [..., packed_dim] uint8, norms [...] float32)
    decode(packed, norms, dtype) -> [..., head_dim]
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from tiercache.errors import shown

# name → (key bits, value bits). None = lossless raw bytes of the model dtype. The purpose presets first,
# chosen by quality per byte on SmolLM2 (benchmarks/quality.py's simulation, then through vLLM with
# benchmarks/quality_backend.py: RESULTS.md, "Quality per byte against vLLM's fp8 cache").
PRESETS: dict[str, tuple[int | None, int | None]] = {
    "balanced": (6, 4),  # 168 B per token and head at d128: 3.05× bf16's tokens, 1.52× fp8's
    "capacity": (5, 3),  # 136 B: 3.76× bf16's tokens; K4V4's bytes at about half its ΔPPL (simulated)
    "tq4": (4, 4),
    "k8v4": (8, 4),
    "k3v4": (3, 4),
    "tq3": (3, 3),
    "k8v8": (8, 8),
    "k8v4u": (8, 4),  # uniform (affine) 8-bit keys: arithmetic centroids in the decode kernel
    "none": (None, None),
}
WIDTHS_NAME = re.compile(r"k([1-8])v([1-8])")
# name → (key codebook, value codebook); presets not listed use Lloyd-Max for both.
PRESET_CODEBOOKS: dict[str, tuple[str, str]] = {"k8v4u": ("uniform", "lloyd")}
CODEBOOKS = ("lloyd", "uniform")
NORM_BYTES = (
    4  # one float32 norm per vector (TurboQuant); raw codecs keep a zero norm so pools stay one format
)


@dataclass(frozen=True)
class KVCodecSpec:
    """Which codec keys and values use. bits None = lossless (raw bytes of the model dtype).

    key_codebook / value_codebook: "lloyd" (Lloyd-Max, lowest MSE) or "uniform" (affine centroids); they
    apply to TurboQuant sides only and must stay "lloyd" for a lossless side.
    exact_layers: primary mode's layers whose pages hold exact K/V in the model dtype (the others hold this
    codec's pages); indices as Python's, -1 the last layer. Needs TurboQuant keys and values. The name and
    codec_id stay those of the TurboQuant pages.
    """

    key_bits: int | None
    value_bits: int | None
    seed: int = 0
    rotation: str = "haar"
    key_codebook: str = "lloyd"
    value_codebook: str = "lloyd"
    exact_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check_exact_layers(self.exact_layers, self.key_bits, self.value_bits)
        for side, codebook, bits in (
            ("key", self.key_codebook, self.key_bits),
            ("value", self.value_codebook, self.value_bits),
        ):
            if codebook not in CODEBOOKS:
                raise ValueError(f"{side}_codebook must be one of {', '.join(CODEBOOKS)}, got {codebook!r}")
            if bits is None and codebook != "lloyd":
                raise ValueError(
                    f"{side}_codebook={codebook!r} needs {side}_bits: lossless {side}s have no codebook"
                )

    @classmethod
    def from_preset(cls, name: str) -> KVCodecSpec:
        """A preset (PRESETS) or widths by name ("k5v3": 5-bit keys, 3-bit values, Lloyd-Max both)."""
        widths = WIDTHS_NAME.fullmatch(name) if isinstance(name, str) else None
        if widths:
            return cls(int(widths.group(1)), int(widths.group(2)))
        if name not in PRESETS:
            raise ValueError(
                f"unknown codec preset {name!r}; valid presets: {', '.join(PRESETS)}, or k<bits>v<bits> "
                "(bits 1..8, e.g. k5v3)"
            )
        key_codebook, value_codebook = PRESET_CODEBOOKS.get(name, ("lloyd", "lloyd"))
        return cls(*PRESETS[name], key_codebook=key_codebook, value_codebook=value_codebook)

    @property
    def name(self) -> str:
        codebooks = (self.key_codebook, self.value_codebook)
        for preset, bits in PRESETS.items():
            if bits == (self.key_bits, self.value_bits) and codebooks == PRESET_CODEBOOKS.get(
                preset, ("lloyd", "lloyd")
            ):
                return preset
        k_mark, v_mark = ("u" if codebook == "uniform" else "" for codebook in codebooks)
        return f"k{self.key_bits or 'raw'}{k_mark}v{self.value_bits or 'raw'}{v_mark}"

    def exact_layer_indices(self, num_layers: int) -> tuple[int, ...]:
        """exact_layers as sorted indices 0..num_layers-1 of a model (-1 = num_layers-1; repeats merged);
        ValueError naming the valid range for an index the model does not have."""
        out = set()
        for index in self.exact_layers:
            if not -num_layers <= index < num_layers:
                raise ValueError(
                    f"codec.exact_layers: layer {index} is out of range for a model of {num_layers} layers "
                    f"(valid: 0..{num_layers - 1}, or -{num_layers}..-1 from the last)"
                )
            out.add(index % num_layers)
        return tuple(sorted(out))

    @property
    def lossless(self) -> bool:
        return self.key_bits is None and self.value_bits is None

    def packed_dims(self, head_dim: int, dtype_bytes: int = 2) -> tuple[int, int]:
        """(key packed_dim, value packed_dim) in bytes per vector, norms excluded."""
        return _packed_dim(self.key_bits, head_dim, dtype_bytes), _packed_dim(
            self.value_bits, head_dim, dtype_bytes
        )

    def bytes_per_token(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
        """layers × kv_heads × [(packed_k + 4) + (packed_v + 4)]: what one token costs in a tier pool."""
        pk, pv = self.packed_dims(head_dim, dtype_bytes)
        return num_layers * num_kv_heads * (pk + NORM_BYTES + pv + NORM_BYTES)

    def build(self, head_dim: int, dtype: torch.dtype = torch.bfloat16) -> KVCodec:
        return KVCodec(self, head_dim, dtype)

    def codec_id(self, head_dim: int, dtype: torch.dtype = torch.bfloat16) -> str:
        """KVCodec.codec_id without building codebooks or rotations (for the scheduler side)."""
        from tiercache.kernels.codec import codec_id

        def one(bits: int | None, codebook: str) -> str:
            if bits is None:
                return f"raw1-d{head_dim}-{str(dtype).removeprefix('torch.')}"
            return codec_id(head_dim, bits, self.rotation, self.seed, codebook)

        return f"K:{one(self.key_bits, self.key_codebook)}|V:{one(self.value_bits, self.value_codebook)}"


EXACT_LAYERS_BOUND = 1 << 16  # |index| below this: more layers than any model has


def _check_exact_layers(layers, key_bits: int | None, value_bits: int | None) -> None:
    if not isinstance(layers, tuple) or not all(type(i) is int for i in layers):
        raise ValueError(f"exact_layers must be a tuple of layer indices (int), got {shown(layers)}")
    bound = EXACT_LAYERS_BOUND
    if any(not -bound <= i < bound for i in layers) or len(set(layers)) < len(layers):
        raise ValueError(
            f"exact_layers must be distinct indices within ±{EXACT_LAYERS_BOUND}: {shown(layers)}"
        )
    if layers and (key_bits is None or value_bits is None):
        raise ValueError("exact_layers needs TurboQuant keys and values (a lossless side is exact already)")


def _packed_dim(bits: int | None, head_dim: int, dtype_bytes: int) -> int:
    return head_dim * dtype_bytes if bits is None else head_dim * bits // 8


class RawCodec:
    """Lossless codec: packed = the bytes of x in `dtype`; norms are zeros (kept so pools stay one format)."""

    def __init__(self, head_dim: int, dtype: torch.dtype = torch.bfloat16) -> None:
        if not dtype.is_floating_point:
            raise ValueError(f"RawCodec dtype must be a float dtype, got {dtype}")
        self.head_dim = head_dim
        self.dtype = dtype
        self.packed_dim = head_dim * dtype.itemsize

    @property
    def codec_id(self) -> str:
        return f"raw1-d{self.head_dim}-{str(self.dtype).removeprefix('torch.')}"

    def __repr__(self) -> str:
        return f"RawCodec(head_dim={self.head_dim}, dtype={self.dtype})"

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"encode: x last dimension must be head_dim={self.head_dim}, got {tuple(x.shape)}"
            )
        packed = x.to(self.dtype).contiguous().view(torch.uint8)
        return packed, torch.zeros(x.shape[:-1], dtype=torch.float32, device=x.device)

    def decode(
        self, packed: torch.Tensor, norms: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        if packed.dtype != torch.uint8 or packed.shape[-1] != self.packed_dim:
            raise ValueError(
                f"decode: packed must be uint8 [..., {self.packed_dim}], "
                f"got {packed.dtype} {tuple(packed.shape)}"
            )
        return packed.contiguous().view(self.dtype).to(dtype)


class KVCodec:
    """A built key/value codec pair for one head_dim and model dtype."""

    def __init__(self, spec: KVCodecSpec, head_dim: int, dtype: torch.dtype = torch.bfloat16) -> None:
        self.spec = spec
        self.head_dim = head_dim
        self.dtype = dtype
        self.keys = _build_one(spec.key_bits, spec.key_codebook, spec, head_dim, dtype)
        self.values = _build_one(spec.value_bits, spec.value_codebook, spec, head_dim, dtype)

    @property
    def codec_id(self) -> str:
        """Stable id of the pair; stored with every block so a mismatch becomes a miss, never wrong KV."""
        return f"K:{self.keys.codec_id}|V:{self.values.codec_id}"

    @property
    def k_packed_dim(self) -> int:
        return self.keys.packed_dim

    @property
    def v_packed_dim(self) -> int:
        return self.values.packed_dim

    def __repr__(self) -> str:
        return f"KVCodec({self.spec.name}, keys={self.keys!r}, values={self.values!r})"


def _build_one(bits: int | None, codebook: str, spec: KVCodecSpec, head_dim: int, dtype: torch.dtype):
    if bits is None:
        return RawCodec(head_dim, dtype)
    from tiercache.kernels.codec import TurboQuantCodec

    return TurboQuantCodec(head_dim, bits, seed=spec.seed, rotation=spec.rotation, codebook=codebook)
