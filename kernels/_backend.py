"""Launch policy shared by the kernel launchers; importable without Triton.

Provides:
    HAVE_TRITON                        whether Triton imports
    interpreting() -> bool             TRITON_INTERPRET=1 is set
    use_triton(*tensors) -> bool       Triton on CUDA tensors, or anywhere under TRITON_INTERPRET=1
    num_sms(device) -> int             multiprocessor count (cached; a small constant off-GPU)
    cuda_index(device) -> int          a CUDA device's index (the current device where it has none)
    pdl_supported(device) -> bool      programmatic dependent launch: Hopper or newer, Triton with launch_pdl
    next_pow2(n) -> int
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

HAVE_TRITON = importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(*tensors: torch.Tensor) -> bool:
    return HAVE_TRITON and (interpreting() or all(t.is_cuda for t in tensors))


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return _sm_count(cuda_index(device))


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def pdl_supported(device: torch.device) -> bool:
    """Whether kernels on `device` may be launched with programmatic dependent launch (PDL): a CUDA device of
    compute capability ≥ 9.0 and a Triton whose launcher takes `launch_pdl`; never under the interpreter."""
    if device.type != "cuda" or interpreting() or not HAVE_TRITON:
        return False
    return _pdl_supported(cuda_index(device))


@functools.cache
def _pdl_supported(index: int) -> bool:
    if torch.cuda.get_device_capability(index)[0] < 9:
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
    except ImportError:
        return False
    return "launch_pdl" in CUDAOptions.__dataclass_fields__
