"""Per-output tolerances for matmul-like results, derived from the dtypes involved.

A product ``y = x @ w.T`` computed with operands rounded to ``act_dtype`` and accumulated in f32
differs from the float64 product by at most about ``(2 u_act + k u_acc) * (|x| @ |w|.T)`` per
output, where ``u`` is the unit roundoff of a dtype and ``k`` the reduction length. The checks below
use that bound (with a safety factor and ``sqrt(k)`` for the accumulation, the typical rather than the
worst case) per output element, so one large output cannot hide an error in a small one.
"""

from __future__ import annotations

import math

import torch


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the machine epsilon of a floating dtype (2**-24 for f32, 2**-11 for f16, 2**-8 bf16)."""
    return torch.finfo(dtype).eps / 2


def matmul_scale(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``|x| @ |w|.T`` in float64: the magnitude each output's rounding errors scale with.

    ``x``: ``(..., k)``; ``w``: ``(n, k)`` dense weights. Returns ``(..., n)`` float64 on x's device."""
    xa = x.detach().to(torch.float64).abs()
    wa = w.detach().to(device=xa.device, dtype=torch.float64).abs()
    return xa @ wa.T


def matmul_tolerance(x: torch.Tensor, w: torch.Tensor, act_dtype: torch.dtype,
                     acc_dtype: torch.dtype = torch.float32, out_dtype: torch.dtype | None = None,
                     factor: float = 4.0) -> torch.Tensor:
    """Per-output absolute tolerance for ``x @ w.T`` computed with operands in ``act_dtype``.

    ``out_dtype`` (default: none) adds the rounding of the stored result. Returns a float64 tensor
    shaped like the product."""
    k = x.shape[-1]
    u = 2 * unit_roundoff(act_dtype) + math.sqrt(k) * unit_roundoff(acc_dtype)
    if out_dtype is not None:
        u += unit_roundoff(out_dtype)
    scale = matmul_scale(x, w)
    return factor * u * scale + torch.finfo(torch.float32).tiny


def assert_matmul_close(y: torch.Tensor, ref: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                        act_dtype: torch.dtype, *, acc_dtype: torch.dtype = torch.float32,
                        factor: float = 4.0, what: str = "") -> None:
    """Assert ``|y - ref| <= matmul_tolerance`` element by element (``ref`` ideally float64).

    Shapes of ``y`` and ``ref``: ``(..., n)``; the message names the worst output and its ratio
    of error to tolerance."""
    assert y.shape == ref.shape, f"{what} shape {tuple(y.shape)} != {tuple(ref.shape)}"
    tol = matmul_tolerance(x, w, act_dtype, acc_dtype, out_dtype=y.dtype, factor=factor)
    err = (y.detach().to(torch.float64) - ref.detach().to(torch.float64)).abs().to(tol.device)
    ratio = err / tol
    worst = int(torch.argmax(ratio).item()) if ratio.numel() else 0
    r = float(ratio.flatten()[worst]) if ratio.numel() else 0.0
    assert bool(torch.isfinite(y).all()), f"{what} non-finite outputs"
    assert r <= 1.0, (f"{what} output {worst}: error {float(err.flatten()[worst]):.3e} is "
                      f"{r:.2f}x its tolerance {float(tol.flatten()[worst]):.3e}")
