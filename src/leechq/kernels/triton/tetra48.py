"""Fused Tetra decode + matvec over the ``tetra48`` layout (M = 1..8 activation rows).

Implements docs/kernels.md in Triton (our design):

* A program owns ``ROWS`` output rows (a flat [ROWS·BP] tile, see ``_tile_rows``) and walks their
  blocks two at a time (a *pair*: blocks 2i and
  2i+1 are the three aligned u32 words 3i..3i+2 of the row, so no unaligned window is ever read).
  Each iteration decodes a ``[ROWS, BP]`` tile of even blocks, then the tile of odd blocks.
* The activation arrives *prepared* (``leechq.kernels.triton.activation``): for block parity ``par``,
  trio position ``t`` and pair ``i`` the value sits at ``(par·24 + t)·NPP + i``, so the lanes of a
  warp, which own consecutive pairs, read it coalesced and no permutation happens in the hot loop.
* Decode (docs/kernels.md) without int→float conversions: the Golay pattern is two small-table
  reads (F2-linear split ``L(s8, b1) ⊕ L(b2, b3)``), the three rank rows are table reads, and each
  4-coordinate quad of a section becomes 4 biased bytes with two byte permutes (the rank nibbles
  select from the ``o = p`` and ``o = p + 2`` value tables) blended by the pattern bits; a third
  permute turns each byte into an exact float (``_bits``).
* Per block: ``dot · (centroid[g] · rsqrt(‖y‖²))`` (0 for the origin); per row at the end
  ``acc · σ_row + tail · x_tail``.

Decode-table placement is a compile-time choice (``SMEM_ROWS``): 1 stages the 16 KiB rank table in
shared memory through ``tl.gather`` (bank-conflict gathers instead of L1 line-divergent loads);
0 reads it from global memory through L1, as the author's CUDA kernel does.
"""

from __future__ import annotations

import triton
import triton.language as tl

from leechq.kernels.triton._bits import byte_to_f32, dp4a_self, prmt, spread4_bytes

# Value tables val(o, ρ) + 128 for ρ = 0..7, little-endian in two u32 (bytes 0..3, 4..7).
T_LO = (0x887C8480, 0x79857D81, 0x7A867E82, 0x877B837F)
T_HI = (0x90748C78, 0x718D7589, 0x728E768A, 0x8F738B77)


@triton.jit
def _fma_rows(d0, d1, d2, d3, d4, d5, d6, d7, v, xb, XS: tl.constexpr, MP: tl.constexpr):
    """``d_m += v · x_m`` for the MP activation rows (row m of the prepared x at ``xb + m·XS``).

    Accumulators past MP stay scalar zeros (one compile-time specialization per MP)."""
    d0 += v * tl.load(xb)
    if MP > 1:
        d1 += v * tl.load(xb + XS)
    if MP > 2:
        d2 += v * tl.load(xb + 2 * XS)
        d3 += v * tl.load(xb + 3 * XS)
    if MP > 4:
        d4 += v * tl.load(xb + 4 * XS)
        d5 += v * tl.load(xb + 5 * XS)
        d6 += v * tl.load(xb + 6 * XS)
        d7 += v * tl.load(xb + 7 * XS)
    return d0, d1, d2, d3, d4, d5, d6, d7


@triton.jit
def _section(d0, d1, d2, d3, d4, d5, d6, d7, n2, row, c, ta_lo, ta_hi, tb_lo, tb_hi, xb,
             NPP: tl.constexpr, XS: tl.constexpr, MP: tl.constexpr, K: tl.constexpr,
             USE_ASM: tl.constexpr):
    """Section K (trio positions 8K..8K+7): rank row ``row``, pattern byte ``c``.

    Each half is a quad: two byte permutes look the 4 rank nibbles up in the ``o = p`` and
    ``o = p + 2`` tables, the pattern bits pick per byte, then each byte becomes a float."""
    for h in tl.static_range(2):
        sel = row >> (16 * h)
        a = prmt(ta_lo, ta_hi, sel, USE_ASM)
        b = prmt(tb_lo, tb_hi, sel, USE_ASM)
        m = spread4_bytes((c >> (4 * h)) & 15, USE_ASM)
        q = (a & ~m) | (b & m)
        for i in tl.static_range(4):
            v = byte_to_f32(q, i, USE_ASM)
            d0, d1, d2, d3, d4, d5, d6, d7 = _fma_rows(
                d0, d1, d2, d3, d4, d5, d6, d7, v, xb + (8 * K + 4 * h + i) * NPP, XS, MP
            )
        n2 = dp4a_self(q, n2, USE_ASM)
    return d0, d1, d2, d3, d4, d5, d6, d7, n2


@triton.jit
def _gather_rows(rows_ptr, rows_src, i1, i2, i3, SMEM_ROWS: tl.constexpr):
    """The three rank rows of a 1-D tile of blocks."""
    if SMEM_ROWS:
        n: tl.constexpr = i1.shape[0]
        # One gather (one staging of the table in shared memory) for the three rows. tl.join adds
        # a last axis: idx[e, j, a] is (i1, i2)[j] for a = 0 and (i3, i3)[j] for a = 1.
        idx = tl.join(tl.join(i1, i2), tl.join(i3, i3))
        got = tl.gather(rows_src, tl.reshape(idx, (4 * n,)).to(tl.int32), 0)
        g12, g33 = tl.split(tl.reshape(got, (n, 2, 2)))
        r1, r2 = tl.split(g12)
        r3, _dup = tl.split(g33)
    else:
        r1 = tl.load(rows_ptr + i1)
        r2 = tl.load(rows_ptr + i2)
        r3 = tl.load(rows_ptr + i3)
    return r1.to(tl.uint32), r2.to(tl.uint32), r3.to(tl.uint32)


@triton.jit
def _block_pass(a0, a1, a2, a3, a4, a5, a6, a7, lo, hi, cent0, cent1, rows_ptr, rows_src, cw_ptr,
                xb, NPP: tl.constexpr, XS: tl.constexpr, MP: tl.constexpr, USE_ASM: tl.constexpr,
                SMEM_ROWS: tl.constexpr):
    """Decode one tile of blocks (words ``lo``/``hi``: uint32 [ROWS, BP]) and accumulate
    ``a_m += dot_m · centroid[g] · rsqrt(‖y‖²)`` (0 for the origin)."""
    p = lo & 1
    r = (lo >> 1) & 1
    cwa = tl.load(cw_ptr + ((lo >> 2) & 127)).to(tl.uint32)
    cwb = tl.load(cw_ptr + 128 + (((lo >> 20) & 15) | ((hi & 8) << 1))).to(tl.uint32)
    c = cwa ^ cwb
    i1 = ((lo >> 9) & 2047) | (r << 11)
    i2 = ((lo >> 24) & 255) | ((hi & 7) << 8)
    dl = (i2 >= 1240).to(tl.uint32)
    i2 = i2 + dl * 808
    i3 = ((hi >> 4) & 2047) | ((p ^ r ^ dl) << 11)
    g = (hi >> 15) & 1
    r1, r2, r3 = _gather_rows(rows_ptr, rows_src, i1, i2, i3, SMEM_ROWS)
    odd = p != 0
    ta_lo = tl.where(odd, tl.full(lo.shape, 0x79857D81, tl.uint32),
                     tl.full(lo.shape, 0x887C8480, tl.uint32))
    ta_hi = tl.where(odd, tl.full(lo.shape, 0x718D7589, tl.uint32),
                     tl.full(lo.shape, 0x90748C78, tl.uint32))
    tb_lo = tl.where(odd, tl.full(lo.shape, 0x877B837F, tl.uint32),
                     tl.full(lo.shape, 0x7A867E82, tl.uint32))
    tb_hi = tl.where(odd, tl.full(lo.shape, 0x8F738B77, tl.uint32),
                     tl.full(lo.shape, 0x728E768A, tl.uint32))
    z = tl.zeros(lo.shape, tl.float32)
    d0 = z
    d1 = 0.0
    d2 = 0.0
    d3 = 0.0
    d4 = 0.0
    d5 = 0.0
    d6 = 0.0
    d7 = 0.0
    if MP > 1:
        d1 = z
    if MP > 2:
        d2 = z
        d3 = z
    if MP > 4:
        d4 = z
        d5 = z
        d6 = z
        d7 = z
    n2 = tl.zeros(lo.shape, tl.int32)
    d0, d1, d2, d3, d4, d5, d6, d7, n2 = _section(
        d0, d1, d2, d3, d4, d5, d6, d7, n2, r1, c & 255, ta_lo, ta_hi, tb_lo, tb_hi, xb,
        NPP, XS, MP, 0, USE_ASM)
    d0, d1, d2, d3, d4, d5, d6, d7, n2 = _section(
        d0, d1, d2, d3, d4, d5, d6, d7, n2, r2, (c >> 8) & 255, ta_lo, ta_hi, tb_lo, tb_hi, xb,
        NPP, XS, MP, 1, USE_ASM)
    d0, d1, d2, d3, d4, d5, d6, d7, n2 = _section(
        d0, d1, d2, d3, d4, d5, d6, d7, n2, r3, (c >> 16) & 255, ta_lo, ta_hi, tb_lo, tb_hi, xb,
        NPP, XS, MP, 2, USE_ASM)
    cent = tl.where(g != 0, cent1, cent0)
    scale = tl.where(n2 > 0, cent * tl.math.rsqrt(tl.maximum(n2.to(tl.float32), 1.0)), 0.0)
    a0 += d0 * scale
    if MP > 1:
        a1 += d1 * scale
    if MP > 2:
        a2 += d2 * scale
        a3 += d3 * scale
    if MP > 4:
        a4 += d4 * scale
        a5 += d5 * scale
        a6 += d6 * scale
        a7 += d7 * scale
    return a0, a1, a2, a3, a4, a5, a6, a7


@triton.jit
def _finish_row(acc, m, sig, tw, tc, rows, row_ok, xp_ptr, y_ptr, stride_ym, M: tl.constexpr,
                NPP: tl.constexpr, XS: tl.constexpr, ROWS: tl.constexpr, BP: tl.constexpr):
    """Row result ``Σ_blocks · σ_row + tail · x_tail`` for activation row m, stored if m < M.

    ``acc`` is the flat [ROWS·BP] tile (element ``r·BP + i``: row r, pair column i)."""
    if m < M:
        out = tl.sum(tl.reshape(acc, (ROWS, BP)), axis=1) * sig
        xt = tl.load(xp_ptr + m * XS + 48 * NPP + tc)
        out += tl.sum(tw * xt[None, :], axis=1)
        tl.store(y_ptr + m * stride_ym + rows, out, mask=row_ok)


@triton.jit
def _tile_rows(pid, d_out, ROWS: tl.constexpr, BP: tl.constexpr):
    """The flat tile: element e = r·BP + i is row ``pid·ROWS + r``, pair column i.

    A 1-D tile has one layout whatever the compiler version: thread t of a CTA holds the elements
    t, t + 32·W, … — with BP = 32 that is one pair column (its lane) of ROWS/W rows, so each
    activation value it loads serves all of them."""
    e = tl.arange(0, ROWS * BP)
    r = pid * ROWS + e // BP
    ok = r < d_out
    return tl.where(ok, r, 0), ok, e % BP


@triton.jit
def _epilogue(a0, a1, a2, a3, a4, a5, a6, a7, pid, d_out, scale_ptr, tail_ptr, xp_ptr, y_ptr,
              stride_ym, TAIL_COLS: tl.constexpr, M: tl.constexpr, NPP: tl.constexpr,
              XS: tl.constexpr, ROWS: tl.constexpr, BP: tl.constexpr):
    rows = pid * ROWS + tl.arange(0, ROWS)
    row_ok = rows < d_out
    rows_c = tl.where(row_ok, rows, 0)
    sig = tl.load(scale_ptr + rows_c)
    tc = tl.arange(0, 32)
    tw = tl.load(tail_ptr + rows_c[:, None] * TAIL_COLS + tc[None, :],
                 mask=row_ok[:, None] & (tc < TAIL_COLS)[None, :], other=0.0)
    _finish_row(a0, 0, sig, tw, tc, rows, row_ok, xp_ptr, y_ptr, stride_ym, M, NPP, XS, ROWS, BP)
    _finish_row(a1, 1, sig, tw, tc, rows, row_ok, xp_ptr, y_ptr, stride_ym, M, NPP, XS, ROWS, BP)
    _finish_row(a2, 2, sig, tw, tc, rows, row_ok, xp_ptr, y_ptr, stride_ym, M, NPP, XS, ROWS, BP)
    _finish_row(a3, 3, sig, tw, tc, rows, row_ok, xp_ptr, y_ptr, stride_ym, M, NPP, XS, ROWS, BP)
    _finish_row(a4, 4, sig, tw, tc, rows, row_ok, xp_ptr, y_ptr, stride_ym, M, NPP, XS, ROWS, BP)
    _finish_row(a5, 5, sig, tw, tc, rows, row_ok, xp_ptr, y_ptr, stride_ym, M, NPP, XS, ROWS, BP)
    _finish_row(a6, 6, sig, tw, tc, rows, row_ok, xp_ptr, y_ptr, stride_ym, M, NPP, XS, ROWS, BP)
    _finish_row(a7, 7, sig, tw, tc, rows, row_ok, xp_ptr, y_ptr, stride_ym, M, NPP, XS, ROWS, BP)


@triton.jit
def tetra48_matvec_kernel(
    xp_ptr, w_ptr, scale_ptr, cent_ptr, tail_ptr, rows_ptr, cw_ptr, y_ptr, stride_ym, d_out,
    N_BLOCKS: tl.constexpr, TAIL_COLS: tl.constexpr, M: tl.constexpr, ROWS: tl.constexpr,
    BP: tl.constexpr, USE_ASM: tl.constexpr, SMEM_ROWS: tl.constexpr,
):
    """One program: ``ROWS`` output rows × all their blocks, for M ≤ 8 activation rows.

    Shapes are compile-time constants (one specialization per ``d_in``), so every activation
    address is a base plus an immediate; the prepared activation (MP rows, zero padded) is read
    without masks."""
    NP: tl.constexpr = (N_BLOCKS + 1) // 2
    NPP: tl.constexpr = ((NP + 63) // 64) * 64
    XS: tl.constexpr = 48 * NPP + 32
    STRIDE_W: tl.constexpr = ((6 * N_BLOCKS + 7) // 8) * 2
    MP: tl.constexpr = 1 if M == 1 else (2 if M == 2 else (4 if M <= 4 else 8))
    pid = tl.program_id(0)
    rows_c, row_ok, pi = _tile_rows(pid, d_out, ROWS, BP)
    cent0 = tl.load(cent_ptr + rows_c * 2)
    cent1 = tl.load(cent_ptr + rows_c * 2 + 1)
    if SMEM_ROWS:
        rows_src = tl.load(rows_ptr + tl.arange(0, 4096))
    else:
        rows_src = rows_ptr
    z = tl.zeros((ROWS * BP,), tl.float32)
    a0 = z
    a1 = z
    a2 = z
    a3 = z
    a4 = z
    a5 = z
    a6 = z
    a7 = z
    wrow = w_ptr + rows_c * STRIDE_W
    for p0 in range(0, NP, BP):
        pair = p0 + pi
        ok_e = row_ok & (pair * 2 < N_BLOCKS)
        ok_o = row_ok & (pair * 2 + 1 < N_BLOCKS)
        pw = wrow + 3 * pair
        w0 = tl.load(pw, mask=ok_e, other=0).to(tl.uint32)
        w1 = tl.load(pw + 1, mask=ok_e, other=0).to(tl.uint32)
        w2 = tl.load(pw + 2, mask=ok_o, other=0).to(tl.uint32)
        # even blocks (x parity 0), then odd blocks, whose word starts in the middle of w1
        xb = xp_ptr + pair
        a0, a1, a2, a3, a4, a5, a6, a7 = _block_pass(
            a0, a1, a2, a3, a4, a5, a6, a7, w0, w1, cent0, cent1, rows_ptr, rows_src, cw_ptr,
            xb, NPP, XS, MP, USE_ASM, SMEM_ROWS)
        a0, a1, a2, a3, a4, a5, a6, a7 = _block_pass(
            a0, a1, a2, a3, a4, a5, a6, a7, (w1 >> 16) | (w2 << 16), w2 >> 16, cent0, cent1,
            rows_ptr, rows_src, cw_ptr, xb + 24 * NPP, NPP, XS, MP, USE_ASM, SMEM_ROWS)
    _epilogue(a0, a1, a2, a3, a4, a5, a6, a7, pid, d_out, scale_ptr, tail_ptr, xp_ptr, y_ptr,
              stride_ym, TAIL_COLS, M, NPP, XS, ROWS, BP)
