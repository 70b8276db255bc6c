"""Split planning of the decode kernel: waves × (tiles per program + overhead), fewest splits on ties."""

from tiercache.kernels._decode_launch import plan_splits as _plan_splits


def test_too_few_programs_for_a_wave_gives_every_tile_a_program():
    # 8 rows × 64 tiles = 512 programs < one wave of 660: each tile gets its own split
    assert _plan_splits(8, 64, 660, 1.0, 2.0) == 64


def test_one_full_wave_beats_a_wave_and_a_sliver():
    # 128 rows: 6 splits = 768 programs (2 waves × (86 + 2) = 176); 10 splits = 1280 (2 × (52 + 2) = 108);
    # 11 splits = 1408 (3 waves). 5 splits = 640 programs would fit one wave but fill less than min_fill 1.0.
    assert _plan_splits(128, 512, 660, 1.0, 2.0) == 10
    # with min_fill 0.9, 5 splits (1 × (103 + 2) = 105) is allowed and cheapest
    assert _plan_splits(128, 512, 660, 0.9, 2.0) == 5


def test_long_single_sequence_takes_the_fewest_splits_of_the_cheapest_plan():
    # 8 rows × 512 tiles, waves of 660: 82 splits (656 programs) is under min_fill 1.0; 83 splits = 2 waves ×
    # (7 + 2) = 18; 128 splits = 1024 programs = 2 × (4 + 2) = 12, as cheap as 165 splits but fewer
    assert _plan_splits(8, 512, 660, 1.0, 2.0) == 128


def test_plan_stays_within_bounds():
    for rows in (1, 3, 64, 1000):
        for tiles in (1, 2, 17, 300):
            s = _plan_splits(rows, tiles, 660, 1.0, 2.0)
            assert 1 <= s <= tiles
