"""Device-side decode tables derived from the codebooks' tables (built lazily, cached per device).

* Tetra (layouts-kernels-recipe.md §2.2, §2.4): ``rows`` int32 [4096] (the rank table as is), and the
  Golay pattern split by F2-linearity into two small tables, ``cw`` int32 [256]:
  ``cw[s8 | b1<<6]`` (128 entries) = pattern of (s8, b1, b2 = 0, b3 = 0) and
  ``cw[128 + (b2 | b3<<4)]`` (32 entries) = pattern of (s8 = 0, b1 = 0, b2, b3), so the full 24-bit
  trio-order pattern ``c1 | c2<<8 | c3<<16`` of a word is ``cw[a] ^ cw[128 + b]`` — two independent
  reads instead of the dependent prefix → branch → suffix chain. The split is checked against the
  trellis on all 4096 inputs when built.
* ``order`` int32 [24] (trio → natural) for the activation preparation.
* Planes14: the 512-entry class table in its kernel form (``formats.layouts.planes14``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import torch


@dataclass(frozen=True)
class TetraKernelTables:
    """Tetra tables as the kernels read them (all int32, on one device)."""

    rows: torch.Tensor
    cw: torch.Tensor
    order: torch.Tensor


def tetra_pattern_split() -> np.ndarray:
    """The 256-entry split pattern table (uint32), verified against the trellis tables."""
    from leechq.codebooks.tetra_tables import tetra_tables

    t = tetra_tables()

    def pattern(s8: np.ndarray, b1: np.ndarray, b2: np.ndarray, b3: np.ndarray) -> np.ndarray:
        c1 = t.prefixes[s8, b1].astype(np.uint32)
        c2 = t.branch_c2[s8, b2].astype(np.uint32)
        s16 = t.branch_s16[s8, b2].astype(np.int64)
        c3 = t.suffixes[s16, b3].astype(np.uint32)
        return c1 | (c2 << 8) | (c3 << 16)

    cw = np.zeros(256, dtype=np.uint32)
    a = np.arange(128)
    cw[:128] = pattern(a & 63, a >> 6, np.zeros_like(a), np.zeros_like(a))
    b = np.arange(32)
    cw[128:160] = pattern(np.zeros_like(b), np.zeros_like(b), b & 15, b >> 4)
    x = np.arange(4096)
    s8, b1, b2, b3 = x & 63, (x >> 6) & 1, (x >> 7) & 15, x >> 11
    full = pattern(s8, b1, b2, b3)
    split = cw[s8 | (b1 << 6)] ^ cw[128 + (b2 | (b3 << 4))]
    if not np.array_equal(full, split):
        raise AssertionError("the Golay trellis is not F2-linear in (s8, b1, b2, b3)")
    return cw


@cache
def _tetra_tables_cached(device: str) -> TetraKernelTables:
    from leechq.codebooks.tetra_tables import tetra_tables

    t = tetra_tables()
    rows = torch.from_numpy(t.rows.astype(np.uint32).view(np.int32).copy())
    cw = torch.from_numpy(tetra_pattern_split().view(np.int32).copy())
    order = torch.from_numpy(t.order.astype(np.int32))
    return TetraKernelTables(rows.to(device), cw.to(device), order.to(device))


def tetra_kernel_tables(device: torch.device | str) -> TetraKernelTables:
    """The Tetra kernel tables on ``device`` (built once per device)."""
    return _tetra_tables_cached(str(torch.device(device)))


@cache
def _planes14_table_cached(device: str) -> torch.Tensor:
    from leechq.formats.layouts.planes14 import planes14_tables

    return torch.from_numpy(planes14_tables().kernel.copy()).to(device)


def planes14_kernel_table(device: torch.device | str) -> torch.Tensor:
    """The Planes14 class table, int32 [512, 4], on ``device``."""
    return _planes14_table_cached(str(torch.device(device)))


def natural_order(device: torch.device | str) -> torch.Tensor:
    """int32 [24] identity permutation (Planes14 blocks are in natural order)."""
    return torch.arange(24, dtype=torch.int32, device=device)
