"""Host side of the float16 tensor-core GEMM (:mod:`.tetra48_gemm`) for 1..128 activation rows
of a lattice record (either Tetra layout or the ball codebook's ``planes14``): the activation in
the dequantized copy's column order, the K-slice geometry, the GEMM launch and the slice sum with
σ_row and the tail. Same entry points as the many-row dense path
(``ops_dense.tetra48_matmul_dense`` / ``planes14_matmul_dense``,
``ops_dense.matmul_dense_ordered``), without the float16 copy; a serving group's parts write
their columns of one output (``out=``). Twins: ``reference.tetra48_dequantize_f16`` /
``planes14_dequantize_f16`` (the decoded values, bit for bit) and ``reference.tetra48_matvec`` /
``planes14_matvec`` (the product, within float16 accuracy)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import triton

from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput, UnsupportedShape
from leechq.kernels.tables import planes14_m1_table, tetra_m1_table
from leechq.kernels.triton.ops_common import (
    _check_lattice,
    _check_x,
    _sm_count,
    _use_asm,
    check_tensor,
)
from leechq.kernels.triton.ops_dense import _copy_columns, aligned_width, dequant_config
from leechq.kernels.triton.tetra48_gemm import (
    PAIRS_PER_STEP,
    ROWS_PER_GROUP,
    gemm_finalize_kernel,
    gemm_kernel,
)
from leechq.kernels.tuning import (
    EPILOGUE_MIN_ROWS,
    EPILOGUE_ROWS,
    GEMM_CONFIG,
    GEMM_P14_ONE_GROUP_TILES,
    GEMM_SWEEP,
)

if TYPE_CHECKING:
    from leechq.formats.layouts.planes14 import Planes14Weight
    from leechq.formats.layouts.tetra48 import Tetra48Weight

_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

GEMM_LAUNCH_ROWS = 128
"""Activation rows one launch takes (all of them in one program tile, so each weight block is
decoded once per launch); the dispatch table uses it for ``tuning.GEMM_MIN_ROWS`` ..
``GEMM_MAX_ROWS`` rows, where it measured fastest."""


@dataclass(frozen=True)
class GemmConfig:
    """Geometry of the float16 tensor-core GEMM: ``num_warps`` (2, 4 or 8; with one warp Triton
    reserves no shared memory for the staged table) warps per program, each taking
    ``rows_per_step`` (1 or 2) groups of 16 weight rows per K step (sharing the step's
    activation fragments); K is split into slices so that about ``programs_per_sm`` programs per
    SM cover the matrix (each stages the 32 KiB decode table: at most 7 per SM). Above 64
    activation rows one row group per step is used whatever ``rows_per_step`` says (two spill
    heavily: offline sm_90, 206 local loads per step against 26)."""

    num_warps: int = GEMM_CONFIG[0]
    rows_per_step: int = GEMM_CONFIG[1]
    programs_per_sm: int = GEMM_CONFIG[2]

    def check(self) -> GemmConfig:
        """This config, or :class:`InvalidInput` naming what is out of range."""
        if self.num_warps not in (2, 4, 8) or self.rows_per_step not in (1, 2) or not (
                1 <= self.programs_per_sm <= 7):
            raise InvalidInput(f"GEMM geometry {self}: num_warps must be 2, 4 or 8, "
                               "rows_per_step 1 or 2, programs_per_sm 1..7")
        return self

    @property
    def block_rows(self) -> int:
        """Weight rows per program."""
        return ROWS_PER_GROUP.value * self.rows_per_step * self.num_warps


GEMM_DEFAULT = GemmConfig()
"""The geometry used when none is given (:data:`.tuning.GEMM_CONFIG`)."""

GEMM_CONFIGS = tuple(GemmConfig(*c) for c in GEMM_SWEEP)
"""The candidate geometries a benchmark sweeps (:data:`.tuning.GEMM_SWEEP`)."""


def gemm_slice_pairs(d_out: int, n_blocks: int, device: torch.device, cfg: GemmConfig) -> int:
    """Block pairs per K-slice (a multiple of 4): as many slices as keep about
    ``cfg.programs_per_sm`` programs per SM over the row tiles, at least one step each."""
    tiles = triton.cdiv(d_out, cfg.block_rows)
    steps = max(1, triton.cdiv((n_blocks + 1) // 2, PAIRS_PER_STEP.value))
    ks = max(1, min(steps, (cfg.programs_per_sm * _sm_count(device)) // max(tiles, 1)))
    return PAIRS_PER_STEP.value * triton.cdiv(steps, ks)


def _codes(w: Tetra48Weight | Planes14Weight) -> torch.Tensor:
    """The record's code words (``records`` of a ``planes14`` record, else ``words``), checked
    with its other tensors."""
    p14 = w.layout == "planes14"
    codes = w.records if p14 else w.words
    _check_lattice(w, codes, "records" if p14 else "words", t64_ok=True)
    return codes


def matmul_gemm(x: torch.Tensor, w: Tetra48Weight | Planes14Weight,
                config: GemmConfig | None = None,
                out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``y = W x`` for 1..128 activation rows on float16 tensor cores, each block decoded once:
    ``out_dtype`` [M, d_out] from x [M, d_in] (float32/16, bfloat16; rotated basis), as
    ``ops_dense.tetra48_matmul_dense`` / ``planes14_matmul_dense`` (values and activations
    rounded to float16, the products accumulated and σ_row and the tail applied in float32).
    Any lattice layout (``Tetra48Weight``, ``Tetra64Weight``, ``Planes14Weight``). ``config``:
    :data:`GEMM_DEFAULT` if None."""
    codes = _codes(w)
    m_rows = _check_x(x, w.d_in, codes.device, max_rows=GEMM_LAUNCH_ROWS,
                      what="the float16 tensor-core GEMM takes")
    grouped = dequant_config().grouped
    n = BLOCK * w.n_blocks
    x16 = torch.empty(m_rows, aligned_width(w.d_in), dtype=torch.float16, device=x.device)
    idx = _copy_columns(w, x.device, grouped)
    x16[:, :n] = x[:, :n] if idx is None else x[:, idx]
    return _gemm(x16, x[:, n:], w, config, out_dtype, grouped)


def matmul_gemm_ordered(x16: torch.Tensor, w: Tetra48Weight | Planes14Weight,
                        config: GemmConfig | None = None,
                        out_dtype: torch.dtype = torch.float32,
                        out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`matmul_gemm` from the float16 activation already in
    ``ops_dense.dense_input_order`` (what ``rotate(..., dense_order=)`` writes, and what
    ``ops_dense.matmul_dense_ordered`` takes): ``x16`` float16 [M ≤ 128, d_in], the tail taken
    from its last ``d_in mod 24`` columns. Copied once into a padded buffer unless its rows are
    16-byte aligned. ``out``: where to write, ``[M, d_out]`` with unit column stride (a column
    slice of a wider output, e.g.) in ``out_dtype``; a new tensor if None."""
    codes = _codes(w)
    check_tensor(x16, "x16", torch.float16, device=codes.device)
    if x16.dim() != 2 or x16.shape[1] != w.d_in:
        raise InvalidInput(f"x16 must be [M, {w.d_in}], got {list(x16.shape)}")
    if not 1 <= x16.shape[0] <= GEMM_LAUNCH_ROWS:
        raise UnsupportedShape(f"x16 has {x16.shape[0]} rows; the float16 tensor-core GEMM "
                               f"takes 1..{GEMM_LAUNCH_ROWS}")
    n = BLOCK * w.n_blocks
    xa = x16
    if x16.stride(0) % 8 or x16.data_ptr() % 16:
        xa = torch.empty(x16.shape[0], aligned_width(w.d_in), dtype=torch.float16,
                         device=x16.device)
        xa[:, : w.d_in] = x16
    return _gemm(xa, x16[:, n:], w, config, out_dtype, dequant_config().grouped, out)


def _row_tiles(m_rows: int) -> int:
    """The 8-row activation tiles a launch of ``m_rows`` rows covers, rounded up to a power of 2."""
    return triton.next_power_of_2(triton.cdiv(m_rows, 8))


def launch_config(config: GemmConfig | None, layout: str, m_rows: int) -> GemmConfig:
    """The geometry a launch of ``m_rows`` activation rows of a ``layout`` record runs: ``config``
    (:data:`GEMM_DEFAULT` if None), with one row group per step from 65 rows whatever it says
    (the grid follows) and, in the default geometry, for a ``planes14`` record whose rows fill
    ``tuning.GEMM_P14_ONE_GROUP_TILES`` 8-row tiles (9..16 rows, where it measured faster)."""
    cfg = (GEMM_DEFAULT if config is None else config).check()
    mt = _row_tiles(m_rows)
    if mt >= 16 or (config is None and layout == "planes14" and mt == GEMM_P14_ONE_GROUP_TILES):
        cfg = replace(cfg, rows_per_step=1)
    return cfg


def _gemm(x16: torch.Tensor, x_tail: torch.Tensor, w: Tetra48Weight | Planes14Weight,
          config: GemmConfig | None,
          out_dtype: torch.dtype, grouped: bool, out: torch.Tensor | None = None
          ) -> torch.Tensor:
    """The GEMM and the finalize launch from ``x16`` (float16 [M, ≥ d_in], rows 16-byte aligned,
    the blocks' columns in the copy's order) and the tail activation ``x_tail`` [M, tail_cols]
    (any float, unit column stride), into ``out`` (checked) or a new tensor."""
    if out_dtype not in _OUT_DTYPES:
        raise InvalidInput(f"out_dtype must be float32, float16 or bfloat16, got {out_dtype}")
    m_rows = int(x16.shape[0])
    cfg = launch_config(config, w.layout, m_rows)
    dev = x16.device
    if out is None:
        out = torch.empty(m_rows, w.d_out, dtype=out_dtype, device=dev)
    elif (not isinstance(out, torch.Tensor) or out.dtype != out_dtype
          or tuple(out.shape) != (m_rows, w.d_out) or out.device != dev
          or (w.d_out > 1 and out.stride(1) != 1)):
        raise InvalidInput(f"out must be {out_dtype} [{m_rows}, {w.d_out}] on {dev} with unit "
                           f"column stride, got {_describe(out)}")
    mt = _row_tiles(m_rows)
    if not w.d_out:
        return out
    np_ = (w.n_blocks + 1) // 2
    k_pairs = gemm_slice_pairs(w.d_out, w.n_blocks, dev, cfg)
    slices = max(1, triton.cdiv(np_, k_pairs))
    alloc = torch.empty if w.n_blocks else torch.zeros  # the kernel writes every entry
    part = alloc(slices, m_rows, w.d_out, dtype=torch.float32, device=dev)
    if w.n_blocks:
        p14 = w.layout == "planes14"
        gemm_kernel[(triton.cdiv(w.d_out, cfg.block_rows), slices)](
            x16.view(torch.int32), x16.stride(0) // 2, w.records if p14 else w.words,
            w.row_centroids, planes14_m1_table(dev) if p14 else tetra_m1_table(dev), part,
            w.d_out, m_rows, k_pairs, N_BLOCKS=w.n_blocks, MT=mt, NW=cfg.num_warps,
            RPS=cfg.rows_per_step, GROUPED=grouped, T64=w.layout == "tetra64",
            USE_ASM=_use_asm(), P14=p14, num_warps=cfg.num_warps, num_stages=1,
        )
    bo = 256
    bm = EPILOGUE_ROWS if m_rows >= EPILOGUE_MIN_ROWS else 1
    gemm_finalize_kernel[(triton.cdiv(m_rows, bm), triton.cdiv(w.d_out, bo))](
        part, slices, w.row_scales, x_tail, x_tail.stride(0) if x_tail.numel() else 0, w.tail,
        out, out.stride(0), w.d_out, m_rows, TAIL=w.tail_cols,
        TP=triton.next_power_of_2(max(w.tail_cols, 1)), BO=bo, BM=bm, num_warps=4,
    )
    return out


def _describe(t: object) -> str:
    """A tensor's dtype, shape, device and strides for an error message (or its type)."""
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{t.dtype} {list(t.shape)} on {t.device}, strides {t.stride()}"
