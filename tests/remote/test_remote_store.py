"""The remote tier's store path against a real redis-server: byte-exact round trips, misses with reasons for
corrupted values and codec mismatches, the store stopped and restarted (a call meeting another thread's
reconnect waits for it; a silent one costs one timeout per reconnect interval), the bounded write-behind
queue (one existence call per batch: a block the store holds is not written again)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from remote_helpers import LAYOUT, hashes, namespace, redis_key, rows, store
from remote_helpers import values as _values

from tiercache.remote.format import BAD_VALUE, DOWN, HEADER_BYTES, RemoteMiss
from tiercache.worker.integrity import block_checksum, checksums_of
from tiercache.worker.pools import block_views
from tiercache.worker.remote_io import RemoteBlock, RemoteWriter, read_blocks, rows_of


@pytest.mark.parametrize("n", [1, 7])
def test_put_then_read_back_byte_exact(redis_server, n):
    ns, keys, data = namespace(), hashes(n, salt=n), rows(n, seed=n)
    s = store(redis_server.url, ns)
    try:
        assert s.put(keys, _values(ns, keys, data)) is None
        other = hashes(3, salt=100 + n)
        answer = s.exists([*keys, *other])
        assert answer.reason is None and answer.found == (True,) * n + (False,) * 3
        got = read_blocks(s, keys)
        assert all(isinstance(b, RemoteBlock) for b in got), got
        assert torch.equal(torch.stack([b.row for b in got]), data)
        whole = rows_of(got)  # one read, in order: its own rows, not a copy
        assert torch.equal(whole, data) and whole.data_ptr() == got[0].row.data_ptr()
        assert torch.equal(rows_of(got[::-1]), data.flip(0))  # another order: stacked
        assert [b.checksum for b in got] == [
            tuple(x) for x in block_checksum(checksums_of(block_views(data, LAYOUT)), LAYOUT).tolist()
        ]
        assert s.stats()["puts"] == n and s.stats()["lookup_hits"] == n
    finally:
        s.close()


def test_a_get_larger_than_one_call_is_split_and_stays_in_order(redis_server):
    """max_call_bytes of two values: 7 blocks come back in 4 calls, each value byte-exact and in the order
    asked."""
    ns, keys, data = namespace(model="split"), hashes(7, salt=70), rows(7, seed=70)
    s = store(redis_server.url, ns, max_call_bytes=2 * ns.value_bytes + 1)
    try:
        assert s.put(keys, _values(ns, keys, data)) is None
        order = [6, 0, 4, 3, 1, 2, 5]
        values, reasons = s.get([keys[i] for i in order])
        assert reasons == [None] * 7 and s.per_call == 2
        for i, value in zip(order, values, strict=True):
            assert torch.equal(value, _values(ns, [keys[i]], data[i : i + 1])[0]), i
        assert s.stats()["gets"] == 7 and s.stats().get("get_failures", 0) == 0
    finally:
        s.close()


@pytest.mark.parametrize("where", ["payload start", "payload end", "header checksum", "piece checksums"])
def test_corrupted_value_is_a_miss_with_reason(redis_server, where):
    """A changed payload byte is refused by the host check (verify); unverified, the block keeps the value's
    own piece checksums, which no longer match its bytes: every load's device check refuses it. A changed
    header checksum or piece checksum is refused either way (they no longer fold alike)."""
    ns, keys, data = namespace(), hashes(2, salt=20), rows(2, seed=20)
    s = store(redis_server.url, ns)
    try:
        assert s.put(keys, _values(ns, keys, data)) is None
        key = redis_key(redis_server, keys[0])
        length = int(redis_server.command(b"STRLEN", key)[1:].strip())
        extra = length - ns.value_bytes  # LMCache's own prefix before our value, if any
        offset = {"payload start": HEADER_BYTES, "payload end": ns.pieces_at - 1, "header checksum": 30,
                  "piece checksums": ns.value_bytes - 5}[where]  # fmt: skip
        old = redis_server.command(b"GETRANGE", key, b"%d" % (extra + offset), b"%d" % (extra + offset))
        flipped = bytes([old.split(b"\r\n")[1][0] ^ 0x10])
        redis_server.command(b"SETRANGE", key, b"%d" % (extra + offset), flipped)
        bad, good = read_blocks(s, keys)
        assert isinstance(bad, RemoteMiss) and bad.kind == BAD_VALUE, bad
        payload = where.startswith("payload")
        assert ("checksum mismatch" if payload else "corrupted piece checksums") in bad.reason, bad
        assert isinstance(good, RemoteBlock) and torch.equal(good.row, data[1])
        unverified, good = read_blocks(s, keys, verify=False)
        if payload:
            assert isinstance(unverified, RemoteBlock) and not torch.equal(unverified.row, data[0])
            truth = checksums_of(block_views(data[:1], ns.layout))[0]
            assert torch.equal(unverified.pieces, truth)  # the stored block's: the row's bytes fail them
            assert not torch.equal(checksums_of(block_views(unverified.row[None], ns.layout))[0], truth)
        else:
            assert isinstance(unverified, RemoteMiss) and "corrupted piece checksums" in unverified.reason
        assert isinstance(good, RemoteBlock) and torch.equal(good.row, data[1])
    finally:
        s.close()


def test_codec_mismatch_is_a_miss(redis_server):
    a_ns, b_ns = namespace(codec="K:tq8|V:tq4"), namespace(codec="K:tq4|V:tq4")
    keys, data = hashes(2, salt=30), rows(2, seed=30)
    a, b = store(redis_server.url, a_ns), store(redis_server.url, b_ns)
    try:
        assert a.put(keys, _values(a_ns, keys, data)) is None
        assert b.exists(keys).found == (False, False)  # another codec asks for other keys
        # A value of codec A under codec B's key (a foreign writer, a bug): the header refuses it.
        src = redis_key(redis_server, keys[0])
        dst = src.replace(a_ns.salt.encode(), b_ns.salt.encode())
        assert redis_server.command(b"COPY", src, dst).startswith(b":1")
        assert b.exists(keys).found == (True, False)
        (refused,) = read_blocks(b, keys[:1])
        assert isinstance(refused, RemoteMiss) and "codec mismatch" in refused.reason, refused
        assert isinstance(read_blocks(a, keys[:1])[0], RemoteBlock)
    finally:
        a.close()
        b.close()


def test_store_stopped_is_a_miss_then_reconnects(redis_server):
    ns, keys, data = namespace(model="restart"), hashes(3, salt=40), rows(3, seed=40)
    s = store(redis_server.url, ns, timeout=0.2, reconnect_interval=0.2)
    writer = RemoteWriter(s, max_blocks=8)
    try:
        assert s.put(keys[:1], _values(ns, keys[:1], data[:1])) is None
        redis_server.stop()
        answer = s.exists(keys)
        assert answer.found == (False,) * 3 and answer.reason and "health key" in answer.reason
        assert not s.up
        start = time.monotonic()
        assert s.exists(keys).reason.startswith("remote store down")  # no waiting while down
        assert time.monotonic() - start < 0.1
        values, reasons = s.get(keys[:1])
        assert values == [None] and reasons[0].kind == DOWN and "down" in reasons[0].reason
        sums = checksums_of(block_views(data, ns.layout))
        assert writer.offer(keys[1], data[1], sums[1])
        assert writer.flush(5)
        assert writer.stats()["write_failures"] == 1 and writer.stats().get("written", 0) == 0

        redis_server.start()  # an empty server: what the store held is gone, writes and lookups resume
        deadline = time.monotonic() + 10
        while s.exists(keys).reason is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert s.up, s.reason
        assert writer.offer(keys[2], data[2], sums[2])
        assert writer.flush(5) and writer.stats()["written"] == 1
        assert s.exists(keys).found == (False, False, True)
        (block,) = read_blocks(s, keys[2:])
        assert isinstance(block, RemoteBlock) and torch.equal(block.row, data[2])
        assert s.stats()["connects"] == 2 and s.stats()["failures"] >= 1
    finally:
        writer.close()
        s.close()


def test_a_call_during_another_threads_reconnect_waits_for_it(redis_server, monkeypatch):
    """The store comes back while it is marked down; one thread reconnects (slowly, here), and a lookup from
    another thread meanwhile waits for that reconnect and is answered, instead of being told "down"."""
    ns, keys, data = namespace(model="race"), hashes(2, salt=60), rows(2, seed=60)
    s = store(redis_server.url, ns, timeout=2.0, reconnect_interval=0.0)
    try:
        assert s.put(keys, _values(ns, keys, data)) is None
        s._mark_down(s._adapter, "test: marked down")
        assert not s.up
        real_connect = s._connect

        def slow_connect() -> None:
            time.sleep(0.3)
            real_connect()

        monkeypatch.setattr(s, "_connect", slow_connect)
        reconnecting = threading.Thread(target=s.exists, args=(keys,))
        reconnecting.start()
        time.sleep(0.1)  # the other thread is inside its reconnect now
        answer = s.exists(keys)
        reconnecting.join()
        assert answer.reason is None and answer.found == (True, True), answer
        assert s.stats()["connects"] == 2
    finally:
        s.close()


def test_full_write_queue_drops_and_counts(redis_server):
    ns, keys, data = namespace(model="queue"), hashes(10, salt=50), rows(10, seed=50)
    s = store(redis_server.url, ns)
    writer = RemoteWriter(s, max_blocks=2, batch_blocks=1)
    sums = checksums_of(block_views(data, ns.layout))
    try:
        with s._put_lock:  # the store is busy: the writer thread holds at most one block, the queue two
            accepted = [writer.offer(h, row, x) for h, row, x in zip(keys, data, sums, strict=True)]
        assert 2 <= sum(accepted) <= 3 and accepted[:2] == [True, True]
        assert writer.stats()["dropped_full"] == accepted.count(False)
        assert writer.flush(5)
        assert writer.stats()["written"] == sum(accepted)
        assert s.exists(keys).found == tuple(accepted)
    finally:
        writer.close()
        s.close()


def test_the_writer_asks_once_per_batch_and_skips_blocks_the_store_holds(redis_server, monkeypatch):
    """Issue 38: engines sharing a store write a common prefix once. Each batch of the write-behind queue is
    one existence call; blocks the store holds are counted as already_stored and not put again, unless this
    store refused their value (a reader found it bad): that one is written over."""
    ns, keys, data = namespace(model="once"), hashes(4, salt=70), rows(4, seed=70)
    s = store(redis_server.url, ns)
    sums = checksums_of(block_views(data, ns.layout))
    asked: list[list[bytes]] = []
    gate = threading.Event()
    real_exists = s.exists

    def exists(hs):
        asked.append(list(hs))
        gate.wait(5)  # the first batch waits: the others queue up behind it, and go as one batch
        return real_exists(hs)

    monkeypatch.setattr(s, "exists", exists)
    writer = RemoteWriter(s, max_blocks=8, batch_blocks=8)
    try:
        assert s.put(keys[1:3], _values(ns, keys[1:3], data[1:3])) is None  # another engine wrote 1 and 2
        puts = s.stats()["puts"]
        assert all(writer.offer(h, row, x) for h, row, x in zip(keys, data, sums, strict=True))
        gate.set()
        assert writer.flush(5)
        assert len(asked) <= 2 and [h for batch in asked for h in batch] == keys  # one call per batch
        stats = writer.stats()
        assert (stats["written"], stats["already_stored"], s.stats()["puts"] - puts) == (2, 2, 2)
        assert s.exists(keys).found == (True,) * 4

        s.refuse(keys[1], RemoteMiss(BAD_VALUE, "test: a reader refused it"))
        assert s.refused(keys[1])
        assert writer.offer(keys[1], data[1], sums[1]) and writer.offer(keys[2], data[2], sums[2])
        assert writer.flush(5)
        stats = writer.stats()
        assert (stats["written"], stats["already_stored"], s.stats()["puts"] - puts) == (3, 3, 3)
        assert not s.refused(keys[1])  # its value is ours again
        (block,) = read_blocks(s, keys[1:2])
        assert isinstance(block, RemoteBlock) and torch.equal(block.row, data[1])
    finally:
        gate.set()
        writer.close()
        s.close()


def test_on_a_silent_store_reconnect_attempts_are_an_interval_apart(redis_server):
    """redis-server stopped (SIGSTOP: connections open, no answer): a lookup waits the timeout and marks the
    store down; once the interval has passed one call tries to reconnect (its health-key write waits the
    timeout). The next interval counts from the end of that failed attempt: calls right after it are told
    "down" at once, so requests admitted together pay one timeout between them, not one each (issue 38)."""
    keys = hashes(2, salt=80)
    s = store(redis_server.url, namespace(model="silent"), timeout=0.3, reconnect_interval=0.3)
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        assert "timed out" in s.exists(keys).reason
        time.sleep(0.3)
        assert "health key" in s.exists(keys).reason  # the attempt: waits the timeout
        waited = time.monotonic() - start
        start = time.monotonic()
        assert s.exists(keys).reason.startswith("remote store down")
        assert time.monotonic() - start < 0.1, "a second attempt right after the first"
        assert 0.85 <= waited < 1.5, waited
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
        s.close()


class _Ready:
    """A PendingRow's event, on the CPU: done, or failing as a CUDA error would."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def synchronize(self) -> None:
        if self.error is not None:
            raise self.error


def test_a_pending_row_is_written_like_a_row_offered_at_once_and_a_failed_copy_costs_its_block(redis_server):
    """offer_pending (a VRAM block still on its way to the host): the writer waits for it and stores the value
    offer would have; a copy that failed is one failed write, the others are written, nothing hangs."""
    from tiercache.worker.remote_io import PendingRow

    ns, keys, data = namespace(model="pending"), hashes(3, salt=60), rows(3, seed=60)
    s = store(redis_server.url, ns)
    writer = RemoteWriter(s, max_blocks=8, batch_blocks=8)
    try:
        pieces = checksums_of(block_views(data, ns.layout))  # [3, 2, L, 2]
        assert writer.offer_pending(keys[0], PendingRow(data[0], pieces[0], _Ready()))
        broken = PendingRow(data[1], pieces[1], _Ready(RuntimeError("CUDA error: an illegal address")))
        assert writer.offer_pending(keys[1], broken)
        assert writer.offer(keys[2], data[2], pieces[2])
        assert writer.flush(5)
        stats = writer.stats()
        assert (
            stats["written"] == 2
            and stats["write_failures"] == 1
            and "illegal address" in stats["last_error"]
        )
        assert s.exists(keys).found == (True, False, True)
        got = read_blocks(s, [keys[0], keys[2]])
        assert all(isinstance(b, RemoteBlock) for b in got)
        assert torch.equal(got[0].row, data[0]) and torch.equal(got[1].row, data[2])
    finally:
        writer.close()
        s.close()
