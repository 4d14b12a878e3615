"""The many-row path: float16 copies of the lattice records with σ_row folded in and the tail
columns in place (:func:`dense_copy`: :mod:`.tetra48_dequant`, :mod:`.planes14_dequant`), one for
all parts of a serving group, and one cuBLAS GEMM with float32 output — no epilogue, no
concatenation; the column maps between the copies' layout and the natural order. Twins:
``reference.tetra48_dequantize_f16``, ``reference.planes14_dequantize_f16`` (bit for bit, with or
without σ_row), ``reference.folded_dense_f16``."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton

from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput
from leechq.kernels import reference as ref
from leechq.kernels.tables import planes14_m1_table, tetra_kernel_tables, tetra_m1_table
from leechq.kernels.triton.ops_common import (
    _check_lattice,
    _check_x,
    _checked_once,
    _sm_count,
    _use_asm,
    check_tensor,
    interpreting,
)
from leechq.kernels.triton.planes14_dequant import planes14_dequant_kernel
from leechq.kernels.triton.tetra48_dequant import tetra48_dequant_kernel

if TYPE_CHECKING:
    from leechq.formats.layouts.planes14 import Planes14Weight
    from leechq.formats.layouts.tetra48 import Tetra48Weight

    _Record = Tetra48Weight | Planes14Weight


@dataclass(frozen=True)
class DequantConfig:
    """Geometry and store form of the dequantization kernels (:mod:`.tetra48_dequant`,
    :mod:`.planes14_dequant`).

    ``grouped``: the column layout of ``reference.dequant_group_columns`` (a warp's lanes store
    consecutive 16-byte units) instead of block-major (each lane's 96 bytes apart from the next
    lane's). ``vector_stores``: one ``st.global.v4`` per 8 values instead of four 4-byte stores.
    ``programs_per_sm``: grid of the grid-stride loop (each program stages the decode table once;
    at most 7 tables fit in an SM's shared memory)."""

    grouped: bool = False
    vector_stores: bool = False
    num_warps: int = 4
    programs_per_sm: int = 8


DEQUANT_DEFAULT = DequantConfig(grouped=True, vector_stores=True, num_warps=8, programs_per_sm=4)
"""The dequantization form used when none is given: the grouped layout with 16-byte stores, 8
warps, 4 programs per SM (tuning in docs/decisions.md)."""


def dequant_config() -> DequantConfig:
    """:data:`DEQUANT_DEFAULT` (read at call time, so that a test may replace it)."""
    return DEQUANT_DEFAULT


def tetra48_dequantize_f16(w: Tetra48Weight, out: torch.Tensor | None = None,
                           config: DequantConfig | None = None) -> torch.Tensor:
    """The record's coded blocks as float16 ``[d_out, 24·n_blocks]`` without σ_row, columns as
    :func:`dequant_natural_index` maps them (twin of ``reference.tetra48_dequantize_f16`` with the
    same ``grouped``; :mod:`.tetra48_dequant`). ``config``: :func:`dequant_config` if None.
    The ``tetra64`` layout (a ``Tetra64Weight``) is decoded as such."""
    _check_record(w)
    out = _dequant_out(out, w, w.words.device)
    _launch_dequant(w, out, dequant_config() if config is None else config, scaled=False)
    return out


def _launch_dequant(w: Tetra48Weight | Planes14Weight, out: torch.Tensor, cfg: DequantConfig,
                    scaled: bool) -> None:
    """The record's dequantization kernel into ``out``: float16 ``[d_out, ≥ 24·n_blocks]``, unit
    column stride, rows 16-byte aligned (checked by the callers); ``scaled``: σ_row folded in."""
    if not (w.d_out and w.n_blocks):
        return
    dev = out.device
    common = dict(N_BLOCKS=w.n_blocks, NW=cfg.num_warps, USE_ASM=_use_asm(),
                  VEC=cfg.vector_stores, GROUPED=cfg.grouped, SCALED=scaled,
                  OUT_STRIDE=out.stride(0) // 2, num_warps=cfg.num_warps, num_stages=1)
    grid = (_dequant_grid(w, dev, cfg),)
    words = out.view(torch.int32)
    if _is_tetra48(w):
        tetra48_dequant_kernel[grid](
            w.words, w.row_centroids, w.row_scales, tetra_m1_table(dev), words, w.d_out,
            T64=w.layout == "tetra64", **common,
        )
    else:
        planes14_dequant_kernel[grid](
            w.records, w.row_centroids, w.row_scales, planes14_m1_table(dev), words, w.d_out,
            SEL_TABLE=True, **common,
        )


def _dequant_out(out: torch.Tensor | None, w: Tetra48Weight | Planes14Weight,
                 device: torch.device) -> torch.Tensor:
    """The float16 ``[d_out, 24·n_blocks]`` buffer a dequantization kernel writes: ``out``
    checked, or a new one."""
    shape = (w.d_out, BLOCK * w.n_blocks)
    if out is None:
        return torch.empty(shape, dtype=torch.float16, device=device)
    check_tensor(out, "out", torch.float16, shape, device=device)
    return out


def aligned_width(d_in: int) -> int:
    """``d_in`` rounded up to a multiple of 8 (16-byte rows of float16)."""
    return (d_in + 7) // 8 * 8


def dense_copy(parts: Sequence[Tetra48Weight | Planes14Weight],
               config: DequantConfig | None = None) -> torch.Tensor:
    """The float16 matrix the many-row path multiplies, for lattice records of one ``d_in``
    stacked by rows: ``[Σ d_out, d_in]`` (a view of a buffer with rows padded to 16 bytes), each
    record's blocks with σ_row folded in (the dequantization kernels with ``SCALED``) in the
    copy's column order, then its tail columns rounded to float16, in place — so that
    ``x16 @ copy.T`` with ``x16`` in :func:`dense_input_order` is the product. Twin:
    ``reference.folded_dense_f16`` of each record, bit for bit."""
    if not parts:
        raise InvalidInput("dense_copy needs at least one record")
    w0 = parts[0]
    if any(p.d_in != w0.d_in for p in parts):
        raise InvalidInput(f"records differ in d_in: {[p.d_in for p in parts]}")
    for p in parts:
        _check_record(p)
    dev = w0.row_scales.device
    cfg = dequant_config() if config is None else config
    n = BLOCK * w0.n_blocks
    buf = torch.empty(sum(p.d_out for p in parts), aligned_width(w0.d_in), dtype=torch.float16,
                      device=dev)
    off = 0
    for p in parts:
        rows = buf[off : off + p.d_out]
        _launch_dequant(p, rows[:, :n], cfg, scaled=True)
        if p.tail_cols:
            rows[:, n : p.d_in].copy_(p.tail)
        off += p.d_out
    return buf[:, : w0.d_in]


def _dequant_grid(w: Tetra48Weight | Planes14Weight, device: torch.device,
                  cfg: DequantConfig) -> int:
    """Programs of a dequantization kernel's grid-stride loop over (row, block pair) items: one
    item per lane, at most ``cfg.programs_per_sm`` programs per SM."""
    if cfg.num_warps not in (1, 2, 4, 8, 16) or cfg.programs_per_sm < 1:
        raise InvalidInput(f"dequantization geometry {cfg}: num_warps must be 1, 2, 4, 8 or 16 "
                           "and programs_per_sm at least 1")
    items = w.d_out * ((w.n_blocks + 1) // 2)
    return max(1, min(triton.cdiv(items, cfg.num_warps * 32),
                      cfg.programs_per_sm * _sm_count(device)))


_BLOCK_INDEX: dict[tuple[str, str, int], torch.Tensor] = {}


def _block_index(kind: str, n_blocks: int, device: torch.device | str,
                 per_block: Callable[[], torch.Tensor]) -> torch.Tensor:
    """int64 [len(per_block()) · n_blocks]: entry ``j`` of block ``b`` is column
    ``24 b + per_block()[j]`` of a row, or ``24 · n_blocks`` where ``per_block()[j] < 0``; built
    once per (kind, device, width)."""
    key = (kind, str(device), n_blocks)
    if key not in _BLOCK_INDEX:
        pb = per_block().to(torch.int64)
        idx = torch.arange(n_blocks)[:, None] * BLOCK + pb[None, :]
        idx = torch.where(pb[None, :] >= 0, idx, BLOCK * n_blocks)
        _BLOCK_INDEX[key] = idx.reshape(-1).to(device)
    return _BLOCK_INDEX[key]


def dequant_natural_index(n_blocks: int, device: torch.device | str,
                          grouped: bool = False) -> torch.Tensor:
    """int64 [24·n_blocks]: the natural (rotated-basis) column of each column of
    :func:`tetra48_dequantize_f16` in the block-major or ``grouped`` layout (cached per device,
    width and layout)."""
    def blocks() -> torch.Tensor:
        return _block_index("dequant", n_blocks, device,
                            lambda: ref.dequant_column_order(tetra_kernel_tables("cpu").order))

    return _grouped_index("tetra48", blocks, n_blocks, device) if grouped else blocks()


_GROUPED_INDEX: dict[tuple[str, str, int], torch.Tensor] = {}


def _grouped_index(kind: str, blocks: Callable[[], torch.Tensor], n_blocks: int,
                   device: torch.device | str) -> torch.Tensor:
    """The block-major column map ``blocks()`` (int64 [24·n_blocks] on ``device``; built only on
    the first call) taken in the grouped layout's column order (cached per kind, device and
    width)."""
    key = (kind, str(device), n_blocks)
    if key not in _GROUPED_INDEX:
        _GROUPED_INDEX[key] = blocks()[ref.dequant_group_columns(n_blocks).to(device)]
    return _GROUPED_INDEX[key]


def planes14_dequant_natural_index(n_blocks: int, device: torch.device | str,
                                   grouped: bool = False) -> torch.Tensor | None:
    """int64 [24·n_blocks]: the natural column of each column of :func:`planes14_dequantize_f16`
    in the ``grouped`` layout (cached), or None for the block-major layout (natural order)."""
    if not grouped:
        return None
    return _grouped_index("planes14", lambda: torch.arange(BLOCK * n_blocks, device=device),
                          n_blocks, device)


def tetra48_matmul_dense(x: torch.Tensor, w: Tetra48Weight) -> torch.Tensor:
    """``y = W x`` for many activation rows through a float16 copy of W and cuBLAS: float32
    [M, d_out] from x [M, d_in] (rotated basis). Values (σ_row folded in, the tail columns
    included) and activations are rounded to float16 (relative error ≲ 2^-11 per product, the
    precision of an fp16 model), the products summed in float32. Twin of
    ``reference.tetra48_matvec`` within that tolerance."""
    _check_x(x, w.d_in, w.words.device, max_rows=None)
    return _dense_product_natural(x, w)


def _is_tetra48(w: Tetra48Weight | Planes14Weight) -> bool:
    """Whether a lattice record is ``tetra48`` (its words) rather than ``planes14`` (records)."""
    return hasattr(w, "words")


def _check_record(w: Tetra48Weight | Planes14Weight) -> None:
    """A lattice record's code tensor checked (``tetra48``/``tetra64`` words or ``planes14``
    records) before a dequantization kernel reads it."""
    if _is_tetra48(w):
        _check_lattice(w, w.words, "words", t64_ok=True)
    else:
        _check_lattice(w, w.records, "records")


def _copy_columns(w: Tetra48Weight | Planes14Weight, device: torch.device | str,
                  grouped: bool) -> torch.Tensor | None:
    """The natural (rotated-basis) column of each column of ``w``'s float16 copy in the
    block-major or ``grouped`` layout (:func:`dequant_natural_index`,
    :func:`planes14_dequant_natural_index`), or None where that is the natural order."""
    if _is_tetra48(w):
        return dequant_natural_index(w.n_blocks, device, grouped)
    return planes14_dequant_natural_index(w.n_blocks, device, grouped)


def _dense_product_natural(x: torch.Tensor, w: Tetra48Weight | Planes14Weight) -> torch.Tensor:
    """:func:`matmul_dense_ordered` from the float32 activation in natural order: its columns
    gathered into :func:`dense_input_order` and rounded to float16."""
    return matmul_dense_ordered(x[:, dense_input_columns(w, x.device)].to(torch.float16), w)


def mm_f32(a16: torch.Tensor, b16: torch.Tensor) -> torch.Tensor:
    """``a16 @ b16`` of float16 matrices ``[M, K] @ [K, N]`` accumulated and returned in float32
    (cuBLAS with a float32 output on a GPU; float32 products elsewhere)."""
    if a16.device.type == "cuda":
        return torch.mm(a16, b16, out_dtype=torch.float32)
    return a16.float() @ b16.float()


def planes14_dequantize_f16(w: Planes14Weight, out: torch.Tensor | None = None,
                            config: DequantConfig | None = None) -> torch.Tensor:
    """The record's coded blocks as float16 ``[d_out, 24·n_blocks]`` without σ_row, natural
    column order within each block, the blocks as :func:`planes14_dequant_natural_index` maps
    them (twin of ``reference.planes14_dequantize_f16`` with the same ``grouped``;
    :mod:`.planes14_dequant`; the permute selectors from the staged table); ``config``:
    :func:`dequant_config` if None."""
    _check_record(w)
    out = _dequant_out(out, w, w.records.device)
    _launch_dequant(w, out, dequant_config() if config is None else config, scaled=False)
    return out


_P14_DENSE_CHECKED: dict[str, bool] = {}


def planes14_dense_enabled(device: torch.device) -> bool:
    """Whether :func:`planes14_matmul_dense` may serve many rows on ``device``. On a GPU its
    dequantization kernel is checked once, on first use and outside any CUDA-graph capture:
    bit-exact against ``reference.planes14_dequantize_f16`` on a small random record (odd block
    count); a failure or exception warns and disables it for good (the lattice matvec
    keeps the rows). Under a capture with no check yet it is not used for that call."""
    if interpreting() or device.type != "cuda":
        return True
    return _checked_once(_P14_DENSE_CHECKED, str(device), _check_planes14_dense, device)


def _check_planes14_dense(device: torch.device) -> bool:
    from leechq.formats.layouts.planes14 import random_planes14

    try:
        w = random_planes14(37, 13 * BLOCK + 5, seed=0x5EED, device=device)
        cfg = dequant_config()
        want = ref.planes14_dequantize_f16(w, grouped=cfg.grouped)
        same = torch.equal(planes14_dequantize_f16(w, config=cfg), want)
        if same:
            return True
        reason = "values differ from the reference"
    except Exception as exc:  # any failure means: do not use the kernel on this device
        reason = f"{type(exc).__name__}: {exc}"[:300]
    warnings.warn(f"the Planes14 dequantization kernel failed its first-use check on {device} "
                  f"({reason}); many rows keep the lattice matvec", stacklevel=3)
    return False


def planes14_matmul_dense(x: torch.Tensor, w: Planes14Weight) -> torch.Tensor:
    """``y = W x`` for many activation rows through a float16 copy of W and cuBLAS: float32
    [M, d_out] from x [M, d_in] (rotated basis), as :func:`tetra48_matmul_dense` (the same
    float16 values and activations, float32 sums). Twin of
    ``reference.planes14_matvec`` within that tolerance."""
    _check_x(x, w.d_in, w.records.device, max_rows=None)
    return _dense_product_natural(x, w)


_DENSE_COLUMNS: dict[tuple[str, str, int, int, bool], torch.Tensor] = {}
_DENSE_ORDER: dict[tuple[str, str, int, int, bool], torch.Tensor] = {}


def _dense_key(w: Tetra48Weight | Planes14Weight, device: torch.device | str
               ) -> tuple[str, str, int, int, bool]:
    """What the dense column layout depends on: layout, device, width and layout form."""
    return ("tetra48" if _is_tetra48(w) else "planes14", str(device), w.n_blocks, w.d_in,
            dequant_config().grouped)


def dense_input_columns(w: Tetra48Weight | Planes14Weight, device: torch.device | str
                        ) -> torch.Tensor:
    """int64 [d_in]: the natural (rotated-basis) column of each column of ``w``'s float16 copy
    under :func:`dequant_config` — the copy's block columns (:func:`dequant_natural_index` /
    :func:`planes14_dequant_natural_index`), then the tail columns in place; the gather that
    makes :func:`dense_input_order`'s layout (cached per layout, device, width and layout
    form)."""
    key = _dense_key(w, device)
    if key not in _DENSE_COLUMNS:
        cols = torch.arange(w.d_in, dtype=torch.int64, device=device)
        nat = _copy_columns(w, device, key[-1])
        if nat is not None:
            cols[: BLOCK * w.n_blocks] = nat
        _DENSE_COLUMNS[key] = cols
    return _DENSE_COLUMNS[key]


def dense_input_order(w: Tetra48Weight | Planes14Weight, device: torch.device | str
                      ) -> torch.Tensor:
    """int32 [d_in]: where each natural (rotated-basis) column of the activation goes so that its
    columns follow ``w``'s float16 copy (the inverse of :func:`dense_input_columns`; the tail
    columns stay in place) — the ``dense_order`` the rotation writes for
    :func:`matmul_dense_ordered` (cached as those columns are)."""
    key = _dense_key(w, device)
    if key not in _DENSE_ORDER:
        cols = dense_input_columns(w, device)
        dest = torch.empty_like(cols)
        dest[cols] = torch.arange(w.d_in, dtype=torch.int64, device=cols.device)
        _DENSE_ORDER[key] = dest.to(torch.int32)
    return _DENSE_ORDER[key]


def matmul_dense_ordered(x16: torch.Tensor, w: _Record | Sequence[_Record]) -> torch.Tensor:
    """``y = W x`` for many activation rows from the float16 activation ``x16`` [M, d_in] already
    in :func:`dense_input_order` (``rotate(..., dense_order=)`` writes it): float32
    [M, Σ d_out] by one :func:`dense_copy` of the record(s) ``w`` (several records of one
    ``d_in``: their outputs side by side, as a serving group's parts) and one float16 GEMM with
    float32 output (:func:`mm_f32`). Values and activations are float16, as in an fp16 model."""
    parts = [w] if hasattr(w, "row_scales") else list(w)
    if not parts:
        raise InvalidInput("matmul_dense_ordered needs at least one record")
    check_tensor(x16, "x16", torch.float16, device=parts[0].row_scales.device)
    if x16.dim() != 2 or x16.shape[1] != parts[0].d_in:
        raise InvalidInput(f"x16 must be [M, {parts[0].d_in}], got {list(x16.shape)}")
    return mm_f32(x16, dense_copy(parts).T)
