"""The parameters of the inspection methods: their bounds and checks, one set for the service and the client.

Provides:
    MAX_LIMIT (1000), MAX_FILTER (16), MAX_HASH_BYTES (64), MAX_ID_CHARS (512), DIGEST_BYTES (16)
    limit(value, default) -> int              an integer 0..MAX_LIMIT (None: the default)
    tier(value) -> str | None                 one of TIERS, or None for all
    kinds(value) -> frozenset[str] | None     a list of at most MAX_FILTER of DECISION_KINDS (None: all)
    block_hash(value) -> bytes | str          1..MAX_HASH_BYTES bytes, or their hex (a prefix is fine)
    request_key(request_id, digest) -> str | bytes   exactly one: an id of 1..MAX_ID_CHARS characters that
                                              UTF-8 can encode, or a DIGEST_BYTES prompt digest
    digest_of(prompt_tokens) -> bytes         the prompt's digest (request_log.prompt_digest) from its token
                                              ids: integers 0..2**63-1 (the client's side of request_key)

Each raises RequestError (a ValueError) naming the parameter, the value (shortened: errors.shown) and what
is valid: the service sends it back as an error reply, the client (client.py) raises it as InspectError
before anything is sent. Sizes are checked before contents, so a hostile value costs no work.
"""

from __future__ import annotations

import operator
from typing import Any

from tiercache.errors import shown
from tiercache.inspect.request_log import prompt_digest
from tiercache.inspect.shapes import RequestError
from tiercache.inspect.state import DECISION_KINDS
from tiercache.wire import TIERS

MAX_LIMIT = 1000
MAX_FILTER = 16
MAX_HASH_BYTES = 64
MAX_ID_CHARS = 512
DIGEST_BYTES = 16
MAX_TOKEN = 2**63 - 1  # prompt_digest packs token ids as signed 64-bit integers


def limit(value: Any, default: int, name: str = "limit") -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LIMIT:
        raise RequestError(f"{name}: expected an integer 0..{MAX_LIMIT}, got {shown(value, 60)}")
    return value


def tier(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or value not in TIERS):
        valid = ", ".join(TIERS)
        raise RequestError(f"tier: expected one of {valid} (or none for all), got {shown(value, 60)}")
    return value


def kinds(value: Any) -> frozenset[str] | None:
    if value is None:
        return None
    sized = isinstance(value, list) and len(value) <= MAX_FILTER  # the size first: no work on a long one
    if not sized or not all(isinstance(k, str) and k in DECISION_KINDS for k in value):
        expected = f"a list of at most {MAX_FILTER} of {', '.join(DECISION_KINDS)} (e.g. ['eviction'])"
        raise RequestError(f"kinds: expected {expected}, got {shown(value, 80)}")
    return frozenset(value)


def block_hash(value: Any) -> bytes | str:
    """bytes as given; a str as hex (possibly a prefix, resolved by explain)."""
    if isinstance(value, bytes) and 0 < len(value) <= MAX_HASH_BYTES:
        return value
    if isinstance(value, str) and len(value) <= 2 * MAX_HASH_BYTES + 4:
        text = value.strip().lower().removeprefix("0x")
        if text and all(ch in "0123456789abcdef" for ch in text):
            return text
    raise RequestError(
        f"block_hash: expected bytes or a hex string of at most {MAX_HASH_BYTES} bytes (a prefix is fine), "
        f"got {shown(value, 80)}"
    )


def request_key(request_id: Any, digest: Any) -> str | bytes:
    if (request_id is None) == (digest is None):
        raise RequestError(
            "explain_request: give exactly one of request_id (str) or prompt_digest (bytes; from the client: "
            "prompt_tokens, the prompt's token ids)"
        )
    if digest is not None:
        if not (isinstance(digest, bytes) and len(digest) == DIGEST_BYTES):
            raise RequestError(
                f"prompt_digest: expected {DIGEST_BYTES} bytes (inspect.request_log.prompt_digest of token "
                f"ids), got {shown(digest, 80)}"
            )
        return digest
    if not (isinstance(request_id, str) and 0 < len(request_id) <= MAX_ID_CHARS):
        raise RequestError(
            f"request_id: expected a string of 1..{MAX_ID_CHARS} characters (the id vLLM or its API "
            f"returned, e.g. 'cmpl-42'), got {shown(request_id, 80)}"
        )
    if not request_id.isascii():
        try:
            request_id.encode()
        except UnicodeEncodeError as exc:  # a lone surrogate: no request id has one
            raise RequestError(
                f"request_id: character {exc.start} ({request_id[exc.start]!r}) is a lone surrogate, which "
                f"UTF-8 cannot encode; pass the id as vLLM returned it, got {shown(request_id, 80)}"
            ) from None
    return request_id


def digest_of(prompt_tokens: Any) -> bytes:
    expected = f"the prompt's token ids, a non-empty list of integers 0..{MAX_TOKEN}"
    if isinstance(prompt_tokens, str | bytes | bytearray) or not hasattr(prompt_tokens, "__iter__"):
        raise RequestError(f"prompt_tokens: expected {expected}, got {shown(prompt_tokens, 80)}")
    tokens = list(prompt_tokens)
    for i, token in enumerate(tokens):
        try:
            value = operator.index(token)  # int, numpy and torch integers; not float, str, bool
        except TypeError:
            value = None
        if value is None or isinstance(token, bool) or not 0 <= value <= MAX_TOKEN:
            raise RequestError(f"prompt_tokens[{i}]: expected {expected}, got {shown(token, 60)}")
        tokens[i] = value
    if not tokens:
        raise RequestError(f"prompt_tokens: expected {expected}, got an empty one")
    return prompt_digest(tokens)
