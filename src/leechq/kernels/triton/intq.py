"""Group-affine int4 / int8 kernels: matvec (M = 1..8) and embedding-row gathers.

Implements docs/kernels.md (our Triton design). Records: int4 = two codes per
byte, low nibble first, f16 scale/bias per group of 128 (projections) or 64 (tables); int8 = one code
per byte, group 64. Weights ``w = f32(s)·q + f32(b)``.

* Matvec: the packed row is read as u32 words (8 int4 or 4 int8 codes), a program owns ``ROWS`` rows
  and a tile of ``BW`` words per iteration; codes become exact floats through the ``0x4B0000qq``
  bit pattern (``_bits``); per word ``acc += s·Σ q_k x_k + b·Σ x_k`` (the group-affine algebra:
  equal to the per-weight rule up to f32 rounding, checked against the exact-weight f64 reference).
  The activation is read through a *code-transposed* copy ``xt[k][w] = x[PER·w + k]`` (PER codes per
  word) so that lanes owning consecutive words read consecutive addresses.
* Embedding: one program per (token, column tile) dequantizes with the exact two-rounding rule
  (an explicit ``mul.rn`` keeps the multiply out of an FMA on the GPU).
"""

from __future__ import annotations

import triton
import triton.language as tl

from leechq.kernels.triton._bits import prmt
from leechq.kernels.triton.tetra48 import _fma_rows


@triton.jit
def code_transpose_kernel(x_ptr, stride_xm, out_ptr, M, n, W, WP: tl.constexpr, PER: tl.constexpr,
                          BLOCK: tl.constexpr):
    """``out[m, k·WP + w] = x[m, PER·w + k]`` (zero where ``w ≥ W`` or ``m ≥ M``)."""
    m = tl.program_id(0)
    pos = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = pos < PER * WP
    k = pos // WP
    w = pos - k * WP
    ok = in_row & (w < W) & ((pos * 0 + m) < M)
    v = tl.load(x_ptr + m * stride_xm + PER * w + k, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * (PER * WP) + pos, v, mask=in_row)


@triton.jit
def _code_f32(word, K: tl.constexpr, BITS: tl.constexpr, USE_ASM: tl.constexpr):
    """Code K of a u32 word as an exact float32 (int4: even codes are the low nibbles of the bytes
    of ``word & 0x0F0F0F0F``, odd codes those of ``(word >> 4) & 0x0F0F0F0F``)."""
    if BITS == 8:
        src = word
        byte: tl.constexpr = K
    else:
        if K % 2 == 0:
            src = word & 0x0F0F0F0F
        else:
            src = (word >> 4) & 0x0F0F0F0F
        byte: tl.constexpr = K // 2
    if USE_ASM:
        magic = tl.full(word.shape, 0x4B000000, tl.uint32)
        bits = prmt(magic, src, tl.full(word.shape, 0x3004 + byte, tl.uint32), USE_ASM)
    else:
        bits = ((src >> (8 * byte)) & 0xFF) | 0x4B000000
    return bits.to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def intq_matvec_kernel(
    xt_ptr, q_ptr, s_ptr, b_ptr, y_ptr, stride_ym, d_out,
    D_IN: tl.constexpr, GROUP: tl.constexpr, BITS: tl.constexpr, M: tl.constexpr,
    ROWS: tl.constexpr, BW: tl.constexpr, USE_ASM: tl.constexpr,
):
    """``y[m, r] = Σ_c (s·q + b)[r, c] · x[m, c]`` for int4/int8 group-affine rows."""
    PER: tl.constexpr = 32 // BITS
    W: tl.constexpr = D_IN // PER
    WP: tl.constexpr = ((W + 63) // 64) * 64
    XS: tl.constexpr = PER * WP
    G: tl.constexpr = (D_IN + GROUP - 1) // GROUP
    WPG: tl.constexpr = GROUP // PER
    MP: tl.constexpr = 1 if M == 1 else (2 if M == 2 else (4 if M <= 4 else 8))
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    row_ok = rows < d_out
    rows_c = tl.where(row_ok, rows, 0)
    z = tl.zeros((ROWS, BW), tl.float32)
    a0 = z
    a1 = z
    a2 = z
    a3 = z
    a4 = z
    a5 = z
    a6 = z
    a7 = z
    ones = tl.full((1, BW), 1.0, tl.float32)
    for w0 in range(0, W, BW):
        wi = w0 + tl.arange(0, BW)
        wok = row_ok[:, None] & (wi < W)[None, :]
        word = tl.load(q_ptr + rows_c[:, None] * W + wi[None, :], mask=wok, other=0).to(tl.uint32)
        gi = rows_c[:, None] * G + (wi // WPG)[None, :]
        sc = tl.load(s_ptr + gi, mask=wok, other=0.0).to(tl.float32)
        bi = tl.load(b_ptr + gi, mask=wok, other=0.0).to(tl.float32)
        xb = xt_ptr + wi[None, :]
        q0 = z
        q1 = 0.0
        q2 = 0.0
        q3 = 0.0
        q4 = 0.0
        q5 = 0.0
        q6 = 0.0
        q7 = 0.0
        s0 = tl.zeros((1, BW), tl.float32)
        s1 = 0.0
        s2 = 0.0
        s3 = 0.0
        s4 = 0.0
        s5 = 0.0
        s6 = 0.0
        s7 = 0.0
        if MP > 1:
            q1 = z
            s1 = s0
        if MP > 2:
            q2 = z
            q3 = z
            s2 = s0
            s3 = s0
        if MP > 4:
            q4 = z
            q5 = z
            q6 = z
            q7 = z
            s4 = s0
            s5 = s0
            s6 = s0
            s7 = s0
        for k in tl.static_range(PER):
            v = _code_f32(word, k, BITS, USE_ASM)
            q0, q1, q2, q3, q4, q5, q6, q7 = _fma_rows(
                q0, q1, q2, q3, q4, q5, q6, q7, v, xb + k * WP, XS, MP)
            s0, s1, s2, s3, s4, s5, s6, s7 = _fma_rows(
                s0, s1, s2, s3, s4, s5, s6, s7, ones, xb + k * WP, XS, MP)
        a0 += sc * q0 + bi * s0
        if MP > 1:
            a1 += sc * q1 + bi * s1
        if MP > 2:
            a2 += sc * q2 + bi * s2
            a3 += sc * q3 + bi * s3
        if MP > 4:
            a4 += sc * q4 + bi * s4
            a5 += sc * q5 + bi * s5
            a6 += sc * q6 + bi * s6
            a7 += sc * q7 + bi * s7
    _store_row(a0, 0, rows, row_ok, y_ptr, stride_ym, M)
    _store_row(a1, 1, rows, row_ok, y_ptr, stride_ym, M)
    _store_row(a2, 2, rows, row_ok, y_ptr, stride_ym, M)
    _store_row(a3, 3, rows, row_ok, y_ptr, stride_ym, M)
    _store_row(a4, 4, rows, row_ok, y_ptr, stride_ym, M)
    _store_row(a5, 5, rows, row_ok, y_ptr, stride_ym, M)
    _store_row(a6, 6, rows, row_ok, y_ptr, stride_ym, M)
    _store_row(a7, 7, rows, row_ok, y_ptr, stride_ym, M)


@triton.jit
def _store_row(acc, m, rows, row_ok, y_ptr, stride_ym, M: tl.constexpr):
    if m < M:
        tl.store(y_ptr + m * stride_ym + rows, tl.sum(acc, axis=1), mask=row_ok)


@triton.jit
def _mul_rn(a, b, USE_ASM: tl.constexpr):
    """f32 multiply that is never contracted into an FMA (the exact dequant rule)."""
    if USE_ASM:
        out = tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b],
                                        dtype=tl.float32, is_pure=True, pack=1)
    else:
        out = a * b
    return out


@triton.jit
def intq_embedding_kernel(
    ids_ptr, q_ptr, s_ptr, b_ptr, out_ptr, D: tl.constexpr, GROUP: tl.constexpr,
    BITS: tl.constexpr, BLOCK: tl.constexpr, USE_ASM: tl.constexpr,
):
    """``out[t, c] = f32(s)·q + f32(b)`` for row ``ids[t]`` of a group-affine table."""
    t = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < D
    row = tl.load(ids_ptr + t).to(tl.int64)
    G: tl.constexpr = (D + GROUP - 1) // GROUP
    if BITS == 8:
        code = tl.load(q_ptr + row * D + c, mask=ok, other=0).to(tl.int32)
    else:
        byte = tl.load(q_ptr + row * (D // 2) + c // 2, mask=ok, other=0).to(tl.int32)
        code = (byte >> ((c & 1) * 4)) & 15
    s = tl.load(s_ptr + row * G + c // GROUP, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + row * G + c // GROUP, mask=ok, other=0.0).to(tl.float32)
    w = _mul_rn(s, code.to(tl.float32), USE_ASM) + b
    tl.store(out_ptr + t * D + c, w.to(out_ptr.dtype.element_ty), mask=ok)
