"""Wire format of the inspection service: length-prefixed msgpack over a Unix-domain stream socket.

Provides:
    PROTOCOL_VERSION, MAX_REQUEST_BYTES (16 KiB), MAX_RESPONSE_BYTES (16 MiB), HEADER (4-byte big-endian)
    MAX_REQUEST_DEPTH (8), MAX_REQUEST_ITEMS (64), MAX_REQUEST_CONTAINERS (128)   bounds of a request,
                                       checked before any work on it (containers: before unpacking)
    InspectError                       the client-side error (a TierCacheError): the message says what to do
    ProtocolError                      a frame that cannot be read (bad length, truncated, not msgpack)
    pack_frame(obj, max_bytes) -> bytes       header + body; ProtocolError when the body exceeds max_bytes
    unpack_body(body) -> Any                   msgpack → Python (str keys and text, bytes stay bytes)
    unpack_request(body) -> Any                the same for a request, within the request bounds: more bytes
                                               that may open a list or map than MAX_REQUEST_CONTAINERS
                                               (counted in C before unpacking: a hostile request cannot make
                                               the service allocate thousands of objects, nor trigger the
                                               garbage collector on the engine's time), an array or map of
                                               more than MAX_REQUEST_ITEMS, nesting deeper than
                                               MAX_REQUEST_DEPTH → ProtocolError
    FrameBuffer(max_bytes)                     incremental reader for the server: feed(data), next_frame(),
                                               .pending (bytes buffered), .partial, .missing (bytes owed)
    send_frame(sock, obj, max_bytes, deadline=None) / recv_frame(sock, max_bytes, deadline=None)
                                               blocking helpers for the client; `deadline` (time.monotonic())
                                               bounds the whole frame, not each recv

A frame is `len(body).to_bytes(4, "big") + body`. A request body is a map
`{"v": 1, "method": str, "params": map}`; a response body is `{"ok": true, "result": ...}` or
`{"ok": false, "error": str}`. Block hashes travel as msgpack bin (bytes). A request is small (a method
name, a few filters): the bounds keep the cost of reading a hostile one to microseconds.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

import msgpack

from tiercache.errors import TierCacheError, shown

PROTOCOL_VERSION = 1
MAX_REQUEST_BYTES = 16 << 10
MAX_RESPONSE_BYTES = 16 << 20
MAX_REQUEST_DEPTH = 8
MAX_REQUEST_ITEMS = 64
MAX_REQUEST_CONTAINERS = 128
HEADER = struct.Struct(">I")
# msgpack bytes that open a map or an array (fixmap, fixarray, array16/32, map16/32); a few may be data
_CONTAINER_BYTES = bytes(range(0x80, 0xA0)) + b"\xdc\xdd\xde\xdf"
_REQUEST_LIMITS = {
    "max_array_len": MAX_REQUEST_ITEMS,
    "max_map_len": MAX_REQUEST_ITEMS,
    "max_str_len": MAX_REQUEST_BYTES,
    "max_bin_len": MAX_REQUEST_BYTES,
    "max_ext_len": 0,
}


class InspectError(TierCacheError):
    """An inspection request failed (no server, an error reply, a broken connection); the message says why
    and what to do."""


class ProtocolError(InspectError):
    """A frame that cannot be read: a length over the limit, a truncated body, a body not msgpack."""


def pack_frame(obj: Any, max_bytes: int) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    if len(body) > max_bytes:
        raise ProtocolError(f"message of {len(body):,} bytes exceeds the limit of {max_bytes:,} bytes")
    return HEADER.pack(len(body)) + body


def unpack_body(body: bytes, **limits: int) -> Any:
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True, **limits)
    except Exception as exc:  # msgpack raises several types (ExtraData, ValueError, UnicodeDecodeError, …)
        if "exceeds max_" in str(exc):
            raise ProtocolError(
                f"request too large ({exc}): a request is a small map, its lists and maps hold at most "
                f"{MAX_REQUEST_ITEMS} items"
            ) from None
        why = f"{type(exc).__name__}: {shown(str(exc), 120)}"
        raise ProtocolError(f"body is not valid msgpack ({why})") from None


def unpack_request(body: bytes) -> Any:
    containers = len(body) - len(body.translate(None, _CONTAINER_BYTES))  # an upper bound, in one C pass
    if containers > MAX_REQUEST_CONTAINERS:
        raise ProtocolError(
            f"request too large: up to {containers:,} lists or maps, the limit is {MAX_REQUEST_CONTAINERS}; "
            "a request is a small map {'method': str, 'params': {name: value}}"
        )
    request = unpack_body(body, **_REQUEST_LIMITS)
    _check_depth(request)
    return request


def _check_depth(obj: Any) -> None:
    """Iterative (no recursion), and visits at most the containers a 16 KiB frame can hold."""
    level, depth = [obj], 0
    while level:
        depth += 1
        if depth > MAX_REQUEST_DEPTH:
            raise ProtocolError(
                f"request nested deeper than {MAX_REQUEST_DEPTH} levels; send a flat map "
                "{'method': str, 'params': {name: value}}"
            )
        level = [
            child
            for item in level
            if isinstance(item, list | dict)
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, list | dict)
        ]


class FrameBuffer:
    """Bytes in, whole frame bodies out. A length prefix over max_bytes makes next_frame() raise
    ProtocolError (the stream cannot be resynchronized: the caller closes the connection)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data

    @property
    def pending(self) -> int:
        """Bytes received that are not yet taken by next_frame()."""
        return len(self._buf)

    @property
    def partial(self) -> bool:
        """Whether the first frame buffered is not yet whole (the sender owes bytes). A length prefix over
        the limit is not partial: next_frame() can tell at once that it is an error."""
        if not self._buf:
            return False
        if len(self._buf) < HEADER.size:
            return True
        length = HEADER.unpack_from(self._buf)[0]
        return length <= self.max_bytes and len(self._buf) < HEADER.size + length

    @property
    def missing(self) -> int:
        """Bytes the sender still owes for the first frame buffered: 0 when none is started or it is whole (or
        its length prefix is over the limit); while the header itself is not whole, what completes it."""
        if len(self._buf) < HEADER.size:
            return HEADER.size - len(self._buf) if self._buf else 0
        length = HEADER.unpack_from(self._buf)[0]
        return max(HEADER.size + length - len(self._buf), 0) if length <= self.max_bytes else 0

    def next_frame(self) -> bytes | None:
        if len(self._buf) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(self._buf)
        if length > self.max_bytes:
            raise ProtocolError(
                f"request length prefix says {length:,} bytes; the limit is {self.max_bytes:,} "
                "(frames are a 4-byte big-endian length, then that many bytes of msgpack)"
            )
        end = HEADER.size + length
        if len(self._buf) < end:
            return None
        body = bytes(self._buf[HEADER.size : end])
        del self._buf[:end]
        return body


def send_frame(sock: socket.socket, obj: Any, max_bytes: int, deadline: float | None = None) -> None:
    if deadline is not None:
        sock.settimeout(_remaining(deadline))  # sendall's timeout bounds the whole call
    sock.sendall(pack_frame(obj, max_bytes))


def recv_frame(sock: socket.socket, max_bytes: int, deadline: float | None = None) -> Any:
    """One whole frame from a blocking socket. With a deadline, a peer that sends slowly (a byte at a time)
    cannot stretch the wait past it: socket.timeout when it passes."""
    (length,) = HEADER.unpack(_recv_exact(sock, HEADER.size, deadline))
    if length > max_bytes:
        raise ProtocolError(f"reply length prefix says {length:,} bytes; the limit is {max_bytes:,}")
    return unpack_body(_recv_exact(sock, length, deadline))


def _recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            sock.settimeout(_remaining(deadline))
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ProtocolError(f"connection closed after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left
