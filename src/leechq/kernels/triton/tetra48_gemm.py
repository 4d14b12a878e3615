"""Many-row lattice product (Tetra, and the ball codebook's ``planes14``) on float16 tensor cores,
each block decoded once per launch.

The many-row path (:mod:`.tetra48_dequant` then cuBLAS) writes a float16 copy of every matrix
and reads it back; the int8 kernel (:mod:`.tetra48_imma`) decodes once per 8-row chunk and
splits the activation into byte limbs. Here a program decodes its weight tile once into float16
values held in registers — the dequantization kernel's arithmetic
(:func:`.tetra48_dequant.block_values`, :func:`.tetra48_dequant.f16_eight`: the same float16
numbers, bit for bit, as
``reference.tetra48_dequantize_f16``) — and multiplies them against every activation row (up to
128) with ``mma.sync.m16n8k16`` (float16 × float16 → float32). No dequantized value is written.

* **Fragments.** A warp takes 16 weight rows (``RPS`` = 1 or 2 such groups per step, sharing the
  activation fragments) × 4 block pairs per step. Lane ``4g + c`` decodes pair ``c`` of rows
  ``g`` and ``g + 8``: per block (``h`` = 0 even, 1 odd) and section ``s`` four float16x2 words
  (columns ``8s + 0..7`` of the block in the dequantized column order,
  ``reference.dequant_column_order``). Words ``2q`` and ``2q + 1`` (``q`` = 0, 1) of rows
  ``g`` / ``g + 8`` are exactly the ``A`` fragment registers ``a0, a2`` / ``a1, a3`` of one MMA
  whose 16-deep ``k`` is, for each ``c``, those four columns of pair ``c`` — 12 MMAs (2 blocks
  × 3 sections × 2) per step, 8 activation rows each. The MMA's ``k`` order is thus a
  permutation of the step's 192 columns; the ``B`` fragments (lane ``4g + c``: activation row
  ``g`` of the 8-row tile, the same four columns of pair ``c``) are read from the activation
  stored in the dequantized copy's column order (``ops_dense.dense_input_order``, which the
  rotation writes): 8 consecutive columns per (block, section), one 16-byte load that serves
  ``q`` = 0 and 1.
* **Activation rows** ``M ≤ 128`` in one program: the accumulators and ``B`` fragments are
  ``[MT, NW·32]`` tensors (``MT`` = tiles of 8 rows, a power of two), each lane holding its
  ``MT`` entries, so one decoded tile meets all rows.
* **Tables and memory.** The decode table is staged in shared memory once per program (the
  batch-1 kernel's, :func:`.tetra48_m1.stage_table`); every other load and store is inline PTX
  (``_bits``), so Triton moves nothing through shared memory. The next step's weight words are
  loaded one step ahead.
* **Slices.** Programs split K in slices of ``K_PAIRS`` pairs (a multiple of 4) to fill the GPU;
  partial sums go to ``part [slices, M, d_out]`` and :func:`gemm_finalize_kernel` adds them,
  applies σ_row and the tail columns (twin ``reference.scale_and_tail``) and writes the output
  dtype.

Three layouts: Tetra's 48-bit words (``T64`` False), its ``tetra64`` pairs, and the ball
codebook's 14-byte ``planes14`` records (``P14``: seven words per record pair, decoded by the
batch-1 Planes14 decode, :func:`.planes14_m1._record_bytes`, with its table staged instead; the
same float16 numbers as ``reference.planes14_dequantize_f16``, sections in natural coordinate
order as :mod:`.planes14_dequant` stores them). Under the interpreter the MMA is emulated with
f32 products (:func:`mma_f16`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from leechq.kernels.triton._bits import global_load32, global_load128, global_store32
from leechq.kernels.triton.planes14_m1 import TABLE_PART as P14_TABLE_PART
from leechq.kernels.triton.planes14_m1 import TABLE_PARTS as P14_TABLE_PARTS
from leechq.kernels.triton.planes14_m1 import _record_bytes
from leechq.kernels.triton.tetra48_decode import sb_copy
from leechq.kernels.triton.tetra48_dequant import (
    block_values,
    block_values64,
    f16_eight,
    f16_words,
    section_words,
)
from leechq.kernels.triton.tetra48_m1 import stage_table

PAIRS_PER_STEP = tl.constexpr(4)
"""Block pairs a warp decodes per K step (one per lane ``c`` of a fragment row)."""
ROWS_PER_GROUP = tl.constexpr(16)
"""Weight rows of one MMA row group (the ``m16`` of ``m16n8k16``)."""


@triton.jit
def _f16x2_to_f32(w):
    """The two float16 halves of int32 words as float32 (low half first)."""
    lo = (w & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = ((w >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _lane_quad(u, v, NW: tl.constexpr):
    """The four float16 values of two fragment words per lane as float32 ``[MT, NW, 8, 4, 4]``
    (tile, warp, fragment row ``g``, lane column ``c``, value)."""
    MT: tl.constexpr = u.shape[0]
    ul, uh = _f16x2_to_f32(u)
    vl, vh = _f16x2_to_f32(v)
    q = tl.join(tl.join(ul, uh), tl.join(vl, vh))  # [MT, L, 2, 2]
    return tl.reshape(q, (MT, NW, 8, 4, 4))


@triton.jit
def _mma_rows_f16(alo, ahi, b0, b1, c_even, c_odd, NW: tl.constexpr):
    """Emulation of eight ``A`` rows of :func:`mma_f16`: ``C[g, 2c] + D``, ``C[g, 2c+1] + D`` per
    lane ``4g + c``, from the rows' words ``alo`` (``k`` = 2c, 2c+1) and ``ahi`` (2c+8, 2c+9)."""
    MT: tl.constexpr = b0.shape[0]
    a = tl.reshape(_lane_quad(alo, ahi, NW), (MT, NW, 8, 1, 16))
    b = tl.reshape(_lane_quad(b0, b1, NW), (MT, NW, 1, 8, 16))
    d = tl.sum(a * b, axis=4)  # [MT, NW, g, n]
    d_even, d_odd = tl.split(tl.reshape(d, (MT, NW, 8, 4, 2)))
    return (c_even + tl.reshape(d_even, (MT, NW * 32)),
            c_odd + tl.reshape(d_odd, (MT, NW * 32)))


@triton.jit
def mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, NW: tl.constexpr, USE_ASM: tl.constexpr):
    """``D = A·B + C`` of ``mma.sync.m16n8k16`` with float16 ``A``, ``B`` (two values per int32
    word, the lower ``k`` in the low half) and float32 ``C``/``D``, in PTX's fragment layout: lane
    ``4g + c`` holds ``a0 = A[g, 2c..2c+1]``, ``a1 = A[g+8, 2c..]``, ``a2 = A[g, 2c+8..]``,
    ``a3 = A[g+8, 2c+8..]``, ``b0 = B[2c..2c+1, g]``, ``b1 = B[2c+8.., g]``,
    ``c0, c1 = C[g, 2c], C[g, 2c+1]``, ``c2, c3 = C[g+8, 2c], C[g+8, 2c+1]``. ``A`` words are
    ``[NW·32]`` (one tile per warp), ``B``/``C`` ``[MT, NW·32]`` (``MT`` independent MMAs on the
    same ``A``)."""
    a0 = tl.broadcast_to(a0[None, :], b0.shape)
    a1 = tl.broadcast_to(a1[None, :], b0.shape)
    a2 = tl.broadcast_to(a2[None, :], b0.shape)
    a3 = tl.broadcast_to(a3[None, :], b0.shape)
    if USE_ASM:
        d0, d1, d2, d3 = tl.inline_asm_elementwise(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
            "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", [a0, a1, a2, a3, b0, b1, c0, c1, c2, c3],
            dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1,
        )
    else:
        d0, d1 = _mma_rows_f16(a0, a2, b0, b1, c0, c1, NW)
        d2, d3 = _mma_rows_f16(a1, a3, b0, b1, c2, c3, NW)
    return d0, d1, d2, d3


@triton.jit
def _sections(v, USE_ASM: tl.constexpr):
    """A decoded ``tetra48`` block (:func:`.tetra48_dequant.block_values`) as its three
    sections' float16x2 words (:func:`.tetra48_dequant.f16_eight`)."""
    e1, o1, e2, o2, e3, o3, scale = v
    return (f16_eight(e1, o1, scale, USE_ASM), f16_eight(e2, o2, scale, USE_ASM),
            f16_eight(e3, o3, scale, USE_ASM))


@triton.jit
def _sections64(v, USE_ASM: tl.constexpr):
    """A decoded ``tetra64`` block (:func:`.tetra48_dequant.block_values64`) as its three
    sections' float16x2 words (:func:`.tetra48_dequant.f16_words`)."""
    e1, o1, e2, o2, e3, o3, c2, scale = v
    return (f16_words(e1, o1, c2, scale, USE_ASM), f16_words(e2, o2, c2, scale, USE_ASM),
            f16_words(e3, o3, c2, scale, USE_ASM))


@triton.jit
def _record_sections(A, B, C, D, cent0, cent1, tab_ptr, base, USE_ASM: tl.constexpr):
    """One ``planes14`` record per element (bits 0..31, 32..63, 64..95, 96..111 in ``A, B, C,
    D``) as its three sections' float16x2 words: section ``s`` holds natural coordinates
    ``8s .. 8s + 7``, values ``y · centroid[g] / ‖y‖`` (:mod:`.planes14_dequant`'s numbers)."""
    quads, g, invw = _record_bytes(A, B, C, D, tab_ptr, base, True, USE_ASM)
    scale = tl.where(g != 0, cent1, cent0) * invw.to(tl.float32, bitcast=True)
    q0, q1, q2, q3, q4, q5 = quads
    return (f16_eight(q0, q1, scale, USE_ASM), f16_eight(q2, q3, scale, USE_ASM),
            f16_eight(q4, q5, scale, USE_ASM))


@triton.jit
def pair_fragments(words, cent0, cent1, tab_ptr, base, sb_rep, T64: tl.constexpr,
                   USE_ASM: tl.constexpr, P14: tl.constexpr = False):
    """One block pair per element decoded to float16x2 words: ``f[h][s][k]`` is word ``k``
    (columns ``2k``, ``2k + 1``) of section ``s`` of the pair's even (``h`` = 0) or odd block,
    values ``y · centroid[g] / ‖y‖`` as the dequantization kernels store them. ``words``: the
    pair's words (:func:`pair_words`); ``P14``: a ``planes14`` record pair (``sb_rep`` unused)."""
    if P14:
        w0, w1, w2, w3, w4, w5, w6 = words
        fe = _record_sections(w0, w1, w2, w3 & 0xFFFF, cent0, cent1, tab_ptr, base, USE_ASM)
        fo = _record_sections((w3 >> 16) | (w4 << 16), (w4 >> 16) | (w5 << 16),
                              (w5 >> 16) | (w6 << 16), w6 >> 16, cent0, cent1, tab_ptr, base,
                              USE_ASM)
        return fe, fo
    else:
        x0, x1, x2, x3 = words
        if T64:
            ve = block_values64(x0, x1, x2, x3, False, cent0, cent1, tab_ptr, base, sb_rep,
                                USE_ASM)
            vo = block_values64(x0, x1, x2, x3, True, cent0, cent1, tab_ptr, base, sb_rep,
                                USE_ASM)
            fe = _sections64(ve, USE_ASM)
            fo = _sections64(vo, USE_ASM)
        else:
            ve = block_values(x0, x1, cent0, cent1, tab_ptr, base, sb_rep, USE_ASM)
            vo = block_values((x1 >> 16) | (x2 << 16), x2 >> 16, cent0, cent1, tab_ptr, base,
                              sb_rep, USE_ASM)
            fe = _sections(ve, USE_ASM)
            fo = _sections(vo, USE_ASM)
        return fe, fo


@triton.jit
def pair_words(w_ptr, row, pair, ok_e, ok_o, STRIDE_W: tl.constexpr, T64: tl.constexpr,
               USE_ASM: tl.constexpr, P14: tl.constexpr = False):
    """The words of block pair ``pair`` of weight row ``row`` (a valid row) per element, as
    uint32: the four of a ``tetra64`` pair (zeros unless ``ok_e``), the three of a ``tetra48``
    pair (the third zero unless ``ok_o``, the odd block exists) and a copy, or with ``P14`` the
    seven of a ``planes14`` record pair (words 0..3 zero unless ``ok_e``, 4..6 unless ``ok_o``;
    word 3's high half is the odd record's)."""
    if P14:
        pw = w_ptr + row * STRIDE_W + 7 * pair
        w0 = global_load32(pw, ok_e, USE_ASM).to(tl.uint32, bitcast=True)
        w1 = global_load32(pw + 1, ok_e, USE_ASM).to(tl.uint32, bitcast=True)
        w2 = global_load32(pw + 2, ok_e, USE_ASM).to(tl.uint32, bitcast=True)
        w3 = global_load32(pw + 3, ok_e, USE_ASM).to(tl.uint32, bitcast=True)
        w4 = global_load32(pw + 4, ok_o, USE_ASM).to(tl.uint32, bitcast=True)
        w5 = global_load32(pw + 5, ok_o, USE_ASM).to(tl.uint32, bitcast=True)
        w6 = global_load32(pw + 6, ok_o, USE_ASM).to(tl.uint32, bitcast=True)
        return w0, w1, w2, w3, w4, w5, w6
    else:
        if T64:
            a, b, c, d = global_load128(w_ptr + row * STRIDE_W + 4 * pair, ok_e, USE_ASM)
        else:
            pw = w_ptr + row * STRIDE_W + 3 * pair
            a = global_load32(pw, ok_e, USE_ASM)
            b = global_load32(pw + 1, ok_e, USE_ASM)
            c = global_load32(pw + 2, ok_o, USE_ASM)
            d = c
        return (a.to(tl.uint32, bitcast=True), b.to(tl.uint32, bitcast=True),
                c.to(tl.uint32, bitcast=True), d.to(tl.uint32, bitcast=True))


@triton.jit
def _x_words(xrow, ok, pair, H: tl.constexpr, S: tl.constexpr, NP: tl.constexpr,
             N_BLOCKS: tl.constexpr, GROUPED: tl.constexpr, USE_ASM: tl.constexpr):
    """The ``B`` words of block ``H``, section ``S`` of the lane's pair: the four int32 words (8
    float16 columns at the copy's column order, :func:`.tetra48_dequant.section_words`) of
    activation row ``xrow`` (int32 pointers ``[MT, L]``); zeros where not ``ok``."""
    first, step = section_words(pair, H, NP, N_BLOCKS, GROUPED)
    col = first + S * step
    return global_load128(xrow + col[None, :], ok, USE_ASM)


@triton.jit
def _section_mmas(acc, wg, wh, u, NW: tl.constexpr, USE_ASM: tl.constexpr):
    """The two MMAs of one (block, section) of a 16-row group: ``wg`` / ``wh`` the section's
    four words (:func:`pair_fragments`) of rows ``g`` / ``g + 8``, ``u`` its ``B`` words
    (:func:`_x_words`), added to ``acc`` (``c0..c3``)."""
    c0, c1, c2, c3 = acc
    c0, c1, c2, c3 = mma_f16(wg[0], wh[0], wg[1], wh[1], u[0], u[1], c0, c1, c2, c3, NW, USE_ASM)
    c0, c1, c2, c3 = mma_f16(wg[2], wh[2], wg[3], wh[3], u[2], u[3], c0, c1, c2, c3, NW, USE_ASM)
    return c0, c1, c2, c3


@triton.jit
def _step_mmas(acc_u, acc_v, fa, fb, fc, fd, xrow, row_ok, pair, pe, po, NP: tl.constexpr,
               N_BLOCKS: tl.constexpr, GROUPED: tl.constexpr, RPS: tl.constexpr,
               NW: tl.constexpr, USE_ASM: tl.constexpr):
    """One step's 12 MMAs per 16-row group (``fa``/``fb``: fragments of rows ``g``/``g + 8``
    of the first group, ``fc``/``fd`` of the second with ``RPS = 2``): per (block, section) its
    ``B`` words, loaded once for both groups (zeros where the activation row or the block is
    absent: ``row_ok`` ``[MT, L]``, ``pe``/``po`` the even/odd block of the lane's pair)."""
    for h in tl.static_range(2):
        if h == 0:  # noqa: SIM108 (statements: a constexpr branch in any Triton version)
            ok = row_ok & pe[None, :]
        else:
            ok = row_ok & po[None, :]
        for s in tl.static_range(3):
            u = _x_words(xrow, ok, pair, h, s, NP, N_BLOCKS, GROUPED, USE_ASM)
            acc_u = _section_mmas(acc_u, fa[h][s], fb[h][s], u, NW, USE_ASM)
            if RPS == 2:
                acc_v = _section_mmas(acc_v, fc[h][s], fd[h][s], u, NW, USE_ASM)
    return acc_u, acc_v


@triton.jit
def _row_cents(cent_ptr, row, ok, USE_ASM: tl.constexpr):
    """The two centroids of weight row ``row`` (float32; zeros where not ``ok``)."""
    c0 = global_load32(cent_ptr + row * 2, ok, USE_ASM).to(tl.float32, bitcast=True)
    c1 = global_load32(cent_ptr + row * 2 + 1, ok, USE_ASM).to(tl.float32, bitcast=True)
    return c0, c1


@triton.jit
def _store_group(acc, part, row_g, n_even, d_out, m_rows, USE_ASM: tl.constexpr):
    """One row group's accumulators to ``part[n, o]`` (``n``: activation row, ``o``: weight
    row): entry ``k`` of lane ``4g + c`` in tile ``t`` is ``(o, n) = (row_g + 8·(k // 2),
    8t + 2c + k mod 2)`` (``n_even``: ``8t + 2c``, ``[MT, L]``)."""
    c0, c1, c2, c3 = acc
    og = row_g[None, :]
    oh = og + 8
    n_odd = n_even + 1
    global_store32(part + n_even * d_out + og, c0, (n_even < m_rows) & (og < d_out), USE_ASM)
    global_store32(part + n_odd * d_out + og, c1, (n_odd < m_rows) & (og < d_out), USE_ASM)
    global_store32(part + n_even * d_out + oh, c2, (n_even < m_rows) & (oh < d_out), USE_ASM)
    global_store32(part + n_odd * d_out + oh, c3, (n_odd < m_rows) & (oh < d_out), USE_ASM)


@triton.jit
def gemm_kernel(x_ptr, stride_x, w_ptr, cent_ptr, tab_ptr, part_ptr, d_out, m_rows, K_PAIRS,
                N_BLOCKS: tl.constexpr, MT: tl.constexpr, NW: tl.constexpr, RPS: tl.constexpr,
                GROUPED: tl.constexpr, T64: tl.constexpr, USE_ASM: tl.constexpr,
                P14: tl.constexpr = False):
    """Partial ``y[n, o] = Σ_b ⟨W16[o, b], x16[n, b]⟩`` (no σ_row, no tail) over K-slice
    ``program_id(1)`` (``K_PAIRS`` block pairs, a multiple of 4) for weight rows
    ``program_id(0)·16·RPS·NW ..`` and all ``m_rows ≤ 8·MT`` activation rows:
    ``part[slice, n, o]`` (float32). ``x``: the float16 activation in the dequantized copy's
    column order (``GROUPED`` or block-major) as int32 words, row stride ``stride_x`` words (a
    multiple of 4). ``w``: Tetra words (``T64``: the ``tetra64`` pairs) or, with ``P14``,
    ``planes14`` records, and ``tab`` the matching decode table. Launched with
    ``num_warps = NW``; see the module docstring."""
    NP: tl.constexpr = (N_BLOCKS + 1) // 2
    if P14:
        STRIDE_W: tl.constexpr = 7 * NP  # planes14.stride_u32
    elif T64:
        STRIDE_W: tl.constexpr = 4 * NP  # tetra48.t64_stride
    else:
        STRIDE_W: tl.constexpr = ((6 * N_BLOCKS + 7) // 8) * 2
    tl.static_assert(RPS == 1 or RPS == 2)
    if P14:
        base = stage_table(tab_ptr, d_out, USE_ASM, P14_TABLE_PARTS, P14_TABLE_PART)
    else:
        base = stage_table(tab_ptr, d_out, USE_ASM)
    e = tl.arange(0, NW * 32)
    sb_rep = sb_copy(e)
    lane = e % 32
    g = lane // 4
    c = lane % 4
    r0 = tl.program_id(0) * (NW * 16 * RPS) + (e // 32) * (16 * RPS)  # the warp's first row
    t = tl.arange(0, MT)[:, None]
    n_b = 8 * t + g[None, :]  # the activation row of this lane's B fragments
    row_ok = n_b < m_rows
    xrow = x_ptr + tl.where(row_ok, n_b, 0) * stride_x
    n_even = 8 * t + 2 * c[None, :]  # the first activation row of this lane's C entries
    ks = tl.program_id(1)
    p_start = ks * K_PAIRS
    p_stop = tl.minimum(p_start + K_PAIRS, NP)
    part = part_ptr + ks * m_rows * d_out
    # the lane's four weight rows: g, g + 8 of the first group, of the second (RPS = 2)
    ra = r0 + g
    rb = ra + 8
    rc = ra + 16
    rd = ra + 24
    oka = ra < d_out
    okb = rb < d_out
    okc = rc < d_out
    okd = rd < d_out
    ra = tl.where(oka, ra, 0)
    rb = tl.where(okb, rb, 0)
    rc = tl.where(okc, rc, 0)
    rd = tl.where(okd, rd, 0)
    ca0, ca1 = _row_cents(cent_ptr, ra, oka, USE_ASM)
    cb0, cb1 = _row_cents(cent_ptr, rb, okb, USE_ASM)
    cc0 = ca0
    cc1 = ca1
    cd0 = ca0
    cd1 = ca1
    if RPS == 2:
        cc0, cc1 = _row_cents(cent_ptr, rc, okc, USE_ASM)
        cd0, cd1 = _row_cents(cent_ptr, rd, okd, USE_ASM)
    z = tl.zeros((MT, NW * 32), tl.float32)
    acc_u = (z, z, z, z)
    acc_v = (z, z, z, z)
    # the first step's weight words; each step loads the next one's before its own decode
    pair = p_start + c
    pe = pair < p_stop
    po = pe & (2 * pair + 1 < N_BLOCKS)
    wa = pair_words(w_ptr, ra, pair, oka & pe, oka & po, STRIDE_W, T64, USE_ASM, P14)
    wb = pair_words(w_ptr, rb, pair, okb & pe, okb & po, STRIDE_W, T64, USE_ASM, P14)
    wc = wa
    wd = wb
    if RPS == 2:
        wc = pair_words(w_ptr, rc, pair, okc & pe, okc & po, STRIDE_W, T64, USE_ASM, P14)
        wd = pair_words(w_ptr, rd, pair, okd & pe, okd & po, STRIDE_W, T64, USE_ASM, P14)
    for p0 in range(p_start, p_stop, PAIRS_PER_STEP):
        pair = p0 + c
        pe = pair < p_stop
        po = pe & (2 * pair + 1 < N_BLOCKS)
        nxt = pair + PAIRS_PER_STEP
        ne = nxt < p_stop
        no = ne & (2 * nxt + 1 < N_BLOCKS)
        cur_a = wa
        cur_b = wb
        cur_c = wc
        cur_d = wd
        wa = pair_words(w_ptr, ra, nxt, oka & ne, oka & no, STRIDE_W, T64, USE_ASM, P14)
        wb = pair_words(w_ptr, rb, nxt, okb & ne, okb & no, STRIDE_W, T64, USE_ASM, P14)
        if RPS == 2:
            wc = pair_words(w_ptr, rc, nxt, okc & ne, okc & no, STRIDE_W, T64, USE_ASM, P14)
            wd = pair_words(w_ptr, rd, nxt, okd & ne, okd & no, STRIDE_W, T64, USE_ASM, P14)
        fa = pair_fragments(cur_a, ca0, ca1, tab_ptr, base, sb_rep, T64, USE_ASM, P14)
        fb = pair_fragments(cur_b, cb0, cb1, tab_ptr, base, sb_rep, T64, USE_ASM, P14)
        fc = fa
        fd = fb
        if RPS == 2:
            fc = pair_fragments(cur_c, cc0, cc1, tab_ptr, base, sb_rep, T64, USE_ASM, P14)
            fd = pair_fragments(cur_d, cd0, cd1, tab_ptr, base, sb_rep, T64, USE_ASM, P14)
        acc_u, acc_v = _step_mmas(acc_u, acc_v, fa, fb, fc, fd, xrow, row_ok, pair, pe, po, NP,
                                  N_BLOCKS, GROUPED, RPS, NW, USE_ASM)
    _store_group(acc_u, part, r0 + g, n_even, d_out, m_rows, USE_ASM)
    if RPS == 2:
        _store_group(acc_v, part, r0 + 16 + g, n_even, d_out, m_rows, USE_ASM)


@triton.jit
def gemm_finalize_kernel(part_ptr, slices, scale_ptr, xt_ptr, stride_xt, tail_ptr, out_ptr,
                         stride_o, d_out, m_rows, TAIL: tl.constexpr, TP: tl.constexpr,
                         BO: tl.constexpr, BM: tl.constexpr):
    """``out[n, o] = σ[o] · Σ_k part[k, n, o] + Σ_t f32(xt[n, t]) · tail[o, t]`` (twin
    ``reference.scale_and_tail`` of the summed slices), stored in ``out``'s dtype (row stride
    ``stride_o``): ``part`` float32 ``[slices, m_rows, d_out]``, σ float32 ``[d_out]``, the tail
    activation ``xt`` (any float, ``TAIL`` columns, row stride ``stride_xt``), ``tail`` float32
    ``[d_out, TAIL]``. Grid ``(⌈m_rows / BM⌉, ⌈d_out / BO⌉)``; the tail tile is read once per
    program for its ``BM`` rows."""
    o = tl.program_id(1) * BO + tl.arange(0, BO)
    ok = o < d_out
    scale = tl.load(scale_ptr + o, mask=ok, other=0.0)
    tt = tl.arange(0, TP)
    tok = tt < TAIL
    if TAIL > 0:
        tw = tl.load(tail_ptr + o[:, None] * TAIL + tt[None, :], mask=ok[:, None] & tok[None, :],
                     other=0.0)
    for i in range(BM):
        m = tl.program_id(0) * BM + i
        o_ok = ok & (tl.zeros([BO], tl.int32) + m < m_rows)
        acc = tl.zeros([BO], tl.float32)
        for k in range(slices):
            acc += tl.load(part_ptr + (k * m_rows + m) * d_out + o, mask=o_ok, other=0.0)
        y = acc * scale
        if TAIL > 0:
            t_ok = tok & (tl.zeros([TP], tl.int32) + m < m_rows)
            xt = tl.load(xt_ptr + m * stride_xt + tt, mask=t_ok, other=0.0).to(tl.float32)
            y = y + tl.sum(tw * xt[None, :], axis=1)
        tl.store(out_ptr + m * stride_o + o, y.to(out_ptr.dtype.element_ty), mask=o_ok)
