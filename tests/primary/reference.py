"""A plain-PyTorch reference of a model served in primary mode: Hugging Face's forward of the same
checkpoint, with every post-RoPE key and value replaced by its codec round trip inside attention (what the
TurboQuant pages hold) except in the layers kept exact, then float32 causal attention; greedy decoding by full
recomputation."""

from __future__ import annotations

import torch
import torch.nn.functional as F

ATTN_NAME = "tiercache_primary_reference"


def _attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """query [B, Hq, S, D]; key, value [B, H, S, D] → (out [B, S, Hq, D], None). The module carries its
    layer's codec (None: an exact layer), set by load()."""
    codec = module.tiercache_codec
    if codec is not None:
        key = codec.keys.decode(*codec.keys.encode(key.transpose(1, 2)), key.dtype).transpose(1, 2)
        value = codec.values.decode(*codec.values.encode(value.transpose(1, 2)), value.dtype).transpose(1, 2)
    out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def load(model_dir, preset: str, exact_layers: tuple[int, ...] = ()):
    """The checkpoint as a float32 HF model whose attention reads the codec round trip of K and V, except
    in `exact_layers` (0-based indices), which attend over their K and V as computed."""
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    from tiercache.codecs import KVCodecSpec

    AttentionInterface.register(ATTN_NAME, _attention)
    if ATTN_NAME not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.set_attn_implementation(ATTN_NAME)
    codec = KVCodecSpec.from_preset(preset).build(model.config.head_dim, torch.float32)
    for module in model.modules():
        if hasattr(module, "layer_idx") and hasattr(module, "o_proj"):  # the decoder layers' attention
            module.tiercache_codec = None if module.layer_idx in exact_layers else codec
    return model.eval()


def greedy(model, prompt_ids: list[int], max_tokens: int) -> list[int]:
    ids = list(prompt_ids)
    with torch.inference_mode():
        for _ in range(max_tokens):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt_ids) :]
