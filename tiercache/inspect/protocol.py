"""Wire format of the inspection service: length-prefixed msgpack over a Unix-domain stream socket.

Provides:
    PROTOCOL_VERSION, MAX_REQUEST_BYTES (1 MiB), MAX_RESPONSE_BYTES (16 MiB), HEADER (4-byte big-endian)
    InspectError                       the client-side error (a TierCacheError): the message says what to do
    ProtocolError                      a frame that cannot be read (bad length, truncated, not msgpack)
    pack_frame(obj, max_bytes) -> bytes       header + body; ProtocolError when the body exceeds max_bytes
    unpack_body(body) -> Any                   msgpack → Python (str keys and text, bytes stay bytes)
    FrameBuffer(max_bytes)                     incremental reader for the server: feed(data), next_frame()
    send_frame(sock, obj, max_bytes) / recv_frame(sock, max_bytes)   blocking helpers for the client

A frame is `len(body).to_bytes(4, "big") + body`. A request body is a map
`{"v": 1, "method": str, "params": map}`; a response body is `{"ok": true, "result": ...}` or
`{"ok": false, "error": str}`. Block hashes travel as msgpack bin (bytes).
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import msgpack

from tiercache.errors import TierCacheError

PROTOCOL_VERSION = 1
MAX_REQUEST_BYTES = 1 << 20
MAX_RESPONSE_BYTES = 16 << 20
HEADER = struct.Struct(">I")


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


def unpack_body(body: bytes) -> Any:
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several types (ExtraData, ValueError, UnicodeDecodeError, …)
        raise ProtocolError(f"body is not valid msgpack ({type(exc).__name__}: {exc})") from None


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
        """Bytes received that do not yet form a whole frame."""
        return len(self._buf)

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


def send_frame(sock: socket.socket, obj: Any, max_bytes: int) -> None:
    sock.sendall(pack_frame(obj, max_bytes))


def recv_frame(sock: socket.socket, max_bytes: int) -> Any:
    """One whole frame from a blocking socket (its timeout applies to each recv)."""
    (length,) = HEADER.unpack(_recv_exact(sock, HEADER.size))
    if length > max_bytes:
        raise ProtocolError(f"reply length prefix says {length:,} bytes; the limit is {max_bytes:,}")
    return unpack_body(_recv_exact(sock, length))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ProtocolError(f"connection closed after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
