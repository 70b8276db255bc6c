"""Block geometry, byte layout and tier capacities: shared by the scheduler side (the manager's capacities),
the worker side (the pools' sizes) and the planner, so both processes derive the same numbers.

Provides:
    BlockLayout(num_layers, block_size, num_kv_heads, k_packed_dim, v_packed_dim)
        .block_bytes      bytes of one block: k/v packed + k/v norms, all layers (what both tiers hold)
        .dram_stride      bytes between DRAM blocks (block_bytes rounded up to 64; block-major storage)
        .sections()       [(name, byte offset in a block, shape per block, dtype name)]
        .blocks_in(bytes, tier) / .bytes_per_token
        .piece_words      32-bit words of one checksummed piece, keys' and values' (kernels.fold_pieces)
        from_spec(spec, num_layers, num_kv_heads, head_dim, block_size, dtype_bytes)
    tier_capacities(config, layout) -> {tier: blocks}   per rank, from the config's tier sizes
    describe_tiers(capacity, layout, ranks) -> str      each tier's blocks, tokens and bytes per rank and
                                                        over all ranks (for log lines)
    contiguous_runs(slots) -> [(start, length)]         how a slot list splits into runs (a run of DRAM
                                                        slots is one DMA)

Per block (one rank's KV-head shard), in the VRAM tier's 5-D format:
    k_packed [L, BS, H, Pk] uint8   v_packed [L, BS, H, Pv] uint8   k_norms, v_norms [L, BS, H] float32
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from tiercache.codecs import NORM_BYTES, KVCodecSpec
from tiercache.wire import DRAM, VRAM

DRAM_ALIGN = 64
SECTION_ALIGN = 16


@dataclass(frozen=True)
class BlockLayout:
    num_layers: int
    block_size: int
    num_kv_heads: int
    k_packed_dim: int
    v_packed_dim: int

    def __post_init__(self) -> None:
        for name in ("num_layers", "block_size", "num_kv_heads", "k_packed_dim", "v_packed_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"BlockLayout.{name} must be a positive integer, got {value!r}")

    @classmethod
    def from_spec(
        cls,
        spec: KVCodecSpec,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        dtype_bytes: int = 2,
    ) -> BlockLayout:
        pk, pv = spec.packed_dims(head_dim, dtype_bytes)
        return cls(num_layers, block_size, num_kv_heads, pk, pv)

    @property
    def vectors(self) -> int:
        """Vectors per block per side: layers × block_size × kv_heads."""
        return self.num_layers * self.block_size * self.num_kv_heads

    def sections(self) -> list[tuple[str, int, tuple[int, ...], str]]:
        """(name, byte offset in a block, per-block shape, dtype): k_packed, v_packed, k_norms, v_norms.
        Sections start at 16-byte-aligned offsets (packed sections are padded to 16), so copies can move
        them as 8-byte words."""
        per = (self.num_layers, self.block_size, self.num_kv_heads)
        k_bytes = _round_up(self.vectors * self.k_packed_dim, SECTION_ALIGN)
        v_bytes = _round_up(self.vectors * self.v_packed_dim, SECTION_ALIGN)
        norm_bytes = self.vectors * NORM_BYTES
        return [
            ("k_packed", 0, (*per, self.k_packed_dim), "uint8"),
            ("v_packed", k_bytes, (*per, self.v_packed_dim), "uint8"),
            ("k_norms", k_bytes + v_bytes, per, "float32"),
            ("v_norms", k_bytes + v_bytes + norm_bytes, per, "float32"),
        ]

    @property
    def block_bytes(self) -> int:
        """Payload bytes per block (identical in both tiers)."""
        return self.vectors * (self.k_packed_dim + self.v_packed_dim + 2 * NORM_BYTES)

    @cached_property  # read per value by the remote and disk tiers' checks
    def dram_stride(self) -> int:
        offset = self.sections()[-1][1]
        return _round_up(offset + self.vectors * NORM_BYTES, DRAM_ALIGN)

    @property
    def piece_words(self) -> tuple[int, int]:
        """32-bit words of one checksummed piece (one side's, one layer's: its packed bytes in whole words,
        then one norm per vector) for the keys and the values: kernels.fold_pieces's words."""
        per = self.block_size * self.num_kv_heads
        return -(-per * self.k_packed_dim // 4) + per, -(-per * self.v_packed_dim // 4) + per

    @property
    def bytes_per_token(self) -> float:
        return self.block_bytes / self.block_size

    def blocks_in(self, num_bytes: int, tier: str = VRAM) -> int:
        return num_bytes // (self.dram_stride if tier == DRAM else self.block_bytes)


def tier_capacities(config, layout: BlockLayout) -> dict[str, int]:
    """{"vram": blocks, "dram": blocks} per rank for a TierCacheConfig and a per-rank BlockLayout. Sizes in
    tokens are whole blocks of block_size tokens; sizes in bytes hold floor(bytes / bytes per block) blocks
    (a DRAM block takes its 64-byte-aligned stride). A VRAM tier (or a DRAM tier other than 0) below one
    block is a ConfigError."""

    def blocks(size, tier: str) -> int:
        if size.tokens is not None:
            return size.tokens // layout.block_size
        return layout.blocks_in(size.bytes, tier)

    capacity = {VRAM: blocks(config.tiers.vram, VRAM), DRAM: blocks(config.tiers.dram, DRAM)}
    config.check_blocks(capacity, layout)  # a tier below one block: a ConfigError naming the minimum
    return capacity


def describe_tiers(capacity: dict[str, int], layout: BlockLayout, ranks: int = 1) -> str:
    """'vram 128 blocks (4,096 tokens): 4.06 MiB per rank, 8.12 MiB over 2 ranks; dram …'. Under tensor
    parallelism every rank holds the same blocks (its KV heads' share of them): tokens are the same on every
    rank, bytes add up over the ranks."""
    from tiercache.units import format_bytes

    parts = []
    for tier, blocks in capacity.items():
        per_rank = blocks * (layout.dram_stride if tier == DRAM else layout.block_bytes)
        total = "" if ranks == 1 else f", {format_bytes(per_rank * ranks)} over {ranks} ranks"
        tokens = blocks * layout.block_size
        parts.append(f"{tier} {blocks} blocks ({tokens:,} tokens): {format_bytes(per_rank)} per rank{total}")
    return "; ".join(parts)


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def contiguous_runs(slots: Sequence[int]) -> list[tuple[int, int]]:
    """[3, 4, 5, 9, 10, 2] → [(3, 3), (9, 2), (2, 1)]: maximal runs of consecutive slots, in order."""
    runs: list[tuple[int, int]] = []
    for slot in slots:
        if runs and runs[-1][0] + runs[-1][1] == slot:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((slot, 1))
    return runs
