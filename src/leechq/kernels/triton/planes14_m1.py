"""The Planes14 decode of the ``m1`` kernel: integer block dot for the ball codebook.

Implements docs/kernels.md (the 14-byte bit-plane record, the 512-entry class
table) in the geometry of :mod:`.tetra48_m1` (activation-stationary split-K, one K-slice of 32
record pairs per program, row chunks walked by the warps, partials in a scratch reduced by the last
program of a chunk through an acq_rel ticket) and with its integer block dot: each block's 24
activation values are one exponent and 24-bit integers in three byte limbs (:func:`.tetra48_m1.
_x_limbs`), and the record's signed value bytes meet them with ``dp4a`` (3 limbs × 6 quads).

* **Activation order.** The limb words of :func:`.tetra48_m1._x_limbs` pack prepared coordinates
  ``8k + 2j + h`` (``j = 0..3``) as word ``(k, h)``. The record's quad ``q`` holds natural
  coordinates ``4q .. 4q + 3``; with the activation prepared in ``tables.planes14_m1_order``
  (``order[8k + 2j + h] = 8k + 4h + j``) word ``(k, h)`` is quad ``2k + h``.
* **Decode per record**: the class entry in its signed form (``tables.planes14_signed_classes``:
  the magnitudes of levels 0..3 as bytes, their negatives, level 4's magnitude and negative,
  ``1/√(16 m)``; one 16-byte read of the table staged in shared memory) and the planes regrouped
  by quad parity (:func:`_plane_bytes`); per quad one permute gathers the three level-plane
  nibbles that index the byte-permute selector, one permute reads the positive value bytes and
  one the negative ones, and the sign plane picks between them: signed value bytes, no bias to
  remove. Offline SASS (Triton 3.6, sm_90): 131.5 instructions per block (159 as timed below).
* Block: ``dot · centroid[g] · invnorm[class] · E_b``; row: the fixup applies ``σ_row`` and the
  tail (:func:`.tetra48_m1._ticket_fixup`).
* **The kernel** is :func:`.tetra48_m1.m1_kernel` with ``CODE = PLANES14`` (its loop, geometry,
  prefetch, scratch and tickets; this module gives the words it loads, :func:`load_row`, and the
  pair dot, :func:`pair_dot`). Several activation rows per launch (``MB`` 2 or 4) share each
  record's decode: offline SASS 86 and 56 instructions per row and block (one row: 131.5);
  the default for 2..8 rows (``ops.planes14_matvec``).

The result differs from the f32 reference only by the activation rounding (≤ 2^-23 of each block's
largest value) and f32 accumulation. The default for 1..8 activation rows of a Planes14 record
(``ops.planes14_matvec``, row groups as Tetra's). H200, Qwen3-8B projections, cuBLAS
fp16 ≈ 4.7 ms: one row 3.37 ms with this decode (3.85 with the earlier 159-instruction one),
against the tiled kernel's 5.41; M = 2, 4, 8: 4.26, 6.80, 13.10 ms against 5.44, 9.92, 14.57.
"""

from __future__ import annotations

import triton
import triton.language as tl

from leechq.kernels.triton._bits import (
    dp4a,
    prmt,
    spread4_bytes,
    table_load32,
    table_load128,
)
from leechq.kernels.triton.planes14 import load_record_pair, record_fields

TABLE_PARTS = tl.constexpr(3)
TABLE_PART = tl.constexpr(2048)
"""The staged table is copied into shared memory in ``TABLE_PARTS`` parts of ``TABLE_PART`` words
(``tetra48_m1.stage_table``)."""
TABLE_WORDS = tl.constexpr(3 * 2048)  # TABLE_PARTS · TABLE_PART
"""The staged table (``tables.planes14_m1_table``, 6144 words): the class table, 512 entries × 4
words (its signed form, ``tables.planes14_signed_classes``), then the 4096 level selectors."""
SELECTOR_WORD = tl.constexpr(2048)  # tables.P14_SELECTOR_WORD


@triton.jit
def _plane_bytes(p0, p1, p2, sgn):
    """The level and sign planes regrouped by quad parity: byte ``j`` of ``ev01`` holds the
    plane-0 and plane-1 nibbles of quad ``2j`` (plane 1 in the high half), of ``ev2`` its plane-2
    nibble, of ``sev`` its sign nibble; ``od01``, ``od2`` and ``sod`` the same for quad ``2j + 1``.
    Byte 3 of each is zero (24-bit planes)."""
    ev01 = (p0 & 0x0F0F0F) | ((p1 << 4) & 0xF0F0F0)
    od01 = ((p0 >> 4) & 0x0F0F0F) | (p1 & 0xF0F0F0)
    return (ev01, od01, p2 & 0x0F0F0F, (p2 >> 4) & 0x0F0F0F, sgn & 0x0F0F0F,
            (sgn >> 4) & 0x0F0F0F)


@triton.jit
def _quad_bytes(bits, planes, vals, tab_ptr, base, Q: tl.constexpr, SEL_TABLE: tl.constexpr,
                USE_ASM: tl.constexpr):
    """Signed value bytes of quad ``Q`` (coordinates 4Q..4Q+3) of one record per element
    (``bits``: the planes ``p0, p1, p2, sgn``; ``planes``: :func:`_plane_bytes` of them;
    ``vals``: the class entry's positive and negative level bytes and level 4's word and that
    word ``>> 8``). The byte-permute selector (nibble i = level of coordinate i) comes from the
    selector table (``SEL_TABLE``: one shared load), indexed by the quad's three level-plane
    nibbles that one byte permute gathers from ``planes``, or is built from the planes in
    registers (level bytes by multiply-spread, then packed by a byte permute)."""
    p0, p1, p2, sgn = bits
    ev01, od01, ev2, od2, sev, sod = planes
    pos4, neg4, w4, w4n = vals
    J: tl.constexpr = Q // 2
    if SEL_TABLE:
        # byte 0: planes 0 and 1 of the quad, byte 1: plane 2, bytes 2-3: byte 3 (zero)
        gather = tl.full(p0.shape, J | ((4 + J) << 4) | 0x3300, tl.uint32)
        u = prmt(ev01, ev2, gather, USE_ASM) if Q % 2 == 0 else prmt(od01, od2, gather, USE_ASM)
        sel = table_load32(tab_ptr, base, SELECTOR_WORD + u, USE_ASM)
        # the sign nibble: byte J of its parity's sign word, zeros above
        pick = tl.full(p0.shape, J | 0x3330, tl.uint32)
        nib = prmt(sev, sev, pick, USE_ASM) if Q % 2 == 0 else prmt(sod, sod, pick, USE_ASM)
    else:
        b0 = (((p0 >> (4 * Q)) & 15) * 0x00204081) & 0x01010101
        b1 = (((p1 >> (4 * Q)) & 15) * 0x00204081) & 0x01010101
        b2 = (((p2 >> (4 * Q)) & 15) * 0x00204081) & 0x01010101
        lev = b0 | (b1 << 1) | (b2 << 2)  # level = P2 ? 4 : P0 + 2·P1, one byte per coordinate
        lev = lev | (lev >> 4)
        sel = prmt(lev, lev, tl.full(lev.shape, 0x0020, tl.uint32), USE_ASM)
        nib = (sgn >> (4 * Q)) & 15
    pos = prmt(pos4, w4, sel, USE_ASM)
    neg = prmt(neg4, w4n, sel, USE_ASM)
    m = spread4_bytes(nib, USE_ASM)
    return (pos & ~m) | (neg & m)


@triton.jit
def _quad_dot(qb, la, lb, lc, acc0, acc1, acc2, USE_ASM: tl.constexpr, A16: tl.constexpr):
    """The three limb sums of one quad (signed value bytes ``qb`` against limb words ``la..lc``;
    ``A16``: limb 0 is zero, its sum stays ``acc0``)."""
    if not A16:
        acc0 = dp4a(qb, la, acc0, False, USE_ASM)
    acc1 = dp4a(qb, lb, acc1, False, USE_ASM)
    acc2 = dp4a(qb, lc, acc2, True, USE_ASM)
    return acc0, acc1, acc2


@triton.jit
def _record_bytes(A, B, C, D, tab_ptr, base, SEL_TABLE: tl.constexpr, USE_ASM: tl.constexpr):
    """The signed value bytes of one record per element (record bits 0..31, 32..63, 64..95,
    96..111 in ``A, B, C, D``: uint32), its six quads as a tuple, with its gain bit and the f32
    bits of ``1/‖y‖``."""
    cid, g, sgn, p0, p1, p2 = record_fields(A, B, C, D)
    pos4, neg4, w4, invw = table_load128(tab_ptr, base, cid * 4, USE_ASM)
    bits = (p0, p1, p2, sgn)
    planes = _plane_bytes(p0, p1, p2, sgn)
    vals = (pos4, neg4, w4, w4 >> 8)  # w4 >> 8: level 4's negative in byte 0
    quads = (_quad_bytes(bits, planes, vals, tab_ptr, base, 0, SEL_TABLE, USE_ASM),
             _quad_bytes(bits, planes, vals, tab_ptr, base, 1, SEL_TABLE, USE_ASM),
             _quad_bytes(bits, planes, vals, tab_ptr, base, 2, SEL_TABLE, USE_ASM),
             _quad_bytes(bits, planes, vals, tab_ptr, base, 3, SEL_TABLE, USE_ASM),
             _quad_bytes(bits, planes, vals, tab_ptr, base, 4, SEL_TABLE, USE_ASM),
             _quad_bytes(bits, planes, vals, tab_ptr, base, 5, SEL_TABLE, USE_ASM))
    return quads, g, invw


@triton.jit
def _row_dot(quads, x, USE_ASM: tl.constexpr, A16: tl.constexpr = False):
    """``⟨y, x⟩ / E_b`` (int32) of one record per element from its value bytes ``quads`` and one
    activation row's limb words ``x`` (:func:`.tetra48_m1._x_limbs`, read in the order of
    ``tables.planes14_m1_order``: limb word ``(k, h)`` is quad ``2k + h``; ``A16``: the limb-0
    words are zero and skipped)."""
    (_e, a00, a01, a10, a11, a20, a21, b00, b01, b10, b11, b20, b21,
     c00, c01, c10, c11, c20, c21) = x
    q0, q1, q2, q3, q4, q5 = quads
    z = tl.zeros(q0.shape, tl.int32)
    acc0, acc1, acc2 = _quad_dot(q0, a00, b00, c00, z, z, z, USE_ASM, A16)
    acc0, acc1, acc2 = _quad_dot(q1, a01, b01, c01, acc0, acc1, acc2, USE_ASM, A16)
    acc0, acc1, acc2 = _quad_dot(q2, a10, b10, c10, acc0, acc1, acc2, USE_ASM, A16)
    acc0, acc1, acc2 = _quad_dot(q3, a11, b11, c11, acc0, acc1, acc2, USE_ASM, A16)
    acc0, acc1, acc2 = _quad_dot(q4, a20, b20, c20, acc0, acc1, acc2, USE_ASM, A16)
    acc0, acc1, acc2 = _quad_dot(q5, a21, b21, c21, acc0, acc1, acc2, USE_ASM, A16)
    if A16:
        return (acc2 << 16) + (acc1 << 8)
    return (acc2 << 16) + (acc1 << 8) + acc0


@triton.jit
def _record_dot(A, B, C, D, cent0, cent1, tab_ptr, base, x0, x1, x2, x3, MB: tl.constexpr,
                SEL_TABLE: tl.constexpr, USE_ASM: tl.constexpr, A16: tl.constexpr = False):
    """``⟨y, x_m⟩ · centroid[g] / ‖y‖`` of one record per element for the first ``MB`` (1, 2 or
    4) activation rows ``m`` (one decode, 18 ``dp4a`` per row; the unused results repeat row 0)."""
    quads, g, invw = _record_bytes(A, B, C, D, tab_ptr, base, SEL_TABLE, USE_ASM)
    scale = tl.where(g != 0, cent1, cent0) * invw.to(tl.float32, bitcast=True)
    d0 = _row_dot(quads, x0, USE_ASM, A16).to(tl.float32) * (scale * x0[0])
    d1 = d0
    d2 = d0
    d3 = d0
    if MB >= 2:
        d1 = _row_dot(quads, x1, USE_ASM, A16).to(tl.float32) * (scale * x1[0])
    if MB >= 4:
        d2 = _row_dot(quads, x2, USE_ASM, A16).to(tl.float32) * (scale * x2[0])
        d3 = _row_dot(quads, x3, USE_ASM, A16).to(tl.float32) * (scale * x3[0])
    return d0, d1, d2, d3


@triton.jit
def pair_dot(words, cent0, cent1, tab_ptr, base, xs, MB: tl.constexpr, SEL_TABLE: tl.constexpr,
             USE_ASM: tl.constexpr, A16: tl.constexpr = False):
    """The sums of the two record dots of a record pair (its seven words ``words``) for each of
    the ``MB`` activation rows (``xs``: the rows' even- and odd-block limbs,
    :func:`.tetra48_m1._row_limbs`)."""
    w0, w1, w2, w3, w4, w5, w6 = words
    (xe0, xo0, xe1, xo1, xe2, xo2, xe3, xo3) = xs
    e0, e1, e2, e3 = _record_dot(w0, w1, w2, w3 & 0xFFFF, cent0, cent1, tab_ptr, base, xe0, xe1,
                                 xe2, xe3, MB, SEL_TABLE, USE_ASM, A16)
    o0, o1, o2, o3 = _record_dot((w3 >> 16) | (w4 << 16), (w4 >> 16) | (w5 << 16),
                                 (w5 >> 16) | (w6 << 16), w6 >> 16, cent0, cent1, tab_ptr, base,
                                 xo0, xo1, xo2, xo3, MB, SEL_TABLE, USE_ASM, A16)
    return e0 + o0, e1 + o1, e2 + o2, e3 + o3


@triton.jit
def load_row(r_ptr, cent_ptr, rows, pair, d_out, ok_e, ok_o, STRIDE: tl.constexpr):
    """The seven words of each element's record pair (a tuple) and its row's centroid pair (zeros
    past ``d_out`` or past the last record; issued one trip ahead of their use)."""
    row_ok = rows < d_out
    rc = tl.where(row_ok, rows, 0)
    words = load_record_pair(r_ptr + rc * STRIDE + 7 * pair, row_ok & ok_e, row_ok & ok_o)
    return words, tl.load(cent_ptr + rc * 2), tl.load(cent_ptr + rc * 2 + 1)
