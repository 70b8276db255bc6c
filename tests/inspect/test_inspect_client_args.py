"""Issue 42, item 4: the client checks its arguments before sending anything. Each bad one raises InspectError
(the client's one error type) naming the argument and what is valid, over the socket and in-process alike;
before: a raw UnicodeEncodeError (a lone surrogate), OverflowError (a huge integer) or TypeError. The checks
are the service's own (params.py), so nothing the client accepts is refused by the service for its form."""

from __future__ import annotations

import numpy as np
import pytest
from inspect_helpers import h

from tiercache.inspect import InspectError, connect, prompt_digest
from tiercache.inspect.protocol import ProtocolError
from tiercache.inspect.request_log import RequestRecord

HUGE = 10**5000  # more digits than int → str allows
# (the call, a fragment of the message: the argument and what is valid)
BAD = [
    (lambda c: c.explain_request("cmpl-\ud800"), "request_id: character 5 ('\\ud800') is a lone surrogate"),
    (lambda c: c.explain_request("\udcff"), "request_id: character 0"),
    (lambda c: c.explain_request(42), "request_id: expected a string of 1..512 characters"),
    (lambda c: c.explain_request(HUGE), "request_id: expected a string"),
    (lambda c: c.explain_request(b"cmpl-1"), "request_id: expected a string"),
    (lambda c: c.explain_request(""), "request_id: expected a string of 1..512"),
    (lambda c: c.explain_request("x" * 513), "request_id: expected a string of 1..512"),
    (lambda c: c.explain_request(), "give exactly one of request_id"),
    (lambda c: c.explain_request("cmpl-1", prompt_tokens=[1]), "give exactly one of request_id"),
    (lambda c: c.explain_request(prompt_tokens=[1, 2**63]), "prompt_tokens[1]: expected the prompt's token"),
    (lambda c: c.explain_request(prompt_tokens=[HUGE]), "prompt_tokens[0]: expected"),
    (lambda c: c.explain_request(prompt_tokens=[-1]), "prompt_tokens[0]: expected"),
    (lambda c: c.explain_request(prompt_tokens=[1.0]), "prompt_tokens[0]: expected"),
    (lambda c: c.explain_request(prompt_tokens=["1"]), "prompt_tokens[0]: expected"),
    (lambda c: c.explain_request(prompt_tokens=[True]), "prompt_tokens[0]: expected"),
    (lambda c: c.explain_request(prompt_tokens=5), "prompt_tokens: expected the prompt's token ids"),
    (lambda c: c.explain_request(prompt_tokens="123"), "prompt_tokens: expected"),
    (lambda c: c.explain_request(prompt_tokens=[]), "prompt_tokens: expected the prompt's token ids, a non-"),
    (lambda c: c.decisions(limit=2**64), "limit: expected an integer 0..1000"),
    (lambda c: c.decisions(limit=HUGE), "limit: expected an integer 0..1000, got <an integer of"),
    (lambda c: c.decisions(limit=-1), "limit: expected an integer 0..1000"),
    (lambda c: c.decisions(limit=2.5), "limit: expected an integer"),
    (lambda c: c.decisions(limit="10"), "limit: expected an integer"),
    (lambda c: c.decisions(limit=True), "limit: expected an integer"),
    (lambda c: c.decisions(kinds="eviction"), "kinds: expected a list of at most 16 of eviction, drop"),
    (lambda c: c.decisions(kinds=["\ud800"]), "kinds: expected a list"),
    (lambda c: c.decisions(kinds=[1]), "kinds: expected a list"),
    (lambda c: c.decisions(kinds=["eviction"] * 17), "kinds: expected a list of at most 16"),
    (lambda c: c.decisions(kinds=5), "kinds: expected a list"),
    (lambda c: c.blocks(tier="\ud800"), "tier: expected one of vram, dram"),
    (lambda c: c.blocks(tier=0), "tier: expected one of"),
    (lambda c: c.blocks(limit=HUGE), "limit: expected an integer 0..1000"),
    (lambda c: c.explain("ab\ud800"), "block_hash: expected bytes or a hex string of at most 64 bytes"),
    (lambda c: c.explain(HUGE), "block_hash: expected bytes or a hex string"),
    (lambda c: c.explain(None), "block_hash: expected"),
    (lambda c: c.explain(b""), "block_hash: expected"),
    (lambda c: c.explain(b"\x01" * 65), "block_hash: expected bytes or a hex string of at most 64 bytes"),
    (lambda c: c.explain("xyz"), "block_hash: expected"),
]  # fmt: skip


def _fresh_client(where: str, served) -> object:
    run, service = served
    return connect(service.path, timeout=5) if where == "socket" else connect(state=run.state)


@pytest.mark.parametrize("where", ["socket", "in-process"])
@pytest.mark.parametrize(("call", "fragment"), BAD, ids=[f"{i}" for i in range(len(BAD))])
def test_bad_arguments_raise_inspect_error(served, where, call, fragment):
    client = _fresh_client(where, served)
    with pytest.raises(InspectError) as info:
        call(client)
    assert type(info.value) is InspectError and not isinstance(info.value, ProtocolError)
    message = str(info.value)
    assert fragment in message and len(message) < 400, message
    if where == "socket":
        assert client._transport._sock is None  # refused before anything was sent: never even connected
    assert client.ping()["pid"]  # the client is still usable
    client.close()


# connect(): (arguments, fragment)
BAD_CONNECT = [
    ({"timeout": HUGE}, "timeout: expected seconds for each whole request, a number > 0 and ≤ 86400"),
    ({"timeout": 1e300}, "timeout: expected seconds"),
    ({"timeout": float("nan")}, "timeout: expected seconds"),
    ({"timeout": 0}, "timeout: expected seconds"),
    ({"timeout": -1.0}, "timeout: expected seconds"),
    ({"timeout": "5"}, "timeout: expected seconds"),
    ({"timeout": True}, "timeout: expected seconds"),
    ({"path": "/tmp/\ud800.sock"}, "path: expected the inspection socket's path"),
    ({"path": "/tmp/a\0b.sock"}, "path: expected the inspection socket's path"),
    ({"path": 5}, "path: expected the inspection socket's path (a str or os.PathLike"),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "fragment"), BAD_CONNECT, ids=[f"{i}" for i in range(len(BAD_CONNECT))])
def test_bad_connect_arguments_raise_inspect_error(served, kwargs, fragment):
    _, service = served
    with pytest.raises(InspectError) as info:
        connect(**{"path": service.path, **kwargs})
    assert type(info.value) is InspectError and fragment in str(info.value), str(info.value)


def test_what_the_checks_accept(served):
    """Sequences other than lists, bytes-like hashes, numpy token ids, non-ASCII ids that UTF-8 encodes."""
    run, service = served
    run.state.record_request(
        RequestRecord(
            request_id="résumé-0-0123abcd", external_id="résumé-0", digest=prompt_digest([5, 6, 7]),
            clock=0.0, wall=0.0, block_size=16, block_hashes=(h(0),), vllm_blocks=0, hit_blocks=0, where="-",
            unreadable={}, departed={}, prompt_tokens=17, tokens_loaded=0, tokens_recomputed=17,
        )
    )  # fmt: skip
    run.state.publish(run.manager.view(), force=True)
    with connect(service.path, timeout=5) as client:
        assert all(d.kind == "eviction" for d in client.decisions(limit=5, kinds=("eviction",)))
        assert client.decisions(limit=5, kinds={"eviction", "drop"})
        stored = run.manager.view().hashes()[0]
        assert client.explain(bytearray(stored)).block_hash == stored
        assert client.explain(memoryview(stored)).stored
        assert client.explain_request("résumé-0").request_id == "résumé-0-0123abcd"
        for tokens in ((5, 6, 7), np.array([5, 6, 7]), [np.int64(5), 6, 7]):
            assert client.explain_request(prompt_tokens=tokens).request_id == "résumé-0-0123abcd"
