"""Block coders: what the GPTQ loop calls to code one column group of 24 for every row at once.

A coder turns ``v`` (float64 [rows, 24], the current error-compensated values of one 24-column group)
into codes and the exact reconstruction the loop continues with (leech-core.md §5.5). Three kinds:

* :class:`ShapeGainCoder` — the shipped rule (leech-core.md §4.6, §5.4): direction from a registered
  codebook (``leechq.codebooks.get(name).encode``, one batched call per column group), gain by the
  norm rule against per-matrix Lloyd–Max centroids fitted before the loop, reconstruction in the exact
  f64 order of the decoder. Produces lattice codes.
* :class:`IdentityCoder` — returns ``v`` unchanged (the control of §5.5: must leave a layer unchanged).
* :class:`ScalarRoundCoder` — a uniform scalar grid relative to the row scale; a codebook-free control
  for tests of the loop itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

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

    def code(self, v: torch.Tensor, row_scales: torch.Tensor, centroids: torch.Tensor) -> BlockCodes:
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

    def code(self, v: torch.Tensor, row_scales: torch.Tensor, centroids: torch.Tensor) -> BlockCodes:
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

    def code(self, v: torch.Tensor, row_scales: torch.Tensor, centroids: torch.Tensor) -> BlockCodes:
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
        return _fit_centroids(samples, self.gain_bits, iters=self.iters)

    def code(self, v: torch.Tensor, row_scales: torch.Tensor, centroids: torch.Tensor) -> BlockCodes:
        labels = self.codebook.encode(v)  # one batched call for every row of the column group
        points = self.codebook.decode(labels).to(v.device)
        norms = torch.sqrt((v * v).sum(dim=-1))
        zero = norms == 0
        gains = _choose_gain(norms, row_scales, centroids)
        # §4.6 step 1: an all-zero block is (index 0, gain 0) and reconstructs to zeros.
        labels = torch.where(zero, torch.zeros_like(labels), labels)
        gains = torch.where(zero, torch.zeros_like(gains), gains)
        points = torch.where(zero[:, None], torch.zeros_like(points), points)
        values = _reconstruct(points, gains, row_scales, centroids)
        return BlockCodes(labels=labels.to(torch.int64), gains=gains.to(torch.uint8), values=values)


# TEMPORARY (until leechq.codebooks.shape_gain lands): §5.4 / §4.6 primitives.
def _fit_centroids(samples: torch.Tensor, gain_bits: int, iters: int = 40) -> torch.Tensor:
    k = 2**gain_bits
    x = torch.sort(samples.to(torch.float64).cpu()).values
    n = x.numel()
    if n == 0:
        return torch.ones(k, dtype=torch.float64)
    c = torch.stack([x[((2 * j + 1) * n) // (2 * k)] for j in range(k)])
    for _ in range(iters):
        assign = torch.argmin((x[:, None] - c[None, :]).abs(), dim=1)
        for j in range(k):
            sel = x[assign == j]
            if sel.numel():
                c[j] = sel.mean()
        c = torch.sort(c).values
    return c


def _choose_gain(norms: torch.Tensor, scales: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    rel = norms / safe
    return torch.argmin((rel[:, None] - centroids.to(rel.device)[None, :]).abs(), dim=1).to(torch.uint8)


def _reconstruct(points: torch.Tensor, gains: torch.Tensor, scales: torch.Tensor,
                 centroids: torch.Tensor) -> torch.Tensor:
    p = points.to(torch.float64)
    n2 = (p * p).sum(dim=-1)
    picked = centroids.to(p.device)[gains.long()] * scales
    scale = torch.where(n2 > 0, picked / torch.sqrt(n2), torch.zeros_like(picked))
    return p * scale[:, None]
