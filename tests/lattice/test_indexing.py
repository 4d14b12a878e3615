"""The bijective v1 index (docs/lattice.md §4): test vectors, exhaustive Shell(2), every class
boundary, random round trips, scalar == vectorized, rejection of non-members."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leechq.errors import InvalidInput, NotInCodebook
from leechq.lattice import _oracle
from leechq.lattice.classes import ball_size, class_table
from leechq.lattice.indexing import (
    decode_index,
    decode_indices,
    encode_point,
    encode_points,
    multinomial,
    multiset_rank,
    multiset_unrank,
)
from leechq.lattice.leech import members

N12 = 111_043_117_458_000
N13 = 280_974_212_784_720
OCTAD = [0, 1, 2, 3, 4, 7, 10, 12]


def _octad_point() -> list[int]:
    x = [0] * 24
    for i in OCTAD:
        x[i] = 2
    return x


TEST_VECTORS = [
    (0, [0] * 24),
    (1, [4, 4] + [0] * 22),
    (2, [-4, 4] + [0] * 22),
    (3, [4, -4] + [0] * 22),
    (1_104, [0] * 22 + [-4, -4]),
    (1_105, _octad_point()),
    (98_257, [-3] + [1] * 23),
    (196_560, [-1] * 23 + [3]),
    (196_561, [2, 2, 2, 2, 2, 4, 0, 2, 0, 0, 2, 0, -2] + [0] * 11),
    (N12, [-1] * 23 + [-13]),
    (N12 + 1, [2, 2, 2, 2, 2, 4, 4, 2, 4, 4, 2, 4, -2, 4, 4, 4, 4, 4, 4] + [0] * 5),
    (N13, [-1] * 21 + [3, 3, -13]),
]


def _boundaries() -> np.ndarray:
    edges = set()
    for c in class_table(13):
        edges.update({c.first_index, c.first_index + 1, c.last_index})
    edges.add(0)
    return np.array(sorted(e for e in edges if e <= N13), dtype=np.int64)


@pytest.mark.parametrize(("index", "point"), TEST_VECTORS, ids=[str(i) for i, _ in TEST_VECTORS])
def test_section_3_8_vectors(index: int, point: list[int]) -> None:
    assert decode_index(index).tolist() == point
    assert encode_point(point) == index
    assert decode_indices(np.array([index]))[0].tolist() == point
    assert encode_points(np.array([point]))[0] == index


def test_n12_and_n13_are_the_ends_of_the_balls() -> None:
    assert ball_size(12) == N12 and ball_size(13) == N13
    assert decode_index(N12, max_shell=12).tolist() == [-1] * 23 + [-13]
    assert encode_point([-1] * 23 + [-13], max_shell=12) == N12


@pytest.mark.parametrize(
    ("index", "max_shell"), [(N13 + 1, 13), (N12 + 1, 12), (-1, 13), (2**63 - 1, 13), (197_000, 2)]
)
def test_out_of_range_indices_are_invalid(index: int, max_shell: int) -> None:
    with pytest.raises(InvalidInput, match="outside"):
        decode_index(index, max_shell)
    with pytest.raises(InvalidInput, match="outside"):
        decode_indices(np.array([5, index], dtype=np.int64), max_shell)


def test_decode_input_validation() -> None:
    with pytest.raises(InvalidInput):
        decode_index(1.0)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        decode_indices(np.array([1.0]))
    with pytest.raises(InvalidInput):
        decode_index(1, max_shell=14)
    with pytest.raises(InvalidInput):
        decode_indices(np.array([2**64 - 1], dtype=np.uint64))
    assert decode_indices(np.zeros(0, dtype=np.int64)).shape == (0, 24)
    grid = decode_indices(np.arange(12).reshape(3, 4))
    assert grid.shape == (3, 4, 24) and grid.dtype == np.int32
    assert np.array_equal(grid.reshape(12, 24), decode_indices(np.arange(12)))
    assert decode_index(np.int64(7)).dtype == np.int32


def test_shell2_exhaustive() -> None:
    oracle = _oracle.shell2_points()
    decoded = decode_indices(np.arange(1, 196_561))
    # Equal as sets to the independent enumeration (whose rows are distinct, see test_leech), so
    # the 196 560 decoded points are distinct too.
    assert np.array_equal(decoded[np.lexsort(decoded.T[::-1])], oracle)
    indices = encode_points(oracle)
    assert np.array_equal(np.sort(indices), np.arange(1, 196_561))
    assert np.array_equal(decode_indices(indices), oracle)
    sample = np.random.default_rng(2).choice(196_560, size=2_000, replace=False)
    assert [encode_point(oracle[k]) for k in sample] == indices[sample].tolist()


def test_every_class_boundary_round_trips() -> None:
    edges = _boundaries()
    decoded = decode_indices(edges)
    scalar = np.stack([decode_index(int(i)) for i in edges])
    assert np.array_equal(decoded, scalar)
    assert np.array_equal(encode_points(decoded), edges)
    assert [encode_point(p) for p in scalar] == edges.tolist()
    norms = (decoded.astype(np.int64) ** 2).sum(axis=1)
    shells = {c.first_index: c.shell for c in class_table(13)}
    for index, norm in zip(edges.tolist(), norms.tolist()):
        if index in shells:
            assert norm == 16 * shells[index]
    assert members(decoded).all()


def test_random_round_trips_vectorized() -> None:
    rng = np.random.default_rng(20_000)
    labels = rng.integers(0, N13 + 1, size=200_000)
    labels[:3] = [0, 1, N13]
    points = decode_indices(labels)
    assert members(points).all()
    assert np.array_equal(encode_points(points), labels)
    # Each point lies on the shell of its class.
    table = class_table(13)
    ends = np.array([c.last_index for c in table])
    shells = np.array([c.shell for c in table])
    cls = np.searchsorted(ends, labels[labels > 0])
    norms = (points[labels > 0].astype(np.int64) ** 2).sum(axis=1)
    assert np.array_equal(norms, 16 * shells[cls])


def test_random_round_trips_scalar_equal_vectorized() -> None:
    rng = np.random.default_rng(5_000)
    labels = rng.integers(0, N13 + 1, size=5_000)
    vectorized = decode_indices(labels)
    for label, point in zip(labels.tolist(), vectorized):
        scalar = decode_index(label)
        assert np.array_equal(scalar, point), label
        assert encode_point(scalar) == label


def test_ball12_labels_stay_in_ball12() -> None:
    rng = np.random.default_rng(12)
    labels = rng.integers(0, N12 + 1, size=20_000)
    points = decode_indices(labels, max_shell=12)
    assert ((points.astype(np.int64) ** 2).sum(axis=1) <= 192).all()
    assert np.array_equal(encode_points(points, max_shell=12), labels)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=N13))
def test_hypothesis_round_trip(index: int) -> None:
    point = decode_index(index)
    assert encode_point(point) == index
    assert np.array_equal(decode_indices(np.array([index]))[0], point)
    assert encode_points(point[None, :])[0] == index


def test_negation_and_coordinate_sign_changes_keep_membership() -> None:
    rng = np.random.default_rng(9)
    points = decode_indices(rng.integers(1, N13 + 1, size=20_000)).astype(np.int64)
    negated = encode_points(-points)
    assert np.array_equal(decode_indices(negated), -points)


P10_PROBES = {
    "2^4": [2, 2, 2, 2] + [0] * 20,
    "2^8 off an octad": [2] * 8 + [0] * 16,  # {0..7} is not an octad
    "1^24 two -1": [-1, -1] + [1] * 22,
    "1^24 four -1 one +5": [-1, -1, -1, -1, 5] + [1] * 19,
    "2,2": [2, 2] + [0] * 22,
}


@pytest.mark.parametrize("name", sorted(P10_PROBES))
def test_non_members_do_not_encode(name: str) -> None:
    x = P10_PROBES[name]
    with pytest.raises(NotInCodebook):
        encode_point(x)
    with pytest.raises(NotInCodebook):
        encode_points(np.array([[4, 4] + [0] * 22, x]))


def test_outside_the_ball_does_not_encode() -> None:
    far = [16] + [0] * 23  # a lattice member on shell 16
    with pytest.raises(NotInCodebook, match="outside"):
        encode_point(far)
    with pytest.raises(NotInCodebook):
        encode_points(np.array([far]))
    shell13 = [-1] * 21 + [3, 3, -13]
    assert encode_point(shell13) == N13
    with pytest.raises(NotInCodebook):
        encode_point(shell13, max_shell=12)
    with pytest.raises(NotInCodebook):
        encode_points(np.array([shell13]), max_shell=12)
    huge = np.zeros((1, 24), dtype=np.int64)
    huge[0, 0] = 2**40  # must not overflow the norm
    with pytest.raises(NotInCodebook):
        encode_points(huge)


def test_encode_input_validation() -> None:
    with pytest.raises(InvalidInput):
        encode_point([0] * 23)
    with pytest.raises(InvalidInput):
        encode_points(np.zeros((2, 23), dtype=np.int64))
    with pytest.raises(InvalidInput):
        encode_points(np.zeros((2, 24), dtype=np.float32))
    assert encode_points(np.zeros((0, 24), dtype=np.int32)).shape == (0,)
    assert encode_points(np.zeros((2, 3, 24), dtype=np.int8)).tolist() == [[0, 0, 0], [0, 0, 0]]


@pytest.mark.parametrize("counts", [(2, 1), (1, 1, 1), (3, 2, 2), (1, 2, 1, 3), (0, 2, 2), (4,)])
def test_multiset_rank_matches_itertools(counts: tuple[int, ...]) -> None:
    arrangements = _oracle.itertools_arrangements(counts)
    assert arrangements == list(_oracle.lex_arrangements(counts))
    assert len(arrangements) == multinomial(counts)
    for rank, sequence in enumerate(arrangements):
        assert multiset_rank(sequence, counts) == rank
        assert multiset_unrank(rank, counts) == list(sequence)


def test_multiset_rank_large_counts_match_naive() -> None:
    counts = (1, 3, 20)  # 24 slots: 10 626 arrangements
    for rank, sequence in enumerate(_oracle.lex_arrangements(counts)):
        if rank % 97 == 0:
            assert multiset_rank(sequence, counts) == rank
            assert multiset_unrank(rank, counts) == list(sequence)
    assert multiset_unrank(multinomial(counts) - 1, counts) == [2] * 20 + [1] * 3 + [0]
    with pytest.raises(InvalidInput):
        multiset_unrank(multinomial(counts), counts)
    with pytest.raises(InvalidInput):
        multiset_rank([0, 0], (1, 1))


@pytest.mark.parametrize("number", [0, 1, 2, 8])
def test_small_classes_match_the_naive_digit_order(number: int) -> None:
    cls = class_table(13)[number]
    naive = _oracle.naive_class_points(cls)
    assert naive.shape == (cls.size, 24)
    decoded = decode_indices(np.arange(cls.first_index, cls.last_index + 1))
    assert np.array_equal(decoded, naive)


@pytest.mark.slow
@pytest.mark.parametrize("number", [3, 6, 7, 12])
def test_more_classes_match_the_naive_digit_order(number: int) -> None:
    cls = class_table(13)[number]
    naive = _oracle.naive_class_points(cls, limit=4_000_000)
    decoded = decode_indices(np.arange(cls.first_index, cls.last_index + 1))
    assert np.array_equal(decoded, naive)


@pytest.mark.slow
def test_shell3_exhaustive() -> None:
    first = class_table(13)[3].first_index
    expected_next = first
    seen_sizes = 0
    for chunk in _oracle.shell_points(3, chunk=1 << 20):
        assert members(chunk).all()
        assert ((chunk.astype(np.int64) ** 2).sum(axis=1) == 48).all()
        labels = encode_points(chunk)
        assert np.array_equal(labels, np.arange(expected_next, expected_next + len(chunk)))
        expected_next += len(chunk)
        seen_sizes += len(chunk)
    assert seen_sizes == 16_773_120


@pytest.mark.slow
def test_random_round_trips_scalar_many() -> None:
    rng = np.random.default_rng(50_000)
    labels = rng.integers(0, N13 + 1, size=50_000)
    vectorized = decode_indices(labels)
    assert np.array_equal(encode_points(vectorized), labels)
    for label, point in zip(labels.tolist(), vectorized):
        assert encode_point(point) == label
        assert np.array_equal(decode_index(label), point)
