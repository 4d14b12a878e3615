"""The ball codebook: directions coded by the exact angular search over Λ24(12) and the v1 index.

Implements the direction half of the shipped code (docs/codebooks.md §2; search docs/lattice.md §6,
labels docs/lattice.md §4): ``encode`` finds the exact angular nearest point of Λ24(M) \\ {0}
(:mod:`leechq.codebooks.ball_search`, tie rule of docs/lattice.md §6.3) and returns its v1 index
(``lattice.indexing``); ``decode`` maps indices back to points of √8·Λ24. The registry default is M
= 12 (47-bit labels, 0 ..= N(12)); M = 13 gives the 48-bit ball. Gains are coded separately
(:mod:`leechq.codebooks.shape_gain`).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch

from leechq.codebooks.ball_search import SearchMode, search_batch
from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput
from leechq.lattice.classes import ball_size, index_bits
from leechq.lattice.indexing import decode_indices, encode_points

PINNED_FINGERPRINT = "338f420f11866319"
"""Fingerprint of index format v1 (docs/lattice.md §5), the same for every ball size."""


@cache
def _computed_fingerprint() -> str:
    try:
        from leechq.lattice.fingerprint import codebook_fingerprint
    except ImportError:  # the lattice fingerprint module is optional
        return PINNED_FINGERPRINT
    return f"{codebook_fingerprint():016x}"


class BallCodebook:
    """Directions on the normalised Leech ball Λ24(M) (registry name "ball").

    Attributes:
        name: "ball".
        dim: 24.
        label_bits: ⌈log2(N(M)+1)⌉: 47 for M = 12, 48 for M = 13.
        max_shell: M.
    """

    name = "ball"
    dim = BLOCK

    def __init__(
        self,
        max_shell: int = 12,
        *,
        mode: SearchMode = "exact",
        work_dtype: torch.dtype = torch.float32,
        chunk_size: int | None = None,
    ) -> None:
        """Args:
        max_shell: M, 12 (default, 47-bit labels) or 13 (48-bit); 2..13 are accepted.
        mode: search mode of :func:`leechq.codebooks.ball_search.search_batch` ("exact" default).
        work_dtype: stage-1 dtype of the search (never changes results).
        chunk_size: queries per search chunk (default: by device).
        """
        if not 2 <= max_shell <= 13:
            raise InvalidInput(f"max_shell must be in [2, 13], got {max_shell}")
        self.max_shell = max_shell
        self.label_bits = index_bits(max_shell)
        self.max_label = ball_size(max_shell)
        self._mode: SearchMode = mode
        self._work_dtype = work_dtype
        self._chunk_size = chunk_size

    def __repr__(self) -> str:
        return f"BallCodebook(max_shell={self.max_shell}, label_bits={self.label_bits})"

    def _blocks(self, x: torch.Tensor, what: str = "x") -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise InvalidInput(f"{what} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() == 0 or x.shape[-1] != BLOCK:
            raise InvalidInput(f"{what} must have shape [..., 24], got {list(x.shape)}")
        if not x.is_floating_point():
            raise InvalidInput(f"{what} must have a floating dtype, got {x.dtype}")
        return x.reshape(-1, BLOCK)

    def search(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact angular nearest points.

        Args:
            x: float [..., 24].

        Returns:
            (points int32 [..., 24], scores float64 [...]): the winners ⟨x,v⟩/‖v‖ (origin and 0 for
            zero blocks), on the device of x.
        """
        flat = self._blocks(x)
        points, scores = search_batch(
            flat,
            self.max_shell,
            mode=self._mode,
            work_dtype=self._work_dtype,
            chunk_size=self._chunk_size,
        )
        return points.reshape(*x.shape[:-1], BLOCK), scores.reshape(x.shape[:-1])

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Direction labels: x float [..., 24] -> int64 [...] (scale-invariant; zero block -> 0)."""
        points, _ = self.search(x)
        labels = encode_points(points.reshape(-1, BLOCK).cpu().numpy(), self.max_shell)
        return torch.from_numpy(labels).to(x.device).reshape(x.shape[:-1])

    def decode(self, labels: torch.Tensor) -> torch.Tensor:
        """labels int64 [...] -> points int32 [..., 24] of √8·Λ24 (natural coordinate order)."""
        if not isinstance(labels, torch.Tensor):
            raise InvalidInput(f"labels must be a torch.Tensor, got {type(labels).__name__}")
        if labels.dtype not in (torch.int64, torch.int32):
            raise InvalidInput(f"labels must be int64 (or int32), got {labels.dtype}")
        flat = labels.reshape(-1).to("cpu", torch.int64).numpy()
        if flat.size:
            low, high = int(flat.min()), int(flat.max())
            if low < 0 or high > self.max_label:
                bad = low if low < 0 else high
                raise InvalidInput(
                    f"label {bad} outside [0, {self.max_label}] (N({self.max_shell}), "
                    f"{self.label_bits}-bit ball labels)"
                )
        points = decode_indices(flat, self.max_shell).astype(np.int32)
        return torch.from_numpy(points).to(labels.device).reshape(*labels.shape, BLOCK)

    def fingerprint(self) -> str:
        """Fingerprint of the label ↔ point map (index format v1): "338f420f11866319"."""
        return _computed_fingerprint()
