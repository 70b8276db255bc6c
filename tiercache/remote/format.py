"""How a block is keyed and laid out in the remote store: its DRAM-tier bytes behind a fixed header.

Provides:
    RemoteNamespace(model, codec_id, layout, rank)   who may read a value: .key(block_hash) -> ObjectKey
                                      fields (model_name, kv_rank, chunk_hash, cache_salt), .value_bytes
    encode_value(namespace, block_hash, checksum, payload) -> [HEADER_BYTES + stride] uint8 tensor
    parse_header(value, namespace, block_hash) -> (checksum, payload) | reason (str)
    HEADER_BYTES (256), MAGIC

Key: model name, this rank (tensor-parallel shard), the block hash, and a salt naming the format version, the
codec id and the layout (blake2b of them): engines with another model, codec or layout ask for other keys and
never read these values. Value (little-endian):
    [0:4]  MAGIC b"TCRB"     [4:6]  version (2)      [6:8]  len(block_hash)    [8:10] len(codec_id utf-8)
    [16:24] payload bytes    [24:40] checksum (two int64: the block's, tiercache.kernels.fold_pieces of its
                             piece checksums — version 1 summed the block's words in section order)
    [40:104] block hash (≤ 64 bytes, zero padded)    [104:256] codec id (≤ 152 bytes, zero padded)
    [256:]  the block's bytes exactly as the DRAM tier holds them (BlockLayout.dram_stride bytes)
The header is fixed so that a reader knows a value's size before fetching it (LMCache loads into buffers of a
given size); a value of another size fails to load, and so is a miss.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import torch

from tiercache.layout import BlockLayout

MAGIC = b"TCRB"
VERSION = 2
HEADER_BYTES = 256
_FIXED = struct.Struct("<4sHHH6xQqq")  # magic, version, hash len, codec len, pad, payload len, s1, s2
_HASH_AT, _HASH_MAX = 40, 64
_CODEC_AT, _CODEC_MAX = 104, HEADER_BYTES - 104


@dataclass(frozen=True)
class RemoteNamespace:
    model: str
    codec_id: str
    layout: BlockLayout
    rank: int = 0

    def __post_init__(self) -> None:
        if len(self.codec_id.encode()) > _CODEC_MAX:
            raise ValueError(
                f"codec id longer than {_CODEC_MAX} bytes cannot be stored remotely: {self.codec_id}"
            )

    @property
    def model_name(self) -> str:
        return self.model.replace("@", "_")  # LMCache keys use @ as their separator

    @property
    def salt(self) -> str:
        lay = self.layout
        text = (f"v{VERSION}|{self.codec_id}|L{lay.num_layers}|B{lay.block_size}|H{lay.num_kv_heads}|"
                f"K{lay.k_packed_dim}|V{lay.v_packed_dim}|S{lay.dram_stride}")  # fmt: skip
        return "tc-" + hashlib.blake2b(text.encode(), digest_size=12).hexdigest()

    @property
    def value_bytes(self) -> int:
        return HEADER_BYTES + self.layout.dram_stride


def encode_value(
    namespace: RemoteNamespace, block_hash: bytes, checksum: tuple[int, int], payload: torch.Tensor
) -> torch.Tensor:
    """payload: [dram_stride] uint8 (a DRAM row). Returns a new [value_bytes] uint8 tensor (CPU)."""
    stride = namespace.layout.dram_stride
    if payload.dtype != torch.uint8 or payload.shape != (stride,):
        raise ValueError(f"payload must be uint8 [{stride}], got {payload.dtype} {list(payload.shape)}")
    if len(block_hash) > _HASH_MAX:
        raise ValueError(f"block hash longer than {_HASH_MAX} bytes: {len(block_hash)}")
    codec = namespace.codec_id.encode()
    header = bytearray(HEADER_BYTES)
    _FIXED.pack_into(header, 0, MAGIC, VERSION, len(block_hash), len(codec), stride, *checksum)
    header[_HASH_AT : _HASH_AT + len(block_hash)] = block_hash
    header[_CODEC_AT : _CODEC_AT + len(codec)] = codec
    value = torch.empty(namespace.value_bytes, dtype=torch.uint8)
    value[:HEADER_BYTES] = torch.frombuffer(header, dtype=torch.uint8)
    value[HEADER_BYTES:] = payload
    return value


def parse_header(
    value: torch.Tensor, namespace: RemoteNamespace, block_hash: bytes
) -> tuple[tuple[int, int], torch.Tensor] | str:
    """((s1, s2), payload view [dram_stride] uint8) when the header names this block, codec and size; else
    why not (a reason for the miss). The payload's checksum is the reader's to verify."""
    if value.numel() != namespace.value_bytes:
        return f"value is {value.numel()} bytes, expected {namespace.value_bytes}"
    header = value[:HEADER_BYTES].numpy().tobytes()
    magic, version, hash_len, codec_len, size, s1, s2 = _FIXED.unpack_from(header, 0)
    if magic != MAGIC or version != VERSION:
        return f"not a tiercache block value (magic {magic!r}, version {version})"
    if hash_len > _HASH_MAX or codec_len > _CODEC_MAX:
        return f"corrupted header (hash length {hash_len}, codec id length {codec_len})"
    codec = header[_CODEC_AT : _CODEC_AT + codec_len].decode(errors="replace")
    if codec != namespace.codec_id:
        return f"codec mismatch: stored with {codec!r}, this engine uses {namespace.codec_id!r}"
    stored_hash = header[_HASH_AT : _HASH_AT + hash_len]
    if stored_hash != block_hash:
        return f"block hash mismatch: value holds block {stored_hash.hex()[:16]}"
    if size != namespace.layout.dram_stride:
        return f"payload is {size} bytes, this layout's blocks are {namespace.layout.dram_stride}"
    return (s1, s2), value[HEADER_BYTES:]
