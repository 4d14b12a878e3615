"""The ball codebook (codebooks.ball): labels, fingerprint, errors and the Gaussian quality gate."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from leechq import codebooks
from leechq.codebooks.ball import PINNED_FINGERPRINT, BallCodebook
from leechq.codebooks.shape_gain import fit_centroids, shape_gain_decode, shape_gain_encode
from leechq.errors import InvalidInput
from leechq.lattice.classes import ball_size
from leechq.lattice.indexing import encode_points
from leechq.lattice.leech import members
from leechq.utils.splitmix import SplitMix64

N12 = 111_043_117_458_000
N13 = 280_974_212_784_720


def test_attributes_and_registry_default() -> None:
    cb = codebooks.get("ball")
    assert isinstance(cb, BallCodebook)
    assert (cb.name, cb.dim, cb.label_bits, cb.max_shell) == ("ball", 24, 47, 12)
    big = BallCodebook(max_shell=13)
    assert big.label_bits == 48 and big.max_label == N13 == ball_size(13)
    with pytest.raises(InvalidInput, match="max_shell"):
        BallCodebook(max_shell=14)


def test_fingerprint_is_the_pinned_v1_value() -> None:
    from leechq.lattice.fingerprint import codebook_fingerprint

    assert PINNED_FINGERPRINT == "338f420f11866319"
    assert BallCodebook().fingerprint() == PINNED_FINGERPRINT
    assert f"{codebook_fingerprint():016x}" == PINNED_FINGERPRINT
    assert BallCodebook(max_shell=13).fingerprint() == PINNED_FINGERPRINT


def test_decode_spec_vectors() -> None:
    cb = BallCodebook()
    labels = torch.tensor([0, 1, 2, 98_257, N12])
    points = cb.decode(labels)
    assert not points[0].any()
    assert points[1].tolist() == [4, 4] + [0] * 22
    assert points[2].tolist() == [-4, 4] + [0] * 22
    assert points[3].tolist() == [-3] + [1] * 23
    assert points[4].tolist() == [-1] * 23 + [-13]
    big = BallCodebook(max_shell=13).decode(torch.tensor([N12 + 1, N13]))
    assert big[0].tolist() == [2, 2, 2, 2, 2, 4, 4, 2, 4, 4, 2, 4, -2, 4, 4, 4, 4, 4, 4] + [0] * 5
    assert big[1].tolist() == [-1] * 21 + [3, 3, -13]


def test_encode_is_search_plus_index() -> None:
    cb = BallCodebook()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((4, 5, 24)))
    points, scores = cb.search(x)
    assert points.shape == (4, 5, 24) and scores.shape == (4, 5)
    labels = cb.encode(x)
    assert labels.shape == (4, 5) and labels.dtype == torch.int64
    expected = encode_points(points.reshape(-1, 24).numpy(), 12).reshape(4, 5)
    assert labels.numpy().tolist() == expected.tolist()
    assert torch.equal(cb.decode(labels), points)
    assert int(labels.max()) <= N12


def test_ball13_uses_shell13() -> None:
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((30, 24)))
    labels = BallCodebook(max_shell=13).encode(x)
    assert int(labels.max()) > N12  # Gaussian winners land on shell 13 often (≈ 40 %)
    points = BallCodebook(max_shell=13).decode(labels)
    assert members(points.numpy()).all()


def test_label_range_checks() -> None:
    cb = BallCodebook()
    cb.decode(torch.tensor([N12]))
    with pytest.raises(InvalidInput, match="outside"):
        cb.decode(torch.tensor([N12 + 1]))
    with pytest.raises(InvalidInput, match="outside"):
        cb.decode(torch.tensor([[3, -1]]))
    BallCodebook(max_shell=13).decode(torch.tensor([N13]))
    with pytest.raises(InvalidInput, match="outside"):
        BallCodebook(max_shell=13).decode(torch.tensor([N13 + 1]))
    with pytest.raises(InvalidInput, match="int64"):
        cb.decode(torch.tensor([1.0]))
    with pytest.raises(InvalidInput, match="int64"):
        cb.decode(torch.tensor([True]))
    with pytest.raises(InvalidInput, match="torch.Tensor"):
        cb.decode([1, 2])  # type: ignore[arg-type]
    assert cb.decode(torch.zeros((0,), dtype=torch.int64)).shape == (0, 24)


def test_encode_input_checks() -> None:
    cb = BallCodebook()
    with pytest.raises(InvalidInput, match=r"\[\.\.\., 24\]"):
        cb.encode(torch.zeros(4, 12))
    with pytest.raises(InvalidInput, match="floating"):
        cb.encode(torch.zeros(2, 24, dtype=torch.int32))
    with pytest.raises(InvalidInput, match="non-finite"):
        cb.encode(torch.tensor([[float("-inf")] + [1.0] * 23]))
    with pytest.raises(InvalidInput, match="torch.Tensor"):
        cb.encode(np.zeros((1, 24)))  # type: ignore[arg-type]


def test_zero_blocks_and_scale_invariance() -> None:
    cb = BallCodebook()
    x = torch.randn(6, 24, generator=torch.Generator().manual_seed(2))
    x[2] = 0.0
    labels = cb.encode(x)
    assert int(labels[2]) == 0 and not cb.decode(labels)[2].any()
    assert torch.equal(cb.encode(x * 1e-20), labels)
    assert torch.equal(cb.encode(x * 3e15), labels)


def test_gaussian_quality_gate() -> None:
    # The docs/codebooks.md §4 stream: the first 600 eval blocks after the 4 000 train blocks.
    rng = SplitMix64(0x64A42026)
    train = rng.gaussians(4000 * 24).reshape(4000, 24)
    evaluation = torch.from_numpy(rng.gaussians(600 * 24).reshape(600, 24))
    centroids = fit_centroids(torch.from_numpy(np.sqrt((train**2).sum(axis=1))), 1, 60)
    ones = torch.ones(600, dtype=torch.float64)
    _, gains, points = shape_gain_encode(evaluation, ones, centroids, BallCodebook())
    xhat = shape_gain_decode(points, gains, ones, centroids)
    mse = float(((evaluation - xhat) ** 2).mean())
    sqnr_db = 10 * math.log10(1 / mse)
    # measured 11.047 dB (MSE 0.07858; full docs/codebooks.md §4 protocol: 0.0781)
    assert sqnr_db >= 10.95
    cos = (evaluation * points).sum(1) / evaluation.norm(dim=1) / points.double().norm(dim=1)
    assert float(cos.mean()) > 0.96  # spec: 0.9644 over 20 000 blocks
    shells = (points.to(torch.int64) ** 2).sum(dim=1) // 16
    assert float((shells == 12).double().mean()) > 0.5  # spec: 60 % on shell 12


def test_approx_mode_option() -> None:
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((16, 24)))
    exact = BallCodebook().search(x)[1]
    approx = BallCodebook(mode="approx").search(x)[1]
    assert (approx <= exact).all() and float(approx.sum()) > 0.999 * float(exact.sum())
