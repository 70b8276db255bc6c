"""Offline inference with tiercache: two requests share a long prefix; the second loads it from the tiers.

Run on a CPU-only machine (after `bash scripts/setup.sh --with-vllm --with-model`):
    python examples/offline_inference.py [MODEL_DIR]
On CPU, vLLM's own KV cache takes VLLM_CPU_KVCACHE_SPACE GiB: 2 unless set (vLLM's default: most of RAM).
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: tiercache.inspect sees the state
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB, read when the engine starts (CPU only)

import torch
from vllm import LLM, SamplingParams

from tiercache.cli.models import smollm2_path
from tiercache.inspect import connect

if __name__ == "__main__":
    model = sys.argv[1] if len(sys.argv) > 1 else str(smollm2_path())
    on_cpu = {} if torch.cuda.is_available() else {"dtype": "float32", "enforce_eager": True}
    llm = LLM(
        model=model,
        max_model_len=4096,
        enable_prefix_caching=False,  # so the reuse below comes from tiercache
        **on_cpu,
        kv_transfer_config={
            "kv_connector": "TierCacheConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "config": str(Path(__file__).with_name("tiers.yaml")),
                "tiers": {"vram": "64MiB", "dram": "1GiB"},  # inline keys override the file
            },
        },
    )
    manual = "Our store opens at nine, closes at six, and accepts returns within 30 days. " * 20
    params = SamplingParams(temperature=0, max_tokens=32)
    for question in ("When do you open?", "Can I return a gift?"):
        out = llm.generate([manual + "\nQuestion: " + question + "\nAnswer:"], params, use_tqdm=False)[0]
        print(f"{question} → {out.outputs[0].text.strip()!r} ({out.num_cached_tokens} tokens from tiercache)")
    print(connect().stats())
