"""The extended Golay code G24 in canonical order (docs/lattice.md §1)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from leechq.lattice.golay import (
    ALL_ONES,
    GENERATOR,
    WEIGHT_COUNTS,
    clmul,
    codeword_bits,
    encode_message,
    golay_code,
)

GENERATOR_ROWS = [
    0x800C75, 0x8018EA, 0x8031D4, 0x8063A8, 0x80C750, 0x818EA0,
    0x831D40, 0x863A80, 0x8C7500, 0x98EA00, 0xB1D400, 0xE3A800,
]


def test_generator_polynomial_and_its_reciprocal_factor_x23_plus_1() -> None:
    assert GENERATOR == 0xC75
    assert clmul(clmul(0b11, 0xC75), 0xAE3) == (1 << 23) | 1


def test_generator_rows() -> None:
    rows = [encode_message(1 << i) for i in range(12)]
    assert rows == GENERATOR_ROWS
    assert all(r.bit_count() == 8 for r in rows)


def test_weight_distribution() -> None:
    weights = [int(w).bit_count() for w in golay_code().words]
    counts = {w: weights.count(w) for w in sorted(set(weights))}
    assert counts == {0: 1, 8: 759, 12: 2576, 16: 759, 24: 1}
    assert counts == WEIGHT_COUNTS
    assert len(set(golay_code().words.tolist())) == 4096


def test_canonical_order_vectors() -> None:
    words = golay_code().words
    expected = {
        0: 0x0, 1: 0x149F, 2: 0x293E, 3: 0x3DA1, 759: 0xF82402, 760: 0x6FDD,
        3335: 0xFF9022, 3336: 0x7DBFD, 4095: 0xFFFFFF,
    }
    for position, word in expected.items():
        assert int(words[position]) == word, position
    octad = [i for i in range(24) if 0x149F >> i & 1]
    assert octad == [0, 1, 2, 3, 4, 7, 10, 12]
    keys = [(int(w).bit_count(), int(w)) for w in words]
    assert keys == sorted(keys)


def test_ranks_are_consistent_with_the_order() -> None:
    code = golay_code()
    starts = {0: 0, 8: 1, 12: 760, 16: 3336, 24: 4095}
    for flat, word in enumerate(code.words.tolist()):
        assert code.flat_rank(word) == flat
        weight = word.bit_count()
        assert code.rank_in_weight(word) == flat - starts[weight]
        assert code.word_of_weight(weight, flat - starts[weight]) == word
    with pytest.raises(ValueError):
        code.flat_rank(0x3)


def test_linear_doubly_even_self_dual_dmin8() -> None:
    code = golay_code()
    members = set(code.words.tolist())
    # Linear: closed under XOR of generator rows and spanned by them (dimension 12).
    for a, b in itertools.combinations(GENERATOR_ROWS, 2):
        assert a ^ b in members
        assert (a & b).bit_count() % 2 == 0  # self-orthogonal
    span = {0}
    for row in GENERATOR_ROWS:
        span |= {s ^ row for s in span}
    assert span == members
    assert all(w.bit_count() % 4 == 0 for w in members)  # doubly even
    # Self-dual: every word orthogonal to every codeword is a codeword (dimension 12 = 24 − 12).
    assert ALL_ONES in members
    assert all((ALL_ONES ^ w) in members for w in members)
    # Minimum distance = minimum non-zero weight of a linear code.
    assert min(w.bit_count() for w in members if w) == 8
    rng = np.random.default_rng(7)
    sample = rng.choice(np.array(sorted(members)), size=(2000, 2))
    for a, b in sample.tolist():
        assert a == b or (a ^ b).bit_count() >= 8


def test_dual_equals_code() -> None:
    words = golay_code().words
    bits = codeword_bits(words)  # [4096, 24]
    gram = (bits[:, None, :] & bits[None, :64, :]).sum(-1)
    assert np.all(gram % 2 == 0)
    # No non-codeword of weight 4 (a sample) is orthogonal to every generator row.
    for support in itertools.islice(itertools.combinations(range(24), 4), 500):
        word = sum(1 << i for i in support)
        orthogonal = all((word & r).bit_count() % 2 == 0 for r in GENERATOR_ROWS)
        assert not orthogonal


def test_contains_vectorized() -> None:
    code = golay_code()
    probe = np.array([0, 0x149F, 0x3, 0xFFFFFF, 0xFFFFFE, 0x6FDD, 1 << 23], dtype=np.int64)
    expected = [code.is_codeword(int(w)) for w in probe]
    assert expected == [True, True, False, True, False, True, False]
    assert code.contains(probe).tolist() == expected


def test_codeword_bits() -> None:
    bits = codeword_bits(np.array([0x149F]))
    assert bits.shape == (1, 24)
    assert np.flatnonzero(bits[0]).tolist() == [0, 1, 2, 3, 4, 7, 10, 12]
