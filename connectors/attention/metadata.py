"""Primary mode's attention metadata: the step's sequences, decodes first, as vLLM's runner lays them out.

Provides:
    PrimaryMetadata     num_decodes (first, one query token each), query_start_loc (+ _cpu), seq_lens
                        (+ _cpu), decode_seq_lens, block_table [S, max_blocks] int32, slot_mapping,
                        num_tokens (not padded)
    PrimaryMetadataBuilder(kv_cache_spec, layer_names, vllm_config, device)
        build(common_prefix_len, common_attn_metadata, fast_build=False) -> PrimaryMetadata
The builder asks vLLM to put decodes first (reorder_batch_threshold 1) and counts them without a device sync;
a step with prefills copies the sequence lengths to the host once.

CUDA graphs: the builder declares UNIFORM_SINGLE_TOKEN_DECODE, so vLLM captures whole decode steps. A
captured batch is padded with requests of no query token, sequence length 0 and the null block (block 0,
zeros) in their table rows, after the real ones. Decode reads its lengths from `decode_seq_lens`, a buffer
the builder owns (a fixed address for every replay), holding the lengths with 0 raised to 1: a padded row
attends one token of the null block (finite; vLLM discards the row). Steps with prefills run outside full
graphs (vLLM's piecewise graphs around attention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.v1.attention.backend import AttentionCGSupport, AttentionMetadataBuilder, CommonAttentionMetadata
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
    decode_seq_lens: torch.Tensor  # [num_decodes] int32: seq_lens of the decodes, 0 (padding) raised to 1
    block_table: torch.Tensor  # [S, max_blocks] int32
    slot_mapping: torch.Tensor  # [T] int64, -1 = padding


class PrimaryMetadataBuilder(AttentionMetadataBuilder[PrimaryMetadata]):
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    def __init__(self, kv_cache_spec, layer_names: list[str], vllm_config, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._init_reorder_batch_threshold(1)
        most = vllm_config.scheduler_config.max_num_batched_tokens  # ≥ the requests of any step
        self._decode_seq_lens = torch.ones(most, dtype=torch.int32, device=device)

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> PrimaryMetadata:
        m = common_attn_metadata
        num_decodes, num_prefills, num_decode_tokens, _ = split_decodes_and_prefills(m, decode_threshold=1)
        if num_decodes != num_decode_tokens and num_prefills:  # padding comes only with pure decode steps
            raise NotImplementedError(
                f"tiercache primary mode: a padded batch with prefills ({num_decodes} decode requests with "
                f"{num_decode_tokens} tokens, {num_prefills} prefills); start vLLM with --enforce-eager"
            )
        qsl_cpu = m.query_start_loc_cpu[: m.num_reqs + 1]
        seq_lens = m.seq_lens[: m.num_reqs]
        decode_seq_lens = self._decode_seq_lens[:num_decodes]
        torch.clamp(seq_lens[:num_decodes], min=1, out=decode_seq_lens)
        return PrimaryMetadata(
            num_decodes=num_decodes,
            num_tokens=int(qsl_cpu[-1]),
            query_start_loc=m.query_start_loc[: m.num_reqs + 1],
            query_start_loc_cpu=qsl_cpu,
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens.cpu() if num_prefills else None,
            decode_seq_lens=decode_seq_lens,
            block_table=m.block_table_tensor[: m.num_reqs],
            slot_mapping=m.slot_mapping,
        )

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> PrimaryMetadata:
        """The capture runs decode once: over one token per sequence (the graph does not depend on it)."""
        metadata = self.build(0, common_attn_metadata)
        metadata.decode_seq_lens.fill_(1)
        return metadata
