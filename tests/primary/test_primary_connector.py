"""The connector on a primary-mode cache: the tiers hold the same bytes as vLLM's TurboQuant pages, so a save
and a load are byte copies — the pages a request loads are, byte for byte, the pages another request saved
— and the reused prefix gives the plain-PyTorch reference's greedy tokens. A codec other than the cache's is
refused at start, naming both."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import reference
import torch
from helpers import connector_config, engine, worker_side
from tiny_llama import words_prompt

from tiercache.codecs import KVCodecSpec
from tiercache.connectors.common import Geometry
from tiercache.errors import ConfigError

MAX_TOKENS = 12


def pages_of_block(worker, block_id: int) -> list[torch.Tensor]:
    """The page bytes of one vLLM block, every layer and section."""
    return [getattr(v, name)[block_id].clone() for v in worker.page_views for name in vars(v)]


def test_saves_and_loads_are_page_copies(tiny_model, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the kernels' PyTorch references (no Triton on CPU)
    shared = words_prompt(11, 96)  # three full blocks
    prompts = [shared + " " + words_prompt(600, 30), shared + " " + words_prompt(700, 25)]
    config = connector_config("k8v4")
    with engine(tiny_model, config, attention_config={"backend": "CUSTOM"}) as llm:
        worker = worker_side()
        assert worker.geometry.primary and worker.page_views and not worker.k_views
        saved, loaded = {}, {}
        real_store, real_load = worker._store, worker._load

        def store(step):
            for item in step.plan.stores:
                saved[item.block_hash] = pages_of_block(worker, item.block_id)
            return real_store(step)

        def load(step):
            real_load(step)
            for item, ok in zip(step.plan.loads, step.loads_ok, strict=True):
                if ok:
                    loaded[item.block_hash] = pages_of_block(worker, item.block_id)

        monkeypatch.setattr(worker, "_store", store)
        monkeypatch.setattr(worker, "_load", load)
        from vllm import SamplingParams

        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
        outs = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
    assert outs[1].num_cached_tokens == 96 and len(loaded) == 3 and set(loaded) <= set(saved)
    for block_hash, pages in loaded.items():
        assert all(torch.equal(a, b) for a, b in zip(pages, saved[block_hash], strict=True))
    ref = reference.load(tiny_model, "k8v4")
    expect = [reference.greedy(ref, list(o.prompt_token_ids), MAX_TOKENS) for o in outs]
    assert [list(o.outputs[0].token_ids) for o in outs] == expect


def test_a_codec_other_than_the_caches_is_refused_naming_both():
    spec = SimpleNamespace(num_kv_heads=2, head_size=64, head_size_v=64, dtype=torch.uint8, block_size=32,
                           state_content_bytes=72)  # fmt: skip  # a K4V4 page at d64
    vllm_config = SimpleNamespace(attention_config=SimpleNamespace(backend=SimpleNamespace(name="CUSTOM")))
    kv_cache_config = SimpleNamespace(
        kv_cache_groups=[SimpleNamespace(kv_cache_spec=spec, layer_names=["l0"])]
    )
    geometry = Geometry.from_vllm(vllm_config, kv_cache_config, KVCodecSpec.from_preset("tq4"))
    assert geometry.primary and geometry.page_format(KVCodecSpec.from_preset("tq4")).token_head_bytes == 72
    with pytest.raises(ConfigError, match=r"holds 72 bytes per token and KV head.*codec k8v4 needs 104"):
        Geometry.from_vllm(vllm_config, kv_cache_config, KVCodecSpec.from_preset("k8v4"))
