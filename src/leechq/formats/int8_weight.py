"""Group-affine 8-bit rows: the head / embedding tables of the served model.

Implements docs/format.md §3 at 8 bits (the published "quant" raw format, MLX's
group-affine scheme): along each row, groups of ``group`` (64) columns share one f16 scale and one f16
bias; a code ``q`` ∈ 0..255 (one byte per weight, row-major) reconstructs as
``f32(scale)·f32(q) + f32(bias)`` — a multiply rounded to f32, then an add rounded to f32 (no FMA), so
every reader reproduces the same bits. 4-bit tables use :class:`leechq.formats.quantized_weight.
Int4Weight` with ``group=64`` (low nibble = even column), the same rule with qmax = 15.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from leechq.errors import InvalidInput

QMAX = 255


@dataclass
class Int8Weight:
    """A group-affine 8-bit matrix.

    Attributes:
        d_out, d_in: shape.
        qweight: uint8 [d_out, d_in], one code per weight.
        scales: float16 [d_out, ceil(d_in / group)].
        biases: float16 [d_out, ceil(d_in / group)].
        group: columns per group (64 for head/embedding tables; the last group may be short).
    """

    d_out: int
    d_in: int
    qweight: torch.Tensor
    scales: torch.Tensor
    biases: torch.Tensor
    group: int = 64

    def __post_init__(self) -> None:
        if self.group <= 0:
            raise InvalidInput(f"Int8Weight.group must be positive, got {self.group}")
        groups = -(-self.d_in // self.group)
        for name, shape, dtype in (
            ("qweight", (self.d_out, self.d_in), torch.uint8),
            ("scales", (self.d_out, groups), torch.float16),
            ("biases", (self.d_out, groups), torch.float16),
        ):
            t = getattr(self, name)
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise InvalidInput(
                    f"Int8Weight.{name}: expected {dtype} {list(shape)}, got {t.dtype} {list(t.shape)}"
                )

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``f32(scale)·f32(q) + f32(bias)`` per element (two f32 roundings), then cast."""
        col_group = torch.arange(self.d_in, device=self.qweight.device) // self.group
        scale = self.scales.to(torch.float32)[:, col_group]
        bias = self.biases.to(torch.float32)[:, col_group]
        prod = scale * self.qweight.to(torch.float32)
        return (prod + bias).to(dtype)

    def to(self, device: torch.device | str) -> Int8Weight:
        return Int8Weight(
            self.d_out, self.d_in, self.qweight.to(device), self.scales.to(device),
            self.biases.to(device), self.group,
        )

    @classmethod
    def quantize(cls, weight: torch.Tensor, group: int = 64) -> Int8Weight:
        """Round-to-nearest asymmetric 8-bit of a float matrix [d_out, d_in] (min/max per group).

        The f16 scale and bias are fixed first; each code is then the nearest level under the exact
        f32 reconstruction rule.
        """
        if weight.dim() != 2:
            raise InvalidInput(f"int8 quantization needs a 2-D weight, got shape {list(weight.shape)}")
        if not bool(torch.isfinite(weight).all()):
            raise InvalidInput("int8 quantization: weight has non-finite values")
        d_out, d_in = weight.shape
        groups = -(-d_in // group)
        pad = groups * group - d_in
        w = weight.to(torch.float32)
        padded = torch.nn.functional.pad(w, (0, pad), value=float("nan")).reshape(d_out, groups, group)
        lo = torch.nan_to_num(padded, nan=float("inf")).amin(dim=-1)
        hi = torch.nan_to_num(padded, nan=float("-inf")).amax(dim=-1)
        scales = ((hi - lo) / QMAX).to(torch.float16)
        scales = torch.where(scales == 0, torch.ones_like(scales), scales)
        biases = lo.to(torch.float16)
        col_group = torch.arange(d_in, device=w.device) // group
        s32 = scales.to(torch.float32)[:, col_group]
        b32 = biases.to(torch.float32)[:, col_group]
        q = torch.clamp(torch.round((w - b32) / s32), 0, QMAX)
        cand = torch.stack([torch.clamp(q + d, 0, QMAX) for d in (-1.0, 0.0, 1.0)])
        err = ((s32 * cand + b32) - w).abs()
        q = cand.gather(0, err.argmin(dim=0, keepdim=True))[0].to(torch.uint8)
        return cls(d_out=d_out, d_in=d_in, qweight=q.contiguous(), scales=scales, biases=biases,
                   group=group)

    def payload_bits(self) -> dict[str, int]:
        """Stored bits by field (8.5 b/w at group 64)."""
        return {
            "qweight": 8 * self.qweight.numel(),
            "scales": 16 * self.scales.numel(),
            "biases": 16 * self.biases.numel(),
        }
