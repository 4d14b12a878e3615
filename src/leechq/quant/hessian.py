"""Input second moments of the linear layers: capture, rotation, damping, inverse-Cholesky factor.

Implements docs/quantizer.md §2 (calibration and Hessians) and the Hessian half of its §3:

* ``H = (1/N) Σ x xᵀ`` over the N token rows that reach a linear input, accumulated on the device in
  f32 (the reference) or f64;
* rotated as ``H' = Q H Qᵀ`` by two passes of the fast transform (no dense Q is ever built);
* damped as ``H + λ·mean(diag H)·I`` (λ = 0.01);
* factored once per activation as the upper-triangular ``U`` with ``H⁻¹ = UᵀU`` (Cholesky → inverse
  → Cholesky, all f64). A Hessian that is not positive definite after damping is a hard error naming
  the matrix (dead channels or too little data).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch

from leechq.errors import InvalidInput
from leechq.formats.rotation import RotationTables, apply_rotation


class NotPositiveDefinite(InvalidInput):
    """A damped Hessian (or its inverse) failed its Cholesky factorization."""


class HessianAccumulator:
    """Running ``Σ x xᵀ`` over the rows of the activations fed to one linear input.

    Args:
        dim: input width ``d_in``.
        device: where the sum lives (the calibration device).
        dtype: accumulation dtype, torch.float32 (reference) or torch.float64.
    """

    def __init__(
        self, dim: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ):
        if dtype not in (torch.float32, torch.float64):
            raise InvalidInput(
                f"Hessian accumulation dtype must be float32 or float64, got {dtype}"
            )
        self.dim = dim
        self.dtype = dtype
        self.sum = torch.zeros(dim, dim, device=device, dtype=dtype)
        self.rows = 0

    def add(self, x: torch.Tensor) -> None:
        """Accumulate activations ``x`` of shape [..., dim] (any float dtype; widened first)."""
        if x.shape[-1] != self.dim:
            raise InvalidInput(
                f"Hessian of width {self.dim} fed activations of width {x.shape[-1]}"
            )
        rows = x.detach().reshape(-1, self.dim).to(device=self.sum.device, dtype=self.dtype)
        self.sum.addmm_(rows.T, rows)
        self.rows += rows.shape[0]

    def finalize(self) -> torch.Tensor:
        """``(1/N) Σ x xᵀ`` as float64 [dim, dim] on the CPU-or-device of the sum, symmetrized."""
        if self.rows == 0:
            raise InvalidInput("Hessian accumulator saw no activations")
        h = self.sum.to(torch.float64) / float(self.rows)
        return 0.5 * (h + h.T)


def rotate_hessian(h: torch.Tensor, tables: RotationTables) -> torch.Tensor:
    """``Q H Qᵀ`` for a symmetric H (float64 [n, n]) by two fast-transform passes.

    ``apply_rotation`` maps each row r to ``Q r``, i.e. ``H ↦ H Qᵀ``; applying it again to the
    transpose gives ``Q Hᵀ Qᵀ = Q H Qᵀ``.
    """
    if h.dim() != 2 or h.shape[0] != h.shape[1] or h.shape[0] != tables.n:
        raise InvalidInput(
            f"cannot rotate a Hessian of shape {list(h.shape)} by a width-{tables.n} rotation"
        )
    h = h.to(torch.float64)
    once = apply_rotation(h, tables)
    twice = apply_rotation(once.T.contiguous(), tables)
    return 0.5 * (twice + twice.T)


def damp(h: torch.Tensor, damping: float) -> torch.Tensor:
    """``H + damping·mean(diag H)·I`` (float64). The ridge is *relative* (pitfall P6)."""
    if not 0.0 < damping < 1.0:
        raise InvalidInput(f"damping must be in (0, 1), got {damping}")
    h = h.to(torch.float64)
    ridge = damping * float(torch.diagonal(h).mean())
    out = h.clone()
    out.diagonal().add_(ridge)
    return out


def inverse_cholesky_factor(h: torch.Tensor, name: str = "Hessian") -> torch.Tensor:
    """Upper-triangular ``U`` (float64 [n, n]) with ``H⁻¹ = UᵀU`` for a positive definite H.

    Computed as the reference does: ``H = L Lᵀ``, ``H⁻¹`` from L, then ``H⁻¹ = L₂ L₂ᵀ`` and ``U =
    L₂ᵀ``.

    Raises:
        NotPositiveDefinite: naming ``name``, when either factorization fails.
    """
    h = h.to(torch.float64)
    if not bool(torch.isfinite(h).all()):
        raise NotPositiveDefinite(f"{name}: Hessian has non-finite entries")
    l1, info = torch.linalg.cholesky_ex(h)
    if int(info) != 0:
        raise NotPositiveDefinite(
            f"{name}: damped Hessian is not positive definite (Cholesky failed at column "
            f"{int(info) - 1}); dead input channels or too little calibration data"
        )
    h_inv = torch.cholesky_inverse(l1)
    h_inv = 0.5 * (h_inv + h_inv.T)
    l2, info = torch.linalg.cholesky_ex(h_inv)
    if int(info) != 0:
        raise NotPositiveDefinite(
            f"{name}: inverse Hessian is not positive definite (ill-conditioned)"
        )
    return l2.T.contiguous()


def prepare_factor(
    h: torch.Tensor, tables: RotationTables | None, damping: float, name: str = "Hessian"
) -> torch.Tensor:
    """Rotate (when ``tables`` is given), damp and factor one activation's Hessian.

    Args:
        h: float64 [n, n], ``(1/N) Σ x xᵀ`` in the natural basis.
        tables: the activation's rotation, or None.
        damping: relative damping λ.
        name: used in error messages.

    Returns:
        U: float64 [n, n] upper triangular, ``(damped H')⁻¹ = UᵀU``.
    """
    if tables is not None:
        h = rotate_hessian(h, tables)
    return inverse_cholesky_factor(damp(h, damping), name)


@contextmanager
def capture_inputs(
    modules: Mapping[int, torch.nn.Module], accumulators: Mapping[int, HessianAccumulator]
) -> Iterator[None]:
    """Forward pre-hooks feeding each module's first positional input to its accumulator.

    Args:
        modules: activation index → the (one) linear module whose input defines it.
        accumulators: activation index → accumulator of matching width.
    """
    handles = []

    def make_hook(acc: HessianAccumulator):  # type: ignore[no-untyped-def]
        def hook(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            acc.add(args[0])

        return hook

    try:
        for act, module in modules.items():
            handles.append(module.register_forward_pre_hook(make_hook(accumulators[act])))
        yield
    finally:
        for handle in handles:
            handle.remove()
