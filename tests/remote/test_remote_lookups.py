"""The scheduler's existence calls off its thread (connectors/scheduler/remote_lookups.py), against a real
redis-server: a store that answers is answered within the first asks; a silent one (SIGSTOP: connections
open, no answer) leaves every ask returning at once with None (vLLM then schedules the other requests) until
the store's timeout ends the call, whose answer is then "none found" with the cause (issue 38: a silent store
never stalls other requests' steps)."""

from __future__ import annotations

import os
import signal
import time

from remote_helpers import hashes, namespace, rows, store, values

from tiercache.connectors.scheduler.remote_lookups import RemoteLookups


def ask_until_answered(lookups: RemoteLookups, request_id: str, keys: list[bytes], limit: float = 10.0):
    """(the answer, the asks that returned None, the longest one ask took)."""
    pending, longest = 0, 0.0
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        start = time.monotonic()
        answer = lookups.found(request_id, keys)
        longest = max(longest, time.monotonic() - start)
        if answer is not None:
            return answer, pending, longest
        pending += 1
        time.sleep(0.005)
    raise AssertionError(f"no answer within {limit}s")


def test_a_store_that_answers_is_answered_with_what_exists_says(redis_server):
    ns = namespace(model="lookups")
    s = store(redis_server.url, ns, timeout=1.0)
    lookups = RemoteLookups(s)
    try:
        keys = hashes(6, salt=90)
        assert s.put(keys[:4], values(ns, keys[:4], rows(4))) is None
        answer, _, _ = ask_until_answered(lookups, "a", keys)
        assert answer.found == (True, True, True, True, False, False)
        assert ask_until_answered(lookups, "b", keys[:3])[0].found == (True,) * 3
        assert not lookups._calls  # answered calls are not kept
    finally:
        lookups.close()
        s.close()


def test_a_silent_store_never_holds_up_the_asker(redis_server):
    s = store(redis_server.url, namespace(model="lookups-silent"), timeout=0.5)
    lookups = RemoteLookups(s)
    keys = hashes(3, salt=91)
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        answer, pending, longest = ask_until_answered(lookups, "a", keys)
        took = time.monotonic() - start
        assert answer.found == (False,) * 3 and "timed out" in answer.reason
        assert pending >= 10 and longest < 0.1, (pending, longest)  # every ask returned at once
        assert 0.4 <= took < 2.0, took  # the store's timeout, once
        lookups.found("b", keys)  # a call in flight for b ...
        lookups.forget("b")  # ... whose request ended: its answer is not kept
        assert "b" not in lookups._calls
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
        lookups.close()
        s.close()
