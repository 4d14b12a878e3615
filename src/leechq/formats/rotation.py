"""The input-side incoherence rotation Q = (Q_odd ⊗ H_m)·D: generation from a seed, and application.

Implements docs/quantizer.md §3 and docs/format.md §2 step 3. For a width ``n``: ``m`` is the
largest power of two dividing ``n`` and ``k = n / m`` (odd). Coordinates are laid out ``index =
group·m + j``.

``Q v``: multiply by the ±1 signs ``D``; apply the orthonormal Walsh–Hadamard transform (Sylvester
order, butterflies ``(a, b) → (a+b, a−b)``, then × ``1/√m``) to each of the ``k`` contiguous groups;
mix the ``k`` values ``{v[g·m + j]}`` of each ``j`` by the ``k×k`` orthogonal ``Q_odd``.
``Qᵀ v`` reverses the three steps. Weights are rotated as ``W' = W Qᵀ`` (``Q`` applied to every row)
and decoded as ``Ŵ = Ŵ' Q`` (``Qᵀ`` applied to every row); a fused runtime rotates the activation
instead: ``y = Ŵ'(Q x)``.

Generation is bit-exact with the spec's recipe (scalar SplitMix64 Box–Muller through libm, modified
Gram–Schmidt in sequential f64), but because libm may differ across platforms, artifacts store the
generated tables (:class:`RotationTables`) beside the seed, and every reader uses the stored tables.
The f64 application order here (mix accumulated with ascending ``t`` from 0.0 as separate multiplies
and adds, butterflies, one multiply by the reciprocal, signs) is the one the Tetra reader uses, so
un-rotation reproduces its bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from leechq.errors import InvalidInput
from leechq.utils.splitmix import SplitMix64

BASE_SEED = 0x110FEED
"""Base rotation seed of the reference recipe."""


def rotation_seed(block: int, act: int, base: int = BASE_SEED) -> int:
    """Effective seed of transformer block ``block`` and activation ``act`` (0: attention input,
    1: attention output, 2: MLP input, 3: MLP product): ``base ⊕ (block << 32) ⊕ (act << 16)``."""
    return base ^ (block << 32) ^ (act << 16)


def split_width(n: int) -> tuple[int, int]:
    """``(m, k)``: the largest power of two ``m`` dividing ``n`` and the odd cofactor ``k = n/m``."""
    if n <= 0:
        raise InvalidInput(f"rotation width must be positive, got {n}")
    m = n & -n
    return m, n // m


@dataclass(frozen=True)
class RotationTables:
    """The stored form of one rotation.

    Attributes:
        n: width.
        seed: the effective seed that generated the tables (informative; readers use the tables).
        signs: float64 [n], entries ±1.0 (the diagonal D).
        small: float64 [k, k], the orthogonal Q_odd, row-major ([[1.0]] when k = 1).
    """

    n: int
    seed: int
    signs: np.ndarray
    small: np.ndarray

    def __post_init__(self) -> None:
        m, k = split_width(self.n)
        if self.signs.shape != (self.n,) or self.small.shape != (k, k):
            raise InvalidInput(
                f"rotation tables for n={self.n} need signs [{self.n}] and small [{k},{k}], got "
                f"{list(self.signs.shape)} and {list(self.small.shape)}"
            )
        if not np.all(np.abs(self.signs) == 1.0):
            raise InvalidInput("rotation signs must all be ±1")

    @property
    def pow2(self) -> int:
        """m, the Hadamard size."""
        return split_width(self.n)[0]

    @property
    def odd(self) -> int:
        """k, the size of the dense odd block."""
        return split_width(self.n)[1]

    def sign_bits(self) -> np.ndarray:
        """Signs as a packed bit mask: uint8 [ceil(n/8)], bit ``i % 8`` of byte ``i // 8`` set iff
        ``signs[i] == -1`` (little-endian bit order)."""
        return np.packbits(self.signs < 0, bitorder="little")

    @staticmethod
    def signs_from_bits(bits: np.ndarray, n: int) -> np.ndarray:
        """Inverse of :meth:`sign_bits`: float64 [n] of ±1.0."""
        neg = np.unpackbits(np.asarray(bits, dtype=np.uint8), bitorder="little")[:n].astype(bool)
        return np.where(neg, -1.0, 1.0)

    def to_matrix(self) -> np.ndarray:
        """The dense n×n matrix Q (float64), for tests on small widths."""
        eye = torch.eye(self.n, dtype=torch.float64)
        return apply_rotation(eye, self).T.numpy()  # column j = Q e_j


def generate_rotation(n: int, seed: int) -> RotationTables:
    """Generate the rotation tables of width ``n`` from ``seed`` (docs/quantizer.md §3).

    First ``n`` Gaussians give the signs (negative draw → −1). If ``k > 1``, ``k`` rows of ``k``
    Gaussians each are orthonormalized by modified Gram–Schmidt (sequential f64 dot products, a
    division by the norm). If ``k == 1`` no Gaussian is drawn and ``small = [[1.0]]``.
    """
    m, k = split_width(n)
    rng = SplitMix64(seed)
    signs = np.array([-1.0 if rng.gaussian() < 0.0 else 1.0 for _ in range(n)], dtype=np.float64)
    if k == 1:
        return RotationTables(n=n, seed=seed, signs=signs, small=np.ones((1, 1), dtype=np.float64))
    rows: list[list[float]] = []
    for _ in range(k):
        row = [rng.gaussian() for _ in range(k)]
        for q in rows:
            d = 0.0
            for j in range(k):
                d += row[j] * q[j]
            for j in range(k):
                row[j] = row[j] - d * q[j]
        sq = 0.0
        for j in range(k):
            sq += row[j] * row[j]
        nrm = math.sqrt(sq)
        rows.append([row[j] / nrm for j in range(k)])
    return RotationTables(n=n, seed=seed, signs=signs, small=np.array(rows, dtype=np.float64))


def _check(x: torch.Tensor, tables: RotationTables) -> None:
    if x.shape[-1] != tables.n:
        raise InvalidInput(f"rotation of width {tables.n} applied to a tensor of last dim {x.shape[-1]}")
    if not x.is_floating_point():
        raise InvalidInput(f"rotation needs a floating-point tensor, got {x.dtype}")


def _wht_groups(v: torch.Tensor, m: int) -> torch.Tensor:
    """Unnormalized Sylvester WHT on contiguous groups of m of the last dim (butterfly order)."""
    shape = v.shape
    length = 1
    while length < m:
        blocks = v.reshape(*shape[:-1], -1, 2, length)
        a = blocks[..., 0, :]
        b = blocks[..., 1, :]
        v = torch.stack((a + b, a - b), dim=-2).reshape(shape)
        length *= 2
    return v


def _mix(v: torch.Tensor, small: torch.Tensor, k: int, m: int, transpose: bool) -> torch.Tensor:
    """out[g] = Σ_t A[g][t] · v[t] over groups, A = small (or its transpose), t ascending, no FMA.

    Every output group at once: for each ``t`` the products ``A[g][t]·v[t]`` of all ``g`` (one
    rounded multiply each) are added to the accumulators, which start at 0.0 — per element the
    same operations in the same order as the scalar loop, in ``2k`` whole-tensor operations.
    """
    groups = v.reshape(*v.shape[:-1], k, m)
    coef = small.T if transpose else small  # coef[g, t]
    out = torch.zeros_like(groups)
    for t in range(k):
        out += coef[:, t, None] * groups[..., t : t + 1, :]
    return out.reshape(v.shape)


def apply_rotation(x: torch.Tensor, tables: RotationTables) -> torch.Tensor:
    """``Q x`` along the last dimension: signs, per-group WHT × 1/√m, then the Q_odd mix.

    Args:
        x: float tensor [..., n] (computed in its own dtype; pass float64 for the exact path).
        tables: the rotation.

    Returns:
        Tensor of the same shape and dtype.
    """
    _check(x, tables)
    m, k = tables.pow2, tables.odd
    signs = torch.as_tensor(tables.signs, dtype=x.dtype, device=x.device)
    v = _wht_groups(x * signs, m) * (1.0 / math.sqrt(m))
    if k > 1:
        small = torch.as_tensor(tables.small, dtype=x.dtype, device=x.device)
        v = _mix(v, small, k, m, transpose=False)
    return v


def apply_rotation_transpose(x: torch.Tensor, tables: RotationTables) -> torch.Tensor:
    """``Qᵀ x`` along the last dimension: the Q_oddᵀ mix, per-group WHT × 1/√m, then signs.

    This is the un-rotation of decoded rows (docs/format.md §2 step 3); in float64 it reproduces
    the published reader's bits.
    """
    _check(x, tables)
    small = torch.as_tensor(tables.small, dtype=x.dtype, device=x.device)
    signs = torch.as_tensor(tables.signs, dtype=x.dtype, device=x.device)
    return rotation_transpose_with(x, signs, small)


def rotation_transpose_with(x: torch.Tensor, signs: torch.Tensor,
                            small: torch.Tensor) -> torch.Tensor:
    """:func:`apply_rotation_transpose` with the tables already tensors of ``x``'s dtype and
    device (``signs`` [n], ``small`` [k, k]): the same operations, no host transfer (so it can run
    inside a CUDA graph)."""
    n = x.shape[-1]
    if signs.shape != (n,):
        raise InvalidInput(f"rotation width {signs.shape[0]} != last dim {n}")
    m, k = split_width(n)
    v = x
    if k > 1:
        v = _mix(v, small, k, m, transpose=True)
    v = _wht_groups(v, m) * (1.0 / math.sqrt(m))
    return v * signs
