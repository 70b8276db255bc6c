"""How a block is keyed and laid out in the remote store: its DRAM-tier bytes behind a fixed header, signed
with a keyed MAC when tiers.remote.secret is set.

Provides:
    RemoteNamespace(model, codec_id, layout, rank, mac=None)   who may read a value: fields (model_name,
                                      salt: the LMCache key's cache_salt), value_bytes; mac: the RemoteSecret
                                      that signs and checks values (None: values carry no MAC)
    encode_value(namespace, block_hash, pieces, payload, sign=True, out=None) -> the value: [value_bytes]
                                      uint8 (`out`, written in place, or a new tensor); pieces: the
                                      payload's piece checksums [2, L, 2] int64 (integrity.checksums_of)
    sign_value(namespace, value)      write the MAC of an encode_value(…, sign=False) value (in place)
    parse_header(value, namespace, block_hash) -> (checksum, pieces, payload) | RemoteMiss
    parse_headers(values, namespace, hashes) -> list of the same   a batch: its MACs checked on up to
                                      MAX_THREADS threads of kernels.checksum_host.host_threads when it
                                      holds PARALLEL_BYTES or more (hashlib releases the GIL while it
                                      hashes)
    RemoteMiss(kind, reason)          why a block's value is not served; kinds: DOWN (no value: the store is
                                      down or failed), VANISHED (the key went away after the lookup),
                                      BAD_VALUE (empty, of another size, wrong header or checksum), BAD_MAC
    value_bytes(layout)               bytes of one value of this layout (RemoteNamespace.value_bytes)
    HEADER_BYTES (256), MAGIC, VERSION (4: no MAC), VERSION_MAC (5: a MAC), OLD_VERSIONS (2, 3)

Key: model name, this rank (tensor-parallel shard), the block hash, and a salt naming the format version, the
codec id and the layout (blake2b of them): engines with another model, codec or layout ask for other keys and
never read these values; engines with a secret and without one ask for other keys too (the version differs).
Value (little-endian):
    [0:4]  MAGIC b"TCRB"     [4:6]  version          [6:8]  len(block_hash)    [8:10] len(codec_id utf-8)
    [16:24] payload bytes    [24:40] checksum (two int64: the block's, tiercache.kernels.fold_pieces of its
                             piece checksums)
    [40:104] block hash (≤ 64 bytes, zero padded)
    version 4 (no MAC):  [104:256] codec id (≤ 152 bytes, zero padded)
    version 5 (MAC):     [104:224] codec id (≤ 120 bytes, zero padded)   [224:256] MAC
    [256:256 + stride]   the block's bytes exactly as the DRAM tier holds them (BlockLayout.dram_stride bytes)
    [256 + stride:]      its piece checksums, [2, L, 2] int64 (32 bytes a layer): what the DRAM tier records
                         for the block, so that a reader whose loads verify every piece on the device (the
                         connector's workers) fills its DRAM slots without a host pass over the bytes; the
                         header's checksum is their fold (checked when parsed)
Versions 2 and 3 (2026-11) carried no piece checksums; their keys' salt names their version, so engines of
this one never ask for them (a miss, never a value read in the wrong format).
MAC: HMAC-SHA-256 under the secret of the key's identity (model name, rank, salt: a value copied under another
model's or rank's key fails), the header's first 224 bytes (block hash, codec, sizes, checksum), the
payload and the piece checksums. A reader with a secret refuses version 4 values, one without refuses
version 5 values: the version says whether a MAC is present, and each engine serves only what its own
configuration can vouch for.
The header is fixed so that a reader knows a value's size before fetching it (LMCache loads into buffers of a
given size); a value of another size fails to load, and so is a miss.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from tiercache.kernels import fold_pieces
from tiercache.kernels.checksum_host import MAX_THREADS, PARALLEL_BYTES, host_threads
from tiercache.layout import BlockLayout
from tiercache.remote.secret import RemoteSecret

MAGIC = b"TCRB"
VERSION = 4  # no MAC
VERSION_MAC = 5  # a keyed MAC at [_MAC_AT:HEADER_BYTES]
OLD_VERSIONS = (2, 3)  # without piece checksums: never read (their keys' salt differs)
HEADER_BYTES = 256
DOWN, VANISHED, BAD_VALUE, BAD_MAC = "down", "vanished", "bad_value", "bad_mac"
_FIXED = struct.Struct("<4sHHH6xQqq")  # magic, version, hash len, codec len, pad, payload len, s1, s2
_HASH_AT, _HASH_MAX = 40, 64
_CODEC_AT = 104
_MAC_AT = 224
_CODEC_MAX = {VERSION: HEADER_BYTES - _CODEC_AT, VERSION_MAC: _MAC_AT - _CODEC_AT}
_MAC_DOMAIN = b"tiercache remote value\x00"


@dataclass(frozen=True)
class RemoteMiss:
    kind: str  # DOWN | VANISHED | BAD_VALUE | BAD_MAC
    reason: str

    def __str__(self) -> str:
        return self.reason


@dataclass(frozen=True)
class RemoteNamespace:
    model: str
    codec_id: str
    layout: BlockLayout
    rank: int = 0
    mac: RemoteSecret | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        most = _CODEC_MAX[self.version]
        if len(self.codec_id.encode()) > most:
            raise ValueError(f"codec id longer than {most} bytes cannot be stored remotely: {self.codec_id}")

    @property
    def version(self) -> int:
        return VERSION if self.mac is None else VERSION_MAC

    @property
    def model_name(self) -> str:
        return self.model.replace("@", "_")  # LMCache keys use @ as their separator

    @cached_property
    def salt(self) -> str:
        lay = self.layout
        text = (f"v{self.version}|{self.codec_id}|L{lay.num_layers}|B{lay.block_size}|H{lay.num_kv_heads}|"
                f"K{lay.k_packed_dim}|V{lay.v_packed_dim}|S{lay.dram_stride}")  # fmt: skip
        return "tc-" + hashlib.blake2b(text.encode(), digest_size=12).hexdigest()

    @cached_property
    def mac_context(self) -> bytes:
        """The key's identity as the MAC covers it (length-prefixed, so no two identities read alike)."""
        parts = [self.model_name.encode(), str(self.rank).encode(), self.salt.encode()]
        return _MAC_DOMAIN + b"".join(struct.pack("<I", len(p)) + p for p in parts)

    @property
    def pieces_at(self) -> int:
        """Where a value's piece checksums start: after the header and the payload."""
        return HEADER_BYTES + self.layout.dram_stride

    @property
    def value_bytes(self) -> int:
        return value_bytes(self.layout)


def value_bytes(layout: BlockLayout) -> int:
    """Bytes of one value: the header, the payload, the piece checksums ([2, L, 2] int64)."""
    return HEADER_BYTES + layout.dram_stride + 32 * layout.num_layers


def encode_value(
    namespace: RemoteNamespace,
    block_hash: bytes,
    pieces: torch.Tensor,
    payload: torch.Tensor,
    sign: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """payload: [dram_stride] uint8 (a DRAM row); pieces: its piece checksums, [2, L, 2] int64 (those the
    DRAM tier recorded at its store). Returns the value, a [value_bytes] uint8 CPU tensor: `out` (written in
    place) or a new one. With a MAC key and sign=False the MAC is left zero, for sign_value to write later
    (off the caller's thread)."""
    layout = namespace.layout
    stride = layout.dram_stride
    if payload.dtype != torch.uint8 or payload.shape != (stride,):
        raise ValueError(f"payload must be uint8 [{stride}], got {payload.dtype} {list(payload.shape)}")
    if pieces.dtype != torch.int64 or pieces.shape != (2, layout.num_layers, 2):
        got = f"{pieces.dtype} {list(pieces.shape)}"
        raise ValueError(f"pieces must be int64 [2, {layout.num_layers}, 2], got {got}")
    pieces = pieces.cpu()
    checksum = fold_pieces(pieces.unsqueeze(0), layout.piece_words)[0].tolist()
    if len(block_hash) > _HASH_MAX:
        raise ValueError(f"block hash longer than {_HASH_MAX} bytes: {len(block_hash)}")
    codec = namespace.codec_id.encode()
    header = bytearray(HEADER_BYTES)
    _FIXED.pack_into(header, 0, MAGIC, namespace.version, len(block_hash), len(codec), stride, *checksum)
    header[_HASH_AT : _HASH_AT + len(block_hash)] = block_hash
    header[_CODEC_AT : _CODEC_AT + len(codec)] = codec
    value = torch.empty(namespace.value_bytes, dtype=torch.uint8) if out is None else out
    if value.dtype != torch.uint8 or value.shape != (namespace.value_bytes,) or value.device.type != "cpu":
        got = f"{value.dtype} {list(value.shape)} on {value.device}"
        raise ValueError(f"out must be uint8 [{namespace.value_bytes}] on the CPU, got {got}")
    # numpy's copy: one thread (torch's intra-op threads, on CPUs the engine's threads also use, took 4-6 ms
    # for a 0.8 MB block instead of 0.1-0.4: benchmarks/RESULTS.md)
    out_bytes = value.numpy()
    out_bytes[:HEADER_BYTES] = np.frombuffer(header, dtype=np.uint8)
    out_bytes[HEADER_BYTES : namespace.pieces_at] = payload.cpu().numpy()
    out_bytes[namespace.pieces_at :] = pieces.contiguous().numpy().view(np.uint8).reshape(-1)
    if sign and namespace.mac is not None:
        sign_value(namespace, value)
    return value


def sign_value(namespace: RemoteNamespace, value: torch.Tensor) -> None:
    """value: an encode_value [value_bytes] uint8 tensor of this namespace; its MAC written in place."""
    assert namespace.mac is not None and value.is_contiguous() and value.numel() == namespace.value_bytes
    mac = namespace.mac.mac(*_mac_parts(namespace, value.numpy()))
    value[_MAC_AT:HEADER_BYTES] = torch.frombuffer(bytearray(mac), dtype=torch.uint8)


def parse_headers(
    values: Sequence[torch.Tensor], namespace: RemoteNamespace, hashes: Sequence[bytes]
) -> list[tuple[tuple[int, int], torch.Tensor, torch.Tensor] | RemoteMiss]:
    """parse_header of each value (the MACs of a large batch computed on threads first). Without a MAC, the
    values exactly as encode_value writes them are parsed as one batch (a few numpy operations for all their
    headers and piece checksums: no per-field Python per value); any other goes through parse_header."""
    if namespace.mac is None:
        return _parse_plain(values, namespace, hashes)
    workers = min(torch.get_num_threads(), MAX_THREADS, len(values))
    macs: Sequence[bool | None] = [None] * len(values)
    if namespace.mac is not None and workers > 1 and sum(v.numel() for v in values) >= PARALLEL_BYTES:
        macs = list(host_threads().map(lambda v: _mac_ok(namespace, v), values))
    return [parse_header(v, namespace, h, ok) for v, h, ok in zip(values, hashes, macs, strict=True)]


def parse_header(
    value: torch.Tensor, namespace: RemoteNamespace, block_hash: bytes, mac_ok: bool | None = None
) -> tuple[tuple[int, int], torch.Tensor, torch.Tensor] | RemoteMiss:
    """((s1, s2), pieces [2, L, 2] int64 (a copy), payload view [dram_stride] uint8) when the value is of this
    namespace's size, signed as it requires (its MAC checked first, before any field is trusted), its header
    names this block, codec and size and its piece checksums fold to the header's; else why not. Whether the
    payload has those piece checksums is the reader's to verify (on the host, or on the device at each load).
    mac_ok: the MAC's check when already made (parse_headers)."""
    if value.numel() != namespace.value_bytes:
        return RemoteMiss(BAD_VALUE, f"value is {value.numel()} bytes, expected {namespace.value_bytes}")
    data = value.numpy()
    header = data[:HEADER_BYTES].tobytes()
    magic, version, hash_len, codec_len, size, s1, s2 = _FIXED.unpack_from(header, 0)
    if magic != MAGIC or version not in _CODEC_MAX:
        return RemoteMiss(BAD_VALUE, f"not a tiercache block value (magic {magic!r}, version {version})")
    refused = _mac_refusal(namespace, version, header, data, mac_ok)
    if refused is not None:
        return RemoteMiss(BAD_MAC, refused)
    if hash_len > _HASH_MAX or codec_len > _CODEC_MAX[version]:
        return RemoteMiss(
            BAD_VALUE, f"corrupted header (hash length {hash_len}, codec id length {codec_len})"
        )
    codec = header[_CODEC_AT : _CODEC_AT + codec_len].decode(errors="replace")
    if codec != namespace.codec_id:
        return RemoteMiss(
            BAD_VALUE, f"codec mismatch: stored with {codec[:60]!r}, this engine uses {namespace.codec_id!r}"
        )
    stored_hash = header[_HASH_AT : _HASH_AT + hash_len]
    if stored_hash != block_hash:
        return RemoteMiss(BAD_VALUE, f"block hash mismatch: value holds block {stored_hash.hex()[:16]}")
    if size != namespace.layout.dram_stride:
        return RemoteMiss(
            BAD_VALUE, f"payload is {size} bytes, this layout's blocks are {namespace.layout.dram_stride}"
        )
    layers = namespace.layout.num_layers
    pieces = torch.from_numpy(data[namespace.pieces_at :].copy().view(np.int64).reshape(2, layers, 2))
    folded = tuple(fold_pieces(pieces.unsqueeze(0), namespace.layout.piece_words)[0].tolist())
    if folded != (s1, s2):
        return RemoteMiss(BAD_VALUE, "corrupted piece checksums: they do not fold to the header's checksum")
    return (s1, s2), pieces, value[HEADER_BYTES : namespace.pieces_at]


def _parse_plain(
    values: Sequence[torch.Tensor], namespace: RemoteNamespace, hashes: Sequence[bytes]
) -> list[tuple[tuple[int, int], torch.Tensor, torch.Tensor] | RemoteMiss]:
    """parse_headers without a MAC: the values whose header is this namespace's template with their block's
    hash and a checksum their piece checksums fold to are accepted together; parse_header answers for the
    others (why not, or yes where only the zero padding differs)."""
    out: list = [None] * len(values)
    size, at = namespace.value_bytes, namespace.pieces_at
    sized = [i for i, v in enumerate(values) if v.numel() == size and len(hashes[i]) <= _HASH_MAX]
    if sized:
        datas = [values[i].numpy() for i in sized]
        heads = np.stack([d[:HEADER_BYTES] for d in datas])  # [m, 256] uint8
        tails = np.stack([d[at:] for d in datas])  # [m, 32 L] uint8: copies
        template, fixed = _template(namespace)
        expected = np.zeros((len(sized), _HASH_MAX + 2), dtype=np.uint8)  # the hash length, then the hash
        for row, i in enumerate(sized):
            expected[row, :2] = (len(hashes[i]), 0)
            expected[row, 2 : 2 + len(hashes[i])] = np.frombuffer(hashes[i], dtype=np.uint8)
        ok = (heads[:, fixed] == template[fixed]).all(axis=1)
        ok &= (heads[:, 6:8] == expected[:, :2]).all(axis=1)
        ok &= (heads[:, _HASH_AT : _HASH_AT + _HASH_MAX] == expected[:, 2:]).all(axis=1)
        layers = namespace.layout.num_layers
        pieces = torch.from_numpy(tails.view(np.int64).reshape(len(sized), 2, layers, 2))
        sums = heads[:, 24:40].copy().view(np.int64)  # [m, 2]
        ok &= (fold_pieces(pieces, namespace.layout.piece_words).numpy() == sums).all(axis=1)
        for row, i in enumerate(sized):
            if ok[row]:
                checksum = (int(sums[row, 0]), int(sums[row, 1]))
                out[i] = checksum, pieces[row], values[i][HEADER_BYTES:at]
    return [
        got if got is not None else parse_header(v, namespace, h)
        for got, v, h in zip(out, values, hashes, strict=True)
    ]


@functools.cache
def _template_of(namespace_key: tuple) -> tuple[np.ndarray, np.ndarray]:
    version, codec, stride = namespace_key
    header = bytearray(HEADER_BYTES)
    _FIXED.pack_into(header, 0, MAGIC, version, 0, len(codec), stride, 0, 0)
    header[_CODEC_AT : _CODEC_AT + len(codec)] = codec
    fixed = np.ones(HEADER_BYTES, dtype=bool)  # what every value of the namespace holds alike
    fixed[6:8] = fixed[24:40] = fixed[_HASH_AT : _HASH_AT + _HASH_MAX] = False  # hash length, checksum, hash
    return np.frombuffer(bytes(header), dtype=np.uint8), fixed


def _template(namespace: RemoteNamespace) -> tuple[np.ndarray, np.ndarray]:
    """(the header every value of this namespace has, the bytes that hold alike in all of them)."""
    return _template_of((namespace.version, namespace.codec_id.encode(), namespace.layout.dram_stride))


def _mac_refusal(
    namespace: RemoteNamespace, version: int, header: bytes, data, ok: bool | None
) -> str | None:
    if version != namespace.version and namespace.mac is None:
        return "value carries a MAC (written by an engine with tiers.remote.secret); this engine has none"
    if version != namespace.version:
        return "value carries no MAC and tiers.remote.secret is set: forged, or written without the secret"
    if namespace.mac is None:
        return None
    if ok is None:
        ok = namespace.mac.verify(header[_MAC_AT:], *_mac_parts(namespace, data))
    return None if ok else "MAC mismatch: forged, copied from another key, or written with another secret"


def _mac_ok(namespace: RemoteNamespace, value: torch.Tensor) -> bool | None:
    """The MAC check of a value of this namespace's size and version (None for any other: parse_header
    refuses it before its MAC matters)."""
    if namespace.mac is None or value.numel() != namespace.value_bytes:
        return None
    data = value.numpy()
    if struct.unpack_from("<H", data, 4)[0] != namespace.version:
        return None
    return namespace.mac.verify(data[_MAC_AT:HEADER_BYTES].tobytes(), *_mac_parts(namespace, data))


def _mac_parts(namespace: RemoteNamespace, data) -> tuple[bytes, memoryview, memoryview]:
    """What a value's MAC covers: the key's identity, the header before the MAC, the payload and the piece
    checksums (no copies)."""
    view = memoryview(data)
    return namespace.mac_context, view[:_MAC_AT], view[HEADER_BYTES:]
