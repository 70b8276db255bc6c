"""What the KV codec does to a real model: SmolLM2-135M-Instruct, every post-RoPE key and value quantized.

A custom attention function (registered with transformers' AttentionInterface) encodes and decodes every
key and value with the configured K and V codecs, then runs standard fp32 causal attention. The exact model
(stock sdpa attention) runs once per batch of windows and its logits are reused for every config. Reported
per config, over the predicted tokens of non-overlapping windows of real English that ships with Python
(stdlib docstrings, then license texts): perplexity, ΔPPL relative to the exact model, mean
KL(exact ‖ quantized) per token and top-1 agreement with the exact model.

    python benchmarks/quality.py                       # all configs, 40,960 tokens, 1,024-token windows
    python benchmarks/quality.py --configs none K8V4 --tokens 8192 --results ''   # quick look, no RESULTS.md

fp8 is a per-tensor unscaled cast of K and V to torch.float8_e4m3fn and back (|K|, |V| stay far below 448).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import importlib
import inspect
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from tiercache.cli.models import load_smollm2
from tiercache.kernels import TurboQuantCodec

ATTN_NAME = "tiercache_kv_quant"
ROTATION = "haar"
ALL_CONFIGS = ("none", "K4V4", "K3V4", "K8V4", "K8V8", "K4V8", "fp8", "K6V4", "K5V3")
# A fixed list, so the corpus depends only on the Python version. Docstrings first, then license texts.
STDLIB_MODULES = """
    abc argparse ast asyncio.events asyncio.tasks base64 bdb bisect calendar cmd codecs collections
    concurrent.futures configparser contextlib copy csv dataclasses datetime decimal difflib dis doctest
    email.message enum filecmp fnmatch fractions ftplib functools getopt gettext glob graphlib gzip
    hashlib heapq hmac html.parser http.client http.cookiejar http.server imaplib importlib inspect io
    ipaddress itertools json logging logging.handlers mailbox mimetypes multiprocessing.pool numbers
    operator optparse os pathlib pdb pickle pkgutil platform poplib pprint queue random re reprlib sched
    secrets selectors shelve shlex shutil smtplib socket socketserver sqlite3 ssl statistics string
    struct subprocess sysconfig tarfile tempfile textwrap threading timeit tokenize trace traceback types
    typing unittest.case unittest.mock urllib.parse urllib.request uuid warnings weakref xml.dom.minidom
    xml.etree.ElementTree zipfile
""".split()  # noqa: SIM905

KVFn = Callable[[torch.Tensor], torch.Tensor]
_TQ_CONFIG = re.compile(r"K([1-8])(u?)(s?)V([1-8])(u?)(s?)")


# ---------------------------------------------------------------- corpus


def _docstrings(module_name: str) -> list[str]:
    """Module docstring, then docstrings of its public classes, functions and methods, sorted by name."""
    module = importlib.import_module(module_name)
    docs = [inspect.getdoc(module) or ""]
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj) or inspect.isfunction(obj):
            docs.append(inspect.getdoc(obj) or "")
        if inspect.isclass(obj):
            for member_name, member in sorted(vars(obj).items()):
                if not member_name.startswith("_") and inspect.isfunction(member):
                    docs.append(inspect.getdoc(member) or "")
    return docs


def _license_texts() -> list[str]:
    stdlib = os.path.dirname(os.__file__)
    site = [p for p in sys.path if p.endswith("site-packages")]
    paths = sorted(glob.glob(os.path.join(stdlib, "LICENSE*")))
    for root in site:
        paths += sorted(glob.glob(os.path.join(root, "*.dist-info", "LICEN[CS]E*")))
        paths += sorted(glob.glob(os.path.join(root, "*.dist-info", "licenses", "*")))
    texts = []
    for path in paths:
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                texts.append(f.read())
    return texts


def gather_tokens(tokenizer, n_tokens: int) -> tuple[torch.Tensor, str]:
    """The first n_tokens tokens of the corpus (deduplicated texts of ≥ 80 characters) and its sources."""
    seen: set[str] = set()
    parts: list[str] = []
    total = 0
    sources = "stdlib docstrings"
    chunks = ((m, _docstrings(m)) for m in STDLIB_MODULES)
    for source, docs in [*chunks, ("licenses", None)]:
        if docs is None:
            docs, sources = _license_texts(), sources + " + license texts"
        for doc in docs:
            doc = doc.strip()
            if len(doc) < 80 or doc in seen:
                continue
            seen.add(doc)
            parts.append(doc)
            total += len(tokenizer(doc).input_ids) + 1
            if total >= n_tokens:
                ids = tokenizer("\n\n".join(parts), return_tensors="pt").input_ids[0]
                return ids[:n_tokens], f"{sources} (stopped at {source})"
    raise SystemExit(f"only {total} tokens of text found, fewer than --tokens {n_tokens}")


# ---------------------------------------------------------------- K/V quantizers and the attention function


def _turboquant(bits: int, head_dim: int, seed: int, codebook: str = "lloyd", shrunk: bool = False) -> KVFn:
    """Encode and decode with the codec; shrunk: with format 1's scale ‖x‖ instead of the stored unbiased one
    (codec.py), to measure what the unbiased scale changes."""
    codec = TurboQuantCodec(head_dim, bits, seed=seed, rotation=ROTATION, codebook=codebook)
    if shrunk:
        return lambda x: codec.decode(codec.encode(x)[0], x.float().norm(dim=-1), dtype=x.dtype)
    return lambda x: codec.decode(*codec.encode(x), dtype=x.dtype)


def _fp8(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float8_e4m3fn).to(x.dtype)


def make_config(name: str, head_dim: int, seed: int = 0) -> tuple[KVFn, KVFn]:
    """(key fn, value fn) for a config name: none, fp8, or K<bits>[u][s]V<bits>[u][s] (both codecs: `seed`).

    A "u" after a width selects the uniform (affine) codebook for that side, e.g. K8uV4; else Lloyd-Max. An
    "s" decodes that side with format 1's shrunk scale ‖x‖ (K6sV4s: the codec before the unbiased scale).
    """
    if name == "none":
        return (lambda x: x), (lambda x: x)
    if name == "fp8":
        return _fp8, _fp8
    match = _TQ_CONFIG.fullmatch(name)
    if match:
        k_bits, k_uniform, k_shrunk, v_bits, v_uniform, v_shrunk = match.groups()
        return (
            _turboquant(int(k_bits), head_dim, seed, "uniform" if k_uniform else "lloyd", bool(k_shrunk)),
            _turboquant(int(v_bits), head_dim, seed, "uniform" if v_uniform else "lloyd", bool(v_shrunk)),
        )
    raise ValueError(
        f"unknown config {name!r}; valid: none, fp8, K<bits>[u][s]V<bits>[u][s] (u = uniform codebook, "
        "s = format 1's scale) "
        f"e.g. {', '.join(ALL_CONFIGS)}, K8uV4"
    )


@dataclass
class _KVState:
    key_fn: KVFn = field(default=lambda x: x)
    value_fn: KVFn = field(default=lambda x: x)
    max_abs: float = 0.0  # largest |K| or |V| seen, to check fp8 never saturates


STATE = _KVState()


def kv_quant_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Quantize post-RoPE K and V, then plain fp32 causal attention (GQA by repetition).

    query [B, H, S, D]; key, value [B, KVH, S, D] → (out [B, S, H, D], None).
    """
    STATE.max_abs = max(STATE.max_abs, key.abs().max().item(), value.abs().max().item())
    key, value = STATE.key_fn(key), STATE.value_fn(value)
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    causal = attention_mask is None and query.shape[2] > 1
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, is_causal=causal, scale=scaling
    )
    return out.transpose(1, 2).contiguous(), None


def register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_NAME, kv_quant_attention)
    if ATTN_NAME not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)


# ---------------------------------------------------------------- measurement


@dataclass
class Stats:
    nll: float = 0.0
    kl: float = 0.0
    agree: int = 0
    tokens: int = 0

    def add(self, exact_logp: torch.Tensor, logp: torch.Tensor, targets: torch.Tensor) -> None:
        """*_logp [N, V] log-probabilities predicting targets [N]."""
        self.nll -= logp.gather(1, targets[:, None]).sum().item()
        self.kl += (exact_logp.exp() * (exact_logp - logp)).sum().item()
        self.agree += (exact_logp.argmax(1) == logp.argmax(1)).sum().item()
        self.tokens += targets.numel()

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.tokens)


def log_probs(model, ids: torch.Tensor) -> torch.Tensor:
    """ids [B, W] → log-probabilities [B·(W−1), vocab] for the next token at positions 0..W−2."""
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[:, :-1].float()
    return torch.log_softmax(logits.reshape(-1, logits.shape[-1]), dim=-1)


def load_tokens(tokenizer, args) -> tuple[torch.Tensor, str]:
    """Corpus token ids; from --tokens-file if it exists, so runs on other machines score the same tokens."""
    if args.tokens_file and os.path.exists(args.tokens_file):
        saved = torch.load(args.tokens_file)
        return saved["ids"][: args.tokens], saved["sources"]
    ids, sources = gather_tokens(tokenizer, args.tokens)
    if args.tokens_file:
        torch.save({"ids": ids, "sources": sources}, args.tokens_file)
    return ids, sources


def check_identity(model, ids: torch.Tensor) -> float:
    """Max |logit difference| between the stock model and the custom function with the codec off."""
    with torch.inference_mode():
        model.set_attn_implementation("sdpa")
        stock = model(input_ids=ids).logits
        model.set_attn_implementation(ATTN_NAME)
        STATE.key_fn = STATE.value_fn = lambda x: x
        ours = model(input_ids=ids).logits
    return (stock - ours).abs().max().item()


def run(args) -> tuple[dict[str, Stats], dict]:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    register_attention()
    model, tokenizer = load_smollm2(attn_implementation="sdpa", path=args.model_dir, device=args.device)
    head_dim = model.config.head_dim
    configs = {name: make_config(name, head_dim, args.seed) for name in args.configs}
    ids, sources = load_tokens(tokenizer, args)
    windows = ids[: len(ids) // args.window * args.window].view(-1, args.window).to(args.device)
    print(
        f"corpus: {sources}; {windows.shape[0]} windows of {args.window} tokens on {args.device}", flush=True
    )

    diff = check_identity(model, windows[:1])
    print(f"codec off vs stock sdpa logits: max |Δ| = {diff:.3e}", flush=True)
    assert diff < 1e-3, f"the custom attention function does not reproduce the stock model (max |Δ| {diff})"

    stats = {name: Stats() for name in configs}
    exact_stats = Stats()
    start = time.perf_counter()
    for first in range(0, windows.shape[0], args.batch):
        batch = windows[first : first + args.batch]
        targets = batch[:, 1:].reshape(-1)
        model.set_attn_implementation("sdpa")
        exact = log_probs(model, batch)
        exact_stats.add(exact, exact, targets)
        model.set_attn_implementation(ATTN_NAME)
        for name, (key_fn, value_fn) in configs.items():
            STATE.key_fn, STATE.value_fn = key_fn, value_fn
            stats[name].add(exact, log_probs(model, batch), targets)
        done = first + batch.shape[0]
        elapsed = time.perf_counter() - start
        line = "  ".join(f"{n} {s.ppl / exact_stats.ppl - 1:+.2%}" for n, s in stats.items())
        print(
            f"[{done}/{windows.shape[0]} windows, {elapsed:.0f} s] exact PPL {exact_stats.ppl:.3f}  {line}",
            flush=True,
        )
        if args.progress_json:  # partial results survive an interrupted run
            with open(args.progress_json, "w") as f:
                json.dump(
                    {
                        "windows": done,
                        "seconds": elapsed,
                        "exact": vars(exact_stats),
                        "configs": {n: vars(s) for n, s in stats.items()},
                    },
                    f,
                    indent=1,
                )
    meta = {
        "exact": exact_stats,
        "identity_diff": diff,
        "sources": sources,
        "seconds": time.perf_counter() - start,
        "max_abs_kv": STATE.max_abs,
    }
    return stats, meta


# ---------------------------------------------------------------- report


def table(stats: dict[str, Stats], exact: Stats) -> str:
    rows = [
        "| K / V codec | PPL | ΔPPL | KL(exact ‖ q) / token | top-1 agreement |",
        "|---|---|---|---|---|",
        f"| exact (stock sdpa) | {exact.ppl:.3f} | — | — | — |",
    ]
    for name, s in stats.items():
        rows.append(
            f"| {name} | {s.ppl:.3f} | {s.ppl / exact.ppl - 1:+.2%} | {max(s.kl / s.tokens, 0.0):.5f} | "
            f"{s.agree / s.tokens:.2%} |"
        )
    return "\n".join(rows)


def results_section(args, stats: dict[str, Stats], meta: dict, command: str) -> str:
    exact = meta["exact"]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    if args.device == "cpu":
        machine = f"CPU, {os.cpu_count()} cores, {args.threads} threads"
    else:
        machine = f"{torch.cuda.get_device_name()}, fp32"
    return (
        "\n## Quality on a real model (SmolLM2-135M-Instruct)\n\n"
        f"{today}, {machine}, commit {commit or 'unknown'}, {meta['seconds'] / 60:.1f} min.\n"
        f"`{command}`\n\n"
        f"{exact.tokens:,} predicted tokens in {exact.tokens // (args.window - 1)} non-overlapping "
        f"{args.window}-token windows of {meta['sources']}. Every post-RoPE key and value of all 30 layers "
        f"is encoded and decoded (TurboQuant, rotation={ROTATION}, seed {args.seed} for K and V) inside a "
        "custom attention function, then fp32 causal attention. fp8 = per-tensor unscaled cast to "
        f"float8_e4m3fn and back (max |K|, |V| seen: {meta['max_abs_kv']:.1f}, below e4m3's 448). "
        f"Codec off reproduces the stock logits to max |Δ| = {meta['identity_diff']:.1e}. "
        "KL and top-1 are against the exact model.\n\n"
        f"{table(stats, exact)}\n"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--tokens", type=int, default=40 * 1024, help="input tokens (≥ 40,000 for the report)"
    )
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=2, help="windows per forward pass")
    parser.add_argument("--configs", nargs="+", default=list(ALL_CONFIGS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0, help="rotation seed, the same for every K and V codec")
    parser.add_argument(
        "--model-dir", default=None, help="HF checkpoint dir (default: tiercache.cli.models cache)"
    )
    parser.add_argument(
        "--tokens-file", default=None, help="load token ids from here if it exists, else save"
    )
    parser.add_argument("--progress-json", default=None, help="write cumulative stats here after each batch")
    parser.add_argument(
        "--results", default="benchmarks/RESULTS.md", help="append the table here ('' = don't)"
    )
    args = parser.parse_args(argv)
    command = "python benchmarks/quality.py " + " ".join(argv if argv is not None else sys.argv[1:])
    stats, meta = run(args)
    if args.results:
        if not os.path.exists(args.results):
            with open(args.results, "w") as f:
                f.write("# Benchmark results\n")
        with open(args.results, "a") as f:
            f.write(results_section(args, stats, meta, command.strip()))
        print(f"appended to {args.results}")
    print(f"\n{meta['exact'].tokens:,} tokens, {meta['seconds']:.0f} s\n{table(stats, meta['exact'])}")


if __name__ == "__main__":
    main()
