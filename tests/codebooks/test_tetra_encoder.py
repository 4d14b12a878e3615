"""The Tetra direction search (docs/codebooks.md §3.7; docs/codebooks.md §4 quality gate)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from leechq.codebooks import get
from leechq.codebooks.tetra import FIELDS, decode, split_fields
from leechq.codebooks.tetra_encoder import (
    DEFAULT_NORMS,
    cosine_of,
    encode,
    encode_reference,
    nearest,
    nearest_reference,
    score_of,
)
from leechq.errors import InvalidInput
from leechq.lattice.golay import golay_code
from leechq.utils.splitmix import SplitMix64

GAUSSIAN_SEED = 0x64A42026
TRAIN_BLOCKS = 4000


def _gaussian_stream(eval_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """docs/codebooks.md §4: 4000 train blocks, then the eval blocks, 24 Gaussians per block."""
    rng = SplitMix64(GAUSSIAN_SEED)
    train = rng.gaussians(24 * TRAIN_BLOCKS).reshape(TRAIN_BLOCKS, 24)
    return train, rng.gaussians(24 * eval_blocks).reshape(eval_blocks, 24)


def _lloyd_max(samples: np.ndarray, levels: int = 2, iterations: int = 60) -> np.ndarray:
    """Scalar Lloyd–Max as in docs/codebooks.md §4 (quantile start, ties to the lower level)."""
    ordered = np.sort(samples)
    n = ordered.size
    c = np.array([ordered[(2 * j + 1) * n // (2 * levels)] for j in range(levels)])
    for _ in range(iterations):
        assign = np.argmin(np.abs(samples[:, None] - c[None, :]), axis=1)
        for j in range(levels):
            if (assign == j).any():
                c[j] = samples[assign == j].mean()
        c = np.sort(c)
    return c


def _retention(train: np.ndarray, x: np.ndarray, labels: torch.Tensor) -> tuple[float, float]:
    """(MSE per coordinate, retention %) with 1 gain bit, norm rule, R = 2 bits/dim."""
    centroids = _lloyd_max(np.linalg.norm(train, axis=1))
    y = decode(labels).numpy().astype(np.float64)
    t = (x * y).sum(axis=1) / np.linalg.norm(y, axis=1)
    norms = np.linalg.norm(x, axis=1)
    g = centroids[np.argmin(np.abs(norms[:, None] - centroids[None, :]), axis=1)]
    mse = float((norms**2 - 2 * g * t + g**2).sum() / x.size)
    return mse, 100.0 * (-0.5 * math.log2(mse)) / 2.0


def _is_leech(points: torch.Tensor) -> bool:
    y = points.numpy().astype(np.int64)
    p = y[:, 0] & 1
    residue = np.where(p[:, None] == 0, (y % 4) == 2, (y % 4) == 3)
    word = (residue.astype(np.int64) << np.arange(24)).sum(axis=1)
    ok = ((y & 1) == p[:, None]).all(axis=1) & golay_code().contains(word)
    return bool((ok & ((y.sum(axis=1) - 4 * p) % 8 == 0)).all())


def _targets(n: int, seed: int, norm: float) -> torch.Tensor:
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((n, 24)))
    return (x / x.norm(dim=-1, keepdim=True) * norm).to(torch.float32)


# ---------------------------------------------------------------------------------------------
# The inner search is exact


@pytest.mark.parametrize("norm", [9.0, 14.0, 18.5])
def test_nearest_equals_brute_force_reference(norm):
    z = _targets(3, seed=int(norm * 10), norm=norm)
    labels, score = nearest(z)
    ref_labels, ref_score = nearest_reference(z)
    assert torch.allclose(score.double(), ref_score, rtol=0, atol=1e-3)
    assert torch.equal(labels, ref_labels)
    assert torch.allclose(score_of(z, labels), score.double(), atol=1e-3)


def test_nearest_is_optimal_against_every_single_field_change():
    """Changing any one field of the winning word (all 2048 rows of any section, every trellis
    choice, parity, class) never gives a closer point."""
    z = _targets(2, seed=99, norm=14.5)
    labels, _ = nearest(z)
    for b in range(z.shape[0]):
        base = split_fields(labels[b])
        variants = []
        for name, (_, width) in FIELDS.items():
            fields = {k: v.expand(1 << width).clone() for k, v in base.items()}
            fields[name] = torch.arange(1 << width)
            lab = sum(fields[k] << FIELDS[k][0] for k in FIELDS)
            variants.append(lab)
        lab = torch.cat(variants)
        scores = score_of(z[b].expand(lab.numel(), 24), lab)
        own = float(score_of(z[b : b + 1], labels[b : b + 1])[0])
        assert float(scores.max()) <= own + 1e-4
        assert float(scores.max()) == pytest.approx(own, abs=1e-4)  # the word itself is a variant


def test_encode_equals_reference_twin():
    x = torch.from_numpy(np.random.default_rng(4).standard_normal((3, 24)))
    assert torch.equal(encode(x), encode_reference(x))


# ---------------------------------------------------------------------------------------------
# Properties of the full encoder


def test_encode_output_is_valid_and_shaped():
    x = torch.randn(2, 3, 24, generator=torch.Generator().manual_seed(1))
    x[1, 2] = 0.0
    labels = encode(x)
    assert labels.shape == (2, 3) and labels.dtype == torch.int64
    assert int(labels[1, 2]) == 0
    assert ((labels >= 0) & (labels < (1 << 47))).all()
    points = decode(labels.reshape(-1))
    assert _is_leech(points)
    assert (points[:5].long() ** 2).sum(-1).min() > 0
    assert torch.equal(get("tetra").encode(x), labels)


def test_encode_is_scale_invariant_in_quality_and_accepts_dtypes():
    x = torch.randn(64, 24, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    cos = cosine_of(x, encode(x))
    for scaled in (x * 1e-20, x * 3e15, x.to(torch.float32), x.to(torch.float16)):
        assert torch.allclose(cosine_of(x, encode(scaled)), cos, atol=2e-3)


def test_encode_beats_its_own_trials_and_a_random_baseline():
    x = torch.from_numpy(np.random.default_rng(8).standard_normal((200, 24)))
    cos = cosine_of(x, encode(x))
    unit = (x / x.norm(dim=-1, keepdim=True)).float()
    for norm in DEFAULT_NORMS:
        single = cosine_of(x, nearest(unit * norm)[0])
        assert (cos >= single - 1e-9).all()
    # Trivial baseline: the best of 2000 random codebook words per block.
    rng = np.random.default_rng(9)
    random_labels = torch.from_numpy(rng.integers(0, 1 << 47, size=2000, dtype=np.int64))
    y = decode(random_labels).double()
    y = y / y.norm(dim=-1, keepdim=True)
    baseline = ((x / x.norm(dim=-1, keepdim=True)) @ y.T).max(dim=1).values
    assert (cos > baseline).all()
    assert float(cos.mean()) > 0.955


def test_encode_rejects_bad_input():
    with pytest.raises(InvalidInput, match="last dimension 24"):
        encode(torch.zeros(4, 23))
    with pytest.raises(InvalidInput, match="NaN or infinite"):
        encode(torch.tensor([[float("nan")] + [0.0] * 23]))
    with pytest.raises(InvalidInput, match="NaN or infinite"):
        encode(torch.tensor([[float("inf")] + [0.0] * 23]))
    with pytest.raises(InvalidInput, match="floating"):
        encode(torch.zeros(2, 24, dtype=torch.int64))


# ---------------------------------------------------------------------------------------------
# Quality gate (docs/codebooks.md §4 protocol)


def test_gaussian_retention_on_2000_blocks():
    """First 2000 eval blocks of the docs/codebooks.md §4 stream. Measured: MSE 0.08539, retention
    88.743 %.

    Threshold 88.64 %: 0.1 pp below the measured value. The computation is deterministic on one
    platform; across CPUs and BLAS builds only exact near-ties can flip, each moving the MSE by
    < 1e-6 here, while 0.1 pp of retention is ΔMSE ≈ 6e-5. Real regressions are larger: a single
    search scale scores about 0.5 pp less, a non-exact section search several tenths.
    """
    train, ev = _gaussian_stream(2000)
    labels = encode(torch.from_numpy(ev))
    mse, retention = _retention(train, ev, labels)
    assert retention >= 88.64, (mse, retention)


@pytest.mark.slow
def test_gaussian_retention_full_protocol():
    """The full gate: 20 000 eval blocks, retention ≥ 88.6 % (MSE ≤ 0.0857). Measured 88.870 %."""
    train, ev = _gaussian_stream(20_000)
    labels = encode(torch.from_numpy(ev))
    mse, retention = _retention(train, ev, labels)
    assert mse <= 0.0857 and retention >= 88.6, (mse, retention)


@pytest.mark.gpu
def test_cuda_encode_matches_cpu():
    _, ev = _gaussian_stream(2000)
    x = torch.from_numpy(ev)
    cpu = encode(x)
    gpu = encode(x.cuda())
    assert gpu.is_cuda
    cos_cpu, cos_gpu = cosine_of(x, cpu), cosine_of(x, gpu.cpu())
    assert torch.allclose(cos_cpu, cos_gpu, atol=1e-6)
    assert float((cpu == gpu.cpu()).double().mean()) >= 0.99
