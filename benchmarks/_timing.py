"""Timing helpers shared by the GPU benchmarks (median of CUDA-event timings, L2 flushed between runs)."""

from __future__ import annotations

import os
import subprocess

import torch
import triton.testing


def bench_us(fn, warmup_ms: int = 25, rep_ms: int = 200) -> float:
    """Median time of fn() in µs (triton.testing.do_bench: CUDA events, L2 cleared before each call)."""
    return 1000.0 * triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def graphed(fn):
    """fn captured in a CUDA graph (after one eager warm-up call); returns the replay callable."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def copy_bandwidth_gbs(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = bench_us(lambda: dst.copy_(src))
    return 2 * nbytes / t / 1e3


def describe_device() -> str:
    props = torch.cuda.get_device_properties(0)
    versions = f"torch {torch.__version__}, triton {triton.__version__}"
    return f"{props.name}, {props.multi_processor_count} SMs, {versions}"


def compiled_report(kernel) -> str:
    """Registers, spills and shared memory of a compiled Triton kernel (or '')."""
    if kernel is None:
        return ""
    return f"regs {kernel.n_regs} spills {kernel.n_spills} smem {kernel.metadata.shared}"


def git_commit() -> str:
    if os.environ.get("TIERCACHE_COMMIT"):  # set by the caller where the tree has no .git
        return os.environ["TIERCACHE_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
