"""Tetra decode, word/byte conventions and the point → label map (docs/codebooks.md §3)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from leechq.codebooks import Codebook, get
from leechq.codebooks.tetra import (
    TetraCodebook,
    decode,
    decode_reference,
    disk_bytes_from_words,
    encode_point,
    encode_point_mask,
    labels_gains_from_words,
    pack_fields,
    served_bytes_from_words,
    split_fields,
    words_from_disk_bytes,
    words_from_labels_gains,
    words_from_served_bytes,
)
from leechq.errors import ArtifactError, InvalidInput, NotInCodebook
from leechq.lattice.golay import golay_code

LABEL_LIMIT = 1 << 47

# (word, disk bytes, served bytes, point) — docs/codebooks.md §3.5.
VECTORS = [
    ("000000000000", "000000000000", "000000000000", [0] * 24),
    ("800000000000", "000000000001", "000000000080", [0] * 24),
    ("000000000001", "000000000002", "010000000000", [1] * 23 + [-3]),
    (
        "7fffffffffff", "fffffffffffe", "ffffffffff7f",
        [-1, 1, -5, -5, -5, -1, 7, -1, -1, 5, -3, -3, 3, -1, 1, 5, -1, -1, -1, -1, -5, 1, -3, 3],
    ),
    (
        "12c4d7902316", "2589af20462c", "162390d7c412",
        [0, 2, 0, 4, 0, 2, -6, -2, 2, 2, 2, 2, -2, 0, 0, 0, -2, 0, 4, 2, 2, 4, 8, 0],
    ),
    (
        "12c4d8902316", "2589b120462c", "162390d8c412",
        [0, 2, 0, 4, 0, 2, 2, -2, -2, 6, 2, 2, -2, 0, 0, 4, 2, 0, 0, -2, 2, 0, 4, 0],
    ),
    (
        "f994070f3202", "f3280e1e6405", "02320f0794f9",
        [0, 0, 4, 4, 4, 0, 4, 4, 0, 4, 4, 4, 8, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 8],
    ),
]  # fmt: skip


def _load_oracle():
    """``llvq_tetra/tetra.py`` loaded on its own: importing the package would pull in torch and
    transformers (its quantizer registration); the numpy reader needs neither."""
    spec = importlib.util.find_spec("llvq_tetra")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llvq-tetra (test oracle) is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "tetra.py"
    module_spec = importlib.util.spec_from_file_location("_llvq_tetra_oracle_reader", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module  # dataclasses resolve annotations through sys.modules
    module_spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def oracle():
    return _load_oracle()


@pytest.fixture(scope="module")
def oracle_tables(oracle):
    return oracle.TetraTables.load()


def _is_leech(points: np.ndarray) -> np.ndarray:
    """Membership in √8·Λ24 (docs/lattice.md §2.1), computed inline."""
    y = points.astype(np.int64)
    p = y[:, 0] & 1
    same_parity = ((y & 1) == p[:, None]).all(axis=1)
    residue = np.where(p[:, None] == 0, (y % 4) == 2, (y % 4) == 3)
    word = (residue.astype(np.int64) << np.arange(24)).sum(axis=1)
    golay = golay_code().contains(word)
    sums = (y.sum(axis=1) - 4 * p) % 8 == 0
    return same_parity & golay & sums


# ---------------------------------------------------------------------------------------------
# Inline vectors


@pytest.mark.parametrize(("word_hex", "disk_hex", "served_hex", "point"), VECTORS)
def test_inline_vectors(word_hex, disk_hex, served_hex, point):
    word = int(word_hex, 16)
    label, gain = word & (LABEL_LIMIT - 1), word >> 47
    got = decode(torch.tensor([label]))
    assert got.dtype == torch.int32
    assert got[0].tolist() == point
    assert decode_reference(torch.tensor([label]))[0].tolist() == point
    words = words_from_labels_gains(np.array([label]), np.array([gain]))
    assert int(words[0]) == word
    assert disk_bytes_from_words(words).tobytes().hex() == disk_hex
    assert served_bytes_from_words(words).tobytes().hex() == served_hex
    assert int(words_from_disk_bytes(np.frombuffer(bytes.fromhex(disk_hex), np.uint8))[0]) == word
    served = np.frombuffer(bytes.fromhex(served_hex), np.uint8)
    assert int(words_from_served_bytes(served)[0]) == word
    # torch flavour of the byte functions
    tw = torch.tensor([word])
    assert bytes(disk_bytes_from_words(tw).tolist()).hex() == disk_hex
    assert bytes(served_bytes_from_words(tw).tolist()).hex() == served_hex
    assert int(words_from_disk_bytes(torch.tensor(list(bytes.fromhex(disk_hex))))[0]) == word
    assert int(encode_point(np.array([point]))[0]) == label


def test_inline_vectors_against_oracle_stream(oracle):
    disk = np.frombuffer(bytes.fromhex("".join(v[1] for v in VECTORS)), np.uint8)
    labels, gains = oracle.split_stream(disk, len(VECTORS), 47, 1)
    words = [int(v[0], 16) for v in VECTORS]
    assert labels.tolist() == [w & (LABEL_LIMIT - 1) for w in words]
    assert gains.tolist() == [w >> 47 for w in words]


# ---------------------------------------------------------------------------------------------
# Random labels against the oracle


def _random_labels(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, LABEL_LIMIT, size=n, dtype=np.int64)


def _edge_labels() -> np.ndarray:
    edges = [0, LABEL_LIMIT - 1, 1]
    for p in (0, 1):
        for r in (0, 1):
            for i2 in (0, 1239, 1240, 2047):
                for i in (0, 2047):
                    edges.append(
                        int(pack_fields(p=p, r=r, s8=63, b1=1, i1=i, b2=15, i2=i2, b3=1, i3=i))
                    )
    edges.append(int("f994070f3202", 16) & (LABEL_LIMIT - 1))  # largest shell, m = 26
    return np.array(edges, dtype=np.int64)


def test_decode_matches_oracle_on_random_and_edge_labels(oracle_tables):
    labels = np.concatenate([_random_labels(100_000, 2026), _edge_labels()])
    expected = oracle_tables.decode(labels.astype(np.uint64))
    got = decode(torch.from_numpy(labels))
    assert got.dtype == torch.int32 and got.shape == (labels.size, 24)
    assert np.array_equal(got.numpy(), expected)


def test_reference_twin_agrees(oracle_tables):
    labels = np.concatenate([_random_labels(20_000, 7), _edge_labels()])
    fast = decode(torch.from_numpy(labels))
    ref = decode_reference(torch.from_numpy(labels))
    assert torch.equal(fast, ref)
    assert np.array_equal(ref.numpy(), oracle_tables.decode(labels.astype(np.uint64)))


def test_decoded_points_are_leech_members():
    labels = np.concatenate([_random_labels(50_000, 11), _edge_labels()])
    y = decode(torch.from_numpy(labels)).numpy()
    assert _is_leech(y).all()
    n2 = (y.astype(np.int64) ** 2).sum(axis=1)
    assert (n2 % 16 == 0).all()
    assert n2.max() <= 416 and np.abs(y).max() <= 10
    assert (n2[1:] > 0).sum() == (labels[1:] != 0).sum()  # only label 0 is the origin
    assert _is_leech(np.array([[1] * 24])).sum() == 0  # the check itself can fail


def test_largest_shell_vector():
    label = int("f994070f3202", 16) & (LABEL_LIMIT - 1)
    y = decode(torch.tensor(label))
    assert y.shape == (24,)
    assert int((y.long() ** 2).sum()) == 416


def test_decode_keeps_batch_shape():
    labels = torch.from_numpy(_random_labels(60, 3)).reshape(3, 4, 5)
    out = decode(labels)
    assert out.shape == (3, 4, 5, 24)
    assert torch.equal(out.reshape(60, 24), decode(labels.reshape(60)))


def test_disk_stream_matches_oracle_split(oracle):
    rng = np.random.default_rng(5)
    labels = rng.integers(0, LABEL_LIMIT, size=1000, dtype=np.int64)
    gains = rng.integers(0, 2, size=1000)
    words = words_from_labels_gains(labels, gains)
    disk = disk_bytes_from_words(words)
    assert disk.dtype == np.uint8 and disk.size == 6000
    got_labels, got_gains = oracle.split_stream(disk, 1000, 47, 1)
    assert np.array_equal(got_labels.astype(np.int64), labels)
    assert np.array_equal(got_gains.astype(np.int64), gains)
    assert np.array_equal(words_from_disk_bytes(disk), words)
    served = served_bytes_from_words(words)
    assert np.array_equal(words_from_served_bytes(served), words)
    # The two conventions are a bit move, not a byte reversal.
    assert not np.array_equal(served.reshape(-1, 6)[:, ::-1].reshape(-1), disk)
    back_labels, back_gains = labels_gains_from_words(words)
    assert np.array_equal(back_labels, labels) and np.array_equal(back_gains, gains)


# ---------------------------------------------------------------------------------------------
# Points → labels


def test_encode_point_inverts_decode():
    labels = np.concatenate([_random_labels(20_000, 13), _edge_labels()])
    points = decode(torch.from_numpy(labels))
    back = encode_point(points)
    assert isinstance(back, torch.Tensor)
    assert torch.equal(back, torch.from_numpy(labels))


def test_encode_point_rejects_non_members():
    origin = np.zeros(24, dtype=np.int64)
    not_leech = origin.copy()
    not_leech[0] = 1  # mixed parity
    far = origin.copy()
    far[0] = 16  # a Leech point (k = 4 in one coordinate) whose rank 7 no row holds
    assert _is_leech(far[None]).all()
    heavy = origin.copy()
    heavy[[0, 1]] = 8  # a Leech point whose first section (ranks 3, 3: cost 104) is in no list
    assert _is_leech(heavy[None]).all()
    points = np.stack([origin, not_leech, far, heavy])
    labels, member = encode_point_mask(points)
    assert member.tolist() == [True, False, False, False]
    assert labels.tolist() == [0, 0, 0, 0]
    with pytest.raises(NotInCodebook, match="not in the Tetra codebook"):
        encode_point(far[None])
    with pytest.raises(InvalidInput, match="last dimension 24"):
        encode_point(np.zeros((2, 23), dtype=np.int64))


def test_field_split_roundtrip():
    labels = torch.from_numpy(_random_labels(1000, 17))
    assert torch.equal(pack_fields(**split_fields(labels)), labels)


# ---------------------------------------------------------------------------------------------
# Bad input and the codebook object


def test_bad_labels_raise():
    with pytest.raises(InvalidInput, match=r"\[0, 2\^47\)"):
        decode(torch.tensor([LABEL_LIMIT]))
    with pytest.raises(InvalidInput, match=r"\[0, 2\^47\)"):
        decode(torch.tensor([-1]))
    with pytest.raises(InvalidInput, match="integer"):
        decode(torch.tensor([1.0]))


def test_unvalidated_decode_ignores_the_gain_bit():
    labels = torch.from_numpy(_random_labels(1000, 29))
    words = words_from_labels_gains(labels, torch.ones_like(labels))
    assert torch.equal(decode(words, validate=False), decode(labels))


def test_stream_length_must_be_a_multiple_of_six():
    with pytest.raises(ArtifactError, match="multiple of 6"):
        words_from_disk_bytes(np.zeros(7, dtype=np.uint8))
    with pytest.raises(ArtifactError, match="multiple of 6"):
        words_from_served_bytes(torch.zeros(11, dtype=torch.uint8))
    with pytest.raises(InvalidInput):
        words_from_labels_gains(np.array([1]), np.array([2]))


def test_codebook_protocol_and_registry():
    cb = get("tetra")
    assert isinstance(cb, TetraCodebook)
    assert isinstance(cb, Codebook)
    assert (cb.name, cb.dim, cb.label_bits) == ("tetra", 24, 47)
    assert cb.fingerprint() == "9c3060086c7a13e6"
    labels = torch.from_numpy(_random_labels(100, 19))
    assert torch.equal(cb.decode(labels), decode(labels))


@pytest.mark.gpu
def test_cuda_decode_equals_cpu():
    labels = torch.from_numpy(np.concatenate([_random_labels(200_000, 23), _edge_labels()]))
    cpu = decode(labels)
    gpu = decode(labels.cuda())
    assert gpu.is_cuda and torch.equal(gpu.cpu(), cpu)
