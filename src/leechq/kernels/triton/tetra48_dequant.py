"""Dequantize a ``tetra48`` record to a float16 matrix: the many-row path (prefill, batched decode).

At batch 1 the fused matvec (:mod:`.tetra48_m1`) reads each 48-bit word once per token. With many
activation rows (a prompt, a batch of 16) the tiled kernels decode every block once per 8 rows and
spend 8 × 24 FMAs per block, far slower than a tensor-core GEMM. This kernel decodes a record once
into float16 values ``y_t · c_g / ‖y‖`` (no σ_row) so that cuBLAS can take the product; σ_row, the
tail columns and the column order are applied around the GEMM (``ops.tetra48_matmul_dense``).

Decode: the batch-1 kernel's table and arithmetic (:func:`.tetra48_decode.decode_nibbles`,
docs/kernels.md): per section the value bytes of the even and odd trio coordinates, the
squared norm by ``dp4a``, ``1/‖y‖`` from the table. The block scale ``c_g·(1/‖y‖)`` is rounded
to float16 once; each two value bytes become ``f16(v · scale)`` by three float16x2 instructions
(``_bits.bytes_times_f16x2``: a byte permute under the exponent of 1024, an integer offset
added, a multiply) — the twin's numbers, without an int→float conversion or an f32 product. A
``tetra64`` block feeds its doubled rank nibbles straight in (:func:`block_values64`).

Columns within a block: column ``8 s + 4 h + i`` of block ``b`` holds trio coordinate
``t = 8 s + 2 i + h`` (section ``s``, half ``h`` = 0 for the even nibbles, byte ``i``), i.e.
natural coordinate ``order[t]`` (``reference.dequant_column_order``). The blocks' 8-column
sections (16 bytes) are placed either block-major (block ``b`` at columns ``24 b .. 24 b + 23``)
or, with ``GROUPED`` (the default, ``ops.DEQUANT_DEFAULT``), in the layout of
``reference.dequant_group_columns``: per group of :data:`GROUP_PAIRS` block pairs of a row, the
even blocks' sections section-major and pair-minor, then the odd blocks' — so the 32 lanes of a
warp (32 consecutive pairs) store 512 consecutive bytes per store instead of 32 scattered
4-byte words (:func:`pair_outputs`). ``ops.dequant_natural_index`` maps either layout's columns
to the rotated basis, so the activation is gathered to match. With ``VEC`` each section is one
``st.global.v4`` (6 stores per block pair instead of 24).

Geometry: a grid-stride loop over (row, block pair) items, one item per lane, consecutive lanes on
consecutive pairs of a row; the table is staged in shared memory once per program
(``ops.DequantConfig``: warps and programs per SM). H200, Qwen3-8B: a whole step's
copies in 5.40 ms grouped with vector stores (8 warps, 4 programs per SM) against 40.5 ms
block-major with 4-byte stores; ``Tensor.fill_`` of the same bytes takes 4.70 ms
(``benchmarks/bench_dequant.py``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from leechq.kernels.reference import DEQUANT_GROUP_PAIRS
from leechq.kernels.triton._bits import (
    MINUS_1152,
    bytes_times_f16x2,
    global_load128,
    global_store128,
    half2,
)
from leechq.kernels.triton.tetra48_decode import (
    decode_block64,
    decode_nibbles,
    inv_norm,
    sb_copy,
    section_values,
)
from leechq.kernels.triton.tetra48_m1 import load_pair_words, stage_table

T64_OFFSET = tl.constexpr(-468786162)
"""float16 −1038 in both halves of an int32 (``0xE40EE40E``): a ``tetra64`` block's
:func:`f16_words` offset is this plus ``p`` in each half (``−1038 − p``; the byte is ``2h``)."""

GROUP_PAIRS = tl.constexpr(DEQUANT_GROUP_PAIRS)
"""Block pairs per column group of the grouped layout (one warp's 32 lanes: 512-byte stores), as
its twin ``reference.dequant_group_columns`` defines it."""


@triton.jit
def f16_words(qa, qb, c2, scale, USE_ASM: tl.constexpr):
    """Eight values — the bytes of ``qa``, then of ``qb`` (uint32), each plus the offset ``c``
    (``c2``: float16 ``c`` in both halves, :func:`._bits.bytes_times_f16x2`) — times ``scale``
    (f32) rounded to float16: ``f16(v · f16(scale))``, the exact product of the value and the
    float16 scale rounded once, packed two per int32 (the lower column in the low half): four
    words, columns 0-1, 2-3, 4-5, 6-7 — what :func:`store_eight` stores and what the
    tensor-core GEMM (:mod:`.tetra48_gemm`) takes as ``A`` fragments (three float16x2
    instructions per two values)."""
    s2 = half2(scale, USE_ASM)
    w0 = bytes_times_f16x2(qa, 0, c2, s2, USE_ASM)
    w1 = bytes_times_f16x2(qa, 2, c2, s2, USE_ASM)
    w2 = bytes_times_f16x2(qb, 0, c2, s2, USE_ASM)
    w3 = bytes_times_f16x2(qb, 2, c2, s2, USE_ASM)
    return w0, w1, w2, w3


@triton.jit
def f16_eight(a, b, scale, USE_ASM: tl.constexpr):
    """:func:`f16_words` of eight signed value bytes (``a``, then ``b``: int32)."""
    c2 = tl.full(a.shape, MINUS_1152, tl.int32)
    return f16_words((a ^ 0x80808080).to(tl.uint32), (b ^ 0x80808080).to(tl.uint32), c2, scale,
                     USE_ASM)


@triton.jit
def store_words(ptr, w0, w1, w2, w3, ok, VEC: tl.constexpr, USE_ASM: tl.constexpr):
    """Four float16x2 words (16 bytes) at ``ptr`` (int32 pointer): one vector store per element
    with ``VEC``, else four 4-byte stores."""
    if VEC:
        global_store128(ptr, w0, w1, w2, w3, ok, USE_ASM)
    else:
        tl.store(ptr, w0, mask=ok)
        tl.store(ptr + 1, w1, mask=ok)
        tl.store(ptr + 2, w2, mask=ok)
        tl.store(ptr + 3, w3, mask=ok)


@triton.jit
def store_eight(ptr, a, b, scale, ok, VEC: tl.constexpr, USE_ASM: tl.constexpr):
    """Eight values (the signed bytes of ``a``, then of ``b``) times ``scale`` as float16: 16
    bytes at ``ptr`` (:func:`f16_eight`, :func:`store_words`)."""
    w0, w1, w2, w3 = f16_eight(a, b, scale, USE_ASM)
    store_words(ptr, w0, w1, w2, w3, ok, VEC, USE_ASM)


@triton.jit
def block_values(lo, hi, cent0, cent1, tab_ptr, base, sb_rep, USE_ASM: tl.constexpr):
    """One ``tetra48`` block per element (words ``lo``, ``hi``: uint32): its value words
    ``e1, o1, e2, o2, e3, o3`` (signed bytes of the even / odd trio coordinates of sections
    1..3, :func:`.tetra48_decode.section_values`) and its scale ``centroid[g] · (1/‖y‖)`` (f32,
    ``1/‖y‖`` from the table)."""
    h1, h2, h3, mp, kp, g = decode_nibbles(lo, hi, tab_ptr, base, sb_rep, USE_ASM)
    e1, o1, n2 = section_values(h1, mp, kp, tl.zeros(lo.shape, tl.int32), USE_ASM)
    e2, o2, n2 = section_values(h2, mp, kp, n2, USE_ASM)
    e3, o3, n2 = section_values(h3, mp, kp, n2, USE_ASM)
    scale = tl.where(g != 0, cent1, cent0) * inv_norm(n2, tab_ptr, base, sb_rep, USE_ASM)
    return e1, o1, e2, o2, e3, o3, scale


@triton.jit
def block_values64(w0, w1, w2, w3, ODD: tl.constexpr, cent0, cent1, tab_ptr, base, sb_rep,
                   USE_ASM: tl.constexpr):
    """The even (``ODD`` False) or odd block of a ``tetra64`` pair (``w0..w3``,
    :func:`.tetra48_decode.decode_block64`; a constant block choice, so the field selects fold
    away) as :func:`f16_words` operands: per section the doubled even and odd nibbles
    (``2h`` in each byte), the offset ``c = −1038 − p`` (every coordinate is ``2h − 14 − p``)
    in both halves of ``c2``, and the scale ``centroid[g] · (1/‖y‖)`` — the norm is the stored
    shell's, ``‖y‖² = 16 m``, ``1/‖y‖`` the table's as for the other layouts. Returns
    ``(e1, o1, e2, o2, e3, o3, c2, scale)``."""
    odd = tl.full(w0.shape, ODD, tl.int1)
    h1, h2, h3, p, g, m = decode_block64(w0, w1, w2, w3, odd, tab_ptr, base, sb_rep * 4, USE_ASM)
    c2 = p.to(tl.int32) * 0x00010001 + T64_OFFSET
    scale = (tl.where(g.to(tl.int32) != 0, cent1, cent0)
             * inv_norm(m.to(tl.int32) * 16, tab_ptr, base, sb_rep, USE_ASM))
    return ((h1 << 1) & 0x1E1E1E1E, (h1 >> 3) & 0x1E1E1E1E, (h2 << 1) & 0x1E1E1E1E,
            (h2 >> 3) & 0x1E1E1E1E, (h3 << 1) & 0x1E1E1E1E, (h3 >> 3) & 0x1E1E1E1E, c2, scale)


@triton.jit
def _dequant_block(lo, hi, cent0, cent1, tab_ptr, base, sb_rep, out, step, ok,
                   VEC: tl.constexpr, USE_ASM: tl.constexpr):
    """Decode one block per element and store its 24 float16 values: section ``s`` (8 values,
    16 bytes) at ``out + s · step`` (int32 units)."""
    e1, o1, e2, o2, e3, o3, scale = block_values(lo, hi, cent0, cent1, tab_ptr, base, sb_rep,
                                                 USE_ASM)
    _store_block(e1, o1, e2, o2, e3, o3, scale, out, step, ok, VEC, USE_ASM)


@triton.jit
def _dequant_block64(w0, w1, w2, w3, ODD: tl.constexpr, cent0, cent1, tab_ptr, base, sb_rep,
                     out, step, ok, VEC: tl.constexpr, USE_ASM: tl.constexpr):
    """:func:`_dequant_block` for the even (``ODD`` False) or odd block of a ``tetra64`` pair
    (:func:`block_values64`)."""
    e1, o1, e2, o2, e3, o3, c2, scale = block_values64(w0, w1, w2, w3, ODD, cent0, cent1,
                                                       tab_ptr, base, sb_rep, USE_ASM)
    a0, a1, a2, a3 = f16_words(e1, o1, c2, scale, USE_ASM)
    store_words(out, a0, a1, a2, a3, ok, VEC, USE_ASM)
    b0, b1, b2, b3 = f16_words(e2, o2, c2, scale, USE_ASM)
    store_words(out + step, b0, b1, b2, b3, ok, VEC, USE_ASM)
    d0, d1, d2, d3 = f16_words(e3, o3, c2, scale, USE_ASM)
    store_words(out + 2 * step, d0, d1, d2, d3, ok, VEC, USE_ASM)


@triton.jit
def _store_block(e1, o1, e2, o2, e3, o3, scale, out, step, ok, VEC: tl.constexpr,
                 USE_ASM: tl.constexpr):
    """Store a decoded block (its value words and scale ``centroid[g] / ‖y‖``): its three
    sections (see :func:`_dequant_block`)."""
    store_eight(out, e1, o1, scale, ok, VEC, USE_ASM)
    store_eight(out + step, e2, o2, scale, ok, VEC, USE_ASM)
    store_eight(out + 2 * step, e3, o3, scale, ok, VEC, USE_ASM)


@triton.jit
def pair_items(item, n_items, NP: tl.constexpr, N_BLOCKS: tl.constexpr):
    """The (row, block pair) of each flat item ``row·NP + pair`` of a grid-stride loop: whether it
    exists, its row (0 where it does not), its pair, and whether the pair's even and odd blocks
    exist."""
    ok = item < n_items
    row = tl.where(ok, item // NP, 0)
    pair = item - (item // NP) * NP
    return ok, row, pair, ok & (pair * 2 < N_BLOCKS), ok & (pair * 2 + 1 < N_BLOCKS)


@triton.jit
def section_words(pair, H: tl.constexpr, NP: tl.constexpr, N_BLOCKS: tl.constexpr,
                  GROUPED: tl.constexpr):
    """Where block ``2·pair + H``'s three sections lie in a row of the dequantized copy, in
    int32 words (two float16 columns): ``(first, step)``, section ``s`` at ``first + s·step``.
    ``GROUPED``: the layout of ``reference.dequant_group_columns`` (groups of
    :data:`GROUP_PAIRS` pairs; per group the even blocks' sections, section-major, then the odd
    blocks'), so that consecutive lanes (pairs) hold consecutive 16-byte units; else
    block-major (block ``b`` at columns ``24 b .. 24 b + 23``). The dequantization kernels
    store there and the float16 tensor-core GEMM reads its activation from there."""
    if GROUPED:
        GP: tl.constexpr = GROUP_PAIRS
        LAST: tl.constexpr = (NP - 1) // GP
        ODD: tl.constexpr = N_BLOCKS % 2
        g = pair // GP
        j = pair - g * GP
        pg = tl.minimum(NP - g * GP, GP)
        if H == 0:
            return 24 * GP * g + 4 * j, 4 * pg
        else:
            pg_odd = pg - tl.where(g == LAST, ODD, 0)
            return 24 * GP * g + 4 * j + 12 * pg, 4 * pg_odd
    else:
        return 12 * (2 * pair + H), 4


@triton.jit
def row_centroids(cent_ptr, scale_ptr, row, ok, SCALED: tl.constexpr):
    """Row ``row``'s two gain centroids (float32; zeros where not ``ok``), times its σ_row in f32
    with ``SCALED``."""
    cent0 = tl.load(cent_ptr + row * 2, mask=ok, other=0.0)
    cent1 = tl.load(cent_ptr + row * 2 + 1, mask=ok, other=0.0)
    if SCALED:
        sigma = tl.load(scale_ptr + row, mask=ok, other=0.0)
        cent0 = cent0 * sigma
        cent1 = cent1 * sigma
    return cent0, cent1


@triton.jit
def pair_outputs(out_ptr, row, pair, NP: tl.constexpr, N_BLOCKS: tl.constexpr,
                 GROUPED: tl.constexpr, OUT_STRIDE: tl.constexpr):
    """Where a block pair's values go (int32 pointers and section steps, :func:`section_words`):
    the even block's first section and step, the odd block's. ``OUT_STRIDE``: int32 words per
    output row."""
    row_out = out_ptr + row * OUT_STRIDE
    first_e, step_e = section_words(pair, 0, NP, N_BLOCKS, GROUPED)
    first_o, step_o = section_words(pair, 1, NP, N_BLOCKS, GROUPED)
    return row_out + first_e, step_e, row_out + first_o, step_o


@triton.jit
def tetra48_dequant_kernel(w_ptr, cent_ptr, scale_ptr, tab_ptr, out_ptr, d_out,
                           N_BLOCKS: tl.constexpr, OUT_STRIDE: tl.constexpr, NW: tl.constexpr,
                           USE_ASM: tl.constexpr, VEC: tl.constexpr = False,
                           GROUPED: tl.constexpr = False, T64: tl.constexpr = False,
                           SCALED: tl.constexpr = False):
    """float16 ``[d_out, 24·N_BLOCKS]`` (written as int32 pairs, ``OUT_STRIDE`` words per row)
    from the words (``T64``: the ``tetra64`` layout); see the module docstring. ``SCALED``: each
    row's centroids are first multiplied by its σ_row (``scale_ptr``, float32 [d_out], in f32),
    so the values carry σ_row. Any grid; ``num_warps = NW``."""
    NP: tl.constexpr = (N_BLOCKS + 1) // 2
    if T64:
        STRIDE_W: tl.constexpr = 4 * NP  # tetra48.t64_stride
    else:
        STRIDE_W: tl.constexpr = ((6 * N_BLOCKS + 7) // 8) * 2
    LANES: tl.constexpr = NW * 32
    base = stage_table(tab_ptr, d_out, USE_ASM)
    e = tl.arange(0, LANES)
    sb_rep = sb_copy(e)
    n_items = d_out * NP
    for start in range(tl.program_id(0) * LANES, n_items, tl.num_programs(0) * LANES):
        ok, row, pair, ok_e, ok_o = pair_items(start + e, n_items, NP, N_BLOCKS)
        cent0, cent1 = row_centroids(cent_ptr, scale_ptr, row, ok, SCALED)
        out_e, step_e, out_o, step_o = pair_outputs(out_ptr, row, pair, NP, N_BLOCKS, GROUPED,
                                                    OUT_STRIDE)
        if T64:  # the pair's four words (rows hold all of their last pair)
            a, b, c, d = global_load128(w_ptr + row * STRIDE_W + 4 * pair, ok_e, USE_ASM)
            a = a.to(tl.uint32, bitcast=True)
            b = b.to(tl.uint32, bitcast=True)
            c = c.to(tl.uint32, bitcast=True)
            d = d.to(tl.uint32, bitcast=True)
            _dequant_block64(a, b, c, d, False, cent0, cent1, tab_ptr, base, sb_rep, out_e,
                             step_e, ok_e, VEC, USE_ASM)
            _dequant_block64(a, b, c, d, True, cent0, cent1, tab_ptr, base, sb_rep, out_o,
                             step_o, ok_o, VEC, USE_ASM)
        else:
            _dequant_pair(w_ptr, row, pair, ok_e, ok_o, cent0, cent1, tab_ptr, base, sb_rep,
                          out_e, step_e, out_o, step_o, STRIDE_W, VEC, USE_ASM)


@triton.jit
def _dequant_pair(w_ptr, row, pair, ok_e, ok_o, cent0, cent1, tab_ptr, base, sb_rep, out_e,
                  step_e, out_o, step_o, STRIDE_W: tl.constexpr, VEC: tl.constexpr,
                  USE_ASM: tl.constexpr):
    """Load and dequantize one ``tetra48`` block pair per element."""
    w0, w1, w2 = load_pair_words(w_ptr, row, pair, ok_e, ok_o, STRIDE_W)
    _dequant_block(w0, w1, cent0, cent1, tab_ptr, base, sb_rep, out_e, step_e, ok_e, VEC,
                   USE_ASM)
    _dequant_block((w1 >> 16) | (w2 << 16), w2 >> 16, cent0, cent1, tab_ptr, base, sb_rep,
                   out_o, step_o, ok_o, VEC, USE_ASM)
