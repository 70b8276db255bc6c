"""Primary mode's attention metadata: the step's sequences, decodes first, as vLLM's runner lays them out.

Provides:
    PrimaryMetadata     num_decodes (first, one query token each), query_start_loc (+ _cpu), seq_lens
                        (+ _cpu), block_table [S, max_blocks] int32, slot_mapping, num_tokens (not padded)
    PrimaryMetadataBuilder(kv_cache_spec, layer_names, vllm_config, device)
        build(common_prefix_len, common_attn_metadata, fast_build=False) -> PrimaryMetadata
The builder asks vLLM to put decodes first (reorder_batch_threshold 1) and counts them without a device sync;
a step with prefills copies the sequence lengths to the host once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.v1.attention.backend import AttentionMetadataBuilder, CommonAttentionMetadata
from vllm.v1.attention.backends.utils import split_decodes_and_prefills


@dataclass
class PrimaryMetadata:
    num_decodes: int  # the first num_decodes sequences (and tokens) decode one token each
    num_tokens: int  # query tokens of the step, padding excluded
    query_start_loc: torch.Tensor  # [S + 1] int32 (device)
    query_start_loc_cpu: torch.Tensor  # [S + 1] int32
    seq_lens: torch.Tensor  # [S] int32: tokens of each sequence, this step's included
    seq_lens_cpu: (
        torch.Tensor | None
    )  # [S], when the step has prefills (they loop over sequences on the host)
    block_table: torch.Tensor  # [S, max_blocks] int32
    slot_mapping: torch.Tensor  # [T] int64, -1 = padding


class PrimaryMetadataBuilder(AttentionMetadataBuilder[PrimaryMetadata]):
    def __init__(self, kv_cache_spec, layer_names: list[str], vllm_config, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._init_reorder_batch_threshold(1)

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> PrimaryMetadata:
        m = common_attn_metadata
        num_decodes, _, num_decode_tokens, _ = split_decodes_and_prefills(m, decode_threshold=1)
        if num_decodes != num_decode_tokens:  # padded decodes (query length 0) come with full CUDA graphs
            raise NotImplementedError(
                "tiercache primary mode does not run padded decode batches (full CUDA graphs) yet: "
                "start vLLM with enforce_eager=True (--enforce-eager)"
            )
        qsl_cpu = m.query_start_loc_cpu[: m.num_reqs + 1]
        prefills = num_decodes < m.num_reqs
        return PrimaryMetadata(
            num_decodes=num_decodes,
            num_tokens=int(qsl_cpu[-1]),
            query_start_loc=m.query_start_loc[: m.num_reqs + 1],
            query_start_loc_cpu=qsl_cpu,
            seq_lens=m.seq_lens[: m.num_reqs],
            seq_lens_cpu=m.seq_lens[: m.num_reqs].cpu() if prefills else None,
            block_table=m.block_table_tensor[: m.num_reqs],
            slot_mapping=m.slot_mapping,
        )
