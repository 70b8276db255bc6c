"""What explain_request is built from: the bounded request log, the departures, the failure causes, and the
explanation itself on a real TierManager (no vLLM)."""

from __future__ import annotations

import pytest

from tiercache.inspect import InspectionState, connect, prompt_digest
from tiercache.inspect.handlers import handle
from tiercache.inspect.request_log import Departures, RequestLog, RequestRecord
from tiercache.scheduler.events import DropEvent, EvictionEvent, HitEvent, StoreEvent, cause_of
from tiercache.scheduler.manager import TierManager
from tiercache.scheduler.policies.lru import LRUPolicy


def record(request_id: str, hashes=(b"a" * 32,), external=None, tokens=(1, 2, 3), **kw) -> RequestRecord:
    fields = dict(
        request_id=request_id, external_id=external, digest=prompt_digest(tokens), clock=0.0, wall=0.0,
        block_size=16, block_hashes=tuple(hashes), vllm_blocks=0, hit_blocks=0, where="-" * len(hashes),
        unreadable={}, departed={}, prompt_tokens=16 * len(hashes) + 1, tokens_loaded=0,
        tokens_recomputed=16 * len(hashes) + 1,
    )  # fmt: skip
    return RequestRecord(**{**fields, **kw})


def test_request_log_keeps_the_newest_and_finds_them_by_any_key():
    log = RequestLog(2)
    log.add(record("0-0123abcd", external="0", tokens=(1,)))
    log.add(record("1-89abcdef", external="1", tokens=(2,)))
    log.add(record("2-00000000", external="2", tokens=(3,)))
    assert len(log) == 2 and log.find("0-0123abcd") is None and log.find("0") is None
    assert log.find("1").request_id == "1-89abcdef" == log.find(prompt_digest((2,))).request_id
    assert log.find(prompt_digest((1,))) is None  # aliases leave with their record
    log.add(record("3-11111111", external="3", tokens=(2,)))  # the same prompt again: the newest wins
    assert log.find(prompt_digest((2,))).request_id == "3-11111111"
    assert RequestLog(0).find("x") is None


def test_the_openai_response_id_finds_its_request_and_a_miss_names_the_known_ids():
    """vLLM's OpenAI server returns cmpl-X and gives the engine cmpl-X-<prompt index>, which vLLM makes
    internal as cmpl-X-0-<8 hex>: all three find the record; an unknown id's error lists the newest ids."""
    log = RequestLog(3)
    log.add(record("cmpl-9f3e-0-0123abcd", external="cmpl-9f3e-0", tokens=(1,)))
    log.add(record("chatcmpl-77-89abcdef", external="chatcmpl-77", tokens=(2,)))
    for key in ("cmpl-9f3e", "cmpl-9f3e-0", "cmpl-9f3e-0-0123abcd"):
        assert log.find(key).request_id == "cmpl-9f3e-0-0123abcd", key
    assert log.recent_ids == ("chatcmpl-77", "cmpl-9f3e-0")
    state = InspectionState()
    state.record_request(record("cmpl-1-0-0123abcd", external="cmpl-1-0"))
    manager = TierManager(vram_blocks=2, dram_blocks=0, codec_id="c", policy=LRUPolicy())
    state.publish(manager.view(), force=True)
    reply = handle(state, {"method": "explain_request", "params": {"request_id": "cmpl-2"}})
    assert reply["ok"] is False and "no recent request matches request id 'cmpl-2'" in reply["error"]
    assert "the newest ids it knows: 'cmpl-1-0'" in reply["error"]


def test_departures_keep_only_departures_and_count_what_they_forget():
    gone = Departures(2)
    gone.record(HitEvent(0, 0.0, b"a", "c", "lookup"))
    gone.record(EvictionEvent(1, 0.0, b"b", "c", "lru", tier_to="dram"))  # a spill: still stored
    assert gone.get(b"a") is None and gone.get(b"b") is None
    gone.record(EvictionEvent(2, 0.0, b"b", "c", "lru", tier_to=None))
    gone.record(DropEvent(3, 0.0, b"c", "c", "load failed"))
    gone.record(StoreEvent(4, 0.0, b"d", "c", "no room", stored=False))
    assert gone.get(b"b") is None and gone.get(b"c").kind == "drop" and gone.get(b"d").kind == "store"
    assert gone.forgotten == 1


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        (
            "load failed (hash mismatch: vram slot 3 holds block ab12): block will be recomputed",
            "hash_mismatch",
        ),
        (
            "load failed (codec mismatch: dram slot 1 holds K:8|V:4): block will be recomputed",
            "codec_mismatch",
        ),
        ("no room: every slot pinned or in flight", "no_room"),
        ("store aborted: step 4's plan failed: RuntimeError: x", "store_aborted"),
        ("store failed", "store_failed"),
        ("the manager refused it after the lookup", "load_refused"),
        ("load failed: block will be recomputed", "load_failed"),
        ("something new", "other"),
    ],
)
def test_failure_reasons_map_to_bounded_causes(reason, cause):
    assert cause_of(reason) == cause


def test_explanation_of_an_admission_on_a_real_manager():
    """Three blocks: one evicted by LRU before the request, one never stored, one stored (after the miss)."""
    manager = TierManager(vram_blocks=2, dram_blocks=0, codec_id="c", policy=LRUPolicy())
    state = InspectionState()
    a, b, c, d = (bytes([i]) * 32 for i in range(4))
    for block in (a, c, d):  # a is stored first: with two slots, storing d evicts it
        manager.complete_store(manager.prepare_store([block]).block_hashes)
    state.record(manager.take_events())
    where = manager.where([a, b, c])
    assert where == [(None, "not stored"), (None, "not stored"), ("vram", None)]
    departed = {0: state.departures.get(a)}  # what the connector takes at admission (b has no departure)
    assert departed[0] is not None and state.departures.get(b) is None
    state.record_request(
        record(
            "7-abcdef01", hashes=(a, b, c), external="7", clock=manager.view().clock(), departed=departed,
            where="".join(RequestRecord.where_code(t, r) for t, r in where),
        )
    )  # fmt: skip
    state.publish(manager.view(), force=True)
    with connect(state=state) as client:
        why = client.explain_request("7")
    assert [(x.outcome, x.cause) for x in why.blocks] == [
        ("miss", "evicted"), ("miss", "never_stored"), ("miss", "after_miss")
    ]  # fmt: skip
    assert why.blocks[0].event["policy"] == "lru" and why.blocks[2].tier == "vram"
    assert why.first_miss == 0 and "evicted from vram" in why.summary and "1 never stored" in why.summary


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({}, "exactly one of request_id"),
        ({"request_id": "a", "prompt_digest": b"x" * 16}, "exactly one of request_id"),
        ({"request_id": 7}, "request_id: expected a string"),
        ({"request_id": "x" * 600}, "request_id: expected a string"),
        ({"prompt_digest": b"short"}, "prompt_digest: expected 16 bytes"),
    ],
)
def test_explain_request_parameters_are_checked(params, error):
    state = InspectionState()
    reply = handle(state, {"method": "explain_request", "params": params})
    assert reply["ok"] is False and error in reply["error"]
