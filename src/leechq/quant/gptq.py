"""Block GPTQ over 24-column groups with shape–gain coding, and the int4 path.

Implements leech-core.md §5.5 exactly (and §5.4, §5.6):

* the weights are rotated ``W' = W Qᵀ`` (Q applied to every row) in f64;
* row scales ``s_i`` are computed once on the full rotated row (tail included) and frozen; the
  coder's per-matrix parameters (gain centroids) are fitted on ``W'`` *before* the loop (pitfall
  P5);
* left → right over 24-column groups Q: every row's block of the group is coded in ONE batched coder
  call (the hot path), ``E = v − q`` against the *compensated* values, ``X = E·U_QQ⁻¹``, ``W'[:, R]
  −= X·U[Q, R]`` for all later columns R (tail included);
* the ``d_in mod 24`` tail columns are never quantized but absorb every correction, then are rounded
  to f32 in the rotated basis (``KeepExact``) so that the file and the evaluated model agree (P13);
* there is no retraction (a no-op for gain-reset coding, and it would cancel any gain code,
  §5.7/P3).

Rows are independent. The update ``E·(U_QQ⁻¹·U[Q, R])`` is written as explicit element-wise f64
multiplies and adds in a fixed order (no BLAS reduction whose order could depend on the number of
rows), so the batched loop and the per-row reference :func:`gptq_quantize_reference` agree bit for
bit.

The int4 path (:func:`quantize_int4`) keeps a matrix as the published ``int4g128`` record in the
natural basis: round-to-nearest of the original tensor (the recipe, layouts-kernels-recipe.md §5.2),
or optionally column-wise GPTQ against the natural-basis Hessian with the group scales frozen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput, UnsupportedShape
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import RotationTables, apply_rotation, apply_rotation_transpose
from leechq.quant.coders import BlockCoder, row_scales


@dataclass
class GPTQResult:
    """One coded matrix.

    Attributes:
        coder: name of the coder that produced it.
        lattice: whether ``labels``/``gains`` are codebook codes (a :class:`QuantizedWeight`).
        weight_rot: float64 [d_out, d_in], the evaluated matrix in the rotated basis (coded blocks
            as reconstructed in exact f64 order, tail rounded to f32).
        labels: int64 [d_out, n_blocks].
        gains: uint8 [d_out, n_blocks].
        row_scales: float64 [d_out].
        centroids: float64 [K].
        rotation: the rotation tables (effective seed), or None.
    """

    coder: str
    lattice: bool
    weight_rot: torch.Tensor
    labels: torch.Tensor
    gains: torch.Tensor
    row_scales: torch.Tensor
    centroids: torch.Tensor
    rotation: RotationTables | None

    @property
    def d_out(self) -> int:
        return int(self.weight_rot.shape[0])

    @property
    def d_in(self) -> int:
        return int(self.weight_rot.shape[1])

    def to_quantized_weight(self) -> QuantizedWeight:
        """The canonical record (only for lattice coders)."""
        if not self.lattice:
            raise InvalidInput(f"coder {self.coder!r} does not produce lattice codes")
        nb = self.d_in // BLOCK
        return QuantizedWeight(
            codebook=self.coder,
            d_out=self.d_out,
            d_in=self.d_in,
            labels=self.labels.cpu(),
            gains=self.gains.cpu(),
            row_scales=self.row_scales.cpu(),
            centroids=self.centroids.cpu(),
            tail=self.weight_rot[:, nb * BLOCK :].to(torch.float32).cpu().contiguous(),
            rotation=self.rotation,
        )

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The natural-basis matrix the pipeline evaluates: un-rotate in f64, narrow to f32 once.

        For a lattice coder this equals ``to_quantized_weight().dequantize()`` bit for bit (P13).
        """
        w = self.weight_rot.cpu()
        if self.rotation is not None:
            w = apply_rotation_transpose(w, self.rotation)
        return w.to(torch.float32).to(dtype)


def _check_weight(weight: torch.Tensor, name: str) -> None:
    if weight.dim() != 2:
        raise InvalidInput(f"{name}: expected a 2-D weight, got shape {list(weight.shape)}")
    if not weight.is_floating_point():
        raise InvalidInput(f"{name}: weight must be floating point, got {weight.dtype}")
    if not bool(torch.isfinite(weight).all()):
        raise InvalidInput(f"{name}: weight has non-finite values")


def _propagate(
    w: torch.Tensor, err: torch.Tensor, u_qq: torch.Tensor, u_qr: torch.Tensor, start: int
) -> None:
    """``W[:, R] −= X·U[Q, R]`` with ``X = E·U_QQ⁻¹``.

    ``M = U_QQ⁻¹·U[Q, R]`` (24 × |R|) is shared by every row; the per-row product ``E·M`` is summed
    over the 24 rows of M in ascending order with element-wise f64 multiplies and adds, so a row's
    result never depends on how many rows are processed together.
    """
    m = torch.linalg.solve_triangular(u_qq, u_qr, upper=True)
    update = err[:, 0:1] * m[0:1, :]
    for j in range(1, err.shape[1]):
        update = update + err[:, j : j + 1] * m[j : j + 1, :]
    w[:, start:] -= update


def _loop(
    w: torch.Tensor,
    u: torch.Tensor | None,
    coder: BlockCoder,
    scales: torch.Tensor,
    centroids: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The §5.5 loop on float64 rows ``w`` [rows, d_in] (modified in place). Returns labels,
    gains."""
    rows, d_in = w.shape
    nb = d_in // BLOCK
    labels = torch.zeros(rows, nb, dtype=torch.int64, device=w.device)
    gains = torch.zeros(rows, nb, dtype=torch.uint8, device=w.device)
    for b in range(nb):
        lo, hi = b * BLOCK, (b + 1) * BLOCK
        v = w[:, lo:hi].clone()
        codes = coder.code(v, scales, centroids)
        labels[:, b] = codes.labels.to(w.device)
        gains[:, b] = codes.gains.to(w.device)
        q = codes.values.to(device=w.device, dtype=torch.float64)
        w[:, lo:hi] = q
        err = v - q
        # An exactly-zero error (identity control, all-zero rows) has nothing to propagate.
        if u is not None and hi < d_in and bool(err.any()):
            _propagate(w, err, u[lo:hi, lo:hi], u[lo:hi, hi:], hi)
    return labels, gains


def _setup(
    weight: torch.Tensor,
    u: torch.Tensor | None,
    coder: BlockCoder,
    rotation: RotationTables | None,
    tail_policy: str,
    name: str,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    _check_weight(weight, name)
    d_in = weight.shape[1]
    if d_in < BLOCK:
        raise UnsupportedShape(f"{name}: d_in={d_in} is smaller than one {BLOCK}-column block")
    if d_in % BLOCK and tail_policy == "refuse":
        raise UnsupportedShape(
            f"{name}: d_in={d_in} is not a multiple of {BLOCK} and tail_policy is 'refuse'"
        )
    if tail_policy not in ("keep_exact", "refuse"):
        raise InvalidInput(f"unknown tail_policy {tail_policy!r}")
    if rotation is not None and rotation.n != d_in:
        raise InvalidInput(f"{name}: rotation width {rotation.n} != d_in {d_in}")
    if u is not None:
        if tuple(u.shape) != (d_in, d_in):
            raise InvalidInput(f"{name}: Hessian factor {list(u.shape)} does not match d_in {d_in}")
        u = u.to(device=weight.device, dtype=torch.float64)
    w = weight.detach().to(torch.float64)
    if rotation is not None:
        w = apply_rotation(w, rotation)  # each row r -> Q r, i.e. W' = W Qᵀ
    w = w.contiguous()
    scales = row_scales(w)
    centroids = coder.fit(w, scales).to(device=w.device, dtype=torch.float64)
    return w, u, scales, centroids


def _finish(
    w: torch.Tensor,
    labels: torch.Tensor,
    gains: torch.Tensor,
    scales: torch.Tensor,
    centroids: torch.Tensor,
    coder: BlockCoder,
    rotation: RotationTables | None,
) -> GPTQResult:
    nb = w.shape[1] // BLOCK
    # KeepExact: the tail is stored as f32 in the rotated basis, so evaluate exactly that (P13).
    w[:, nb * BLOCK :] = w[:, nb * BLOCK :].to(torch.float32).to(torch.float64)
    return GPTQResult(
        coder=coder.name,
        lattice=coder.lattice,
        weight_rot=w,
        labels=labels,
        gains=gains,
        row_scales=scales,
        centroids=centroids.cpu(),
        rotation=rotation,
    )


def gptq_quantize(
    weight: torch.Tensor,
    u: torch.Tensor | None,
    coder: BlockCoder,
    rotation: RotationTables | None = None,
    tail_policy: str = "keep_exact",
    name: str = "weight",
) -> GPTQResult:
    """Code one matrix with block GPTQ (leech-core.md §5.5), all rows at once.

    Args:
        weight: [d_out, d_in] float, natural basis (on the compute device).
        u: float64 [d_in, d_in] upper-triangular factor of the damped, *rotated* inverse Hessian
            (``H'⁻¹ = UᵀU``), or None for plain rounding (no error feedback).
        coder: the block coder (e.g. :class:`leechq.quant.coders.ShapeGainCoder`).
        rotation: the input rotation with its effective seed, or None.
        tail_policy: "keep_exact" or "refuse".
        name: the matrix name used in error messages.

    Returns:
        The coded matrix (:class:`GPTQResult`).
    """
    w, u, scales, centroids = _setup(weight, u, coder, rotation, tail_policy, name)
    labels, gains = _loop(w, u, coder, scales, centroids)
    return _finish(w, labels, gains, scales, centroids, coder, rotation)


def gptq_quantize_reference(
    weight: torch.Tensor,
    u: torch.Tensor | None,
    coder: BlockCoder,
    rotation: RotationTables | None = None,
    tail_policy: str = "keep_exact",
    name: str = "weight",
) -> GPTQResult:
    """Reference twin of :func:`gptq_quantize`: the same loop run serially, one row at a time.

    It must agree with the batched loop bit for bit (rows are independent, §5.5).
    """
    w, u, scales, centroids = _setup(weight, u, coder, rotation, tail_policy, name)
    nb = w.shape[1] // BLOCK
    labels = torch.zeros(w.shape[0], nb, dtype=torch.int64, device=w.device)
    gains = torch.zeros(w.shape[0], nb, dtype=torch.uint8, device=w.device)
    for i in range(w.shape[0]):
        row = w[i : i + 1].clone()
        lab, gai = _loop(row, u, coder, scales[i : i + 1], centroids)
        w[i] = row[0]
        labels[i] = lab[0]
        gains[i] = gai[0]
    return _finish(w, labels, gains, scales, centroids, coder, rotation)


def proxy_loss(delta: torch.Tensor, h: torch.Tensor) -> float:
    """The local GPTQ objective ``Tr(ΔW H ΔWᵀ)`` (float64)."""
    d = delta.to(torch.float64)
    return float(((d @ h.to(torch.float64)) * d).sum())


def _int4_codes(w: torch.Tensor, s32: torch.Tensor, b32: torch.Tensor) -> torch.Tensor:
    """Nearest 4-bit level of f32 values under the exact reconstruction ``f32(s·q) + b``."""
    q = torch.clamp(torch.round((w - b32) / s32), 0, 15)
    cand = torch.stack([torch.clamp(q + d, 0, 15) for d in (-1.0, 0.0, 1.0)])
    err = ((s32 * cand + b32) - w).abs()
    return cand.gather(0, err.argmin(dim=0, keepdim=True))[0]


def quantize_int4(
    weight: torch.Tensor,
    u_natural: torch.Tensor | None = None,
    group: int = 128,
    name: str = "weight",
) -> Int4Weight:
    """An int4 g``group`` record of a natural-basis matrix.

    Args:
        weight: [d_out, d_in] float (d_in even).
        u_natural: None → round-to-nearest of the original tensor (``Int4Weight.quantize``, the
            published recipe); else the float64 upper factor of the damped *natural-basis* inverse
            Hessian, and the codes are chosen column by column with GPTQ error feedback while the
            group scales/offsets stay those of the original tensor.
        group: group size along the row.
        name: used in error messages.
    """
    _check_weight(weight, name)
    base = Int4Weight.quantize(weight.detach().cpu(), group=group)
    if u_natural is None:
        return base
    d_out, d_in = weight.shape
    if tuple(u_natural.shape) != (d_in, d_in):
        raise InvalidInput(
            f"{name}: Hessian factor {list(u_natural.shape)} does not match d_in {d_in}"
        )
    dev = weight.device
    u = u_natural.to(device=dev, dtype=torch.float64)
    col_group = torch.arange(d_in, device=dev) // group
    s32 = base.scales.to(device=dev, dtype=torch.float32)[:, col_group]
    b32 = base.biases.to(device=dev, dtype=torch.float32)[:, col_group]
    w = weight.detach().to(torch.float64).clone()
    codes = torch.empty(d_out, d_in, dtype=torch.uint8, device=dev)
    for j in range(d_in):
        col = w[:, j].to(torch.float32)
        q = _int4_codes(col, s32[:, j], b32[:, j])
        codes[:, j] = q.to(torch.uint8)
        deq = (s32[:, j] * q + b32[:, j]).to(torch.float64)  # f32 multiply, f32 add (no FMA)
        if j + 1 < d_in:
            x = (w[:, j] - deq) / u[j, j]
            w[:, j + 1 :] -= x[:, None] * u[j : j + 1, j + 1 :]
    codes = codes.cpu()
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    return Int4Weight(
        d_out=d_out, d_in=d_in, qweight=packed, scales=base.scales, biases=base.biases, group=group
    )
