"""The codebook protocol shared by the ball (Λ24(12)) and Tetra codebooks.

A codebook maps 24-dimensional directions to integer labels and labels back to points of the integer
embedding √8·Λ24 (docs/lattice.md). Labels carry the direction only; gains are coded separately
(``leechq.codebooks.shape_gain``). See docs/architecture.md §1.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

BLOCK = 24
"""Coordinates per block (the dimension of Λ24)."""


@runtime_checkable
class Codebook(Protocol):
    """A direction codebook over √8·Λ24.

    Attributes:
        name: registry name ("ball", "tetra").
        dim: block dimension, always 24.
        label_bits: bits of a label (47 for both shipped codebooks).
    """

    name: str
    dim: int
    label_bits: int

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Best direction: x float [..., 24] -> labels int64 [...] (scale-invariant)."""
        ...

    def decode(self, labels: torch.Tensor) -> torch.Tensor:
        """labels int64 [...] -> points int32 [..., 24], natural coordinate order."""
        ...

    def fingerprint(self) -> str:
        """16-hex-digit fingerprint of the label ↔ point map, lower case."""
        ...
