"""Host wrappers of the activation rotations (``Q x`` row by row, the Hadamard/incoherence
rotation of the lattice layers' inputs): validate, allocate, launch the rotation kernels of
:mod:`.activation` (same signatures as the twins in ``leechq.kernels.reference``).

Owns :class:`DeviceRotation` (a rotation's tables on a device), :func:`rotate` and the fused
pre-op forms :func:`norm_rotate` (residual add + RMSNorm) and :func:`silu_mul_rotate` (SwiGLU),
each writing natural order, the prepared layout of the lattice kernels (one launch; optionally
with the int8 kernel's activation records) or the float16 column order of the dense copies.
The checks and errors are those of :mod:`.ops` (:class:`leechq.errors.InvalidInput` naming the
tensor; CPU tensors only under ``TRITON_INTERPRET=1``); the prepared buffers, the two-launch
preparation and the PDL launch rule come from there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton

from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput, UnsupportedShape
from leechq.kernels import reference as ref
from leechq.kernels.triton import ops_common as _c
from leechq.kernels.triton.activation import (
    PRE_ADD_NORM,
    PRE_NORM,
    PRE_SILU_MUL,
    rotate_kernel,
    rotate_prepared_kernel,
)
from leechq.kernels.triton.ops import _pdl_launch, _prepared_out, pdl_enabled, prepare_activation
from leechq.kernels.triton.ops_common import check_tensor, interpreting
from leechq.kernels.triton.ops_imma import _check_acts, _check_imma_rows, imma_chunks
from leechq.kernels.tuning import PDL_MAX_ROWS, ROTATE_SPLITS

if TYPE_CHECKING:
    from leechq.formats.rotation import RotationTables


@dataclass(frozen=True)
class DeviceRotation:
    """A rotation's tables on a device: signs float32 [n], small float32 [k, k], 1/√m."""

    n: int
    pow2: int
    odd: int
    signs: torch.Tensor
    small: torch.Tensor
    inv_sqrt_m: float

    @classmethod
    def from_tables(cls, tables: RotationTables, device: torch.device | str) -> DeviceRotation:
        return cls(
            n=tables.n,
            pow2=tables.pow2,
            odd=tables.odd,
            signs=torch.as_tensor(tables.signs, dtype=torch.float32, device=device).contiguous(),
            small=torch.as_tensor(tables.small, dtype=torch.float32, device=device).contiguous(),
            inv_sqrt_m=float(1.0 / math.sqrt(tables.pow2)),
        )


_PAIR_SPAN: dict[tuple[int, int, int], int] = {}


def _group_pair_span(k: int, m: int, npp: int) -> int:
    """The most pairs of the prepared layout that one rotation group's program must cover: from the
    pair of the group's first column to that of its last (the last group: to ``NPP``, so that it
    also writes the padding pairs). Computed once per shape (it runs on every rotation call)."""
    key = (k, m, npp)
    if key not in _PAIR_SPAN:
        span = 0
        for g in range(k):
            first = (g * m // BLOCK) // 2
            stop = npp if g == k - 1 else (((g + 1) * m - 1) // BLOCK) // 2 + 1
            span = max(span, stop - first)
        _PAIR_SPAN[key] = span
    return _PAIR_SPAN[key]


_HALF_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
"""The kernels' ``HDT`` code of the dtype a pre-op's output is narrowed to."""


@dataclass(frozen=True)
class _PreOp:
    """What the rotation kernels compute before rotating (``activation.PRE_*``): the code, the
    ``aux`` (residual delta) and weight tensors, the residual output, ``eps``, the ``HDT`` code."""

    code: int = 0  # PRE_NONE
    aux: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    eps: float = 0.0
    hdt: int = 0


def rotate_splits(requested: int | None = None) -> int:
    """The ``SPLITS`` a prepared rotation runs with: ``requested``, else :data:`ROTATE_SPLITS`
    (1 under the interpreter); a power of two ≥ 1."""
    n = requested if requested is not None else (1 if interpreting() else ROTATE_SPLITS)
    if n < 1 or n & (n - 1):
        raise InvalidInput(f"rotation splits must be a power of two ≥ 1, got {n}")
    return n


def rotate(x: torch.Tensor, rotation: DeviceRotation | RotationTables, *,
           prepared_order: torch.Tensor | None = None, out: torch.Tensor | None = None,
           tensor_cores: bool = False, one_launch: bool = True,
           splits: int | None = None,
           records: tuple[torch.Tensor, torch.Tensor] | None = None,
           dense_order: torch.Tensor | None = None) -> torch.Tensor:
    """``Q x`` row by row (twin of ``reference.rotate``); one program per (row, group).

    x: [M, n] float32/float16/bfloat16. Returns float32 [M, n] (natural order) or, with
    ``prepared_order`` (int32 [24]), the prepared layout of the lattice kernels, float32
    [MP, 48·NPP + 32]: by default in one launch (``activation.rotate_prepared_kernel``: each
    program gathers its group's slots from registers); ``one_launch=False`` keeps the earlier two
    launches (natural order to a scratch row, then the preparation kernel) for comparison.
    ``tensor_cores`` selects the tensor-core transform for groups of 256..4096 (opt-in: slower
    than the butterflies on most H200 widths). ``splits``: programs per (row, group) of the
    prepared write (:func:`rotate_splits`). ``records``: buffers of :func:`imma_records` the same
    launch fills with the int8 tensor-core kernel's activation records (the prepared one-launch
    form of a one-group rotation, ≤ 8 rows; bit for bit :func:`imma_activation`'s words).
    ``dense_order`` (int32 [n], a permutation; not with ``prepared_order``): float16 [M, n] with
    coordinate ``c`` at column ``dense_order[c]`` — the activation of the many-row products in
    the column order of the float16 copies (:func:`dense_input_order`), in the same launch.
    """
    if not isinstance(rotation, DeviceRotation):
        rotation = DeviceRotation.from_tables(rotation, x.device)
    check_tensor(x, "x", (torch.float32, torch.float16, torch.bfloat16))
    if x.dim() != 2 or x.shape[1] != rotation.n:
        raise InvalidInput(f"x must be [M, {rotation.n}] for this rotation, got {list(x.shape)}")
    return _rotate(x, rotation, _PreOp(), prepared_order, out, tensor_cores, one_launch, splits,
                   records, dense_order)


def norm_rotate(x: torch.Tensor, weight: torch.Tensor, eps: float,
                rotation: DeviceRotation | RotationTables, *, delta: torch.Tensor | None = None,
                prepared_order: torch.Tensor | None = None, out: torch.Tensor | None = None,
                tensor_cores: bool = False, splits: int | None = None,
                records: tuple[torch.Tensor, torch.Tensor] | None = None,
                dense_order: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm (after the residual add) and the input rotation in one launch: twin of
    ``reference.norm_rotate``.

    x: the residual stream [M, n] float32/float16/bfloat16; delta: None or [M, n] (any float dtype;
    narrowed to x's dtype before the add); weight: the norm weight [n] (float32 or x's dtype); eps.
    Returns ``(r, y)``: ``r = x + delta`` in x's dtype (``x`` itself without ``delta``; a new
    tensor, written by the same launch) and ``y = Q·rms_norm(r)`` with the HF rounding of
    ``reference.rms_norm`` — float32 [M, n] in natural order, or with ``prepared_order`` the
    prepared layout (see :func:`rotate`). The row's mean square is summed in f32 in the kernel's
    order, so ``y`` can differ from the reference by one rounding of the narrowed norm.
    ``records`` and ``dense_order`` as for :func:`rotate`.
    """
    if not isinstance(rotation, DeviceRotation):
        rotation = DeviceRotation.from_tables(rotation, x.device)
    n = rotation.n
    check_tensor(x, "x", (torch.float32, torch.float16, torch.bfloat16))
    if x.dim() != 2 or x.shape[1] != n:
        raise InvalidInput(f"x must be [M, {n}] for this rotation, got {list(x.shape)}")
    check_tensor(weight, "weight", (torch.float32, x.dtype), (n,), device=x.device)
    if delta is not None:
        check_tensor(delta, "delta", (torch.float32, torch.float16, torch.bfloat16),
                     tuple(x.shape), device=x.device)
    if not math.isfinite(eps) or eps < 0:
        raise InvalidInput(f"eps must be finite and ≥ 0, got {eps}")
    r = x if delta is None else torch.empty_like(x)
    pre = _PreOp(code=(PRE_NORM if delta is None else PRE_ADD_NORM).value, aux=delta,
                 weight=weight, residual=r, eps=float(eps),
                 hdt=_HALF_CODES[torch.promote_types(x.dtype, weight.dtype)])
    return r, _rotate(x, rotation, pre, prepared_order, out, tensor_cores, True, splits, records,
                      dense_order)


def silu_mul_rotate(gate_up: torch.Tensor, dtype: torch.dtype,
                    rotation: DeviceRotation | RotationTables, *,
                    prepared_order: torch.Tensor | None = None, out: torch.Tensor | None = None,
                    tensor_cores: bool = False, splits: int | None = None,
                    records: tuple[torch.Tensor, torch.Tensor] | None = None,
                    dense_order: torch.Tensor | None = None) -> torch.Tensor:
    """SwiGLU and the input rotation of the down projection in one launch: twin of
    ``reference.silu_mul_rotate``.

    gate_up: [M, 2n] float32/float16/bfloat16 (gate columns first); dtype: the activation dtype
    ``silu(gate)·up`` (computed in gate_up's dtype) is narrowed to. Returns ``Q·silu_mul`` as
    :func:`rotate` does (natural order, or the prepared layout with ``prepared_order``;
    ``records`` and ``dense_order`` as there).
    """
    if not isinstance(rotation, DeviceRotation):
        rotation = DeviceRotation.from_tables(rotation, gate_up.device)
    n = rotation.n
    check_tensor(gate_up, "gate_up", (torch.float32, torch.float16, torch.bfloat16))
    if gate_up.dim() != 2 or gate_up.shape[1] != 2 * n:
        raise InvalidInput(f"gate_up must be [M, {2 * n}] for this rotation, "
                           f"got {list(gate_up.shape)}")
    if dtype not in _HALF_CODES:
        raise InvalidInput(f"dtype must be float32, float16 or bfloat16, got {dtype}")
    pre = _PreOp(code=PRE_SILU_MUL.value, hdt=_HALF_CODES[dtype])
    return _rotate(gate_up, rotation, pre, prepared_order, out, tensor_cores, True, splits,
                   records, dense_order)


def _rotate(x: torch.Tensor, rotation: DeviceRotation, pre: _PreOp,
            prepared_order: torch.Tensor | None, out: torch.Tensor | None, tensor_cores: bool,
            one_launch: bool, splits: int | None = None,
            records: tuple[torch.Tensor, torch.Tensor] | None = None,
            dense_order: torch.Tensor | None = None) -> torch.Tensor:
    """Launch the rotation of ``x``'s rows (or of their pre-op) after the entry points' checks."""
    n = rotation.n
    check_tensor(rotation.signs, "rotation.signs", torch.float32, (n,), device=x.device)
    m_rows = int(x.shape[0])
    k, m = rotation.odd, rotation.pow2
    if k > 64:
        raise UnsupportedShape(f"rotation with an odd factor k={k} > 64")
    warps = 8 if m >= 2048 else 4
    # PDL for one row, which goes on to the m1 kernel (PDL_MAX_ROWS)
    rotate_pdl = m_rows <= PDL_MAX_ROWS and pdl_enabled(x.device)
    aux = pre.aux if pre.aux is not None else x
    res = pre.residual if pre.residual is not None else x
    pre_args = (aux, aux.stride(0), pre.weight if pre.weight is not None else x, res,
                res.stride(0), pre.eps)
    if records is not None and (prepared_order is None or not one_launch):
        raise InvalidInput("activation records come only with the one-launch prepared rotation")
    if dense_order is not None:
        if prepared_order is not None:
            raise InvalidInput("dense_order and prepared_order are two output layouts: give one")
        check_tensor(dense_order, "dense_order", torch.int32, (n,), device=x.device)
    if prepared_order is not None and one_launch:
        check_tensor(prepared_order, "prepared_order", torch.int32, (BLOCK,), device=x.device)
        n_blocks = n // BLOCK
        out = _prepared_out(out, m_rows, n_blocks, x.device)
        npp = ref.prepared_pairs(n_blocks)
        pr = triton.next_power_of_2(_group_pair_span(k, m, npp))
        parts = min(rotate_splits(splits), pr, m)
        rec, ex = (out, out) if records is None else _check_records(records, k, m_rows, npp,
                                                                     x.device)
        if m_rows:
            rotate_prepared_kernel[(out.shape[0], k, parts)](
                x, x.stride(0), rotation.signs, rotation.small, out, out.stride(0),
                prepared_order, rotation.inv_sqrt_m, m_rows, *pre_args, rec, ex,
                N=n, N_BLOCKS=n_blocks, NPP=npp, PR=pr, K=k, MW=m, LOG2M=int(math.log2(m)),
                TC=bool(tensor_cores), PRE=pre.code, HDT=pre.hdt, SPLITS=parts,
                RECORDS=records is not None, A16=_c.A16,
                num_warps=warps,
                **_pdl_launch(rotate_pdl),
            )
        return out
    if prepared_order is None:
        dt = torch.float32 if dense_order is None else torch.float16
        nat = out if out is not None else torch.empty((m_rows, n), dtype=dt, device=x.device)
        check_tensor(nat, "out", dt, (m_rows, n), device=x.device)
    else:
        nat = torch.empty((m_rows, n), dtype=torch.float32, device=x.device)
    if m_rows:
        rotate_kernel[(m_rows, k)](
            x, x.stride(0), rotation.signs, rotation.small, nat, nat.stride(0),
            rotation.inv_sqrt_m, *pre_args, nat if dense_order is None else dense_order,
            K=k, MW=m, LOG2M=int(math.log2(m)), TC=bool(tensor_cores), PRE=pre.code,
            HDT=pre.hdt, DEST=dense_order is not None, num_warps=warps,
            **_pdl_launch(rotate_pdl),
        )
    if prepared_order is None:
        return nat
    return prepare_activation(nat, n // BLOCK, prepared_order, out=out)


def _check_records(records: tuple[torch.Tensor, torch.Tensor], k: int, m_rows: int, npp: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``records`` buffers of a rotation (see :func:`rotate`), checked: one group, ≤ 16 rows,
    the shapes of :func:`imma_records` for ``m_rows``."""
    if k != 1:
        raise UnsupportedShape(f"activation records from the rotation need one group (a "
                               f"power-of-two width), not {k}")
    _check_imma_rows(m_rows)
    return _check_acts(records, npp, device, imma_chunks(m_rows))
