"""Fused Planes14 decode + matvec (ball codebook, 14-byte bit-plane records), M = 1..8.

Implements docs/kernels.md in Triton with the program geometry of
``leechq.kernels.triton.tetra48``: ``ROWS`` output rows per program, records two at a time (a pair
of 14-byte records is 7 aligned u32 words of the row), even records then odd records, activation
prepared in natural order. Per record: one gather of the class entry (``128 + magnitude`` of levels
0..3 and of level 4 as bytes, and ``1/√(16 m)``); per quad of 4 coordinates the three level planes
become level bytes (multiply spread), then selector nibbles; a byte permute reads the biased
magnitudes, the sign plane chooses between ``128 + mag`` and ``128 − mag`` per byte, and each byte
becomes an exact float. Block: ``dot · centroid[g] · invnorm[class]``; row: ``· σ_row + tail``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from leechq.kernels.triton._bits import byte_to_f32, prmt, spread4_bytes
from leechq.kernels.triton.tetra48 import _epilogue, _fma_rows, _tile_rows


@triton.jit
def _level_bytes(p0, p1, p2, Q: tl.constexpr):
    """Bytes of the 4 levels of quad Q (coordinates 4Q..4Q+3): level = P2 ? 4 : P0 + 2·P1."""
    b0 = (((p0 >> (4 * Q)) & 15) * 0x00204081) & 0x01010101
    b1 = (((p1 >> (4 * Q)) & 15) * 0x00204081) & 0x01010101
    b2 = (((p2 >> (4 * Q)) & 15) * 0x00204081) & 0x01010101
    return b0 | (b1 << 1) | (b2 << 2)


@triton.jit
def record_fields(A, B, C, D):
    """The fields of a 14-byte record (bits 0..31, 32..63, 64..95, 96..111 in ``A, B, C, D``):
    class id (9 bits), gain bit, sign plane and level planes 0, 1, 2 (24 bits each)."""
    cid = A & 0x1FF
    g = (A >> 9) & 1
    sgn = ((A >> 10) | (B << 22)) & 0xFFFFFF
    p0 = (B >> 2) & 0xFFFFFF
    p1 = ((B >> 26) | (C << 6)) & 0xFFFFFF
    p2 = ((C >> 18) | (D << 14)) & 0xFFFFFF
    return cid, g, sgn, p0, p1, p2


@triton.jit
def _record_pass(a0, a1, a2, a3, a4, a5, a6, a7, A, B, C, D, cent0, cent1, tab_ptr, xb,
                 NPP: tl.constexpr, XS: tl.constexpr, MP: tl.constexpr, USE_ASM: tl.constexpr):
    """Decode a tile of records (record bits 0..31, 32..63, 64..95, 96..111 in A, B, C, D)."""
    cid, g, sgn, p0, p1, p2 = record_fields(A, B, C, D)
    k0 = tl.load(tab_ptr + cid * 4).to(tl.uint32)
    k1 = tl.load(tab_ptr + cid * 4 + 1).to(tl.uint32)
    inv = tl.load(tab_ptr + cid * 4 + 2).to(tl.float32, bitcast=True)
    # 256 − b per byte (no carries: every biased magnitude byte is ≥ 128)
    n0 = (~k0) + 0x01010101
    n1 = (~k1) + 0x01010101
    z = tl.zeros(A.shape, tl.float32)
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
    for q in tl.static_range(6):
        lev = _level_bytes(p0, p1, p2, q)
        nib = lev | (lev >> 4)
        sel = prmt(nib, nib, tl.full(nib.shape, 0x0020, tl.uint32), USE_ASM)
        pos = prmt(k0, k1, sel, USE_ASM)
        neg = prmt(n0, n1, sel, USE_ASM)
        m = spread4_bytes((sgn >> (4 * q)) & 15, USE_ASM)
        qb = (pos & ~m) | (neg & m)
        for i in tl.static_range(4):
            v = byte_to_f32(qb, i, USE_ASM)
            d0, d1, d2, d3, d4, d5, d6, d7 = _fma_rows(
                d0, d1, d2, d3, d4, d5, d6, d7, v, xb + (4 * q + i) * NPP, XS, MP
            )
    scale = tl.where(g != 0, cent1, cent0) * inv
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
def load_record_pair(pw, me, mo):
    """The seven u32 words of a pair of 14-byte records at ``pw`` (uint32; zeros where the even
    record, ``me``, or the odd one, ``mo``, is absent: words 0..3 and 4..6 — word 3 is shared, its
    low half the even record's)."""
    w0 = tl.load(pw, mask=me, other=0).to(tl.uint32)
    w1 = tl.load(pw + 1, mask=me, other=0).to(tl.uint32)
    w2 = tl.load(pw + 2, mask=me, other=0).to(tl.uint32)
    w3 = tl.load(pw + 3, mask=me, other=0).to(tl.uint32)
    w4 = tl.load(pw + 4, mask=mo, other=0).to(tl.uint32)
    w5 = tl.load(pw + 5, mask=mo, other=0).to(tl.uint32)
    w6 = tl.load(pw + 6, mask=mo, other=0).to(tl.uint32)
    return w0, w1, w2, w3, w4, w5, w6


@triton.jit
def planes14_matvec_kernel(
    xp_ptr, r_ptr, scale_ptr, cent_ptr, tail_ptr, tab_ptr, y_ptr, stride_ym, d_out,
    N_BLOCKS: tl.constexpr, TAIL_COLS: tl.constexpr, M: tl.constexpr, ROWS: tl.constexpr,
    BP: tl.constexpr, USE_ASM: tl.constexpr,
):
    """One program: ``ROWS`` output rows × all their records, M ≤ 8 activation rows."""
    NP: tl.constexpr = (N_BLOCKS + 1) // 2
    NPP: tl.constexpr = ((NP + 63) // 64) * 64
    XS: tl.constexpr = 48 * NPP + 32
    STRIDE: tl.constexpr = 7 * NP
    MP: tl.constexpr = 1 if M == 1 else (2 if M == 2 else (4 if M <= 4 else 8))
    pid = tl.program_id(0)
    rows_c, row_ok, pi = _tile_rows(pid, d_out, ROWS, BP)
    cent0 = tl.load(cent_ptr + rows_c * 2)
    cent1 = tl.load(cent_ptr + rows_c * 2 + 1)
    z = tl.zeros((ROWS * BP,), tl.float32)
    a0 = z
    a1 = z
    a2 = z
    a3 = z
    a4 = z
    a5 = z
    a6 = z
    a7 = z
    rrow = r_ptr + rows_c * STRIDE
    for p0 in range(0, NP, BP):
        pair = p0 + pi
        me = row_ok & (pair * 2 < N_BLOCKS)
        mo = row_ok & (pair * 2 + 1 < N_BLOCKS)
        w0, w1, w2, w3, w4, w5, w6 = load_record_pair(rrow + 7 * pair, me, mo)
        xb = xp_ptr + pair
        a0, a1, a2, a3, a4, a5, a6, a7 = _record_pass(
            a0, a1, a2, a3, a4, a5, a6, a7, w0, w1, w2, w3 & 0xFFFF, cent0, cent1, tab_ptr, xb,
            NPP, XS, MP, USE_ASM)
        a0, a1, a2, a3, a4, a5, a6, a7 = _record_pass(
            a0, a1, a2, a3, a4, a5, a6, a7, (w3 >> 16) | (w4 << 16), (w4 >> 16) | (w5 << 16),
            (w5 >> 16) | (w6 << 16), w6 >> 16, cent0, cent1, tab_ptr, xb + 24 * NPP,
            NPP, XS, MP, USE_ASM)
    _epilogue(a0, a1, a2, a3, a4, a5, a6, a7, pid, d_out, scale_ptr, tail_ptr, xp_ptr, y_ptr,
              stride_ym, TAIL_COLS, M, NPP, XS, ROWS, BP)
