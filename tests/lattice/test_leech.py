"""Membership in √8·Λ24, shells and Golay words (docs/lattice.md §2; pitfall P10)."""

from __future__ import annotations

import numpy as np
import pytest

from leechq.errors import InvalidInput, NotInCodebook
from leechq.lattice._oracle import shell2_points
from leechq.lattice.golay import golay_code
from leechq.lattice.indexing import decode_indices
from leechq.lattice.leech import golay_word, golay_words, is_member, members, shell_of

OCTAD = [0, 1, 2, 3, 4, 7, 10, 12]  # words[1] = 0x149f


def _on(support: list[int], value: int, rest: int = 0) -> list[int]:
    x = [rest] * 24
    for i in support:
        x[i] = value
    return x


def _non_codeword_octet() -> list[int]:
    """A weight-8 support that is not an octad (the first in lexicographic order)."""
    code = golay_code()
    octads = set(code.words_of_weight(8).tolist())
    import itertools

    for support in itertools.combinations(range(24), 8):
        if sum(1 << i for i in support) not in octads:
            return list(support)
    raise AssertionError("unreachable")


# Probes that satisfy the parity and sum rules but fail the Golay rule (pitfall P10).
GOLAY_FAILING = {
    "2^4": _on([0, 1, 2, 3], 2),
    "2^8 off an octad": _on(_non_codeword_octet(), 2),
    "1^24 with two -1": [-1, -1] + [1] * 22,
    "1^24 with four -1, one +5": [-1, -1, -1, -1, 5] + [1] * 19,
}


@pytest.mark.parametrize("name", sorted(GOLAY_FAILING))
def test_p10_probes_pass_parity_and_sum_but_are_not_members(name: str) -> None:
    x = GOLAY_FAILING[name]
    parity = x[0] % 2
    assert all(v % 2 == parity for v in x)
    assert sum(x) % 8 == 4 * parity  # the sum rule holds: only the Golay rule can reject it
    assert not golay_code().is_codeword(golay_word(x))
    assert not is_member(x)
    assert not members(np.array([x]))[0]
    with pytest.raises(NotInCodebook, match="Golay"):
        shell_of(x)


def test_p10_probe_sums_check_the_sum_rule_independently() -> None:
    # Each probe, repaired to a codeword support, becomes a member; so the rejection above is
    # really the Golay stage (e.g. 2^8 on an octad is in Shell(2)).
    assert is_member(_on(OCTAD, 2))
    assert shell_of(_on(OCTAD, 2)) == 2
    # Breaking only the sum rule: 2^8 on an octad with one minus sign.
    x = _on(OCTAD, 2)
    x[0] = -2
    assert not is_member(x)
    # Breaking only parity.
    assert not is_member([1] + [0] * 23)


def test_known_members_and_shells() -> None:
    assert is_member([0] * 24) and shell_of([0] * 24) == 0
    assert shell_of([4, 4] + [0] * 22) == 2
    assert shell_of([-3] + [1] * 23) == 2
    assert shell_of([8] + [0] * 23) == 4
    assert shell_of([-1] * 23 + [-13]) == 12
    assert shell_of([-1] * 21 + [3, 3, -13]) == 13
    x = [16] + [0] * 23  # a member (shell 16), outside the index ball but still in the lattice
    assert is_member(x) and shell_of(x) == 16
    assert not is_member([2, 2] + [0] * 22)
    assert not is_member([4] + [0] * 23)  # sum 4 ≢ 0 (mod 8)


def test_golay_word_uses_euclidean_mod() -> None:
    # Odd coset: bit i set iff x_i ≡ 3 (mod 4); −1 ≡ 3, −3 ≡ 1.
    assert golay_word([-1] * 24) == 0xFFFFFF
    assert golay_word([1] * 24) == 0
    assert golay_word([-3] + [1] * 23) == 0
    assert golay_word([3] + [1] * 23) == 1
    # Even coset: bit i set iff x_i ≡ 2 (mod 4); −2 ≡ 2, −4 ≡ 0, −6 ≡ 2.
    assert golay_word([-2, -4, -6, 6] + [0] * 20) == 0b1101
    rng = np.random.default_rng(3)
    pts = rng.integers(-15, 16, size=(500, 24))
    pts[:, 1:] += (pts[:, :1] - pts[:, 1:]) & 1  # one parity per row
    assert golay_words(pts).tolist() == [golay_word(p) for p in pts]


def test_shell2_enumeration_kissing_number_and_split() -> None:
    pts = shell2_points()
    assert pts.shape == (196_560, 24)
    # Rows come sorted, so they are distinct iff no two neighbours are equal.
    assert np.array_equal(pts[np.lexsort(pts.T[::-1])], pts)
    assert not np.all(pts[1:] == pts[:-1], axis=1).any()
    assert members(pts).all()
    assert np.all((pts.astype(np.int64) ** 2).sum(axis=1) == 32)
    magnitudes = np.sort(np.abs(pts), axis=1)[:, ::-1]
    split = {
        "4^2": int(np.sum(magnitudes[:, 0] == 4)),
        "2^8": int(np.sum(magnitudes[:, 0] == 2)),
        "3,1^23": int(np.sum(magnitudes[:, 0] == 3)),
    }
    assert split == {"4^2": 1_104, "2^8": 97_152, "3,1^23": 98_304}


def test_minimal_norm_is_32() -> None:
    # No member has 0 < ‖x‖² < 32: every short vector shape is rejected.
    shapes = [[2, 2] + [0] * 22, [4] + [0] * 23, [2] * 4 + [0] * 20, [1] * 24, [-3, 1] + [1] * 22]
    for x in shapes:
        assert not is_member(x) or sum(v * v for v in x) >= 32


def test_members_matches_scalar_on_random_near_members() -> None:
    rng = np.random.default_rng(11)
    decoded = decode_indices(rng.integers(0, 10**14, size=300)).astype(np.int64)
    # Perturb half of them by a random ±2 or ±4 on one coordinate (often leaves the lattice).
    noisy = decoded.copy()
    rows = np.arange(150)
    noisy[rows, rng.integers(0, 24, size=150)] += rng.choice([-4, -2, 2, 4], size=150)
    both = np.concatenate([decoded, noisy])
    vectorized = members(both)
    assert vectorized.tolist() == [is_member(p) for p in both]
    assert vectorized[:300].all() and not vectorized[300:450].all()
    assert members(both.reshape(3, 200, 24)).reshape(-1).tolist() == vectorized.tolist()


def test_membership_closed_under_negation() -> None:
    rng = np.random.default_rng(5)
    decoded = decode_indices(rng.integers(0, 280_974_212_784_720, size=2000)).astype(np.int64)
    assert members(-decoded).all()
    pts = shell2_points()
    assert members(-pts).all()
    for probe in GOLAY_FAILING.values():
        assert not is_member([-v for v in probe])


def test_invalid_inputs() -> None:
    with pytest.raises(InvalidInput):
        is_member([0] * 23)
    with pytest.raises(InvalidInput):
        is_member([0.5] * 24)  # type: ignore[list-item]
    with pytest.raises(InvalidInput):
        members(np.zeros((3, 23), dtype=np.int64))
    with pytest.raises(InvalidInput):
        members(np.zeros((3, 24), dtype=np.float64))
    with pytest.raises(InvalidInput):
        shell_of(np.zeros(25, dtype=np.int32))
    assert is_member(np.zeros(24, dtype=np.int8))
