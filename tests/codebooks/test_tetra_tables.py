"""Tetra tables rebuilt from first principles (docs/codebooks.md §3.6)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from leechq.codebooks.tetra_tables import (
    BRANCHES_AS_U16_DIGEST,
    PUBLISHED_DIGESTS,
    TABLE_NAMES,
    pattern_from_columns,
    rank_class,
    rows_ranks,
    tetra_tables,
)
from leechq.lattice.golay import golay_code

EXPECTED_LAYOUT = {
    "order": (np.uint8, (24,)),
    "prefixes": (np.uint8, (64, 2)),
    "prefixes_flat": (np.uint8, (128,)),
    "suffixes": (np.uint8, (64, 2)),
    "suffixes_flat": (np.uint8, (128,)),
    "branch_c2": (np.uint8, (64, 16)),
    "branch_s16": (np.uint8, (64, 16)),
    "branches_u16": (np.uint32, (64, 16)),
    "rows": (np.uint32, (4096,)),
    "values": (np.int64, (4, 8)),
}

PINNED_COLUMNS = [
    0x2D002E, 0x3A005A, 0x740033, 0x03061E, 0x050963, 0x090578,
    0x0000FF, 0x2D1D00, 0x3A2B00, 0x744700, 0x638E00, 0xFF0000,
]  # fmt: skip


@pytest.fixture(scope="module")
def tables():
    return tetra_tables()


def test_names_dtypes_shapes(tables):
    assert tuple(tables.tensors()) == TABLE_NAMES
    for name, (dtype, shape) in EXPECTED_LAYOUT.items():
        arr = getattr(tables, name)
        assert arr.dtype == dtype, name
        assert arr.shape == shape, name
    assert tables.n0_mixed == 1240
    assert tables.fingerprint == "9c3060086c7a13e6"


def test_per_tensor_digests(tables):
    digests = tables.digests()
    for name, expected in PUBLISHED_DIGESTS.items():
        assert digests[name] == expected, name
    assert digests["branches_as_u16"] == BRANCHES_AS_U16_DIGEST


def _oracle_tables_path():
    """The oracle's shipped table file, found without importing ``llvq_tetra`` (whose package
    import pulls in torch and transformers for its quantizer registration)."""
    spec = importlib.util.find_spec("llvq_tetra")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llvq-tetra (test oracle) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "tetra-tables.safetensors"


def test_same_bits_as_the_shipped_file(tables):
    """The oracle package ships the author's dump; every tensor must match it exactly."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    shipped = safetensors_numpy.load_file(str(_oracle_tables_path()))
    assert set(shipped) == set(TABLE_NAMES)
    for name in TABLE_NAMES:
        ours = getattr(tables, name)
        assert shipped[name].dtype == ours.dtype, name
        assert np.array_equal(shipped[name], ours), name


def test_order_is_the_trio(tables):
    expected = [0, 1, 2, 3, 4, 7, 10, 12] + [6, 11, 13, 14, 16, 17, 18, 19]
    expected += [5, 8, 9, 15, 20, 21, 22, 23]
    assert tables.order.tolist() == expected


def _table_patterns(tables) -> np.ndarray:
    x = np.arange(4096)
    s8, b1, b2, b3 = x & 63, (x >> 6) & 1, (x >> 7) & 15, (x >> 11) & 1
    c1 = tables.prefixes[s8, b1].astype(np.int64)
    c2 = tables.branch_c2[s8, b2].astype(np.int64)
    c3 = tables.suffixes[tables.branch_s16[s8, b2], b3].astype(np.int64)
    return c1 | c2 << 8 | c3 << 16


def test_linear_columns_agree_with_tables_on_all_inputs(tables):
    assert tables.columns.tolist() == PINNED_COLUMNS
    assert np.array_equal(pattern_from_columns(np.arange(4096)), _table_patterns(tables))


def test_every_path_is_a_distinct_golay_codeword(tables):
    trio = _table_patterns(tables)
    assert np.unique(trio).size == 4096
    natural = np.zeros_like(trio)
    for j, src in enumerate(tables.order.astype(np.int64)):
        natural |= ((trio >> j) & 1) << src
    assert golay_code().contains(natural).all()


def test_trellis_shape(tables):
    assert (tables.prefixes[:, 0] ^ tables.prefixes[:, 1] == 0xFF).all()
    assert (tables.suffixes[:, 0] ^ tables.suffixes[:, 1] == 0xFF).all()
    assert np.unique(tables.prefixes).size == 128
    assert (np.diff(tables.branch_c2.astype(int), axis=1) > 0).all()  # ascending, distinct
    assert len({tuple(row) for row in tables.branch_c2.tolist()}) == 8
    packed = tables.branch_c2.astype(np.uint32) | tables.branch_s16.astype(np.uint32) << 8
    assert np.array_equal(tables.branches_u16, packed)
    assert np.array_equal(tables.prefixes_flat, tables.prefixes.reshape(-1))
    assert np.array_equal(tables.suffixes_flat, tables.suffixes.reshape(-1))


def test_rows_and_mixed_split(tables):
    ranks = rows_ranks(tables.rows)
    assert ranks.max() == 4
    assert [hex(v) for v in tables.rows[:4]] == ["0x0", "0x11000000", "0x10100000", "0x1100000"]
    assert tables.rows[2048:2052].tolist() == [0x10000000, 0x01000000, 0x00100000, 0x00010000]
    cls = rank_class(ranks)
    assert (cls[:2048] == 0).all() and (cls[2048:] == 1).all()
    cost = ((2 * ranks + 1) ** 2).sum(axis=1)
    # Sorted by (cost, lexicographic with ρ_0 most significant) inside each class.
    for half in (slice(0, 2048), slice(2048, 4096)):
        keys = [(int(c), tuple(r)) for c, r in zip(cost[half], ranks[half].tolist(), strict=True)]
        assert keys == sorted(keys)
    # The 2048 cheapest overall are class-0 rows 0..1239 then class-1 rows 0..807.
    rank_lists = ranks.tolist()
    keys = [(int(cost[i]), tuple(rank_lists[i]), i) for i in range(4096)]
    first = sorted(keys)[:2048]
    picked = sorted(i for _, _, i in first)
    assert picked == list(range(1240)) + list(range(2048, 2048 + 808))


def test_cutoffs(tables):
    assert tables.class0_list.cost == 88 and tables.class0_list.cut == (1, 1, 0, 3, 0, 0, 1, 1)
    assert tables.class1_list.cost == 96 and tables.class1_list.cut == (0, 0, 2, 2, 2, 0, 1, 1)
    assert tables.mixed_list.cost == 72 and tables.mixed_list.cut == (3, 0, 0, 0, 1, 0, 1, 0)
    ranks = rows_ranks(tables.rows)
    assert tuple(ranks[2047]) == tables.class0_list.cut
    assert tuple(ranks[4095]) == tables.class1_list.cut


def test_values_and_invnorm(tables):
    assert tables.values.tolist() == [
        [0, 4, -4, 8, -8, 12, -12, 16],
        [1, -3, 5, -7, 9, -11, 13, -15],
        [2, -2, 6, -6, 10, -10, 14, -14],
        [-1, 3, -5, 7, -9, 11, -13, 15],
    ]
    assert tables.invnorm.dtype == np.float32 and tables.invnorm.shape == (32,)
    assert tables.invnorm[0] == 0
    for m in range(1, 32):
        assert tables.invnorm[m] == np.float32(1.0 / np.sqrt(np.float64(16 * m)))


def test_closed_form_value_formula(tables):
    """docs/codebooks.md §3.3: value = s ? u + 2 − 2p : −u, u = 2ρ + p, s = (ρ ⊕ c ⊕ p) & 1."""
    for p in (0, 1):
        for c in (0, 1):
            for rank in range(8):
                u = 2 * rank + p
                s = (rank ^ c ^ p) & 1
                assert (u + 2 - 2 * p if s else -u) == tables.values[p + 2 * c, rank]
