"""Launch configurations: checked when built (errors name the field, the value and the valid values), frozen,
hashable, and refused by the launchers in any other form."""

import dataclasses
import re

import pytest
import torch
from kernel_cases import codec

from tiercache.kernels import (
    DecodeLaunchConfig,
    DecodeWorkspace,
    DequantizeLaunchConfig,
    EncodeLaunchConfig,
    tq_decode_attention,
    tq_dequantize_blocks,
    tq_encode_store,
)
from tiercache.kernels.decode_attention import plan_num_splits

# (type, field, bad value, the valid values as the error states them)
BAD = [
    (DecodeLaunchConfig, "lut", "byte", "one of 'prmt', 'gather', 'none'"),
    (DecodeLaunchConfig, "tile", 48, "a power of two ≥ 16"),
    (DecodeLaunchConfig, "tile", 8, "a power of two ≥ 16"),
    (DecodeLaunchConfig, "programs_per_sm", 0, "an integer ≥ 1"),
    (DecodeLaunchConfig, "min_wave_fill", 1.5, "a number from 0.0 to 1.0"),
    (DecodeLaunchConfig, "split_overhead_tiles", -1.0, "a number ≥ 0.0"),
    (DecodeLaunchConfig, "num_warps", 3, "a power of two from 1 to 32"),
    (DecodeLaunchConfig, "num_stages", 0, "an integer ≥ 1"),
    (DecodeLaunchConfig, "rotate_in_split", 1, "one of False, True"),
    (DecodeLaunchConfig, "pdl", "yes", "one of False, True"),
    (DecodeLaunchConfig, "maxnreg", 300, "None or an integer from 16 to 255"),
    (DecodeLaunchConfig, "merge_preload", 0, "one of None, False, True"),
    (DecodeLaunchConfig, "merge_rows", 8, "one of None, 1, 16"),
    (DecodeLaunchConfig, "merge_rows", True, "one of None, 1, 16"),
    (DecodeLaunchConfig, "lut_kernel", None, "one of False, True"),
    (DecodeLaunchConfig, "lut_min_work", -1, "an integer ≥ 0"),
    (DecodeLaunchConfig, "lut_warps", 6, "a power of two from 2 to 16"),
    (DecodeLaunchConfig, "lut_warps", 32, "a power of two from 2 to 16"),
    (DecodeLaunchConfig, "lut_warps", 8.0, "a power of two from 2 to 16"),
    (DecodeLaunchConfig, "lut_tile", 128, "one of 16, 32, 64"),
    (DecodeLaunchConfig, "lut_tile", 16.0, "one of 16, 32, 64"),
    (DecodeLaunchConfig, "lut_maxnreg", 8, "None or an integer from 16 to 255"),
    (DecodeLaunchConfig, "lut_combine_max_steps", None, "an integer ≥ 0"),
    (DecodeLaunchConfig, "lut_tma", "auto", "one of False, True"),
    (DecodeLaunchConfig, "lut_min_wave_fill", float("nan"), "a number from 0.0 to 1.0"),
    (DecodeLaunchConfig, "lut_pdl_max_steps", -1, "None or an integer ≥ 0"),
    (DecodeLaunchConfig, "lut_programs_per_sm", 0, "None or an integer ≥ 1"),
    (DecodeLaunchConfig, "lut_head_dims", (96,), "a non-empty tuple of head_dims from (64, 128)"),
    (DecodeLaunchConfig, "lut_head_dims", [128], "a non-empty tuple of head_dims from (64, 128)"),
    (DecodeLaunchConfig, "lut_head_dims", (), "a non-empty tuple of head_dims from (64, 128)"),
    (EncodeLaunchConfig, "block_tokens", 8, "a power of two ≥ 16"),
    (EncodeLaunchConfig, "programs_per_sm", True, "an integer ≥ 1"),
    (EncodeLaunchConfig, "num_warps", 64, "a power of two from 1 to 32"),
    (EncodeLaunchConfig, "num_stages", 0, "an integer ≥ 1"),
    (DequantizeLaunchConfig, "rows", 100, "a power of two ≥ 16"),
    (DequantizeLaunchConfig, "programs_per_sm", 0, "an integer ≥ 1"),
    (DequantizeLaunchConfig, "verify_programs_per_sm", 0, "an integer ≥ 1"),
    (DequantizeLaunchConfig, "num_warps", 0, "a power of two from 1 to 32"),
    (DequantizeLaunchConfig, "num_stages", 2.5, "an integer ≥ 1"),
]
GOOD = [
    (DecodeLaunchConfig, {"lut_warps": 2, "lut_tile": 64, "lut_maxnreg": None, "lut_pdl_max_steps": None}),
    (DecodeLaunchConfig, {"lut": "none", "tile": 16, "merge_preload": True}),
    (DecodeLaunchConfig, {"min_wave_fill": 1, "lut_min_wave_fill": 0, "lut_combine_max_steps": 1 << 30}),
    (DecodeLaunchConfig, {"lut_programs_per_sm": 1, "maxnreg": 255, "num_warps": 8, "rotate_in_split": True}),
    (DecodeLaunchConfig, {"lut_head_dims": (128,)}),
    (EncodeLaunchConfig, {"block_tokens": 32, "programs_per_sm": 4, "num_warps": 8, "num_stages": 3}),
    (DequantizeLaunchConfig, {"rows": 128, "programs_per_sm": 2, "num_warps": 8, "num_stages": 1}),
]


@pytest.mark.parametrize("kind,field,value,valid", BAD)
def test_bad_value_names_field_value_and_valid_values(kind, field, value, valid):
    want = f"{kind.__name__}.{field} is {value!r}: use {valid}"
    with pytest.raises(ValueError, match=re.escape(want)):
        kind(**{field: value})
    with pytest.raises(ValueError, match=re.escape(want)):  # replace() checks too
        dataclasses.replace(kind(), **{field: value})


@pytest.mark.parametrize("kind,changes", GOOD)
def test_valid_configs_are_frozen_hashable_values(kind, changes):
    config = kind(**changes)
    assert config == dataclasses.replace(kind(), **changes)
    assert hash(config) == hash(kind(**changes)) and config != kind()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.num_warps = 2


def test_unknown_field_is_a_type_error():
    with pytest.raises(TypeError, match="lut_warp"):
        DecodeLaunchConfig(lut_warp=8)


def test_launchers_refuse_a_config_of_another_type():
    """The old module-level CONFIG dicts, or another launcher's config, are refused before any work."""
    c = codec(64, 4)
    packed, norms = torch.zeros(2, 16, 1, c.packed_dim, dtype=torch.uint8), torch.ones(2, 16, 1)
    x, slots = torch.randn(3, 1, 64), torch.arange(3)
    query, tables, lens = torch.randn(1, 2, 64), torch.zeros(1, 2, dtype=torch.int32), torch.tensor([5])
    use = "dataclasses.replace"
    with pytest.raises(TypeError, match=rf"config must be EncodeLaunchConfig\(\.\.\.\) .*{use}"):
        tq_encode_store(x, x, slots, packed, norms, packed, norms, c, c, config={"block_tokens": 32})
    with pytest.raises(TypeError, match="config must be DequantizeLaunchConfig"):
        tq_dequantize_blocks(packed, norms, slots, c, torch.empty(3, 16, 1, 64), config=EncodeLaunchConfig())
    with pytest.raises(TypeError, match="config must be DecodeLaunchConfig"):
        tq_decode_attention(query, packed, norms, packed, norms, tables, lens, c, c, config={"tile": 32})
    with pytest.raises(TypeError, match="config must be DecodeLaunchConfig"):
        DecodeWorkspace.allocate(query, tables, 16, 1, config={"tile": 32})
    with pytest.raises(TypeError, match="config must be DecodeLaunchConfig"):
        plan_num_splits(1, 1, 4096, torch.device("cpu"), config=DequantizeLaunchConfig())


def test_split_planning_follows_the_config_it_is_given():
    """The same call with two configurations plans for each (the plan is cached by value only)."""
    cpu = torch.device("cpu")  # 4 "SMs" off the GPU
    assert (
        plan_num_splits(1, 8, 4096, cpu) == plan_num_splits(1, 8, 4096, cpu, config=DecodeLaunchConfig()) == 5
    )
    # 8 rows on a wave of 4 programs: one split each
    assert plan_num_splits(1, 8, 4096, cpu, config=DecodeLaunchConfig(programs_per_sm=1)) == 1
    assert plan_num_splits(1, 8, 4096, cpu) == 5


def test_gluon_kernel_takes_the_head_dims_its_config_names():
    """By default the Gluon kernel takes head_dims 128 and 64 at every width; a config naming one head_dim
    sends the other's decodes to the Triton kernels."""
    from tiercache.kernels.decode_lut import lut_serves, lut_takes

    default, only_128 = DecodeLaunchConfig(), DecodeLaunchConfig(lut_head_dims=(128,))
    assert lut_takes(4, 4, 64, default) and lut_takes(6, 4, 64, default) and lut_takes(4, 4, 128, default)
    assert lut_serves(4, 4, 64) and not lut_takes(4, 4, 64, only_128) and lut_takes(4, 4, 128, only_128)
    assert (
        lut_takes(5, 3, 128, default) and lut_takes(5, 3, 64, default) and not lut_takes(5, 3, 64, only_128)
    )


def test_primary_pages_take_the_gluon_kernel_where_a_token_row_of_heads_fits_a_tma_box():
    """Primary mode's pages hold a token's heads densely: odd widths at head_dim 64 (rows of 8·bits bytes)
    take the Gluon kernel where KV heads × bits is even (the row of heads a multiple of 16 bytes)."""
    from tiercache.kernels.decode_lut import lut_takes_pages

    default = DecodeLaunchConfig()
    assert lut_takes_pages(5, 3, 64, 8, default) and lut_takes_pages(5, 3, 64, 2, default)
    assert not lut_takes_pages(5, 3, 64, 3, default) and not lut_takes_pages(4, 3, 64, 3, default)
    assert lut_takes_pages(4, 4, 64, 3, default) and lut_takes_pages(6, 2, 64, 3, default)
    assert lut_takes_pages(5, 3, 128, 3, default)
    assert not lut_takes_pages(5, 3, 64, 8, DecodeLaunchConfig(lut_head_dims=(128,)))
