"""Block coders: what the GPTQ loop calls to code one column group of 24 for every row at once.

A coder turns ``v`` (float64 [rows, 24], the current error-compensated values of one 24-column
group) into codes and the exact reconstruction the loop continues with (leech-core.md §5.5). Three
kinds:

* :class:`ShapeGainCoder` — the shipped rule (leech-core.md §4.6, §5.4) through
  :mod:`leechq.codebooks.shape_gain`: direction from a registered codebook (one batched
  ``encode`` call per column group), gain by the norm rule against per-matrix Lloyd–Max centroids
  fitted before the loop, reconstruction in the exact f64 order of the decoder. Produces lattice
  codes.
* :class:`IdentityCoder` — returns ``v`` unchanged (the control of §5.5: must leave a layer
  unchanged).
* :class:`ScalarRoundCoder` — a uniform scalar grid relative to the row scale; a codebook-free
  control for tests of the loop itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from leechq.codebooks import shape_gain
from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput


@dataclass
class BlockCodes:
    """Output of a coder for one column group.

    Attributes:
        labels: int64 [rows] direction labels (zeros for coders without a codebook).
        gains: uint8 [rows] gain indices.
        values: float64 [rows, 24] the reconstruction the loop continues with.
    """

    labels: torch.Tensor
    gains: torch.Tensor
    values: torch.Tensor


class BlockCoder(Protocol):
    """What :func:`leechq.quant.gptq.gptq_quantize` needs from a quantizer."""

    name: str
    lattice: bool  # True: codes are codebook labels + gains and form a QuantizedWeight

    def fit(self, w_rot: torch.Tensor, row_scales: torch.Tensor) -> torch.Tensor:
        """Per-matrix parameters fitted before the loop: float64 [K] ascending centroids."""
        ...

    def code(
        self, v: torch.Tensor, row_scales: torch.Tensor, centroids: torch.Tensor
    ) -> BlockCodes:
        """Code ``v`` float64 [rows, 24] given float64 [rows] scales."""
        ...


def row_scales(w_rot: torch.Tensor) -> torch.Tensor:
    """Frozen per-row scale (leech-core.md §5.4): ``sqrt(Σ_j W'_ij² / max(1, ⌊d_in/24⌋))``.

    Args:
        w_rot: float64 [d_out, d_in], the rotated weights before GPTQ (tail included).

    Returns:
        float64 [d_out].
    """
    d_in = w_rot.shape[1]
    return torch.sqrt((w_rot * w_rot).sum(dim=1) / float(max(1, d_in // BLOCK)))


def block_gain_samples(w_rot: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``‖block‖ / s_i`` for every full block of every row, skipping zero rows and zero blocks.

    Returns:
        float64 [n_samples].
    """
    d_out, d_in = w_rot.shape
    nb = d_in // BLOCK
    blocks = w_rot[:, : nb * BLOCK].reshape(d_out, nb, BLOCK)
    norms = torch.sqrt((blocks * blocks).sum(dim=-1))
    keep = (scales[:, None] > 0) & (norms > 0)
    rel = norms / torch.where(scales > 0, scales, torch.ones_like(scales))[:, None]
    return rel[keep]


class IdentityCoder:
    """Returns every block unchanged (labels and gains are zeros; not a lattice code)."""

    name = "identity"
    lattice = False

    def fit(self, w_rot: torch.Tensor, row_scales: torch.Tensor) -> torch.Tensor:
        return torch.ones(1, dtype=torch.float64)

    def code(
        self, v: torch.Tensor, row_scales: torch.Tensor, centroids: torch.Tensor
    ) -> BlockCodes:
        n = v.shape[0]
        return BlockCodes(
            labels=torch.zeros(n, dtype=torch.int64, device=v.device),
            gains=torch.zeros(n, dtype=torch.uint8, device=v.device),
            values=v.clone(),
        )


class ScalarRoundCoder:
    """Rounds each coordinate to the grid ``step·s_i·Z`` (a codebook-free control quantizer)."""

    name = "scalar-round"
    lattice = False

    def __init__(self, step: float = 0.5):
        if step <= 0:
            raise InvalidInput(f"scalar grid step must be positive, got {step}")
        self.step = step

    def fit(self, w_rot: torch.Tensor, row_scales: torch.Tensor) -> torch.Tensor:
        return torch.ones(1, dtype=torch.float64)

    def code(
        self, v: torch.Tensor, row_scales: torch.Tensor, centroids: torch.Tensor
    ) -> BlockCodes:
        unit = (self.step * row_scales / BLOCK**0.5)[:, None]
        unit = torch.where(unit > 0, unit, torch.ones_like(unit))
        q = torch.round(v / unit) * unit
        n = v.shape[0]
        return BlockCodes(
            labels=torch.zeros(n, dtype=torch.int64, device=v.device),
            gains=torch.zeros(n, dtype=torch.uint8, device=v.device),
            values=q,
        )


class ShapeGainCoder:
    """Shape–gain coding over a registered codebook (leech-core.md §4.6).

    Args:
        codebook: registry name ("ball", "tetra", or a codebook registered by a test).
        gain_bits: 0, 1 or 2 → 1, 2 or 4 centroids per matrix.
        iters: Lloyd–Max iterations for the centroids.
    """

    lattice = True

    def __init__(self, codebook: str, gain_bits: int = 1, iters: int = 40):
        from leechq.codebooks import get

        self.codebook = get(codebook)
        self.name = codebook
        self.gain_bits = gain_bits
        self.iters = iters

    def fit(self, w_rot: torch.Tensor, row_scales: torch.Tensor) -> torch.Tensor:
        samples = block_gain_samples(w_rot, row_scales)
        if samples.numel() == 0:  # an all-zero matrix: every block codes to the origin anyway
            return torch.ones(2**self.gain_bits, dtype=torch.float64)
        return shape_gain.fit_centroids(samples, self.gain_bits, iterations=self.iters)

    def code(
        self, v: torch.Tensor, row_scales: torch.Tensor, centroids: torch.Tensor
    ) -> BlockCodes:
        # One batched codebook call for every row of the column group (§4.6 steps 1-3, 5); zero
        # blocks come back as (label 0, gain 0, origin).
        labels, gains, points = shape_gain.shape_gain_encode(
            v, row_scales, centroids, self.codebook
        )
        # §4.6 step 4, in the decoder's exact f64 order.
        values = shape_gain.reconstruct(
            points.to(v.device), gains.to(v.device), row_scales, centroids
        )
        return BlockCodes(labels=labels.to(torch.int64), gains=gains.to(torch.uint8), values=values)
