"""The readable reference search (lattice.nearest) against brute force over whole shells.

Brute force enumerates Shell(2) (and, in the slow tier, Shell(3)) with the test oracle and checks:
the per-shell maxima d_m, the closed form of every (class, codeword) pair, the smallest-index
maximiser of each pair, and the full tie rule of docs/lattice.md §6.3 on the balls Λ24(2) and
Λ24(3).
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest

from leechq.errors import InvalidInput
from leechq.lattice import _oracle
from leechq.lattice import nearest as nr
from leechq.lattice.classes import class_table
from leechq.lattice.golay import golay_code
from leechq.lattice.indexing import encode_point, encode_points
from leechq.lattice.leech import golay_words, members


@cache
def _shell_in_index_order(m: int) -> np.ndarray:
    """Shell(m) points, int32 [|Shell(m)|, 24], in v1 index order."""
    return np.concatenate(list(_oracle.shell_points(m)))


def _ascending_scores(x: np.ndarray, points: np.ndarray) -> np.ndarray:
    """The tie-rule score of every point: Σ_{i ascending} x_i·v_i (sequential), / sqrt(16m)."""
    products = points.astype(np.float64) * x[None, :]
    total = np.zeros(points.shape[0])
    for i in range(24):  # np.sum would use pairwise summation
        total = total + products[:, i]
    norm2 = (points.astype(np.int64) ** 2).sum(axis=1)
    norms = np.array([math.sqrt(16 * m) for m in range(15)])[norm2 // 16]
    return total / norms


def _adversarial(rng: np.random.Generator, count: int) -> list[np.ndarray]:
    """Inputs with ties, zeros, repeated values, one-hots, lattice directions, odd scales."""
    out = []
    for k in range(count):
        kind = k % 7
        if kind == 0:
            x = rng.integers(-2, 3, 24).astype(np.float64)
        elif kind == 1:
            x = np.zeros(24)
            x[rng.choice(24, int(rng.integers(1, 5)), replace=False)] = rng.choice([-1.0, 1.0])
        elif kind == 2:
            x = rng.choice([-1.0, 0.0, 1.0, 2.0, 0.5], 24)
        elif kind == 3:
            x = rng.standard_normal(24) * 10.0 ** float(rng.integers(-30, 30))
        elif kind == 4:
            x = np.round(rng.standard_normal(24) * 2) / 2
        elif kind == 5:
            x = np.zeros(24)
            x[rng.integers(24)] = rng.standard_normal()
        else:
            x = np.abs(rng.standard_normal(24)).astype(np.float32).astype(np.float64)
            x[:12] = x[12:]
        out.append(x)
    return out


def _brute_ball(queries: list[np.ndarray], max_shell: int) -> list[int]:
    """v1 index of the docs/lattice.md §6.3 winner over Λ24(max_shell) for each query, by exhaustive
    scoring.

    Queries must already be scaled (max|x_i| ∈ [1, 2)) like the search scales them.
    """
    q = np.array(queries)
    best_index = np.full(len(queries), -1)
    best_score = np.full(len(queries), -np.inf)
    first_index = 1
    for m in range(2, max_shell + 1):
        chunks = [_shell_in_index_order(2)] if m == 2 else _oracle.shell_points(m)
        norm = math.sqrt(16 * m)
        for points in chunks:
            total = np.zeros((points.shape[0], q.shape[0]))
            for i in range(24):  # ascending coordinates, sequential f64 sums
                total = total + points[:, i : i + 1].astype(np.float64) * q[None, :, i]
            scores = total / norm
            k = np.argmax(scores, axis=0)  # first maximum = smallest index in this chunk
            top = scores[k, np.arange(q.shape[0])]
            better = top > best_score
            best_index = np.where(better, first_index + k, best_index)
            best_score = np.where(better, top, best_score)
            first_index += points.shape[0]
    return best_index.tolist()


def _scaled(x: np.ndarray) -> np.ndarray:
    return np.ldexp(x, -nr.power_of_two_exponent(x))


# --------------------------------------------------------------------------------------------------
# Spec examples and edge cases
# --------------------------------------------------------------------------------------------------


def test_spec_tie_example_picks_smallest_index() -> None:
    # docs/lattice.md §6.3: (4,4,0^22) and (8,8,0^22) both score exactly √2; index 1 wins.
    x = np.zeros(24)
    x[:2] = 1.0
    point, score = nr.search(x, 12)
    assert point.tolist() == [4, 4] + [0] * 22
    assert encode_point(point) == 1
    assert score == 8.0 / math.sqrt(32.0)


@pytest.mark.parametrize("i", [0, 7, 23])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_one_hot_gives_eight(i: int, sign: float) -> None:
    x = np.zeros(24)
    x[i] = sign * 0.3
    point, score = nr.search(x, 12)
    expected = np.zeros(24, dtype=np.int32)
    expected[i] = int(8 * sign)
    assert point.tolist() == expected.tolist()
    assert score == pytest.approx(0.3)


def test_zero_block_gives_origin() -> None:
    point, score = nr.search(np.zeros(24), 12)
    assert point.dtype == np.int32 and not point.any() and score == 0.0


def test_lattice_direction_is_its_own_winner() -> None:
    # A point of the ball, scaled, must come back: cos θ = 1, tied only with its multiple (4^8) on
    # shell 8, which has a larger index.
    word = int(golay_code().words[1])  # the first octad
    x = np.array([2.0 if word >> i & 1 else 0.0 for i in range(24)]) * 0.37
    point, score = nr.search(x, 12)
    assert point.tolist() == [2 if word >> i & 1 else 0 for i in range(24)]
    assert score == pytest.approx(float(np.linalg.norm(x)))


def test_bad_inputs() -> None:
    with pytest.raises(InvalidInput, match="shape"):
        nr.search(np.zeros(23))
    with pytest.raises(InvalidInput, match="non-finite"):
        nr.search(np.r_[np.nan, np.zeros(23)])
    with pytest.raises(InvalidInput, match="non-finite"):
        nr.search(np.r_[np.inf, np.zeros(23)])
    with pytest.raises(InvalidInput, match="real"):
        nr.search(np.zeros(24, dtype=complex))
    with pytest.raises(InvalidInput, match="max_shell"):
        nr.search(np.ones(24), 14)


def test_scale_invariance_and_extreme_scales() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(24)
    point, score = nr.search(x)
    for factor in (2.0**-60, 2.0**70, 2.0**-1000):
        p, s = nr.search(x * factor)
        assert p.tolist() == point.tolist()
        assert s == score * factor  # power-of-two scaling is exact
    p, _ = nr.search(np.r_[1e300, np.full(23, 1e-300)])
    assert p.tolist() == [8] + [0] * 23


# --------------------------------------------------------------------------------------------------
# Brute force on Shell(2) and Λ24(2)
# --------------------------------------------------------------------------------------------------


def test_shell2_maxima_match_brute_force() -> None:
    points = _shell_in_index_order(2).astype(np.float64)
    rng = np.random.default_rng(0)
    queries = [rng.standard_normal(24) for _ in range(40)] + _adversarial(rng, 20)
    for x in queries:
        brute = float((points @ x).max())
        assert nr.shell_maxima(x, 2)[0] == pytest.approx(brute, rel=1e-12, abs=1e-300)


def test_class_codeword_maxima_match_brute_force_shell2() -> None:
    points = _shell_in_index_order(2)
    rank_of = {int(w): r for r, w in enumerate(golay_code().words.tolist())}
    flat = np.array([rank_of[int(w)] for w in golay_words(points)])
    classes = [c for c in class_table(12) if c.shell == 2]
    magnitudes = np.sort(np.abs(points), axis=1)[:, ::-1]
    rng = np.random.default_rng(1)
    for x in [rng.standard_normal(24) for _ in range(5)] + _adversarial(rng, 7):
        dots = points.astype(np.float64) @ x
        for cls in classes:
            in_class = np.all(magnitudes == np.array(cls.magnitudes()), axis=1)
            in_class &= (points[:, 0] % 2 == 1) == cls.odd
            brute = np.full(4096, -np.inf)
            np.maximum.at(brute, flat[in_class], dots[in_class])
            closed = nr.class_codeword_maxima(x, cls)
            expected = brute[nr.search_data(12)[cls.number].codewords]
            np.testing.assert_allclose(closed, expected, rtol=1e-12, atol=1e-12)


def test_class_maximizer_is_smallest_index_maximiser_shell2() -> None:
    # Integer-valued x: every dot product is exact, so ties are exact.
    points = _shell_in_index_order(2)
    indices = np.arange(1, points.shape[0] + 1)
    words = golay_words(points)
    rank_of = {int(w): r for r, w in enumerate(golay_code().words.tolist())}
    flat = np.array([rank_of[int(w)] for w in words])
    rng = np.random.default_rng(2)
    tables = nr.search_data(12)
    for _ in range(12):
        x = rng.integers(-2, 3, 24).astype(np.float64)
        dots = points.astype(np.int64) @ x.astype(np.int64)
        for cls in [c for c in class_table(12) if c.shell == 2]:
            lo, hi = cls.first_index - 1, cls.last_index  # rows of the class (index order)
            allowed = tables[cls.number].codewords
            for rank in rng.choice(allowed, min(6, allowed.size), replace=False):
                rows = np.flatnonzero(flat[lo:hi] == rank) + lo
                best = dots[rows].max()
                expected = indices[rows[dots[rows] == best][0]]
                got = nr.class_maximizer(x, cls, int(rank))
                assert encode_point(got) == expected


def test_tie_rule_on_ball2_matches_brute_force() -> None:
    rng = np.random.default_rng(4)
    queries = [rng.standard_normal(24) for _ in range(6)] + _adversarial(rng, 28)
    expected = _brute_ball([_scaled(x) for x in queries], 2)
    for x, index in zip(queries, expected, strict=True):
        point, score = nr.search(x, 2)
        assert encode_point(point) == index, x
        assert score == nr.reference_score(x, point)


def test_spherical_error_shell2_brute_force() -> None:
    points = _shell_in_index_order(2).astype(np.float64)
    rng = np.random.default_rng(5)
    for beta in (0.2, 0.35, 0.6):
        x = rng.standard_normal(24) * 0.5
        brute = min(float(x @ x), float((((x[None, :] - beta * points) ** 2).sum(axis=1)).min()))
        assert nr.spherical_error(x, beta, 2) == pytest.approx(brute, rel=1e-12)


# --------------------------------------------------------------------------------------------------
# Winners on the production balls
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_shell", [12, 13])
def test_winners_are_members_with_the_reported_score(max_shell: int) -> None:
    rng = np.random.default_rng(6 + max_shell)
    xs = [rng.standard_normal(24) for _ in range(12)] + _adversarial(rng, 14)
    found = []
    for x in xs:
        point, score = nr.search(x, max_shell)
        assert members(point[None])[0]
        assert 2 <= (point.astype(np.int64) ** 2).sum() // 16 <= max_shell
        assert score == nr.reference_score(x, point)
        found.append(point)
    assert encode_points(np.array(found), max_shell).max() > 0


def test_gaussian_winners_and_pruning() -> None:
    # Shipped-rule sanity on Gaussians: high cosines, and the bound prunes most classes.
    rng = np.random.default_rng(7)
    cosines, evaluated = [], []
    for _ in range(40):
        x = rng.standard_normal(24)
        result = nr.search_detailed(x, 12)
        cosines.append(result.score / np.linalg.norm(x))
        evaluated.append(result.classes_evaluated)
    assert np.mean(cosines) > 0.955
    assert np.mean(evaluated) < 150  # of 301: the bound prunes most classes


# --------------------------------------------------------------------------------------------------
# Slow tier: Shell(3) and Λ24(3)
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_shell3_maxima_match_brute_force() -> None:
    rng = np.random.default_rng(8)
    queries = [rng.standard_normal(24) for _ in range(6)] + _adversarial(rng, 6)
    brute = np.full(len(queries), -np.inf)
    q = np.array(queries)
    for chunk in _oracle.shell_points(3):
        brute = np.maximum(brute, (chunk.astype(np.float64) @ q.T).max(axis=0))
    for x, b in zip(queries, brute, strict=True):
        assert nr.shell_maxima(x, 3)[1] == pytest.approx(b, rel=1e-12, abs=1e-300)


@pytest.mark.slow
def test_tie_rule_on_ball3_matches_brute_force() -> None:
    rng = np.random.default_rng(9)
    queries = [rng.standard_normal(24) for _ in range(3)] + _adversarial(rng, 21)
    expected = _brute_ball([_scaled(x) for x in queries], 3)
    for x, index in zip(queries, expected, strict=True):
        point, _ = nr.search(x, 3)
        assert encode_point(point) == index, x
