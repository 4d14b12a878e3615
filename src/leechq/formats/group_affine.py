"""Group-affine 4/8-bit tensors (the embedding / head tables of an artifact,
docs/format.md §3): quantization, code unpacking and the exact dequantization."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from leechq.errors import InvalidInput
from leechq.formats.quantized_weight import Int4Weight


@dataclass
class GroupAffine:
    """A group-affine 4- or 8-bit tensor along its last dimension (docs/format.md §3).

    ``w = f32(scale)·f32(q) + f32(bias)`` (two f32 roundings). 4 bits: two codes a byte, low nibble
    first; 8 bits: one code a byte.

    Attributes:
        dims: the dense shape.
        bits: 4 or 8.
        group: group size along the last dimension.
        qweight: uint8 [rows, cols/2] (4 bits) or [rows, cols] (8 bits), rows = prod(dims[:-1]).
        scales, biases: float16 [rows, ceil(cols/group)].
    """

    dims: tuple[int, ...]
    bits: int
    group: int
    qweight: torch.Tensor
    scales: torch.Tensor
    biases: torch.Tensor

    @property
    def rows(self) -> int:
        return int(math.prod(self.dims[:-1]))

    @property
    def cols(self) -> int:
        return int(self.dims[-1])

    @classmethod
    def quantize(cls, weight: torch.Tensor, bits: int, group: int) -> GroupAffine:
        """Min/max round-to-nearest group-affine quantization of a float tensor."""
        if bits not in (4, 8):
            raise InvalidInput(f"group-affine bits must be 4 or 8, got {bits}")
        if weight.dim() < 1 or not bool(torch.isfinite(weight).all()):
            raise InvalidInput("group-affine quantization needs a finite tensor")
        dims = tuple(int(d) for d in weight.shape)
        w2 = weight.detach().reshape(-1, dims[-1]).to(torch.float32).cpu()
        if bits == 4:
            rec = Int4Weight.quantize(w2, group=group)
            return cls(dims, 4, group, rec.qweight, rec.scales, rec.biases)
        rows, cols = w2.shape
        groups = -(-cols // group)
        pad = groups * group - cols
        padded = torch.nn.functional.pad(w2, (0, pad), value=float("nan")).reshape(
            rows, groups, group
        )
        lo = torch.nan_to_num(padded, nan=float("inf")).amin(dim=-1)
        hi = torch.nan_to_num(padded, nan=float("-inf")).amax(dim=-1)
        scales = ((hi - lo) / 255.0).to(torch.float16)
        scales = torch.where(scales == 0, torch.ones_like(scales), scales)
        biases = lo.to(torch.float16)
        col_group = torch.arange(cols) // group
        s32 = scales.to(torch.float32)[:, col_group]
        b32 = biases.to(torch.float32)[:, col_group]
        q = torch.clamp(torch.round((w2 - b32) / s32), 0, 255)
        cand = torch.stack([torch.clamp(q + d, 0, 255) for d in (-1.0, 0.0, 1.0)])
        err = ((s32 * cand + b32) - w2).abs()
        q = cand.gather(0, err.argmin(dim=0, keepdim=True))[0].to(torch.uint8)
        return cls(dims, 8, group, q.contiguous(), scales, biases)

    def codes(self) -> torch.Tensor:
        """uint8 [rows, cols]."""
        if self.bits == 8:
            return self.qweight
        lo = self.qweight & 0x0F
        hi = self.qweight >> 4
        return torch.stack((lo, hi), dim=-1).reshape(self.rows, self.cols)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        col_group = torch.arange(self.cols) // self.group
        scale = self.scales.to(torch.float32)[:, col_group]
        bias = self.biases.to(torch.float32)[:, col_group]
        prod = scale * self.codes().to(torch.float32)
        return (prod + bias).reshape(self.dims).to(dtype)
