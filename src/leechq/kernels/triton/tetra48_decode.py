"""The Tetra block decode of the batch-1 table, for both word layouts: Triton jit helpers that
turn a block's packed words into its nibble words, value map, gain bit and norm.

Owns the table's word offsets (:data:`PA_WORD`, :data:`PB_WORD`, :data:`TABLE_WORDS`,
:data:`MID_SHIFT`; ``leechq.kernels.tables.M1_*``) and the helpers every Tetra kernel decodes
with (the batch-1 matvec :mod:`.tetra48_m1`, the int8 kernel :mod:`.tetra48_imma`, the
dequantization :mod:`.tetra48_dequant`, the GEMM :mod:`.tetra48_gemm`):

* ``tetra48`` (three uint32 words per block pair, 48 bits per block): :func:`decode_nibbles`
  (``h = f[row] ^ PA[s8] ^ PB[b1, b2, b3]`` per section from the staged table), the value bytes
  and ``‖y‖²`` of a section (:func:`section_values`), ``1/‖y‖`` from the table (:func:`inv_norm`)
  and the lane's pattern-table copy (:func:`sb_copy`);
* ``tetra64`` (four uint32 words per block pair, ``formats.layouts.tetra64``: the table addresses
  and shells stored): :func:`decode_block64` (16-byte pattern entries),
  :func:`decode_block64_bits_split` (the pattern-bits table with :data:`T64_PBITS` copies,
  :func:`pattern_masks`), :func:`_block_decode64` (its ``f``/``k`` words and the block's scale)
  and :func:`value_map64`.

Every helper works element-wise on same-shaped uint32 word tensors (one block or block pair per
element) and returns tensors of that shape: uint32 nibble words, int32 value maps and norms,
float32 shells and scales. The table is read through ``_bits`` (shared memory on a GPU, the
global table under the interpreter).
"""

from __future__ import annotations

import triton
import triton.language as tl

from leechq.kernels.triton._bits import (
    and_or,
    dp4a,
    smem_load32_at,
    smem_load128_at,
    table_load32,
    table_load128,
)

# Word offsets in the batch-1 table (leechq.kernels.tables.M1_*; checked equal in the tests).
PA_WORD = tl.constexpr(4096)
PB_WORD = tl.constexpr(4096 + 2048)
TABLE_WORDS = tl.constexpr(8192)
MID_SHIFT = tl.constexpr(2048 - 1240)
T64_PBITS = tl.constexpr(8)
"""Copies of each pattern entry in the pattern-bits table (``tables.tetra_m1_bits_table``) the
``tetra64`` decode reads (:func:`decode_block64_bits_split`); see docs/decisions.md for the
copy counts that lost."""


@triton.jit
def section_values(h, mp, kp, n2, USE_ASM: tl.constexpr):
    """One section: nibbles of ``h`` → signed value bytes of its even and odd trio coordinates
    (``ev``, ``od``: 4 bytes each) and ``n2`` plus their squared norm."""
    ev = ((h & 0x0F0F0F0F) * mp + kp) ^ 0x80808080
    od = (((h >> 4) & 0x0F0F0F0F) * mp + kp) ^ 0x80808080
    n2 = dp4a(ev, ev, n2, True, USE_ASM)
    n2 = dp4a(od, od, n2, True, USE_ASM)
    return ev, od, n2


@triton.jit
def sb_copy(e):
    """The pattern-table copy offset (in words) of flat tile element ``e``: ``4 · (lane mod 8)`` —
    the eight lanes of one 16-byte shared-load phase read eight different bank groups."""
    return ((e % 8) * 4).to(tl.uint32)


@triton.jit
def decode_nibbles(lo, hi, tab_ptr, base, sb_rep, USE_ASM: tl.constexpr):
    """The resolved nibble words ``h1, h2, h3`` of one block per element (words ``lo``, ``hi``:
    uint32), its value map ``(mp, kp)`` — value bytes + 128 are ``nibbles·mp + kp`` — and the
    gain bit. ``sb_rep``: the element's pattern-table copy offset (:func:`sb_copy`; any copy
    decodes the same)."""
    p = lo & 1
    r = (lo >> 1) & 1
    v20 = (lo >> 20) | (hi << 12)  # word bits 20..47: b2 | i2<<4 | b3<<15 | i3<<16 | g<<27
    # PA by s8 (word bits 2..7), PB by b1 | b2<<1 | b3<<5 (word bits 8, 20..23, 35); 32 words/entry
    pa = (lo & 0xFC) << 3  # 32 words per entry (eight copies)
    pb = PB_WORD + (((lo >> 3) & 32) | ((v20 << 6) & 0x3C0) | ((v20 >> 5) & 0x400))
    sa0, sa1, sa2, _sa3 = table_load128(tab_ptr, base, PA_WORD + pa + sb_rep, USE_ASM)
    sb0, sb1, sb2, _sb3 = table_load128(tab_ptr, base, pb + sb_rep, USE_ASM)
    i1 = ((lo >> 9) & 2047) | (r << 11)
    i2 = (v20 >> 4) & 2047
    dl = (i2 >= 1240).to(tl.uint32)  # the middle section's class: rows 0..1239 or 2048..2855
    i3 = ((v20 >> 16) & 2047) | ((p ^ r ^ dl) << 11)
    h1 = table_load32(tab_ptr, base, i1, USE_ASM) ^ sa0 ^ sb0
    h2 = table_load32(tab_ptr, base, i2 + dl * MID_SHIFT, USE_ASM) ^ sa1 ^ sb1
    h3 = table_load32(tab_ptr, base, i3, USE_ASM) ^ sa2 ^ sb2
    # value bytes + 128 = 2h + 114 (p = 0) or 143 − 2h (p = 1): one multiply-add per 4 nibbles
    mp = 2 - 4 * p
    kp = 0x72727272 + p * 0x1D1D1D1D
    return h1, h2, h3, mp, kp, (v20 >> 27) & 1


@triton.jit
def _fields64(w0, w1, w2, w3, odd, base, sbr, LG: tl.constexpr, USE_ASM: tl.constexpr):
    """The table addresses and scalars of the even (``odd`` False) or odd block of a ``tetra64``
    pair (``w0..w3``, uint32; ``odd`` a bool tensor, constant where the caller knows the block,
    and then its field selects fold): the shared-memory byte addresses ``a1..a3`` of its three
    rank rows, the byte offsets ``opa`` / ``opb`` of its two pattern entries within their tables
    for entries ``2^LG`` bytes apart (``sbr``, the element's copy as a byte offset, merged in;
    the layout stores ``PA_e`` as a 128-byte offset at bit 7, ``PB_e`` in bits 0..5, ``PA_o``
    and ``PB_o`` in bits 26..31), ``p`` and the gain bit (bool) and the stored shell ``m`` as
    float32 (0 where the words are zeros, i.e. masked off)."""
    m12 = tl.full(w0.shape, 0x3FFC, tl.uint32)
    mk = tl.full(w0.shape, 63 << LG, tl.uint32)
    a1 = base + tl.where(odd, (w0 >> 12) & m12, w0 & m12)
    a2 = base + tl.where(odd, (w1 >> 12) & m12, w1 & m12)
    a3 = base + tl.where(odd, (w2 >> 12) & m12, w2 & m12)
    pa_e = and_or(w3 >> (7 - LG), mk, sbr, USE_ASM)  # a shift by 0 for 128-byte entries
    opa = tl.where(odd, (w3 >> (26 - LG)) | sbr, pa_e)
    opb = and_or(tl.where(odd, w2 >> (26 - LG), w3 << LG), mk, sbr, USE_ASM)
    p = tl.where(odd, w1 & 1, (w0 >> 26) & 1) != 0
    g = tl.where(odd, (w0 >> 1) & 1, w0 & 1) != 0
    m = tl.where(odd, w1 >> 27, w0 >> 27).to(tl.float32)
    return a1, a2, a3, opa, opb, p, g, m


@triton.jit
def decode_block64(w0, w1, w2, w3, odd, tab_ptr, base, sbr, USE_ASM: tl.constexpr):
    """The even (``odd`` False) or odd block of a ``tetra64`` pair (:func:`_fields64`; ``sbr``:
    the element's pattern-copy byte offset in the 16-byte-entry table): the nibble words
    ``h1..h3`` (``h = f ^ PA ^ PB``; every coordinate is ``2h − 14 − p``), ``p`` and the gain
    bit (bool) and the stored shell ``m`` as float32 (0 where the words are zeros)."""
    a1, a2, a3, opa, opb, p, g, m = _fields64(w0, w1, w2, w3, odd, base, sbr, 7, USE_ASM)
    sa0, sa1, sa2, _sa3 = smem_load128_at(tab_ptr, base + PA_WORD * 4 + opa, USE_ASM)
    sb0, sb1, sb2, _sb3 = smem_load128_at(tab_ptr, base + PB_WORD * 4 + opb, USE_ASM)
    h1 = smem_load32_at(tab_ptr, a1, USE_ASM) ^ (sa0 ^ sb0)
    h2 = smem_load32_at(tab_ptr, a2, USE_ASM) ^ (sa1 ^ sb1)
    h3 = smem_load32_at(tab_ptr, a3, USE_ASM) ^ (sa2 ^ sb2)
    return h1, h2, h3, p, g, m


@triton.jit
def pattern_masks(pa, pb):
    """The three sections' nibble masks from two pattern-bits words (``tables.pattern_bits``:
    bit ``4i + k`` is nibble ``i`` of section ``k``): the XOR of the two, spread by a mask and a
    multiply by 15 per section."""
    pp = pa ^ pb
    n1 = tl.full(pa.shape, 0x11111111, tl.uint32)
    return (pp & n1) * 15, ((pp >> 1) & n1) * 15, ((pp >> 2) & n1) * 15


@triton.jit
def decode_block64_bits_split(w0, w1, w2, w3, odd, tab_ptr, base, sbr, COPIES: tl.constexpr,
                              USE_ASM: tl.constexpr):
    """:func:`decode_block64_bits` before its last XOR: each section's rank-row word ``f`` and
    pattern mask ``k`` (``h = f ^ k``), as ``f1, k1, f2, k2, f3, k3, p, g, m`` — so that a
    caller masking ``h`` twice (even and odd nibbles) takes each mask of the XOR in one
    :func:`._bits.xor_and`."""
    LG: tl.constexpr = 7 if COPIES == 32 else 6 if COPIES == 16 else 5
    a1, a2, a3, opa, opb, p, g, m = _fields64(w0, w1, w2, w3, odd, base, sbr, LG, USE_ASM)
    pa = smem_load32_at(tab_ptr, base + PA_WORD * 4 + opa, USE_ASM)
    pb = smem_load32_at(tab_ptr, base + (PA_WORD + 64 * COPIES) * 4 + opb, USE_ASM)
    f1 = smem_load32_at(tab_ptr, a1, USE_ASM)
    f2 = smem_load32_at(tab_ptr, a2, USE_ASM)
    f3 = smem_load32_at(tab_ptr, a3, USE_ASM)
    k1, k2, k3 = pattern_masks(pa, pb)
    return f1, k1, f2, k2, f3, k3, p, g, m


@triton.jit
def value_map64(p):
    """The value map of a ``tetra64`` block for :func:`section_values`: value bytes + 128 are
    ``nibbles·mp + kp`` with ``mp = 2``, ``kp = 114 − p`` per byte."""
    kp = (0x72727272 - p.to(tl.uint32) * 0x01010101).to(tl.uint32)
    return tl.full(p.shape, 2, tl.int32), kp


@triton.jit
def _block_decode64(w0, w1, w2, w3, odd, cent0, cent1, tab_ptr, base, sbr,
                    USE_ASM: tl.constexpr):
    """What :func:`_block_dot64` needs of the even (``odd`` False) or odd block of a ``tetra64``
    pair, with no activation: :func:`_decode64`'s ``f1, k1, f2, k2, f3, k3, p`` and the block's
    scale ``centroid[g] · rsqrt(m)`` (float32)."""
    f1, k1, f2, k2, f3, k3, p, g, m = decode_block64_bits_split(w0, w1, w2, w3, odd, tab_ptr,
                                                                base, sbr, T64_PBITS, USE_ASM)
    return f1, k1, f2, k2, f3, k3, p, tl.where(g, cent1, cent0) * tl.math.rsqrt(m)


@triton.jit
def inv_norm(n2, tab_ptr, base, sb_rep, USE_ASM: tl.constexpr):
    """``1/‖y‖`` (float32, the table's value: f32 of the f64 reciprocal) from ``n2 = ‖y‖²`` (int32,
    a multiple of 16 below 512; 0 → 0); ``sb_rep`` as in :func:`decode_nibbles`."""
    word = PA_WORD + ((n2 << 1) & 0x3E0) + sb_rep + 3
    return table_load32(tab_ptr, base, word, USE_ASM).to(tl.float32, bitcast=True)
