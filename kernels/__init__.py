"""TurboQuant codec reference and (in later modules) Triton kernels, importable as tiercache.kernels."""

from .codec import SUPPORTED_HEAD_DIMS, TurboQuantCodec
from .packing import pack_indices, unpack_indices

__all__ = ["SUPPORTED_HEAD_DIMS", "TurboQuantCodec", "pack_indices", "unpack_indices"]
