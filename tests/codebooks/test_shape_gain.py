"""Shape–gain coding (codebooks.shape_gain): Lloyd–Max fit, norm rule, exact f64 reconstruction."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from leechq.codebooks.ball import BallCodebook
from leechq.codebooks.shape_gain import (
    choose_gains,
    exact_norms,
    fit_centroids,
    reconstruct,
    shape_gain_decode,
    shape_gain_encode,
)
from leechq.errors import InvalidInput
from leechq.utils.splitmix import SplitMix64


def _plain_lloyd(samples: list[float], bits: int, iterations: int) -> list[float]:
    """Independent plain-Python Lloyd–Max with the rules of docs/quantizer.md §4."""
    x = sorted(samples)
    n, k = len(x), 1 << bits
    c = [x[(2 * j + 1) * n // (2 * k)] for j in range(k)]
    for _ in range(iterations):
        clusters: list[list[float]] = [[] for _ in range(k)]
        for v in x:
            best = 0
            for j in range(1, k):
                if abs(v - c[j]) < abs(v - c[best]):  # strict: ties stay with the lower index
                    best = j
            clusters[best].append(v)
        c = sorted(sum(cl) / len(cl) if cl else c[j] for j, cl in enumerate(clusters))
    return c


def test_centroids_of_the_spec_train_set() -> None:
    # docs/codebooks.md §1: 1-bit centroids of the raw norms of the docs/codebooks.md §4 train set.
    train = SplitMix64(0x64A42026).gaussians(4000 * 24).reshape(4000, 24)
    norms = torch.from_numpy(np.sqrt((train * train).sum(axis=1)))
    c = fit_centroids(norms, 1, 60)
    assert c.dtype == torch.float64 and c.shape == (2,)
    assert c.tolist() == pytest.approx([4.2952, 5.4178], abs=5e-5)


@pytest.mark.parametrize("bits", [1, 2, 3])
def test_fit_matches_plain_lloyd(bits: int) -> None:
    rng = np.random.default_rng(bits)
    samples = np.abs(rng.standard_normal(301)) + rng.integers(0, 3, 301)  # lumpy, with repeats
    got = fit_centroids(torch.from_numpy(samples), bits, 25)
    want = _plain_lloyd(samples.tolist(), bits, 25)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-13)
    assert torch.all(got[1:] >= got[:-1])


def test_fit_edge_cases() -> None:
    x = torch.tensor([3.0, 1.0, 2.0, 10.0])
    assert fit_centroids(x, 0, 60).tolist() == [4.0]  # 0 bits: the mean
    y = torch.tensor([10.0, 0.0, 6.0, 2.0, 1.0])
    assert fit_centroids(y, 1, 0).tolist() == [1.0, 6.0]  # quantile init sorted[⌊(2j+1)n/4⌋]
    assert fit_centroids(y, 1, 1).tolist() == [1.0, 8.0]
    # 2 is equidistant from 0 and 4: it joins the lower centroid ([1, 4], not [0, 3])
    assert fit_centroids(torch.tensor([0.0, 2.0, 4.0]), 1, 1).tolist() == [1.0, 4.0]
    # more levels than distinct samples: empty clusters keep their value
    assert fit_centroids(torch.tensor([1.0, 1.0]), 2, 3).tolist() == [1.0, 1.0, 1.0, 1.0]
    with pytest.raises(InvalidInput):
        fit_centroids(torch.zeros(0), 1)
    with pytest.raises(InvalidInput):
        fit_centroids(torch.tensor([1.0, float("nan")]), 1)
    with pytest.raises(InvalidInput):
        fit_centroids(x, -1)


def test_gain_rule_rounds_the_norm_ties_low() -> None:
    centroids = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)
    norms = torch.tensor([0.2, 1.5, 1.6, 3.0, 9.0, 3.0], dtype=torch.float64)
    scale = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.5], dtype=torch.float64)
    assert choose_gains(norms, scale, centroids).tolist() == [0, 0, 1, 1, 2, 2]
    assert choose_gains(norms[:1], torch.zeros(1, dtype=torch.float64), centroids).tolist() == [0]


def test_reconstruction_float64_order_is_exact() -> None:
    rng = np.random.default_rng(7)
    codebook = BallCodebook()
    points = codebook.search(torch.from_numpy(rng.standard_normal((50, 24))))[0]
    gains = torch.from_numpy(rng.integers(0, 2, 50))
    scale = torch.from_numpy(np.abs(rng.standard_normal(50)) * 0.03 + 0.01)
    centroids = torch.tensor([0.8723, 1.1146], dtype=torch.float64)
    got = reconstruct(points, gains, scale, centroids)
    rows = zip(got.tolist(), points.tolist(), gains.tolist(), scale.tolist(), strict=True)
    for row, p, g, s in rows:
        picked = centroids[g].item() * s
        factor = picked / math.sqrt(sum(v * v for v in p))  # sqrt(16m), correctly rounded
        assert row == [v * factor for v in p]  # bit-identical, element by element


def test_exact_norms_are_correctly_rounded() -> None:
    points = torch.zeros(13, 24, dtype=torch.int32)
    for m in range(2, 14):
        points[m - 1, :m] = 4  # squared norm 16·m (only the norm matters here)
    expected = [0.0] + [math.sqrt(16 * m) for m in range(2, 14)]
    assert exact_norms(points).tolist() == expected  # IEEE sqrt, e.g. sqrt(32) = 5.656854249492381


def test_encode_decode_round_trip_with_zero_blocks() -> None:
    rng = np.random.default_rng(8)
    blocks = torch.from_numpy(rng.standard_normal((12, 24)) * 0.02)
    blocks[4] = 0.0
    scale = torch.full((12,), 0.02 * math.sqrt(24), dtype=torch.float64)
    centroids = torch.tensor([0.877, 1.106], dtype=torch.float64)
    codebook = BallCodebook()
    labels, gains, points = shape_gain_encode(blocks, scale, centroids, codebook)
    assert labels.dtype == torch.int64 and gains.dtype == torch.int64
    assert points.dtype == torch.int32
    assert labels[4] == 0 and gains[4] == 0 and not points[4].any()
    assert torch.equal(codebook.decode(labels), points)
    out = shape_gain_decode(points, gains, scale, centroids)
    assert out.dtype == torch.float64 and not out[4].any()
    assert torch.equal(out, reconstruct(points, gains, scale, centroids))
    tiny = 1e-300
    norms = out.norm(dim=1).clamp_min(tiny) * blocks.norm(dim=1).clamp_min(tiny)
    cos = (out * blocks).sum(1) / norms
    assert (cos[[i for i in range(12) if i != 4]] > 0.9).all()
    norms = blocks.norm(dim=1)
    assert torch.allclose(out.norm(dim=1), centroids[gains] * scale * (norms > 0))


def test_bad_inputs() -> None:
    codebook = BallCodebook()
    c = torch.tensor([1.0], dtype=torch.float64)
    with pytest.raises(InvalidInput, match="blocks"):
        shape_gain_encode(torch.zeros(3, 23), torch.ones(3), c, codebook)
    with pytest.raises(InvalidInput, match="row_scale"):
        shape_gain_encode(torch.zeros(3, 24), torch.ones(2), c, codebook)
    with pytest.raises(InvalidInput, match="finite"):
        shape_gain_encode(torch.full((1, 24), float("inf")), torch.ones(1), c, codebook)
    with pytest.raises(InvalidInput, match="gain"):
        points = torch.zeros(1, 24, dtype=torch.int32)
        shape_gain_decode(points, torch.tensor([1]), torch.ones(1), c)
