"""Shape–gain coding of 24-blocks: direction from a codebook, gain from per-matrix Lloyd–Max levels.

Implements docs/codebooks.md §1 (the shipped rule and the gain-centroid fit). Codebook-agnostic:
any :class:`leechq.codebooks.base.Codebook` supplies the direction (the ball or Tetra).

- :func:`fit_centroids`: Lloyd–Max on scalar samples (K = 2^bits levels, quantile initialisation
  ``sorted[⌊(2j+1)n/(2K)⌋]``, assignment to the nearest centroid with ties to the lower index, each
  non-empty centroid replaced by its cluster mean, centroids re-sorted every iteration; 0 bits → the
  mean).
- :func:`choose_gains`: the norm rule, ``g = argmin_j |‖v‖/s − c_j|``, ties to the lower index. The
  block norm is rounded, not the projection (docs/codebooks.md §1 step 3).
- :func:`reconstruct`: ``v̂ = p·(c_g·s)/√(16m)`` evaluated in float64 exactly as ``picked = c_g * s;
  scale = picked / sqrt(16m); p_i * scale`` (docs/codebooks.md §1 step 4), the sequence a decoder
  must repeat for bit-exact round trips. ``sqrt(16m)`` is taken from a table built with
  :func:`math.sqrt` (IEEE correctly rounded): torch's vectorised float64 ``sqrt`` on CPU is not
  always correctly rounded (it returns sqrt(32) one ulp low), which would make CPU and CUDA decoders
  disagree.
- :func:`shape_gain_encode` / :func:`shape_gain_decode`: the whole block code (docs/codebooks.md §1
steps 1–5).
"""

from __future__ import annotations

import math

import torch

from leechq.codebooks.base import BLOCK, Codebook
from leechq.errors import InvalidInput


def fit_centroids(samples: torch.Tensor, bits: int, iterations: int = 40) -> torch.Tensor:
    """Lloyd–Max gain levels (docs/quantizer.md §4).

    Args:
        samples: float [n] scalar samples (e.g. ‖block‖/s per block), n ≥ 1.
        bits: gain bits; K = 2^bits levels (0 → the mean).
        iterations: Lloyd iterations (the spec uses 40 for models, 60 for the Gaussian bench).

    Returns:
        float64 [K], ascending, on the CPU.

    Raises:
        InvalidInput: no samples, non-finite samples, negative bits or iterations.
    """
    if bits < 0 or iterations < 0:
        raise InvalidInput(f"bits and iterations must be ≥ 0, got {bits} and {iterations}")
    x = torch.sort(samples.detach().to("cpu", torch.float64).reshape(-1)).values
    n = x.numel()
    if n == 0:
        raise InvalidInput("fit_centroids needs at least one sample")
    if not bool(torch.isfinite(x).all()):
        raise InvalidInput("fit_centroids samples contain non-finite values")
    if bits == 0:
        return x.mean().reshape(1)
    k = 1 << bits
    centroids = x[[(2 * j + 1) * n // (2 * k) for j in range(k)]].clone()
    for _ in range(iterations):
        assign = nearest_level(x, centroids)
        for j in range(k):
            members = x[assign == j]
            if members.numel():
                centroids[j] = members.mean()
        centroids = torch.sort(centroids).values
    return centroids


def nearest_level(values: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Index of the nearest level for each value, ties to the lower index.

    Args:
        values: float64 [n].
        levels: float64 [K].

    Returns:
        int64 [n].
    """
    distance = (values[:, None] - levels[None, :]).abs()
    return torch.argmin(distance, dim=1)  # argmin returns the first minimum: ties → lower index


def choose_gains(
    norms: torch.Tensor, row_scale: torch.Tensor, centroids: torch.Tensor
) -> torch.Tensor:
    """The norm rule of docs/codebooks.md §1 step 3.

    Args:
        norms: float64 [N], block norms ‖v‖.
        row_scale: float64 [N], the block's row scale s > 0 (a zero scale picks level 0).
        centroids: float64 [K], ascending.

    Returns:
        int64 [N] gain indices.
    """
    scale = row_scale.to(torch.float64)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    relative = norms.to(torch.float64) / safe
    gains = nearest_level(relative, centroids.to(relative.device, torch.float64))
    return torch.where(scale > 0, gains, torch.zeros_like(gains))


def exact_norms(points: torch.Tensor) -> torch.Tensor:
    """sqrt(‖p‖²) of integer points, correctly rounded (math.sqrt per distinct squared norm).

    Args:
        points: int [N, 24].

    Returns:
        float64 [N] (0 for the origin).
    """
    norm2 = (points.to(torch.int64) ** 2).sum(dim=-1)
    distinct, inverse = torch.unique(norm2, return_inverse=True)
    roots = torch.tensor(
        [math.sqrt(int(v)) for v in distinct.tolist()], dtype=torch.float64, device=points.device
    )
    return roots[inverse]


def reconstruct(
    points: torch.Tensor, gains: torch.Tensor, row_scale: torch.Tensor, centroids: torch.Tensor
) -> torch.Tensor:
    """v̂ = p·(c_g·s)/√(16m) in the exact float64 order of docs/codebooks.md §1 step 4.

    Args:
        points: int [N, 24] lattice points (integer embedding; the origin reconstructs to zeros).
        gains: int [N] gain indices.
        row_scale: float64 [N].
        centroids: float64 [K].

    Returns:
        float64 [N, 24].
    """
    c = centroids.to(points.device, torch.float64)
    picked = c[gains.to(torch.int64)] * row_scale.to(points.device, torch.float64)
    norm = exact_norms(points)
    scale = torch.where(norm > 0, picked / torch.where(norm > 0, norm, 1.0), 0.0)
    return points.to(torch.float64) * scale[:, None]


def _check_blocks(blocks: torch.Tensor, row_scale: torch.Tensor, centroids: torch.Tensor) -> None:
    if blocks.dim() != 2 or blocks.shape[1] != BLOCK:
        raise InvalidInput(f"blocks must have shape [N, 24], got {list(blocks.shape)}")
    if not blocks.is_floating_point():
        raise InvalidInput(f"blocks must be floating point, got {blocks.dtype}")
    if row_scale.shape != blocks.shape[:1]:
        raise InvalidInput(
            f"row_scale must have shape [{blocks.shape[0]}], got {list(row_scale.shape)}"
        )
    if centroids.dim() != 1 or centroids.numel() == 0:
        raise InvalidInput(f"centroids must be a non-empty 1-D tensor, got {list(centroids.shape)}")
    if not bool(torch.isfinite(blocks).all()) or not bool(torch.isfinite(row_scale).all()):
        raise InvalidInput("blocks and row_scale must be finite")


def shape_gain_encode(
    blocks: torch.Tensor, row_scale: torch.Tensor, centroids: torch.Tensor, codebook: Codebook
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Code blocks by shape and gain (docs/codebooks.md §1 steps 1–3, 5).

    Args:
        blocks: float [N, 24] (any float dtype; norms in float64).
        row_scale: float64 [N], s of each block's row.
        centroids: float64 [K], ascending gain levels relative to s.
        codebook: the direction codebook.

    Returns:
        (labels int64 [N], gains int64 [N], points int32 [N, 24]); a zero block gives label 0,
        gain 0 and the origin.
    """
    _check_blocks(blocks, row_scale, centroids)
    b64 = blocks.to(torch.float64)
    norms = torch.sqrt((b64 * b64).sum(dim=1))  # only compared with centroids, never stored
    zero = norms == 0
    labels = codebook.encode(blocks)
    points = codebook.decode(labels).to(blocks.device)
    gains = choose_gains(norms, row_scale.to(blocks.device), centroids)
    labels = torch.where(zero.to(labels.device), 0, labels)
    gains = torch.where(zero, 0, gains)
    points = torch.where(zero[:, None], 0, points).to(torch.int32)
    return labels, gains, points


def shape_gain_decode(
    points: torch.Tensor, gains: torch.Tensor, row_scale: torch.Tensor, centroids: torch.Tensor
) -> torch.Tensor:
    """Reconstruct blocks from (point, gain) codes; see :func:`reconstruct`. float64 [N, 24]."""
    if points.dim() != 2 or points.shape[1] != BLOCK:
        raise InvalidInput(f"points must have shape [N, 24], got {list(points.shape)}")
    if gains.shape != points.shape[:1] or row_scale.shape != points.shape[:1]:
        raise InvalidInput(
            f"gains and row_scale must have shape [{points.shape[0]}], got "
            f"{list(gains.shape)} and {list(row_scale.shape)}"
        )
    if bool((gains < 0).any()) or bool((gains >= centroids.numel()).any()):
        raise InvalidInput(f"gain indices must be in [0, {centroids.numel()})")
    return reconstruct(points, gains, row_scale, centroids)
