"""Dequantize a ``planes14`` record to a float16 matrix: the ball codebook's many-row path.

The counterpart of :mod:`.tetra48_dequant` for the unfolded ball layout (docs/kernels.md): a prompt
or a large batch decodes each 14-byte record once into float16 values
``y_t · c_g / ‖y‖`` (no σ_row) and leaves the product to cuBLAS; σ_row and the tail columns are
applied around the GEMM (``ops.planes14_matmul_dense``). Without it a Planes14 prompt runs the
lattice matvec once per 8 rows (849 ms for 256 prompt rows of Qwen3-8B shapes).

Decode: the batch-1 Planes14 decode (:func:`.planes14_m1._record_bytes`, the signed class table
and level selectors staged in shared memory): the record's six quads of signed value bytes, its
gain bit and ``1/‖y‖``. Quad ``q`` holds natural coordinates ``4q .. 4q + 3``; quads ``2s, 2s + 1``
make the record's 8-column section ``s``. Each value times the float16-rounded ``c_g · (1/‖y‖)``
is rounded once to float16, two per three float16x2 instructions
(:func:`.tetra48_dequant.store_eight`).

Layout and geometry as in :mod:`.tetra48_dequant`: the sections block-major (natural column
order, no permutation of the activation) or grouped (``GROUPED``, the default; the activation is
gathered by ``ops.planes14_dequant_natural_index``), 16-byte vector stores with ``VEC``, a
grid-stride loop over (row, record pair) items with the table staged once per program. H200,
Qwen3-8B: a step's copies 5.88 ms grouped (44.8 block-major with 4-byte stores).
"""

from __future__ import annotations

import triton
import triton.language as tl

from leechq.kernels.triton.planes14 import load_record_pair
from leechq.kernels.triton.planes14_m1 import TABLE_PART as P14_TABLE_PART
from leechq.kernels.triton.planes14_m1 import TABLE_PARTS as P14_TABLE_PARTS
from leechq.kernels.triton.planes14_m1 import _record_bytes
from leechq.kernels.triton.tetra48_dequant import (
    pair_items,
    pair_outputs,
    row_centroids,
    store_eight,
)
from leechq.kernels.triton.tetra48_m1 import stage_table


@triton.jit
def _dequant_record(A, B, C, D, cent0, cent1, tab_ptr, base, out, step, ok,
                    SEL_TABLE: tl.constexpr, VEC: tl.constexpr, USE_ASM: tl.constexpr):
    """Decode one record per element (bits 0..31, 32..63, 64..95, 96..111 in ``A, B, C, D``) and
    store its 24 float16 values: natural coordinates ``8 s .. 8 s + 7`` at ``out + s · step``
    (int32 units, 16 bytes each)."""
    quads, g, invw = _record_bytes(A, B, C, D, tab_ptr, base, SEL_TABLE, USE_ASM)
    scale = tl.where(g != 0, cent1, cent0) * invw.to(tl.float32, bitcast=True)
    q0, q1, q2, q3, q4, q5 = quads
    store_eight(out, q0, q1, scale, ok, VEC, USE_ASM)
    store_eight(out + step, q2, q3, scale, ok, VEC, USE_ASM)
    store_eight(out + 2 * step, q4, q5, scale, ok, VEC, USE_ASM)


@triton.jit
def planes14_dequant_kernel(r_ptr, cent_ptr, scale_ptr, tab_ptr, out_ptr, d_out,
                            N_BLOCKS: tl.constexpr, OUT_STRIDE: tl.constexpr, NW: tl.constexpr,
                            SEL_TABLE: tl.constexpr, USE_ASM: tl.constexpr,
                            VEC: tl.constexpr = False, GROUPED: tl.constexpr = False,
                            SCALED: tl.constexpr = False):
    """float16 ``[d_out, 24·N_BLOCKS]`` (written as int32 pairs, ``OUT_STRIDE`` words per row)
    from the records (int32 words, ``7·⌈N_BLOCKS/2⌉`` per row); see the module docstring.
    ``SCALED`` as in :func:`.tetra48_dequant.tetra48_dequant_kernel`. Any grid;
    ``num_warps = NW``."""
    NP: tl.constexpr = (N_BLOCKS + 1) // 2
    STRIDE_W: tl.constexpr = 7 * NP
    LANES: tl.constexpr = NW * 32
    base = stage_table(tab_ptr, d_out, USE_ASM, P14_TABLE_PARTS, P14_TABLE_PART)
    e = tl.arange(0, LANES)
    n_items = d_out * NP
    for start in range(tl.program_id(0) * LANES, n_items, tl.num_programs(0) * LANES):
        ok, row, pair, ok_e, ok_o = pair_items(start + e, n_items, NP, N_BLOCKS)
        w0, w1, w2, w3, w4, w5, w6 = load_record_pair(r_ptr + row * STRIDE_W + 7 * pair, ok_e,
                                                      ok_o)
        cent0, cent1 = row_centroids(cent_ptr, scale_ptr, row, ok, SCALED)
        out_e, step_e, out_o, step_o = pair_outputs(out_ptr, row, pair, NP, N_BLOCKS, GROUPED,
                                                    OUT_STRIDE)
        _dequant_record(w0, w1, w2, w3 & 0xFFFF, cent0, cent1, tab_ptr, base, out_e, step_e,
                        ok_e, SEL_TABLE, VEC, USE_ASM)
        _dequant_record((w3 >> 16) | (w4 << 16), (w4 >> 16) | (w5 << 16),
                        (w5 >> 16) | (w6 << 16), w6 >> 16, cent0, cent1, tab_ptr, base, out_o,
                        step_o, ok_o, SEL_TABLE, VEC, USE_ASM)
