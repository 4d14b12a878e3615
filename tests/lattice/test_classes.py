"""Permutation classes, shell sizes and the v1 class layout (docs/lattice.md §2.2, §3)."""

from __future__ import annotations

import math

import pytest

from leechq.lattice.classes import ball_size, class_table, index_bits, shell_size

SHELL_SIZES = {
    2: 196_560,
    3: 16_773_120,
    4: 398_034_000,
    5: 4_629_381_120,
    6: 34_417_656_000,
    7: 187_489_935_360,
    8: 814_879_774_800,
    9: 2_975_551_488_000,
    10: 9_486_551_299_680,
    11: 27_052_945_920_000,
    12: 70_486_236_999_360,
    13: 169_931_095_326_720,
    14: 384_163_586_352_000,
}
CUMULATIVE = {
    2: 196_560, 3: 16_969_680, 4: 415_003_680, 5: 5_044_384_800, 6: 39_462_040_800,
    7: 226_951_976_160, 8: 1_041_831_750_960, 9: 4_017_383_238_960, 10: 13_503_934_538_640,
    11: 40_556_880_458_640, 12: 111_043_117_458_000, 13: 280_974_212_784_720,
}
BITS = {2: 18, 3: 25, 4: 29, 5: 33, 6: 36, 7: 38, 8: 40, 9: 42, 10: 44, 11: 46, 12: 47, 13: 48}
CLASSES_PER_SHELL = {
    2: (2, 1), 3: (2, 2), 4: (6, 2), 5: (5, 4), 6: (11, 6), 7: (10, 7), 8: (19, 11), 9: (18, 15),
    10: (30, 17), 11: (30, 24), 12: (47, 32), 13: (46, 36),
}


@pytest.mark.parametrize("m", sorted(SHELL_SIZES))
def test_shell_sizes(m: int) -> None:
    assert shell_size(m) == SHELL_SIZES[m]


def test_cumulative_counts_index_bits_and_first_indices() -> None:
    for m, n in CUMULATIVE.items():
        assert ball_size(m) == n
        assert index_bits(m) == BITS[m] == math.ceil(math.log2(n + 1))
    assert ball_size(12) == 111_043_117_458_000
    assert ball_size(13) == 280_974_212_784_720
    assert index_bits(12) == 47
    assert index_bits(13) == 48
    table = class_table(13)
    for m in range(2, 14):
        first = min(c.first_index for c in table if c.shell == m)
        assert first == (CUMULATIVE[m - 1] if m > 2 else 0) + 1


def test_theta_series_first_terms() -> None:
    # Theta series of the Leech lattice (OEIS A008408): 1, 0, 196560, 16773120, 398034000, ...
    # Closed form of the Leech theta coefficients: (65520/691)·(σ11(m) − τ(m)).
    tau = {1: 1, 2: -24, 3: 252, 4: -1472, 5: 4830, 6: -6048, 7: -16744}

    def sigma11(m: int) -> int:
        return sum(d**11 for d in range(1, m + 1) if m % d == 0)

    for m in range(2, 8):
        assert shell_size(m) * 691 == 65520 * (sigma11(m) - tau[m])


def test_class_counts() -> None:
    t12, t13 = class_table(12), class_table(13)
    assert len(t12) == 301
    assert (sum(not c.odd for c in t12), sum(c.odd for c in t12)) == (180, 121)
    assert len(t13) == 383
    assert (sum(not c.odd for c in t13), sum(c.odd for c in t13)) == (226, 157)
    for m, (even, odd) in CLASSES_PER_SHELL.items():
        on_shell = [c for c in t13 if c.shell == m]
        assert (sum(not c.odd for c in on_shell), sum(c.odd for c in on_shell)) == (even, odd)
    by_weight = {w: sum(1 for c in t12 if not c.odd and c.weight == w) for w in (0, 8, 12, 16, 24)}
    assert by_weight == {0: 17, 8: 68, 12: 51, 16: 39, 24: 5}
    assert len(class_table(14)) - len(t13) == 115
    assert max(len(c.levels()) for c in t12) == 5


def test_ball_12_is_a_prefix_of_ball_13() -> None:
    assert class_table(13)[:301] == class_table(12)


def test_class_sizes_add_up_and_offsets_accumulate() -> None:
    table = class_table(13)
    offset = 0
    for number, c in enumerate(table):
        assert c.number == number
        assert c.offset == offset
        offset += c.size
        assert sum(n for _, n in (c.odd_kinds if c.odd else (*c.word_kinds, *c.free_kinds))) + (
            0 if c.odd else c.n_zero
        ) == 24
        assert sum(v * v for v in c.magnitudes()) == 16 * c.shell
    assert offset == ball_size(13)


LAYOUT_ROWS = [
    # number, shell, odd, weight, p_req, magnitudes (value, count) descending, size, first index
    (0, 2, False, 0, 0, ((4, 2),), 1_104, 1),
    (1, 2, False, 8, 0, ((2, 8),), 97_152, 1_105),
    (2, 2, True, 0, 0, ((3, 1), (1, 23)), 98_304, 98_257),
    (3, 3, False, 8, 1, ((4, 1), (2, 8)), 3_108_864, 196_561),
    (4, 3, False, 12, 0, ((2, 12),), 5_275_648, 3_305_425),
    (5, 3, True, 0, 0, ((3, 3), (1, 21)), 8_290_304, 8_581_073),
    (6, 3, True, 0, 0, ((5, 1), (1, 23)), 98_304, 16_871_377),
    (7, 4, False, 0, 0, ((4, 4),), 170_016, 16_969_681),
    (8, 4, False, 0, 0, ((8, 1),), 48, 17_139_697),
    (9, 4, False, 8, 0, ((4, 2), (2, 8)), 46_632_960, 17_139_745),
    (10, 4, False, 12, 1, ((4, 1), (2, 12)), 126_615_552, 63_772_705),
    (11, 4, False, 16, 0, ((2, 16),), 24_870_912, 190_388_257),
    (12, 4, False, 8, 1, ((6, 1), (2, 7)), 777_216, 215_259_169),
    (13, 4, True, 0, 0, ((3, 5), (1, 19)), 174_096_384, 216_036_385),
    (14, 4, True, 0, 0, ((5, 1), (3, 2), (1, 21)), 24_870_912, 390_132_769),
]


@pytest.mark.parametrize("row", LAYOUT_ROWS, ids=[str(r[0]) for r in LAYOUT_ROWS])
def test_layout_rows_of_section_3_3(row: tuple) -> None:
    number, shell, odd, weight, p_req, kinds, size, first = row
    c = class_table(13)[number]
    assert (c.shell, c.odd, c.size, c.first_index) == (shell, odd, size, first)
    if not odd:
        assert (c.weight, c.p_req) == (weight, p_req)
    nonzero = tuple((v, n) for v, n in (c.odd_kinds if c.odd else (*c.word_kinds, *c.free_kinds)))
    assert tuple(sorted(nonzero, reverse=True)) == kinds


def test_hand_checkable_decompositions() -> None:
    table = class_table(13)
    shell2 = [c.size for c in table if c.shell == 2]
    assert sorted(shell2) == sorted([97_152, 1_104, 98_304])
    assert 759 * 2**7 == 97_152 and math.comb(24, 2) * 4 == 1_104 and 24 * 4096 == 98_304
    shell3 = sorted(c.size for c in table if c.shell == 3)
    assert shell3 == sorted([2576 * 2**11, 759 * 16 * 2 * 2**7, 24 * 4096, 4096 * math.comb(24, 3)])
    shell4 = {c.magnitudes(): c.size for c in table if c.shell == 4 and not c.odd}
    assert shell4[(8,) + (0,) * 23] == 48
    assert shell4[(4, 4, 4, 4) + (0,) * 20] == math.comb(24, 4) * 16 == 170_016


def test_invalid_max_shell() -> None:
    with pytest.raises(ValueError):
        class_table(1)
    with pytest.raises(ValueError):
        class_table(15)
