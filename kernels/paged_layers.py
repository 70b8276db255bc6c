"""Many layers of a paged float cache, one tensor per layer, reached by one kernel launch.

Provides:
    PagedLayers(caches)     caches: L tensors [NB, BS, H, D] of one dtype, shape and strides, on one device
                            (one side, K or V, of every layer of vLLM's cache: separate allocations, any
                            strides); raises ValueError naming what differs
        base                caches[0], the tensor a kernel receives
        caches              the L tensors
        offsets             [L] int64 on the device, or None when L == 1: layer l starts
                            offsets[l] · align elements past base's first element
        align               elements per offset unit: 16 bytes' worth when every layer starts a multiple of
                            16 bytes past base (the kernels' vector accesses stay aligned), else 1
        num_layers, shape, dtype, device

A kernel reads layer l at `base_ptr + tl.load(offsets_ptr + l) * ALIGN`: the product tells the compiler the
offset is a multiple of ALIGN, so rows keep their 16-byte accesses. The table is built once per set of
caches (the caches must outlive it and keep their storage).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._checks import check_float


class PagedLayers:
    def __init__(self, caches: Sequence[torch.Tensor]) -> None:
        if not caches:
            raise ValueError("PagedLayers: no layers given")
        base = caches[0]
        check_float("PagedLayers: layer 0", base, 4)
        for i, t in enumerate(caches[1:], 1):
            check_float(f"PagedLayers: layer {i}", t, 4)
            if _kind(t) != _kind(base):
                raise ValueError(
                    "PagedLayers: layer {i} is {} {} strides {} on {}, layer 0 {} {} strides {} on {}: one "
                    "launch needs every layer alike (launch per layer otherwise)".format(
                        *_kind(t), *_kind(base), i=i
                    )
                )
        size = base.element_size()
        starts = [t.data_ptr() - base.data_ptr() for t in caches]
        if any(s % size for s in starts):
            raise ValueError(f"PagedLayers: a layer starts between two {base.dtype} elements of layer 0")
        self.caches = tuple(caches)
        self.base = base
        self.num_layers = len(caches)
        self.shape, self.dtype, self.device = tuple(base.shape), base.dtype, base.device
        self.align = 16 // size if all(s % 16 == 0 for s in starts) else 1
        self.offsets = None
        if self.num_layers > 1:
            unit = size * self.align
            self.offsets = torch.tensor([s // unit for s in starts], dtype=torch.int64, device=base.device)


def _kind(t: torch.Tensor) -> tuple:
    return t.dtype, tuple(t.shape), t.stride(), t.device
