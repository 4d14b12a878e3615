"""Canonical, layout-free quantized matrices: lattice-coded (:class:`QuantizedWeight`) and int4.

This is the single representation the quantizer produces, the artifact stores and every served
layout is repacked from (docs/kernels.md). A lattice-coded matrix ``W`` of shape
``d_out × d_in`` holds, in the *rotated* input basis (docs/kernels.md):

* one label (47-bit direction) and one gain index per 24-column block of each row;
* a per-row scale (f64) and the matrix's ascending gain centroids (f64);
* the ``d_in mod 24`` tail columns, unquantized, as f32 (``KeepExact``, docs/kernels.md);
* the rotation tables, or ``None`` when the matrix was coded unrotated.

Dequantization follows docs/kernels.md bit for bit: per block
``picked = c_g·s_i``, ``scale = picked / sqrt(‖y‖²)``, ``w_j = y_j·scale`` in f64 (origin → zeros);
tail widened to f64; un-rotate each f64 row (``Qᵀ``); narrow to f32 once.

:class:`Int4Weight` is the group-affine int4 record of the published Tetra format (docs/kernels.md):
two nibbles per byte (low nibble = even column), f16 scale and bias per group of 128 along the
row, natural basis; ``w = f32(scale)·f32(q) + f32(bias)`` with two f32 roundings and no FMA.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from leechq.codebooks.base import BLOCK
from leechq.codebooks.shape_gain import exact_norms
from leechq.errors import InvalidInput, UnsupportedShape
from leechq.formats.rotation import RotationTables, apply_rotation_transpose


@dataclass
class QuantizedWeight:
    """A lattice-coded matrix in canonical form.

    Attributes:
        codebook: codebook name ("ball" or "tetra"); labels are that codebook's labels.
        d_out: rows (output features).
        d_in: columns (input features); ``n_blocks = d_in // 24`` blocks plus ``d_in % 24`` tail columns.
        labels: int64 [d_out, n_blocks], direction labels.
        gains: uint8 [d_out, n_blocks], gain indices into ``centroids``.
        row_scales: float64 [d_out], per-row scale ``s_i`` (> 0, or 0 for an all-zero row).
        centroids: float64 [n_centroids], ascending gain levels relative to the row scale.
        tail: float32 [d_out, d_in % 24], unquantized tail columns in the rotated basis.
        rotation: the input-side rotation tables (width d_in), or None.
    """

    codebook: str
    d_out: int
    d_in: int
    labels: torch.Tensor
    gains: torch.Tensor
    row_scales: torch.Tensor
    centroids: torch.Tensor
    tail: torch.Tensor
    rotation: RotationTables | None = None

    def __post_init__(self) -> None:
        self.validate()

    @property
    def n_blocks(self) -> int:
        """Full 24-column blocks per row."""
        return self.d_in // BLOCK

    @property
    def tail_cols(self) -> int:
        """Unquantized tail columns per row."""
        return self.d_in % BLOCK

    @property
    def gain_bits(self) -> int:
        """log2 of the number of centroids (0, 1 or 2)."""
        return int(math.log2(self.centroids.numel()))

    def validate(self) -> None:
        """Check shapes, dtypes and value ranges; raise :class:`InvalidInput` naming the field."""
        if self.d_in < BLOCK:
            raise UnsupportedShape(f"d_in={self.d_in} is smaller than one {BLOCK}-column block")
        expect = {
            "labels": ((self.d_out, self.n_blocks), torch.int64),
            "gains": ((self.d_out, self.n_blocks), torch.uint8),
            "row_scales": ((self.d_out,), torch.float64),
            "tail": ((self.d_out, self.tail_cols), torch.float32),
        }
        for name, (shape, dtype) in expect.items():
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor):
                raise InvalidInput(f"QuantizedWeight.{name} must be a torch.Tensor, got {type(t)}")
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise InvalidInput(
                    f"QuantizedWeight.{name}: expected {dtype} {list(shape)}, got {t.dtype} {list(t.shape)}"
                )
        n_c = self.centroids.numel()
        if self.centroids.dtype != torch.float64 or self.centroids.dim() != 1 or n_c not in (1, 2, 4):
            raise InvalidInput(
                f"QuantizedWeight.centroids must be float64 [1|2|4], got {self.centroids.dtype} "
                f"{list(self.centroids.shape)}"
            )
        if n_c > 1 and not bool(torch.all(self.centroids[1:] >= self.centroids[:-1])):
            raise InvalidInput("QuantizedWeight.centroids must be ascending")
        if self.gains.numel() and int(self.gains.max()) >= n_c:
            raise InvalidInput(f"QuantizedWeight.gains index {int(self.gains.max())} >= {n_c} centroids")
        if not bool(torch.isfinite(self.row_scales).all()) or bool((self.row_scales < 0).any()):
            raise InvalidInput("QuantizedWeight.row_scales must be finite and non-negative")
        if not bool(torch.isfinite(self.tail).all()):
            raise InvalidInput("QuantizedWeight.tail has non-finite values")
        if self.rotation is not None and self.rotation.n != self.d_in:
            raise InvalidInput(f"rotation width {self.rotation.n} != d_in {self.d_in}")

    def points(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Decoded lattice points: int32 [d_out, n_blocks, 24] (natural order within a block), on
        ``device`` (default: the labels'; a codebook whose decoder runs on the host decodes there
        and the points move)."""
        from leechq.codebooks import get

        labels = self.labels if device is None else self.labels.to(device)
        points = get(self.codebook).decode(labels)
        return points if device is None else points.to(device)

    def dequantize_rotated(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The matrix in the rotated basis: float64 [d_out, d_in], blocks then tail (exact f64
        order), computed on ``device`` (default: the record's). Every operation is an IEEE
        float64 multiply, divide or add of two operands or a correctly rounded square root, so
        the bits do not depend on the device."""
        points = self.points(device)
        dev = points.device
        # Correctly rounded sqrt(‖y‖²): torch's vectorized CPU f64 sqrt is one ulp low for some
        # shells (e.g. 32, 128, 304), which would break bit-exactness with other readers.
        norms = exact_norms(points.reshape(-1, BLOCK)).reshape(self.d_out, self.n_blocks)
        return rotated_rows(points, self.gains.to(dev), norms, self.row_scales.to(dev),
                            self.centroids.to(dev), self.tail.to(dev))

    def dequantize(self, dtype: torch.dtype = torch.float32,
                   device: torch.device | str | None = None) -> torch.Tensor:
        """The dense matrix in the natural basis: [d_out, d_in] of ``dtype`` on ``device``
        (default: the record's).

        Computed as in docs/kernels.md: f64 blocks and tail, f64 un-rotation, one narrowing to
        f32, then a cast to ``dtype``; the same bits on every device
        (:meth:`dequantize_rotated`).
        """
        w = self.dequantize_rotated(device)
        if self.rotation is not None:
            w = apply_rotation_transpose(w, self.rotation)
        return w.to(torch.float32).to(dtype)

    def payload_bits(self) -> dict[str, int]:
        """Stored bits by field (labels at the codebook's label bits, gains, f64 scales/centroids,
        f32 tail)."""
        from leechq.codebooks import get

        n = self.d_out * self.n_blocks
        return {
            "labels": n * get(self.codebook).label_bits,
            "gains": n * self.gain_bits,
            "row_scales": 64 * self.d_out,
            "centroids": 64 * self.centroids.numel(),
            "tail": 32 * self.d_out * self.tail_cols,
        }


@dataclass
class Int4Weight:
    """A group-affine int4 matrix (the published ``int4g128`` record).

    Attributes:
        d_out, d_in: shape (``d_in`` even).
        qweight: uint8 [d_out, d_in // 2]; byte ``b`` holds column ``2b`` in its low nibble.
        scales: float16 [d_out, ceil(d_in / group)].
        biases: float16 [d_out, ceil(d_in / group)].
        group: columns per group (128 for matrices; the last group of a row may be short).
    """

    d_out: int
    d_in: int
    qweight: torch.Tensor
    scales: torch.Tensor
    biases: torch.Tensor
    group: int = 128

    def __post_init__(self) -> None:
        if self.d_in % 2:
            raise UnsupportedShape(f"int4 needs an even row length, got d_in={self.d_in}")
        groups = -(-self.d_in // self.group)
        for name, shape, dtype in (
            ("qweight", (self.d_out, self.d_in // 2), torch.uint8),
            ("scales", (self.d_out, groups), torch.float16),
            ("biases", (self.d_out, groups), torch.float16),
        ):
            t = getattr(self, name)
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise InvalidInput(
                    f"Int4Weight.{name}: expected {dtype} {list(shape)}, got {t.dtype} {list(t.shape)}"
                )

    def codes(self) -> torch.Tensor:
        """The 4-bit codes: uint8 [d_out, d_in] in 0..15."""
        lo = self.qweight & 0x0F
        hi = self.qweight >> 4
        return torch.stack((lo, hi), dim=-1).reshape(self.d_out, self.d_in)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``f32(scale)·f32(q) + f32(bias)`` per element (two f32 roundings), then cast: [d_out, d_in]."""
        col_group = torch.arange(self.d_in) // self.group
        scale = self.scales.to(torch.float32)[:, col_group]
        bias = self.biases.to(torch.float32)[:, col_group]
        prod = scale * self.codes().to(torch.float32)  # rounded to f32 before the add: no FMA
        return (prod + bias).to(dtype)

    @classmethod
    def quantize(cls, weight: torch.Tensor, group: int = 128) -> Int4Weight:
        """Round-to-nearest asymmetric int4 of a float matrix [d_out, d_in] (min/max per group).

        The f16 scale and bias are chosen first, then each code is the nearest level under the exact
        f32 reconstruction rule, so the stored codes are optimal for the stored scale/bias.
        """
        if weight.dim() != 2:
            raise InvalidInput(f"int4 quantization needs a 2-D weight, got shape {list(weight.shape)}")
        if not bool(torch.isfinite(weight).all()):
            raise InvalidInput("int4 quantization: weight has non-finite values")
        d_out, d_in = weight.shape
        if d_in % 2:
            raise UnsupportedShape(f"int4 needs an even row length, got d_in={d_in}")
        groups = -(-d_in // group)
        pad = groups * group - d_in
        w = weight.to(torch.float32)
        padded = torch.nn.functional.pad(w, (0, pad), value=float("nan")).reshape(d_out, groups, group)
        lo = torch.nan_to_num(padded, nan=float("inf")).amin(dim=-1)
        hi = torch.nan_to_num(padded, nan=float("-inf")).amax(dim=-1)
        scales = ((hi - lo) / 15.0).to(torch.float16)
        scales = torch.where(scales == 0, torch.ones_like(scales), scales)
        biases = lo.to(torch.float16)
        col_group = torch.arange(d_in) // group
        s32 = scales.to(torch.float32)[:, col_group]
        b32 = biases.to(torch.float32)[:, col_group]
        q = torch.clamp(torch.round((w - b32) / s32), 0, 15)
        # Nearest level under the exact reconstruction (guards f16 rounding of scale/bias): of
        # q - 1, q, q + 1 the one of least error, the lowest code on a tie (elementwise: an argmin
        # over a stack of the three is several times slower on the CPU)
        down, up = torch.clamp(q - 1, 0, 15), torch.clamp(q + 1, 0, 15)
        err_q, err_up = ((s32 * q + b32) - w).abs(), ((s32 * up + b32) - w).abs()
        best = torch.where(err_q <= err_up, q, up)
        q = torch.where(((s32 * down + b32) - w).abs() <= torch.minimum(err_q, err_up), down,
                        best).to(torch.uint8)
        packed = (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()
        return cls(d_out=d_out, d_in=d_in, qweight=packed, scales=scales, biases=biases, group=group)

    def payload_bits(self) -> dict[str, int]:
        """Stored bits by field."""
        return {
            "qweight": 8 * self.qweight.numel(),
            "scales": 16 * self.scales.numel(),
            "biases": 16 * self.biases.numel(),
        }


def rotated_rows(points: torch.Tensor, gains: torch.Tensor, norms: torch.Tensor,
                 row_scales: torch.Tensor, centroids: torch.Tensor,
                 tail: torch.Tensor) -> torch.Tensor:
    """Rows of a lattice record in the rotated basis, in the exact float64 order of
    docs/kernels.md: per block ``picked = c_g · s_i``, ``scale = picked / ‖y‖`` (0 for the
    origin), ``w = y · scale``; then the tail widened. Any rows of a record (all of them, or a
    lookup's), on any device.

    Args:
        points: int or float [R, n_blocks, 24]; gains: int [R, n_blocks]; norms: float64
            [R, n_blocks], the correctly rounded ``‖y‖``; row_scales: float64 [R]; centroids:
            float64 [n_centroids]; tail: float32 [R, tail_cols].

    Returns:
        float64 [R, 24·n_blocks + tail_cols].
    """
    rows, nb = gains.shape
    picked = centroids[gains.long()] * row_scales[:, None]
    safe = torch.where(norms > 0, norms, torch.ones_like(norms))
    scale = torch.where(norms > 0, picked / safe, torch.zeros_like(picked))
    blocks = points.to(torch.float64) * scale[..., None]
    out = torch.empty(rows, nb * BLOCK + tail.shape[1], dtype=torch.float64,
                      device=points.device)
    out[:, : nb * BLOCK] = blocks.reshape(rows, -1)
    out[:, nb * BLOCK :] = tail.to(torch.float64)
    return out


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A contiguous CPU numpy view/copy of a tensor (helper for writers)."""
    return t.detach().cpu().contiguous().numpy()
