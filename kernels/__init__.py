"""TurboQuant codec reference and Triton kernels, importable as tiercache.kernels.

VRAM-tier format (one layer): packed [num_blocks, block_size, num_kv_heads, packed_dim] uint8 and
norms [num_blocks, block_size, num_kv_heads] float32; slot = block * block_size + offset.
Kernels: tq_encode_store, tq_encode_blocks, tq_dequantize_blocks, tq_decode_attention, piece_checksums;
tq_encode_layers and tq_dequantize_layers run every layer of a model in one launch (PagedLayers)
(Triton on CUDA and under TRITON_INTERPRET=1, the PyTorch references in kernels/reference.py elsewhere;
piece_checksums_host for checksums); torch.library ops in .ops.
Launch choices: EncodeLaunchConfig, DequantizeLaunchConfig, DecodeLaunchConfig (kernels/launch_config.py),
passed to a launcher as config= (None: the defaults).
"""

from .checksum import fold_pieces, piece_checksums, piece_words
from .checksum_host import piece_checksums_host
from .codec import SUPPORTED_HEAD_DIMS, TurboQuantCodec
from .decode_attention import DecodeWorkspace, tq_decode_attention
from .dequantize import tq_dequantize_blocks, tq_dequantize_layers
from .encode_store import tq_encode_blocks, tq_encode_layers, tq_encode_store
from .launch_config import DecodeLaunchConfig, DequantizeLaunchConfig, EncodeLaunchConfig
from .packing import pack_indices, unpack_indices
from .paged_layers import PagedLayers

__all__ = [
    "SUPPORTED_HEAD_DIMS",
    "DecodeLaunchConfig",
    "DecodeWorkspace",
    "DequantizeLaunchConfig",
    "EncodeLaunchConfig",
    "PagedLayers",
    "TurboQuantCodec",
    "fold_pieces",
    "pack_indices",
    "piece_checksums",
    "piece_checksums_host",
    "piece_words",
    "tq_decode_attention",
    "tq_dequantize_blocks",
    "tq_dequantize_layers",
    "tq_encode_blocks",
    "tq_encode_layers",
    "tq_encode_store",
    "unpack_indices",
]
