"""Launch policy shared by the kernel launchers; importable without Triton.

Provides:
    HAVE_TRITON                        whether Triton imports
    interpreting() -> bool             TRITON_INTERPRET=1 is set
    use_triton(*tensors) -> bool       Triton on CUDA tensors, or anywhere under TRITON_INTERPRET=1
    num_sms(device) -> int             multiprocessor count (cached; a small constant off-GPU)
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


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
