"""Hostile or broken values in a real redis-server cost their own block, never the store (issue 42, item 2).

For each kind of bad value under one block's key (empty, deleted after the lookup as eviction does, truncated,
one byte short or long, random bytes of the right size, another block's value), a fetch of that block with
others: the bad one is a miss with its real cause, the others are served byte-exact, the store stays up (no
failure counted), the call is bounded in time, and the connections stay usable (later reads and writes go
through). The worker's RemoteSteps counts refusals by kind and warns once per kind.
"""

from __future__ import annotations

import logging
import time

import pytest
import torch
from remote_helpers import hashes, namespace, redis_key, rows, store, values

from tiercache.remote.format import BAD_VALUE, VANISHED, RemoteMiss
from tiercache.wire import RemoteCount, RemoteItem
from tiercache.worker.remote_io import RemoteBlock, read_blocks

TIMEOUT = 0.3
N, BAD = 6, 2  # blocks fetched together; the index of the bad one


def _raw(server, key: bytes) -> bytes:
    reply = server.command(b"GET", key)
    head, _, rest = reply.partition(b"\r\n")
    return rest[: int(head[1:])]


def _spoil(server, key: bytes, how: str, other: bytes) -> None:
    """Replace (or remove) the value under `key` from outside tiercache; other: another block's key."""
    value = _raw(server, key)
    new = {
        "empty": b"",
        "truncated": value[: len(value) // 2],
        "one byte short": value[:-1],
        "one byte long": value + b"\x00",
        "random bytes": bytes(torch.randint(0, 256, (len(value),), dtype=torch.uint8).tolist()),
        "another block's value": _raw(server, other),
    }.get(how)
    if new is None:
        assert server.command(b"DEL", key).startswith(b":1")
    else:
        assert server.command(b"SET", key, new).startswith(b"+OK")


SPOILS = {  # how → (kind of miss, words of its reason)
    "empty": (BAD_VALUE, "empty"),
    "deleted": (VANISHED, "vanished after the lookup"),
    "truncated": (BAD_VALUE, "not"),
    "one byte short": (BAD_VALUE, "not"),
    "one byte long": (BAD_VALUE, "not"),
    "random bytes": (BAD_VALUE, "not a tiercache block value"),
    "another block's value": (BAD_VALUE, "block hash mismatch"),
}


@pytest.mark.parametrize("how", list(SPOILS))
def test_a_bad_value_costs_its_block_only(redis_server, how):
    salt = 100 + list(SPOILS).index(how)
    ns, keys, data = namespace(model=f"hostile-{salt}"), hashes(N, salt=salt), rows(N, seed=salt)
    s = store(redis_server.url, ns, timeout=TIMEOUT, reconnect_interval=0.1)
    try:
        assert s.put(keys, values(ns, keys, data)) is None
        assert s.exists(keys).found == (True,) * N  # the fetch path: a lookup, then the get
        _spoil(redis_server, redis_key(redis_server, keys[BAD]), how, redis_key(redis_server, keys[0]))
        start = time.monotonic()
        got = read_blocks(s, keys)
        took = time.monotonic() - start
        kind, words = SPOILS[how]
        bad = got[BAD]
        assert isinstance(bad, RemoteMiss) and bad.kind == kind and words in bad.reason, bad
        for i, block in enumerate(got):
            if i != BAD:
                assert isinstance(block, RemoteBlock) and torch.equal(block.row, data[i]), (i, block)
        assert took < 3 * TIMEOUT + 1.0, took
        assert s.up and s.stats().get("failures", 0) == 0, s.stats()
        # the connections are usable: every worker's (8) reads and a write go through
        good = [k for i, k in enumerate(keys) if i != BAD]
        for _ in range(4):
            assert all(isinstance(b, RemoteBlock) for b in read_blocks(s, good + good))
        more, more_data = hashes(2, salt=salt + 50), rows(2, seed=salt + 50)
        assert s.put(more, values(ns, more, more_data)) is None
        assert all(isinstance(b, RemoteBlock) for b in read_blocks(s, more))
        assert s.up and s.stats().get("failures", 0) == 0, s.stats()
    finally:
        s.close()


@pytest.mark.parametrize("how", ["empty", "one byte short"])
def test_a_value_that_failed_to_load_is_refused_at_once_until_written_again(redis_server, how):
    """Each try of a value that failed to load would cost a timeout and the adapter's connections: it is
    refused without a fetch for refuse_for seconds, unless this store writes the block again."""
    salt = 120 + ["empty", "one byte short"].index(how)
    ns, keys, data = namespace(model=f"refuse-{salt}"), hashes(3, salt=salt), rows(3, seed=salt)
    s = store(redis_server.url, ns, timeout=TIMEOUT, refuse_for=60.0)
    try:
        assert s.put(keys, values(ns, keys, data)) is None
        _spoil(redis_server, redis_key(redis_server, keys[1]), how, b"")
        assert isinstance(read_blocks(s, keys)[1], RemoteMiss)
        replacements = s.stats()["replacements"]
        start = time.monotonic()
        again = read_blocks(s, keys)
        assert time.monotonic() - start < TIMEOUT / 2
        assert isinstance(again[1], RemoteMiss) and "refused again" in again[1].reason, again[1]
        assert isinstance(again[0], RemoteBlock) and isinstance(again[2], RemoteBlock)
        assert s.stats()["refused_again"] == 1 and s.stats()["replacements"] == replacements
        assert s.put(keys[1:2], values(ns, keys[1:2], data[1:2])) is None  # written again: served again
        (block,) = read_blocks(s, keys[1:2])
        assert isinstance(block, RemoteBlock) and torch.equal(block.row, data[1])
    finally:
        s.close()


def test_several_bad_values_in_calls_of_a_split_get(redis_server):
    """Three bad values of different kinds among 12 blocks read in calls of 4: only they are misses."""
    ns, keys, data = namespace(model="hostile-split"), hashes(12, salt=130), rows(12, seed=130)
    s = store(redis_server.url, ns, timeout=TIMEOUT, max_call_bytes=4 * ns.value_bytes)
    try:
        assert s.put(keys, values(ns, keys, data)) is None
        spoiled = {1: "empty", 6: "deleted", 10: "truncated"}
        for i, how in spoiled.items():
            _spoil(redis_server, redis_key(redis_server, keys[i]), how, b"")
        got = read_blocks(s, keys)
        assert [i for i, b in enumerate(got) if isinstance(b, RemoteMiss)] == sorted(spoiled)
        assert got[6].kind == VANISHED and got[1].kind == got[10].kind == BAD_VALUE
        assert all(torch.equal(b.row, data[i]) for i, b in enumerate(got) if isinstance(b, RemoteBlock))
        assert s.up and s.stats().get("failures", 0) == 0
    finally:
        s.close()


class _Tiers:
    """What RemoteSteps needs of a TierWorker: fill_dram, recorded; no slot checksums (so the steps check each
    payload's piece checksums on the host, as for a worker whose loads verify nothing)."""

    def __init__(self) -> None:
        self.filled: list[tuple[bytes, torch.Tensor]] = []
        self.checksums = None

    def fill_dram(self, items, rows, sums) -> None:
        self.filled += [(item.block_hash, row.clone()) for item, row in zip(items, rows, strict=True)]


def test_remote_steps_count_refusals_and_warn_once_per_kind(redis_server, caplog):
    from tiercache.config_remote import RemoteConfig
    from tiercache.connectors.worker.remote_steps import RemoteSteps

    ns, keys, data = namespace(model="hostile-steps"), hashes(8, salt=140), rows(8, seed=140)
    tiers = _Tiers()
    steps = RemoteSteps(RemoteConfig(url=redis_server.url, timeout=TIMEOUT), ns, tiers)
    try:
        assert steps.store.put(keys, values(ns, keys, data)) is None
        for i, how in {1: "empty", 3: "random bytes", 5: "truncated"}.items():
            _spoil(redis_server, redis_key(redis_server, keys[i]), how, b"")
        items = [RemoteItem(h, slot) for slot, h in enumerate(keys)]
        with caplog.at_level(logging.INFO, logger="tiercache"):
            failed = steps.fetch(items)
        assert sorted(failed) == sorted([keys[1], keys[3], keys[5]])
        assert "value never arrived" in failed[keys[1]] and "not a tiercache block value" in failed[keys[3]]
        served = dict(tiers.filled)
        assert sorted(served) == sorted(k for i, k in enumerate(keys) if i not in (1, 3, 5))
        assert all(torch.equal(served[k], data[i]) for i, k in enumerate(keys) if k in served)
        assert RemoteCount("bad_values", 3) in steps.take_counts()
        assert steps.take_counts() == ()  # reported once
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        refused = [w for w in warnings if "refused" in w]
        assert len(refused) == 1 and "remote_bad_values" in refused[0], warnings
        assert not any("down" in w for w in warnings), warnings
        stats = steps.stats()
        assert steps.store.up and stats["bad_values"] == 3
        assert stats["fetch_bytes"] >= 5 * ns.value_bytes  # the five intact values, and what the others held
        assert all(stats[f"fetch_s_{stage}"] > 0 for stage in ("exists", "get", "check", "fill")), stats
    finally:
        steps.close(timeout=5)


def test_a_store_that_stays_down_warns_once_then_counts(caplog):
    """Nothing listens on the port: the first failure is a warning naming the cause, each retry failing the
    same way only counts (the issue's "warning once a second")."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # free, and nothing will listen there
    with caplog.at_level(logging.DEBUG, logger="tiercache"):
        s = store(f"redis://127.0.0.1:{port}", timeout=0.05, reconnect_interval=0.0)
        try:
            for _ in range(4):
                answer = s.exists(hashes(2, salt=150))
                assert answer.found == (False, False) and "down" in answer.reason
            failures = s.stats()["failures"]
        finally:
            s.close()
    down = [r for r in caplog.records if "down:" in r.getMessage() and r.name.startswith("tiercache")]
    assert failures >= 5 and len(down) == failures, (failures, len(down))
    assert [r.levelno for r in down].count(logging.WARNING) == 1, [r.getMessage() for r in down]
    assert "health key" in down[0].getMessage()
