"""Host side of the int8 tensor-core kernel (:mod:`.tetra48_imma`) for 1..16 activation rows:
the activation records, the K-slice geometry, the MMA launch and the slice sum, for ``tetra48``
(and ``tetra64``) words and ``planes14`` records. Twins: ``reference.tetra48_matvec``,
``reference.planes14_matvec``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton

from leechq.errors import InvalidInput, UnsupportedShape
from leechq.kernels import reference as ref
from leechq.kernels.tables import planes14_m1_table, tetra_m1_table
from leechq.kernels.triton import ops_common as _c
from leechq.kernels.triton.ops_common import (
    _check_lattice,
    _check_out,
    _check_prepared,
    _sm_count,
    _use_asm,
    check_tensor,
)
from leechq.kernels.triton.tetra48_imma import (
    STEP_WORDS,
    imma_activation_kernel,
    imma_finalize_kernel,
    imma_kernel,
)
from leechq.kernels.triton.tetra48_m1 import PLANES14, TETRA, TETRA_64
from leechq.kernels.tuning import IMMA_MAXNREG, IMMA_ROWS

if TYPE_CHECKING:
    from leechq.formats.layouts.planes14 import Planes14Weight
    from leechq.formats.layouts.tetra48 import Tetra48Weight


def imma_chunks(m_rows: int) -> int:
    """8-row chunks of activation records the int8 kernel runs for ``m_rows`` rows (1 or 2)."""
    return 1 if m_rows <= 8 else 2


def imma_default(w: Tetra48Weight | Planes14Weight, m_rows: int) -> bool:
    """Whether the dispatch table runs ``m_rows`` unconfigured activation rows of ``w`` on the
    int8 tensor-core kernel (``ops.matvec_path`` chooses the entry ``imma``)."""
    from leechq.kernels.triton.ops import matvec_path

    return matvec_path(w, m_rows)[0] == "imma"


def imma_activation(xp: torch.Tensor, m_rows: int, n_blocks: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 tensor-core kernel's activation (:mod:`.tetra48_imma`) from the prepared layout
    ``xp`` (float32 [MP, 48·NPP + 32], ``m_rows ≤ 16`` real rows) in ``C`` =
    :func:`imma_chunks` chunks of 8 rows: the ``A`` fragment words, int32 [C · NPP/2 · 576]
    (``tetra48_imma.STEP_WORDS`` per 4-block step), and the block exponents, float32
    [C · 2·NPP · 8]. One launch; every word is written (rows past ``m_rows`` and blocks past
    ``n_blocks`` as zeros). Shared by every matrix that reads this activation."""
    _check_imma_rows(m_rows)
    _check_prepared(xp, m_rows, n_blocks, xp.device, IMMA_ROWS)
    npp = ref.prepared_pairs(n_blocks)
    chunks = imma_chunks(m_rows)
    rec_shape, ex_shape = _record_shapes(npp, chunks)
    rec = torch.empty(rec_shape, dtype=torch.int32, device=xp.device)
    ex = torch.empty(ex_shape, dtype=torch.float32, device=xp.device)
    blk = 64
    imma_activation_kernel[(8 * chunks, triton.cdiv(npp, blk))](
        xp, xp.stride(0), rec, ex, m_rows, xp.shape[0], NPP=npp, BLK=blk, USE_ASM=_use_asm(),
        A16=_c.A16,
    )
    return rec, ex


def imma_records(n_blocks: int, device: torch.device | str, m_rows: int = 8
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed buffers for a rotation of ``m_rows`` (1..16) rows to fill with the int8 kernel's
    activation records (``rotate(..., records=)``): int32 [C · NPP/2 · 576] and float32
    [C · 2·NPP · 8], ``C`` = :func:`imma_chunks`. The rotation writes the rows it runs
    (``prepared_rows(m)``); rows past them must stay zero, so keep one buffer per row count."""
    _check_imma_rows(m_rows)
    rec_shape, ex_shape = _record_shapes(ref.prepared_pairs(n_blocks), imma_chunks(m_rows))
    return (torch.zeros(rec_shape, dtype=torch.int32, device=device),
            torch.zeros(ex_shape, dtype=torch.float32, device=device))


def _record_shapes(npp: int, chunks: int) -> tuple[tuple[int], tuple[int]]:
    """The shapes of the int8 kernel's activation records for ``NPP`` prepared pairs and
    ``chunks`` chunks of 8 rows: the ``A`` words (``tetra48_imma.STEP_WORDS`` per 4-block step)
    and the exponents (8 rows per block), chunk after chunk."""
    return (chunks * npp // 2 * STEP_WORDS.value,), (chunks * 2 * npp * 8,)


def _check_imma_rows(m_rows: int) -> None:
    if not 1 <= m_rows <= IMMA_ROWS:
        raise UnsupportedShape(f"{m_rows} activation rows; the int8 tensor-core kernel takes "
                               f"1..{IMMA_ROWS}")


def _check_acts(acts: tuple[torch.Tensor, torch.Tensor], npp: int, device: torch.device,
                chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Activation records (``A`` words, exponents) checked against :func:`_record_shapes`."""
    rec, ex = acts
    rec_shape, ex_shape = _record_shapes(npp, chunks)
    check_tensor(rec, "records", torch.int32, rec_shape, device=device)
    check_tensor(ex, "exponents", torch.float32, ex_shape, device=device)
    return rec, ex


def imma_slices(d_out: int, n_blocks: int, device: torch.device, num_warps: int = 4,
                row_groups: int = 1, rows_per_step: int = 2, chunks: int = 1) -> int:
    """Blocks per K-slice (a multiple of 4) of the int8 tensor-core kernel: as many slices as fit
    one wave of four programs per SM (its register and shared-memory limit; three for two
    chunks of activation rows, 163 registers offline, or four row groups per step, 167) with all
    programs resident — never a
    partial second wave. H200, Qwen3-8B projections at 8 rows, kernel and
    slice sum, µs: q|k|v
    5 slices 19.6 (best, 6: 19.2); o 8 slices 15.5 (best 7: 15.1); gate|up 1 slice 57.6
    (best); down 8 slices 30.6 (best) — where rounding up to a second wave had 19.2, 16.2,
    59.9 and 33.1."""
    tiles = triton.cdiv(d_out, 8 * rows_per_step * num_warps * row_groups)
    steps = max(1, triton.cdiv(n_blocks, 4))
    resident = 4 if chunks == 1 and rows_per_step < 4 else 3
    ks = max(1, min(steps, (resident * _sm_count(device)) // tiles))
    return 4 * triton.cdiv(steps, ks)


def tetra48_matvec_imma_prepared(xp: torch.Tensor, w: Tetra48Weight, m_rows: int,
                                 out: torch.Tensor | None = None,
                                 acts: tuple[torch.Tensor, torch.Tensor] | None = None,
                                 k_per: int | None = None, num_warps: int = 4,
                                 row_groups: int = 1, rows_per_step: int = 2,
                                 maxnreg: int = IMMA_MAXNREG) -> torch.Tensor:
    """``y = W x`` for 1..16 activation rows on int8 tensor cores (:mod:`.tetra48_imma`): float32
    [M, d_out] from the prepared activation ``xp`` (as :func:`tetra48_matvec_prepared`; twin:
    ``reference.tetra48_matvec``, same accuracy as the batch-1 kernel). ``acts``: the result of
    :func:`imma_activation` for ``xp`` when several matrices share it; ``k_per`` blocks per
    K-slice (default :func:`imma_slices`); ``row_groups`` sets of ``8·rows_per_step·num_warps``
    rows per program; ``rows_per_step`` (1, 2, or 4 for at most 8 activation rows; offline
    167 registers with 16-bit activations, three programs per SM) groups of 8 rows per warp and
    step, sharing the step's activation fragments; ``maxnreg``: the register cap (0: the
    compiler's choice; :data:`IMMA_MAXNREG`). Three launches: the activation records (unless
    given), the MMA kernel and the slice sum. The ``tetra64`` layout (a ``Tetra64Weight``,
    ``CODE = TETRA_64``: its stored shells give ``1/‖y‖``) is decoded as such."""
    _check_lattice(w, w.words, "words", t64_ok=True)
    code = TETRA_64.value if w.layout == "tetra64" else TETRA.value
    return _matvec_imma(code, w.words, tetra_m1_table(xp.device), xp, w, m_rows, out,
                        acts, k_per, num_warps, row_groups, rows_per_step, maxnreg)


def planes14_matvec_imma_prepared(xp: torch.Tensor, w: Planes14Weight, m_rows: int,
                                  out: torch.Tensor | None = None,
                                  acts: tuple[torch.Tensor, torch.Tensor] | None = None,
                                  k_per: int | None = None, num_warps: int = 4,
                                  row_groups: int = 1, rows_per_step: int = 2,
                                  maxnreg: int = IMMA_MAXNREG) -> torch.Tensor:
    """:func:`tetra48_matvec_imma_prepared` for ``planes14`` records (the Planes14 decode of the
    batch-1 kernel, :mod:`.planes14_m1`), the activation prepared in ``tables.planes14_m1_order``
    (twin: ``reference.planes14_matvec``); :func:`planes14_matvec_planned` selects it for
    3..16 rows on a GPU."""
    _check_lattice(w, w.records, "records")
    return _matvec_imma(PLANES14.value, w.records, planes14_m1_table(xp.device), xp, w, m_rows,
                        out, acts, k_per, num_warps, row_groups, rows_per_step, maxnreg)


def _matvec_imma(code: int, data: torch.Tensor, table: torch.Tensor, xp: torch.Tensor,
                 w: Tetra48Weight | Planes14Weight, m_rows: int, out: torch.Tensor | None,
                 acts: tuple[torch.Tensor, torch.Tensor] | None, k_per: int | None,
                 num_warps: int, row_groups: int, rows_per_step: int,
                 maxnreg: int) -> torch.Tensor:
    """The launches of :func:`tetra48_matvec_imma_prepared` and
    :func:`planes14_matvec_imma_prepared` (``code``: the kernel's ``CODE``; ``data``: the words
    or records; ``table``: the decode's staged table)."""
    _check_imma_rows(m_rows)
    _check_prepared(xp, m_rows, w.n_blocks, data.device, IMMA_ROWS)
    chunks = imma_chunks(m_rows)
    dev = xp.device
    y = out if out is not None else torch.empty(m_rows, w.d_out, dtype=torch.float32, device=dev)
    _check_out(y, m_rows, w.d_out)
    if rows_per_step not in (1, 2, 4) or (rows_per_step == 4 and chunks > 1):
        raise InvalidInput(f"rows_per_step must be 1, 2 or 4 (4 for at most 8 activation rows), "
                           f"got {rows_per_step} for {m_rows} rows")
    if k_per is None:
        k_per = imma_slices(w.d_out, w.n_blocks, dev, num_warps, row_groups, rows_per_step,
                            chunks)
    if k_per < 4 or k_per % 4:
        raise InvalidInput(f"k_per must be a positive multiple of 4, got {k_per}")
    if not w.d_out:
        return y
    npp = ref.prepared_pairs(w.n_blocks)
    rec, ex = _check_acts(acts if acts is not None else imma_activation(xp, m_rows, w.n_blocks),
                          npp, dev, chunks)
    slices = max(1, triton.cdiv(w.n_blocks, k_per))
    part = torch.empty(slices, 8 * chunks, w.d_out, dtype=torch.float32, device=dev)
    tiles = triton.cdiv(w.d_out, 8 * rows_per_step * num_warps * row_groups)
    regs = {"maxnreg": maxnreg} if maxnreg and _use_asm() else {}
    imma_kernel[(tiles, slices)](
        rec, ex, data, w.row_centroids, table, part, w.d_out, k_per,
        N_BLOCKS=w.n_blocks, NPP=npp, NW=num_warps, RG=row_groups, RPS=rows_per_step,
        CH=chunks, CODE=code, USE_ASM=_use_asm(), A16=_c.A16, num_warps=num_warps,
        num_stages=1, **regs,
    )
    blk = 128
    imma_finalize_kernel[(triton.cdiv(w.d_out, blk), m_rows)](
        part, w.row_scales, w.tail, xp, xp.stride(0), y, y.stride(0), w.d_out, slices,
        NPP=npp, TAIL_COLS=w.tail_cols, TAIL_P2=triton.next_power_of_2(max(1, w.tail_cols)),
        SLICES=triton.next_power_of_2(slices), BLK=blk, T=8 * chunks,
    )
    return y
