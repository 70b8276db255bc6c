"""tiers.remote.secret: the key of the remote values' MAC, read from an environment variable or a file.

Provides:
    RemoteSecret(source, name, key)     source "env" | "file", name: the variable or the path; the key bytes
                                        never appear in repr/str, messages or logs
        .mac(*parts) -> bytes           HMAC-SHA-256 of the parts (bytes-like, fed in order) under the key
        .verify(mac, *parts) -> bool    constant-time comparison with .mac(*parts)
        .to_dict() -> {source: name}    what the config writes back (never the key)
    read_secret(raw, key_name) -> RemoteSecret   raises ValueError whose message names the key and the fix,
                                        never the secret (nor a literal given in its place)
    SECRET_SOURCES ("env", "file"), MIN_SECRET_BYTES (16), MAX_SECRET_BYTES (4096)

The key is the variable's value or the file's bytes, surrounding whitespace stripped (a trailing newline from
`echo` or an editor is not part of it). Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from pathlib import Path

from tiercache.files import NotRegularFile, read_regular

SECRET_SOURCES = ("env", "file")
MIN_SECRET_BYTES = 16  # 128 bits when random
MAX_SECRET_BYTES = 4096  # a longer file is the wrong file
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_SHOWN_ENV = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")
_SHOWN_PATH = re.compile(r"^[~/.]|\.[A-Za-z0-9]{1,8}$")
_FORMS = "secret: {env: NAME} (an environment variable) or secret: {file: PATH}"
_MAKE = "e.g. `openssl rand -hex 32`"


class RemoteSecret:
    __slots__ = ("_key", "name", "source")

    def __init__(self, source: str, name: str, key: bytes) -> None:
        assert source in SECRET_SOURCES and isinstance(key, bytes) and key
        self.source, self.name, self._key = source, name, key

    def mac(self, *parts: bytes | memoryview) -> bytes:
        h = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in parts:
            h.update(part)
        return h.digest()

    def verify(self, mac: bytes, *parts: bytes | memoryview) -> bool:
        return hmac.compare_digest(mac, self.mac(*parts))

    def to_dict(self) -> dict[str, str]:
        return {self.source: self.name}

    def __repr__(self) -> str:
        return f"RemoteSecret({self.source}={self.name!r})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RemoteSecret):
            return NotImplemented
        same = hmac.compare_digest(self._key, other._key)
        return (self.source, self.name) == (other.source, other.name) and same

    def __hash__(self) -> int:
        return hash((self.source, self.name))


def read_secret(raw: object, key_name: str = "tiers.remote.secret") -> RemoteSecret:
    """The secret that `raw` ({env: NAME} or {file: PATH}) names. A str or any other value in its place is
    refused without being quoted: it may be the secret itself."""
    if not isinstance(raw, dict):
        raise ValueError(
            f"{key_name}: got {_kind(raw)} (not shown: it may be the secret itself); the secret is read from "
            f"an environment variable or a file, so that it stays out of config files and logs: {_FORMS}"
        )
    keys = [k for k in raw if k not in SECRET_SOURCES]
    if keys or len(raw) != 1:
        names = ", ".join(repr(k)[:40] for k in list(raw)[:4])
        raise ValueError(
            f"{key_name}: got keys {names or 'none'}; expected exactly one of env or file: {_FORMS}"
        )
    ((source, name),) = raw.items()
    key = (_from_env(name, key_name) if source == "env" else _from_file(name, key_name)).strip()
    where = f"environment variable {_named(name)}" if source == "env" else f"file {_path(name)}"
    if len(key) < MIN_SECRET_BYTES:
        raise ValueError(
            f"{key_name}: {where} holds {len(key)} bytes (surrounding whitespace stripped); a secret needs "
            f"at least {MIN_SECRET_BYTES}: use a random one, {_MAKE}"
        )
    return RemoteSecret(source, name, key)


def _from_env(name: object, key_name: str) -> bytes:
    if not isinstance(name, str) or not _ENV_NAME.match(name):
        raise ValueError(
            f"{key_name}.env: got {_kind(name)} that is not an environment variable name (not shown); "
            "expected letters, digits and _, e.g. {env: TIERCACHE_REMOTE_SECRET}"
        )
    value = os.environ.get(name)
    if not value:
        state = "empty" if value == "" else "not set"
        raise ValueError(
            f"{key_name}.env: environment variable {_named(name)} is {state}; set it to the same random "
            f"secret in every engine's environment ({_MAKE}), or use secret: {{file: PATH}}"
        )
    return value.encode("utf-8", "surrogateescape")


def _from_file(name: object, key_name: str) -> bytes:
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValueError(
            f"{key_name}.file: got {_kind(name)}; expected the path of a file holding the secret"
        )
    try:
        data = read_regular(Path(name).expanduser(), MAX_SECRET_BYTES + 64)
    except NotRegularFile as exc:
        raise ValueError(
            f"{key_name}.file: {_path(name)} is {exc.kind}, not a regular file; give the path of a file "
            f"holding the secret ({_MAKE} > FILE; chmod 600 FILE)"
        ) from None
    except OSError as exc:
        raise ValueError(
            f"{key_name}.file: cannot read {_path(name)} ({exc.strerror or type(exc).__name__}); give the "
            f"path of a readable file holding the secret ({_MAKE} > FILE; chmod 600 FILE)"
        ) from None
    if len(data.strip()) > MAX_SECRET_BYTES:
        raise ValueError(
            f"{key_name}.file: {_path(name)} holds more than {MAX_SECRET_BYTES} bytes: not a secret file? "
            f"Expected a file holding only the secret ({_MAKE})"
        )
    return data


def _kind(value: object) -> str:
    return "a string" if isinstance(value, str) else f"a value of type {type(value).__name__}"


def _named(name: str) -> str:
    """An environment variable's name as a message may show it: a conventional (upper-case) name; any other
    string may be the secret itself, written where its name belongs."""
    return name if _SHOWN_ENV.match(name) else "(its name is not shown: not upper case, it may be the secret)"


def _path(name: str) -> str:
    """A path as a message may show it: one that starts with /, ~ or . or ends with an extension; any other
    string may be the secret itself, written where its path belongs."""
    if not _SHOWN_PATH.search(name):
        return "(its path is not shown: use an absolute path; this one may be the secret itself)"
    text = repr(name)[1:-1]
    return text if len(text) <= 120 else text[:70] + "…" + text[-49:]
