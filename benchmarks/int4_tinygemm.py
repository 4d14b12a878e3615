"""The int4 baseline of the kernel and end-to-end benchmarks: torch's own int4 weight-only GEMM
("tinygemm", ``torch.ops.aten._weight_int4pack_mm``), asymmetric, group 128 along the input.

A weight ``w`` (``[n, k]``) is coded per row and per group of :data:`GROUP` inputs as 4-bit
``q`` in 0..15 with a float scale and zero, ``w ≈ (q - 8) · scale + zero`` (tinygemm's own
convention), and packed into the layout the op reads. On CUDA the op takes bfloat16 activations
and a bfloat16 scale/zero table, so :class:`Int4Linear` runs in bfloat16; on the CPU it uses the
op's CPU twin (``_weight_int4pack_mm_for_cpu``), which lets the tests check the packing against
:func:`dequantize` without a GPU.
"""

from __future__ import annotations

import torch
from torch import nn

GROUP = 128
"""Inputs per scale/zero pair (the group size the issue's baseline names)."""

INNER_K_TILES = 8
"""tinygemm's inner k-tiling of the packed weight (``k`` must be a multiple of 16 × this)."""


def fits(n: int, k: int) -> bool:
    """Whether tinygemm takes a weight of ``n`` outputs and ``k`` inputs (what :func:`pack`
    needs: ``n`` a multiple of 16, ``k`` of 16 × :data:`INNER_K_TILES` and of :data:`GROUP`)."""
    return n % 16 == 0 and k % (16 * INNER_K_TILES) == 0 and k % GROUP == 0


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest asymmetric int4 of ``w`` (``[n, k]``, any float dtype, ``k`` a multiple
    of :data:`GROUP`): codes ``q`` (int32 ``[n, k]`` in 0..15) and the scale/zero table
    (float32 ``[k / GROUP, n, 2]``: ``[..., 0]`` scale, ``[..., 1]`` zero)."""
    n, k = w.shape
    if k % GROUP:
        raise ValueError(f"int4 tinygemm needs inputs in groups of {GROUP}; got k={k}")
    wg = w.float().reshape(n, k // GROUP, GROUP)
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    scale = (hi - lo).clamp(min=1e-6) / 15
    q = ((wg - lo) / scale).round().clamp(0, 15).to(torch.int32)
    zero = lo + 8 * scale
    table = torch.cat([scale, zero], dim=-1).transpose(0, 1).contiguous()
    return q.reshape(n, k), table


def dequantize(q: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The float32 ``[n, k]`` matrix that codes ``q`` and ``table`` (as :func:`quantize`)
    stand for."""
    n, k = q.shape
    t = table.float().transpose(0, 1)  # [n, k/GROUP, 2]
    qg = q.reshape(n, k // GROUP, GROUP).float()
    return ((qg - 8) * t[..., :1] + t[..., 1:]).reshape(n, k)


def pack(q: torch.Tensor) -> torch.Tensor:
    """``q`` (int32 ``[n, k]``) in the layout ``_weight_int4pack_mm`` reads on ``q``'s device:
    on CUDA int32 ``[n / 8, k / (16 · INNER_K_TILES), 32, INNER_K_TILES / 2]`` (``n`` a
    multiple of 16, as the CPU twin needs); on the CPU uint8 ``[n, k / 2]``."""
    n, k = q.shape
    if k % (16 * INNER_K_TILES) or n % 16:
        raise ValueError(f"int4 tinygemm needs n % 16 == 0 and k % {16 * INNER_K_TILES} == 0; "
                         f"got [{n}, {k}]")
    if q.device.type == "cuda":
        nibbles = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
        return torch.ops.aten._convert_weight_to_int4pack(nibbles, INNER_K_TILES)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), INNER_K_TILES)


class Int4Linear(nn.Module):
    """``y = x Ŵᵀ + b`` with ``Ŵ`` the int4 g128 coding of a dense weight, through tinygemm.

    ``forward`` takes ``x`` of shape ``[..., k]`` in :attr:`dtype` (bfloat16 on CUDA, the CPU
    op takes float32 too) and returns ``[..., n]`` in the same dtype.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        cuda = weight.device.type == "cuda"
        self.dtype = dtype or (torch.bfloat16 if cuda else torch.float32)
        self.out_features, self.in_features = weight.shape
        q, table = quantize(weight)
        self.register_buffer("packed", pack(q))
        self.register_buffer("table", table.to(self.dtype))
        self.register_buffer("bias", None if bias is None else bias.to(self.dtype))

    @classmethod
    def from_linear(cls, lin: nn.Linear, dtype: torch.dtype | None = None) -> Int4Linear:
        """The int4 coding of ``lin``'s weight and bias."""
        return cls(lin.weight.detach(), None if lin.bias is None else lin.bias.detach(), dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if self.packed.device.type == "cuda":
            y = torch.ops.aten._weight_int4pack_mm(x2, self.packed, GROUP, self.table)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed, GROUP, self.table)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def swap_linears(model: nn.Module, dtype: torch.dtype | None = None) -> int:
    """Replace every ``nn.Linear`` inside ``model`` (in place) by its :class:`Int4Linear`;
    returns how many were replaced."""
    count = 0
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model, name, Int4Linear.from_linear(child, dtype))
            count += 1
        else:
            count += swap_linears(child, dtype)
    return count
