"""tiers.remote.secret against a real redis-server (issue 42, item 3): every value carries a keyed MAC over
its key's identity, header and bytes; a forged value (recomputed checksum with no MAC, a stale MAC, another
secret's MAC, a value copied from another model's key) is a miss for its block alone, counted, while the other
blocks of the fetch are served and the store stays up. Engines with and without a secret never serve each
other's values; values of the formats before piece checksums live under other keys, never read; the secret
appears in no repr, message or log line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import struct

import pytest
import torch
from remote_helpers import CODEC, LAYOUT, hashes, namespace, redis_key, rows, store, values

from tiercache.config import TierCacheConfig
from tiercache.config_remote import RemoteConfig
from tiercache.errors import ConfigError
from tiercache.remote.format import BAD_MAC, BAD_VALUE, HEADER_BYTES, VERSION, RemoteMiss, encode_value
from tiercache.remote.secret import RemoteSecret
from tiercache.worker.integrity import block_checksum, checksums_of
from tiercache.worker.pools import block_views
from tiercache.worker.remote_io import RemoteBlock, RemoteWriter, read_blocks

SECRET = b"s3cr3t-0123456789abcdef-not-for-logs"
OTHER = b"another-secret-0123456789abcdef"
N, BAD = 5, 3


def _secret(key: bytes = SECRET) -> RemoteSecret:
    return RemoteSecret("env", "TC_TEST_SECRET", key)


def _raw(server, key: bytes) -> bytes:
    head, _, rest = server.command(b"GET", key).partition(b"\r\n")
    return rest[: int(head[1:])]


def _pieces(payload: bytes) -> torch.Tensor:
    """[2, L, 2] int64: the piece checksums of a payload (a DRAM row's bytes)."""
    row = torch.frombuffer(bytearray(payload), dtype=torch.uint8)[None]
    return checksums_of(block_views(row, LAYOUT))[0]


def _tampered(value: bytes) -> tuple[bytes, bytearray]:
    """The payload with one byte changed and its piece checksums recomputed after it, and the header with
    their fold (what anyone who can write the store can do: the checksums catch corruption, not forgery)."""
    payload = bytearray(value[HEADER_BYTES : HEADER_BYTES + LAYOUT.dram_stride])
    payload[7] ^= 0x5A
    pieces = _pieces(bytes(payload))
    header = bytearray(value[:HEADER_BYTES])
    struct.pack_into("<qq", header, 24, *block_checksum(pieces[None], LAYOUT)[0].tolist())
    return bytes(payload) + pieces.numpy().tobytes(), header


def _encoded(ns, block_hash: bytes, payload: bytes) -> bytes:
    """payload: the payload, then (ignored) the piece checksums _tampered recomputed."""
    row = torch.frombuffer(bytearray(payload[: LAYOUT.dram_stride]), dtype=torch.uint8)
    return encode_value(ns, block_hash, _pieces(row.numpy().tobytes()), row).numpy().tobytes()


def _forge(how: str, genuine: bytes, block_hash: bytes, copy_from: bytes) -> bytes:
    if how == "recomputed checksum, no MAC":  # a plain (version 4) value, as an engine without secret writes
        payload, _ = _tampered(genuine)
        return _encoded(namespace(), block_hash, payload)
    if how == "recomputed checksum, stale MAC":
        payload, header = _tampered(genuine)
        return bytes(header) + payload
    if how == "recomputed checksum, zero MAC":
        payload, header = _tampered(genuine)
        header[224:256] = bytes(32)
        return bytes(header) + payload
    if how == "signed with another secret":
        payload, _ = _tampered(genuine)
        return _encoded(
            dataclasses.replace(namespace(model="secret-forge"), mac=_secret(OTHER)), block_hash, payload
        )
    assert how == "copied from another model's key"
    return copy_from


FORGERIES = [
    "recomputed checksum, no MAC",
    "recomputed checksum, stale MAC",
    "recomputed checksum, zero MAC",
    "signed with another secret",
    "copied from another model's key",
]


@pytest.mark.parametrize("how", FORGERIES)
def test_a_forged_value_is_never_served_and_costs_its_block_only(redis_server, how, caplog):
    model = "secret-forge"
    salt = 150 + FORGERIES.index(how)
    ns, keys, data = namespace(model=model), hashes(N, salt=salt), rows(N, seed=salt)
    s = store(redis_server.url, ns, secret=_secret())
    other = store(redis_server.url, namespace(model="secret-elsewhere"), secret=_secret())
    try:
        signed = s.namespace
        assert signed.mac is not None and signed.salt != ns.salt  # signed values live under other keys
        assert s.put(keys, values(signed, keys, data)) is None
        elsewhere = rows(1, seed=salt + 1)  # the same block hash, another model's (genuine, signed) value
        assert other.put(keys[BAD : BAD + 1], values(other.namespace, keys[BAD : BAD + 1], elsewhere)) is None
        key = redis_key(redis_server, keys[BAD], model)
        copy_from = _raw(redis_server, redis_key(redis_server, keys[BAD], "secret-elsewhere"))
        forged = _forge(how, _raw(redis_server, key), keys[BAD], copy_from)
        assert len(forged) == signed.value_bytes  # the right size: only the MAC can tell
        assert redis_server.command(b"SET", key, forged).startswith(b"+OK")
        with caplog.at_level(logging.DEBUG, logger="tiercache"):
            got = read_blocks(s, keys)
        bad = got[BAD]
        assert isinstance(bad, RemoteMiss) and bad.kind == BAD_MAC, bad
        for i, block in enumerate(got):
            if i != BAD:
                assert isinstance(block, RemoteBlock) and torch.equal(block.row, data[i]), i
        assert s.up and s.stats().get("failures", 0) == 0
        assert SECRET.decode() not in caplog.text and OTHER.decode() not in caplog.text
    finally:
        s.close()
        other.close()


def test_signed_values_round_trip_through_the_writer(redis_server):
    ns, keys, data = namespace(model="secret-writer"), hashes(4, salt=160), rows(4, seed=160)
    s = store(redis_server.url, ns, secret=_secret())
    writer = RemoteWriter(s, max_blocks=8)
    sums = checksums_of(block_views(data, LAYOUT))
    try:
        for h, row, x in zip(keys, data, sums, strict=True):
            assert writer.offer(h, row, x)
        assert writer.flush(5) and writer.stats()["written"] == 4
        raw = _raw(redis_server, redis_key(redis_server, keys[0]))
        assert struct.unpack_from("<H", raw, 4)[0] == 5 and raw[224:256] != bytes(32)  # version 5: a MAC
        got = read_blocks(s, keys)
        assert all(isinstance(b, RemoteBlock) for b in got), got
        assert torch.equal(torch.stack([b.row for b in got]), data)
    finally:
        writer.close()
        s.close()


def test_engines_with_and_without_a_secret_never_serve_each_others_values(redis_server):
    keys, data = hashes(2, salt=170), rows(2, seed=170)
    plain_ns = namespace(model="secret-mixed")
    plain, signed = store(redis_server.url, plain_ns), store(redis_server.url, plain_ns, secret=_secret())
    try:
        assert plain.put(keys[:1], values(plain.namespace, keys[:1], data[:1])) is None
        assert signed.put(keys[1:], values(signed.namespace, keys[1:], data[1:])) is None
        assert plain.exists(keys).found == (True, False) and signed.exists(keys).found == (False, True)
        # each value copied under the other's key: the header says whether a MAC is there
        for block_hash, src, dst in ((keys[0], plain, signed), (keys[1], signed, plain)):
            key = redis_key(redis_server, block_hash)
            copy = key.replace(src.namespace.salt.encode(), dst.namespace.salt.encode())
            assert redis_server.command(b"COPY", key, copy).startswith(b":1")
            (refused,) = read_blocks(dst, [block_hash])
            assert isinstance(refused, RemoteMiss) and refused.kind == BAD_MAC, refused
        assert "carries no MAC" in read_blocks(signed, keys[:1])[0].reason
        assert "carries a MAC" in read_blocks(plain, keys[1:])[0].reason
    finally:
        plain.close()
        signed.close()


def test_values_of_the_formats_before_piece_checksums_are_under_other_keys(redis_server, monkeypatch):
    """A value an engine of format version 2 (no MAC, no piece checksums) wrote is under a key of another
    salt: an engine of this version never finds it (a miss, never a value parsed in the wrong format)."""
    from tiercache.remote import format as fmt

    keys, data = hashes(3, salt=180), rows(3, seed=180)
    lay = LAYOUT
    old_salt_text = (f"v2|{CODEC}|L{lay.num_layers}|B{lay.block_size}|H{lay.num_kv_heads}|"
                     f"K{lay.k_packed_dim}|V{lay.v_packed_dim}|S{lay.dram_stride}")  # fmt: skip
    with monkeypatch.context() as m:
        m.setattr(fmt, "VERSION", 2)
        m.setitem(fmt._CODEC_MAX, 2, fmt._CODEC_MAX[VERSION])
        old_ns = namespace(model="secret-old")
        assert old_ns.salt == "tc-" + hashlib.blake2b(old_salt_text.encode(), digest_size=12).hexdigest()
        old = store(redis_server.url, old_ns)
        try:
            assert old.put(keys, values(old_ns, keys, data)) is None and old.exists(keys).found == (True,) * 3
        finally:
            old.close()
    ns = namespace(model="secret-old")
    assert VERSION == 4 and ns.salt != old_ns.salt
    s = store(redis_server.url, ns)
    try:
        assert s.exists(keys).found == (False,) * 3
    finally:
        s.close()


def test_the_secret_appears_in_no_repr_message_or_log(redis_server, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("TC_TEST_SECRET", SECRET.decode())
    (tmp_path / "key").write_bytes(SECRET + b"\n")
    seen: list[str] = []
    with caplog.at_level(logging.DEBUG):
        for secret in ({"env": "TC_TEST_SECRET"}, {"file": str(tmp_path / "key")}):
            cfg = TierCacheConfig.from_dict(
                {"tiers": {"remote": {"url": redis_server.url, "secret": secret}}}
            )
            remote = cfg.tiers.remote
            assert remote.secret is not None and remote.to_dict()["secret"] == secret
            assert TierCacheConfig.from_dict(cfg.to_dict()) == cfg
            seen += [repr(cfg), str(cfg.to_dict()), repr(remote.secret), str(remote.secret)]
            s = store(redis_server.url, namespace(model="secret-log"), secret=remote.secret)
            seen += [repr(s.namespace), str(s.stats())]
            s.close()
        for bad in (
            SECRET.decode(),
            {"env": SECRET.decode()},
            {"file": SECRET.decode()},
            {"env": "TC_TEST_SECRET", "x": 1},
        ):
            with pytest.raises(ConfigError) as err:
                TierCacheConfig.from_dict({"tiers": {"remote": {"url": redis_server.url, "secret": bad}}})
            seen.append(str(err.value))
            assert len(str(err.value).encode()) <= 1024
    seen.append(caplog.text)
    assert "HMAC-SHA-256" in caplog.text and "TC_TEST_SECRET" in caplog.text
    for text in seen:
        assert SECRET.decode() not in text and SECRET.decode()[:12] not in text, text


@pytest.mark.parametrize(
    ("secret", "env", "words"),
    [
        ("just-a-literal-secret-value", None, ["got a string", "not shown", "{env: NAME}"]),
        (42, None, ["int", "{env: NAME}"]),
        ({}, None, ["exactly one of env or file"]),
        ({"env": "A", "file": "/x"}, None, ["exactly one of env or file"]),
        ({"path": "/x"}, None, ["'path'", "exactly one of env or file"]),
        ({"env": "TC_UNSET_SECRET"}, None, ["TC_UNSET_SECRET", "not set", "openssl rand"]),
        ({"env": "TC_TEST_SECRET"}, "", ["TC_TEST_SECRET", "empty"]),
        ({"env": "TC_TEST_SECRET"}, "short\n", ["5 bytes", "at least 16"]),
        ({"env": "not a name"}, None, ["not an environment variable name"]),
        ({"file": "/nonexistent/tiercache-secret"}, None, ["cannot read", "/nonexistent/tiercache-secret"]),
        ({"file": 7}, None, ["secret.file", "path"]),
    ],
)
def test_bad_secret_settings_are_refused_at_load(monkeypatch, secret, env, words):
    monkeypatch.delenv("TC_UNSET_SECRET", raising=False)
    if env is not None:
        monkeypatch.setenv("TC_TEST_SECRET", env)
    with pytest.raises(ConfigError) as err:
        TierCacheConfig.from_dict(
            {"tiers": {"remote": {"url": "redis://127.0.0.1:6379", "secret": secret}}}, "t.yaml"
        )
    message = str(err.value)
    assert "tiers.remote.secret" in message and "t.yaml" in message and len(message.encode()) <= 1024
    for word in words:
        assert word in message, message
    if isinstance(secret, str):
        assert secret not in message


def test_a_secret_file_too_large_is_refused(tmp_path):
    path = tmp_path / "big.key"
    path.write_bytes(b"x" * 10_000)
    with pytest.raises(ConfigError, match="more than 4096 bytes"):
        TierCacheConfig.from_dict(
            {"tiers": {"remote": {"url": "redis://h:1", "secret": {"file": str(path)}}}}
        )


def test_a_value_refused_for_its_mac_is_counted_by_the_worker(redis_server, caplog):
    """RemoteSteps counts MAC refusals (remote_bad_macs) apart from other bad values, and warns once."""
    from tiercache.connectors.worker.remote_steps import RemoteSteps
    from tiercache.wire import RemoteCount, RemoteItem

    class Tiers:
        checksums = None  # none kept: the steps check payloads on the host

        def fill_dram(self, items, rows, sums) -> None:
            self.served = [item.block_hash for item in items]

    ns, keys, data = namespace(model="secret-steps"), hashes(4, salt=190), rows(4, seed=190)
    tiers = Tiers()
    steps = RemoteSteps(RemoteConfig(url=redis_server.url, timeout=0.5, secret=_secret()), ns, tiers)
    try:
        assert steps.store.put(keys, values(steps.store.namespace, keys, data)) is None
        for i in (1, 2):
            key = redis_key(redis_server, keys[i])
            payload, header = _tampered(_raw(redis_server, key))
            redis_server.command(b"SET", key, bytes(header) + payload)
        with caplog.at_level(logging.INFO, logger="tiercache"):
            failed = steps.fetch([RemoteItem(h, slot) for slot, h in enumerate(keys)])
        assert sorted(failed) == sorted(keys[1:3]) and tiers.served == [keys[0], keys[3]]
        assert all("MAC mismatch" in reason for reason in failed.values())
        assert RemoteCount("bad_macs", 2) in steps.take_counts()
        warned = [
            r for r in caplog.records if r.levelno == logging.WARNING and "remote_bad_macs" in r.getMessage()
        ]
        assert len(warned) == 1 and BAD_VALUE not in warned[0].getMessage()
        assert SECRET.decode() not in caplog.text
    finally:
        steps.close(timeout=5)


def test_macs_checked_on_threads_agree_with_one_by_one(monkeypatch):
    """parse_headers checks a large batch's MACs on threads: the same answers as parse_header, value by value
    (a genuine value, a tampered payload, a value without MAC, one of another size)."""
    from tiercache.remote import format as fmt

    ns = dataclasses.replace(namespace(), mac=_secret())
    keys, data = hashes(6, salt=200), rows(6, seed=200)
    vals = values(ns, keys, data)
    vals[2] = vals[2].clone()
    vals[2][HEADER_BYTES + 5] ^= 1
    vals[4] = values(namespace(), keys[4:5], data[4:5])[0]
    vals[5] = vals[5][:-1]
    one = [fmt.parse_header(v, ns, h) for v, h in zip(vals, keys, strict=True)]
    monkeypatch.setattr(fmt, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    many = fmt.parse_headers(vals, ns, keys)
    assert [type(x) for x in many] == [type(x) for x in one]
    assert [x.kind for x in many if isinstance(x, RemoteMiss)] == [BAD_MAC, BAD_MAC, BAD_VALUE]
    assert all(
        torch.equal(a[1], b[1]) for a, b in zip(one, many, strict=True) if not isinstance(a, RemoteMiss)
    )


def test_values_without_a_mac_parsed_as_a_batch_agree_with_one_by_one():
    """parse_headers without a secret takes the values as encode_value writes them together: the same answers
    as parse_header, value by value, for genuine values and each kind of bad one (another block's, another
    codec's, a changed checksum or piece checksum, a short value, a MAC'd one, non-zero padding: accepted)."""
    from tiercache.remote import format as fmt

    ns = namespace()
    keys, data = hashes(8, salt=210), rows(8, seed=210)
    vals = [v.clone() for v in values(ns, keys, data)]
    vals[1] = values(ns, keys[2:3], data[1:2])[0]  # another block's value under this key
    vals[2] = values(namespace(codec="K:tq8|V:tq8"), keys[2:3], data[2:3])[0]
    vals[3][30] ^= 1  # the header's checksum
    vals[4][-3] ^= 1  # a piece checksum
    vals[5] = vals[5][:-1]
    vals[6] = values(dataclasses.replace(ns, mac=_secret()), keys[6:7], data[6:7])[0]
    vals[7][12] = 7  # padding: parse_header ignores it
    one = [fmt.parse_header(v, ns, h) for v, h in zip(vals, keys, strict=True)]
    many = fmt.parse_headers(vals, ns, keys)
    assert [type(x) for x in many] == [type(x) for x in one]
    assert [x.reason for x in many if isinstance(x, RemoteMiss)] == [
        x.reason for x in one if isinstance(x, RemoteMiss)
    ]
    assert (
        isinstance(many[0], tuple)
        and isinstance(many[7], tuple)
        and len([x for x in many if isinstance(x, tuple)]) == 2
    )
    for a, b in ((x, y) for x, y in zip(one, many, strict=True) if isinstance(x, tuple)):
        assert a[0] == b[0] and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])


def test_a_secret_path_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path):
    """A FIFO with no writer would block the open forever: it is refused from its stat, like a directory."""
    import os

    from tiercache.remote.secret import read_secret

    fifo = tmp_path / "secret.fifo"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path):
        with pytest.raises(ValueError, match="not a regular file"):
            read_secret({"file": str(path)})
