"""Small-batch Tetra matvec on int8 tensor cores: 1..16 activation rows, one decode per block.

Implements the "decode that amortizes over M rows" of issue 4 (docs/kernels.md for
the decode and for the integer dot). The batch-1 kernel (:mod:`.tetra48_m1`) decodes each block
to signed value bytes and meets every activation row with 18 ``dp4a``; at 8 rows the dots cost
more than the decode. Here the same value bytes go to ``mma.sync.m16n8k32`` (int8 × int8 → int32):

* **Fragments.** A warp takes groups of 8 weight rows (``RPS`` = 1, 2 or 4 groups, default 2;
  4 = two pairs of groups decoded one after the other on the same fragments, opt-in) ×
  4 consecutive blocks per step; in each group lane ``4g + c`` decodes block ``c`` of row ``g``
  (:func:`.tetra48_decode.decode_nibbles`, the staged batch-1 table).
  Its section ``s`` value words (even, odd trio halves) are exactly the ``B`` fragment
  (``b0 = B[4c.., g]``, ``b1 = B[16+4c.., g]``) of one MMA whose 32-deep ``k`` is section ``s`` of
  the four blocks. ``A`` is block-diagonal: row ``m`` is (block ``(m mod 8) // 2``, activation
  row ``(m mod 8) mod 2 + 2·(m ≥ 8) + 4h``), nonzero only in its block's ``k`` columns, so each
  ``C`` entry is one block's dot with one activation row — the per-block scale
  (``centroid[g] / ‖y‖``) stays separate. Lanes with ``c = g // 2`` hold the nonzero ``A``
  words; they are precomputed per (block, activation-row parity, half ``h``) by
  :func:`imma_activation_kernel` as 16-byte records in fragment order.
* **Integer activation.** As in the batch-1 kernel: each block of each activation row becomes an
  exponent ``E`` and 24-bit integers in three byte limbs (limb 2 signed, limbs 0, 1 unsigned), so
  one (block, row) dot is ``((S₂·2⁸) + S₁)·2⁸ + S₀``, accumulated exactly in int32 by chaining
  the nine MMAs (3 limbs × 3 sections) of each half through ``C`` and shifting between limbs.
* **Per step, lane and row group**: one block decode, 18 MMAs (two halves of four activation
  rows), two shuffles for the row scales, 8 scaled accumulations; per step the 18 16-byte
  fragment loads shared by the groups (zeros on the inactive lanes) are issued first and the
  next step's weight words one step ahead — issued next to their MMAs they cost one L2 round
  trip each.
* **9..16 rows** (``CH = 2``): the activation records come as two 8-row chunks; each step's
  decoded blocks meet the first chunk's fragments, then the second's (loaded after the first
  chunk's MMAs) — 36 MMAs per lane and row group, one decode (run 15: 16 rows 7.44 ms against
  5.33 for 8 on the Qwen3-8B projections).
* **Slices.** Partial sums per K-slice go to
  ``part [KS, 8·CH, d_out]``; :func:`imma_finalize_kernel` adds the slices, applies σ_row and the
  tail. ``ops.tetra48_matvec_prepared`` and
  ``ops.planes14_matvec_planned`` take this kernel for 3..16 rows on a GPU.

The result differs from the f32 reference by the activation rounding (≤ 2^-23 of each block's
largest value), ``rsqrt`` (≤ 2^-22.9 relative) and f32 accumulation, as the batch-1 kernel.
Under the interpreter the MMA, shuffles and loads are emulated (:mod:`._bits`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from leechq.kernels.triton._bits import (
    global_load32,
    global_load128,
    global_load128_all,
    global_store32,
    mma_i8,
    shfl_idx,
    shfl_xor,
)
from leechq.kernels.triton.planes14_m1 import TABLE_PART as P14_TABLE_PART
from leechq.kernels.triton.planes14_m1 import TABLE_PARTS as P14_TABLE_PARTS
from leechq.kernels.triton.planes14_m1 import _record_bytes
from leechq.kernels.triton.tetra48_decode import (
    decode_block64,
    decode_nibbles,
    sb_copy,
    section_values,
    value_map64,
)
from leechq.kernels.triton.tetra48_m1 import _x_limbs, limb_words, rounded_quads, stage_table

HALF_WORDS = tl.constexpr(288)
"""Words of one half's ``A`` fragments per 4-block step: 3 limbs × 3 sections × 8 lanes × 4."""
STEP_WORDS = tl.constexpr(576)
"""Words of a 4-block step's ``A`` fragments (two halves). Within a (half, limb, section) the 8
lanes that hold nonzero words — block ``c`` of the step, activation-row parity ``q`` — read
16 bytes each at ``(2c + q)·4``: one 128-byte line per warp request."""


@triton.jit
def chunk_of(rec_ptr, ex_ptr, row, NPP):
    """Where activation row ``row``'s records are: its 8-row chunk's ``A`` words (``NPP / 2``
    steps of ``STEP_WORDS``) and exponents (``16·NPP``: 8 rows × 2·NPP blocks), and its row within
    the chunk."""
    k = row // 8
    return rec_ptr + k * (NPP // 2) * STEP_WORDS, ex_ptr + k * 16 * NPP, row % 8


@triton.jit
def imma_activation_kernel(xp_ptr, stride_x, rec_ptr, ex_ptr, m_rows, x_rows,
                           NPP: tl.constexpr, BLK: tl.constexpr, USE_ASM: tl.constexpr,
                           A16: tl.constexpr = False):
    """The ``A`` records and block exponents of activation row ``program_id(0)`` (0..15) from
    the prepared layout ``xp`` (``x_rows`` rows; rows ``≥ m_rows`` give zero records), for the
    ``BLK`` block pairs of ``program_id(1)``. Rows come in chunks of 8 (:func:`chunk_of`);
    within its chunk, for row
    ``t`` (0..7), the limb word of block ``b`` (step ``b // 4``, position ``c = b mod 4``),
    section ``s`` and trio half ``half`` is at ``(b // 4)·STEP_WORDS + (t // 4)·HALF_WORDS
    + (limb·3 + s)·32 + (2c + t mod 2)·4 + (t // 2) mod 2 + 2·half`` (the fragment word
    ``a0..a3`` of the lane that reads it); ``ex[(b·2 + t mod 2)·4 + (t // 2) mod 2 + 2·(t // 4)]``
    is the exponent ``E``. ``A16``: the activation rounded to 16 bits per block
    (:data:`.tetra48_m1.A16_STEP`; the limb-0 words are zero)."""
    row = tl.program_id(0)
    pair = tl.program_id(1) * BLK + tl.arange(0, BLK)
    ok = pair < NPP
    xr = xp_ptr + tl.minimum(row, x_rows - 1) * stride_x + tl.where(ok, pair, 0)
    live = row < m_rows
    rec_ptr, ex_ptr, t = chunk_of(rec_ptr, ex_ptr, row, NPP)
    q = t % 2
    r = (t // 2) % 2
    h = t // 4
    for par in tl.static_range(2):
        lim = _x_limbs(xr, NPP, par, USE_ASM, A16)
        blk = 2 * pair + par
        rec = rec_ptr + (blk // 4) * STEP_WORDS + h * HALF_WORDS + ((blk % 4) * 2 + q) * 4 + r
        for limb in tl.static_range(3):
            for s in tl.static_range(3):
                for half in tl.static_range(2):
                    word = tl.where(live, lim[1 + limb * 6 + s * 2 + half], 0)
                    tl.store(rec + (limb * 3 + s) * 32 + 2 * half, word.to(tl.int32, bitcast=True),
                             mask=ok)
        tl.store(ex_ptr + (blk * 2 + q) * 4 + r + 2 * h, lim[0], mask=ok)


@triton.jit
def store_activation_tile(x, rec_ptr, ex_ptr, row, pair, NPP: tl.constexpr,
                          A16: tl.constexpr = False):
    """What :func:`imma_activation_kernel` writes for activation row ``row`` (0..15, to its 8-row
    chunk's records) and the pairs ``pair`` (int32 [1, PRS]), from the prepared slots' values in
    registers: ``x`` float32 [64, PRS] in limb-word order (row
    ``((parity·4 + section)·2 + half)·4 + j`` holds trio position ``8·section + 2j + half``;
    section 3, absent blocks and dead rows zero — the tile the one-group rotation gathers for its
    prepared write). Bit for bit that kernel's words and exponents: the rounding of
    :func:`.tetra48_m1.rounded_quads` (as :func:`.tetra48_m1._x_limbs`), the bytes of
    :func:`.tetra48_m1.limb_words` (``A16``: 16-bit activations)."""
    rec_ptr, ex_ptr, row = chunk_of(rec_ptr, ex_ptr, row, NPP)
    q, e_blk = rounded_quads(x, A16)
    k = tl.arange(0, 16)[:, None]  # (parity·4 + section)·2 + half
    ks = (k // 2) % 4
    bw = 2 * pair + k // 8
    base = ((bw // 4) * STEP_WORDS + (row // 4) * HALF_WORDS + ((bw % 4) * 2 + row % 2) * 4
            + (row // 2) % 2 + ks * 32 + 2 * (k % 2))
    live = (ks < 3) & (pair < NPP)
    for limb in tl.static_range(3):
        tl.store(rec_ptr + base + limb * 96, limb_words(q, limb), mask=live)
    pb = tl.arange(0, 2)[:, None]
    be = 2 * pair + pb
    tl.store(ex_ptr + (be * 2 + row % 2) * 4 + (row // 2) % 2 + 2 * (row // 4), e_blk,
             mask=(pair + pb * 0) < NPP)


@triton.jit
def _block_words(w_ptr, rc, blk, ok, STRIDE_W: tl.constexpr, CODE: tl.constexpr,
                 USE_ASM: tl.constexpr):
    """The words holding block ``blk`` of row ``rc`` per lane (zeros where not ``ok``): two of a
    ``tetra48`` row (``CODE`` 0), four of a ``planes14`` row (``CODE`` 1; the odd record of a
    pair starts in the high half of the pair's word 3), or the four words of the block's pair in
    the ``tetra64`` layout (``CODE`` 3)."""
    if CODE == 3:
        a, b, c, d = global_load128(w_ptr + rc * STRIDE_W + 4 * (blk // 2), ok, USE_ASM)
        return (a.to(tl.uint32, bitcast=True), b.to(tl.uint32, bitcast=True),
                c.to(tl.uint32, bitcast=True), d.to(tl.uint32, bitcast=True))
    if CODE == 0:
        pw = w_ptr + rc * STRIDE_W + 3 * (blk // 2) + (blk % 2)
    else:
        pw = w_ptr + rc * STRIDE_W + 7 * (blk // 2) + 3 * (blk % 2)
    x0 = global_load32(pw, ok, USE_ASM).to(tl.uint32, bitcast=True)
    x1 = global_load32(pw + 1, ok, USE_ASM).to(tl.uint32, bitcast=True)
    x2 = x0
    x3 = x1
    if CODE == 1:
        x2 = global_load32(pw + 2, ok, USE_ASM).to(tl.uint32, bitcast=True)
        x3 = global_load32(pw + 3, ok, USE_ASM).to(tl.uint32, bitcast=True)
    return x0, x1, x2, x3


@triton.jit
def _decode_block(words, odd, cent0, cent1, tab_ptr, base, sb_rep, CODE: tl.constexpr,
                  USE_ASM: tl.constexpr):
    """A block per lane from its words (:func:`_block_words`; ``odd``: the block is the odd one
    of its pair): its six value words (the ``B`` fragments of sections 1..3) and its scale
    ``centroid[g] / ‖y‖`` — the Tetra decode (``CODE`` 0; 3 for ``tetra64``) or the Planes14 one
    (``CODE`` 1,
    :func:`.planes14_m1._record_bytes`: its quads ``2k + h`` are the value words of section
    ``k``, half ``h``, with the activation prepared in ``tables.planes14_m1_order``)."""
    x0, x1, x2, x3 = words
    if CODE == 1:
        ra = tl.where(odd, (x0 >> 16) | (x1 << 16), x0)
        rb = tl.where(odd, (x1 >> 16) | (x2 << 16), x1)
        rc = tl.where(odd, (x2 >> 16) | (x3 << 16), x2)
        rd = tl.where(odd, x3 >> 16, x3 & 0xFFFF)
        quads, g, invw = _record_bytes(ra, rb, rc, rd, tab_ptr, base, True, USE_ASM)
        scale = tl.where(g != 0, cent1, cent0) * invw.to(tl.float32, bitcast=True)
        return quads, scale
    if CODE == 3:  # tetra64: the pair's four words; the shell is stored
        h1, h2, h3, p, g, m = decode_block64(x0, x1, x2, x3, odd, tab_ptr, base, sb_rep * 4,
                                             USE_ASM)
        mp, kp = value_map64(p)
        ev1, od1, _n2 = section_values(h1, mp, kp, tl.zeros(x0.shape, tl.int32), USE_ASM)
        ev2, od2, _n2 = section_values(h2, mp, kp, _n2, USE_ASM)
        ev3, od3, _n2 = section_values(h3, mp, kp, _n2, USE_ASM)
        # masked-off blocks load zeros: shell 1 keeps their (zero) products finite
        scale = tl.where(g, cent1, cent0) * (tl.math.rsqrt(tl.maximum(m, 1.0)) * 0.25)
        return (ev1, od1, ev2, od2, ev3, od3), scale
    lo = tl.where(odd, (x0 >> 16) | (x1 << 16), x0)
    hi = tl.where(odd, x1 >> 16, x1)
    h1, h2, h3, mp, kp, gbit = decode_nibbles(lo, hi, tab_ptr, base, sb_rep, USE_ASM)
    ev1, od1, n2 = section_values(h1, mp, kp, tl.zeros(x0.shape, tl.int32), USE_ASM)
    ev2, od2, n2 = section_values(h2, mp, kp, n2, USE_ASM)
    ev3, od3, n2 = section_values(h3, mp, kp, n2, USE_ASM)
    scale = tl.where(gbit != 0, cent1, cent0) * tl.math.rsqrt(tl.maximum(n2, 1).to(tl.float32))
    return (ev1, od1, ev2, od2, ev3, od3), scale


@triton.jit
def _load_half(rb, active, USE_ASM: tl.constexpr, A16: tl.constexpr):
    """The lane's nine ``A`` fragments (limb-major, 4 words each) of one half at ``rb``, zeros
    where not ``active``: 36 words, all issued before any is used (the MMAs then wait once for
    the slowest load rather than once per load). ``A16``: limb 0 is zero and not loaded (its
    three entries repeat limb 1's, never used)."""
    a3 = global_load128(rb + 3 * 32, active, USE_ASM)
    a4 = global_load128(rb + 4 * 32, active, USE_ASM)
    a5 = global_load128(rb + 5 * 32, active, USE_ASM)
    a6 = global_load128(rb + 6 * 32, active, USE_ASM)
    a7 = global_load128(rb + 7 * 32, active, USE_ASM)
    a8 = global_load128(rb + 8 * 32, active, USE_ASM)
    if A16:
        a0 = a3
        a1 = a4
        a2 = a5
    else:
        a0 = global_load128(rb + 0 * 32, active, USE_ASM)
        a1 = global_load128(rb + 1 * 32, active, USE_ASM)
        a2 = global_load128(rb + 2 * 32, active, USE_ASM)
    return a0, a1, a2, a3, a4, a5, a6, a7, a8


@triton.jit
def _half_dots(frags, bu, bv, RPS: tl.constexpr, NW: tl.constexpr, USE_ASM: tl.constexpr,
               A16: tl.constexpr):
    """The ``C`` fragments of one half (four activation rows) for one step, for the ``RPS``
    (1 or 2) row groups whose value words are ``bu`` and ``bv``: nine MMAs each on the half's
    ``A`` fragments ``frags`` (:func:`_load_half`, shared by both groups), limb 2 first, shifted
    by 8 bits between limbs (``A16``: limbs 2 and 1 only — the sums are then x̃/256 dots, and
    the caller scales them by 256)."""
    LO: tl.constexpr = 1 if A16 else 0
    d0 = tl.zeros(bu[0].shape, tl.int32)
    d1 = d0
    d2 = d0
    d3 = d0
    f0 = d0
    f1 = d0
    f2 = d0
    f3 = d0
    for limb in tl.static_range(2, LO - 1, -1):
        for s in tl.static_range(3):
            a0, a1, a2, a3 = frags[limb * 3 + s]
            d0, d1, d2, d3 = mma_i8(a0, a1, a2, a3, bu[2 * s], bu[2 * s + 1], d0, d1, d2, d3,
                                    limb == 2, NW, USE_ASM)
            if RPS == 2:
                f0, f1, f2, f3 = mma_i8(a0, a1, a2, a3, bv[2 * s], bv[2 * s + 1], f0, f1, f2, f3,
                                        limb == 2, NW, USE_ASM)
        if limb > LO:
            d0 = d0 << 8
            d1 = d1 << 8
            d2 = d2 << 8
            d3 = d3 << 8
            f0 = f0 << 8
            f1 = f1 << 8
            f2 = f2 << 8
            f3 = f3 << 8
    return d0, d1, d2, d3, f0, f1, f2, f3


@triton.jit
def _accumulate(acc, d, s0, s1, e_r0, e_r1):
    """One half's ``C`` fragment ``d`` (int32 × 4) of one row group scaled and added to its four
    accumulators ``acc``: entry ``k`` belongs to row ``2c + k mod 2`` (row scale ``s0`` or
    ``s1``) and activation row parity ``k // 2`` (block exponent ``e_r0`` or ``e_r1``)."""
    a0, a1, a2, a3 = acc
    d0, d1, d2, d3 = d
    return (a0 + d0.to(tl.float32) * (s0 * e_r0), a1 + d1.to(tl.float32) * (s1 * e_r0),
            a2 + d2.to(tl.float32) * (s0 * e_r1), a3 + d3.to(tl.float32) * (s1 * e_r1))


@triton.jit
def _store_group(acc, part, row0, lane, d_out, HALF: tl.constexpr, NW: tl.constexpr,
                 USE_ASM: tl.constexpr):
    """Sum one row group's four accumulators ``acc`` of a half (:func:`_accumulate`) over the four
    block lanes (shuffles) and store them from lanes 0..7 at ``part[activation row, row]``
    (``row0``: the group's first row per lane). Accumulator ``k``: row ``2c + k mod 2``,
    activation row ``q + 2·(k // 2) + 4·HALF`` of lane ``8·blk + 4q + c``."""
    c = lane % 4
    q = (lane // 4) % 2
    first = lane < 8
    for k in tl.static_range(4):
        tot = acc[k] + shfl_xor(acc[k], 8, NW, USE_ASM)
        tot += shfl_xor(tot, 16, NW, USE_ASM)
        n = row0 + 2 * c + (k % 2)
        t = q + 2 * (k // 2) + 4 * HALF
        global_store32(part + t * d_out + n, tot, first & (n < d_out), USE_ASM)


@triton.jit
def _step_loads(rec, ex, b0, c, q, gb, active, USE_ASM: tl.constexpr, A16: tl.constexpr):
    """One 8-row chunk's ``A`` fragments of the step at block ``b0`` (both halves, all issued
    before any is used) and the four block exponents of this lane's ``C`` entries."""
    rb = rec + (b0 // 4) * STEP_WORDS + (c * 2 + q) * 4
    frag0 = _load_half(rb, active, USE_ASM, A16)
    frag1 = _load_half(rb + HALF_WORDS, active, USE_ASM, A16)
    ea, eb, ec, ed = global_load128_all(ex + ((b0 + gb) * 2 + q) * 4, USE_ASM)
    return frag0, frag1, (ea.to(tl.float32, bitcast=True), eb.to(tl.float32, bitcast=True),
                          ec.to(tl.float32, bitcast=True), ed.to(tl.float32, bitcast=True))


@triton.jit
def _step_dots(loads, bu, bv, su, sv, accs, RPS: tl.constexpr, NW: tl.constexpr,
               USE_ASM: tl.constexpr, A16: tl.constexpr):
    """One 8-row chunk's MMAs of a step (:func:`_step_loads`) for the decoded row groups ``bu``,
    ``bv`` (row scales ``su``, ``sv``: the two rows of each lane's ``C`` entries), added to its
    accumulators ``accs`` (row group u halves 0, 1; row group v halves 0, 1)."""
    frag0, frag1, ex = loads
    u0, u1, v0, v1 = accs
    d0, d1, d2, d3, f0, f1, f2, f3 = _half_dots(frag0, bu, bv, RPS, NW, USE_ASM, A16)
    u0 = _accumulate(u0, (d0, d1, d2, d3), su[0], su[1], ex[0], ex[1])
    if RPS == 2:
        v0 = _accumulate(v0, (f0, f1, f2, f3), sv[0], sv[1], ex[0], ex[1])
    d0, d1, d2, d3, f0, f1, f2, f3 = _half_dots(frag1, bu, bv, RPS, NW, USE_ASM, A16)
    u1 = _accumulate(u1, (d0, d1, d2, d3), su[0], su[1], ex[2], ex[3])
    if RPS == 2:
        v1 = _accumulate(v1, (f0, f1, f2, f3), sv[0], sv[1], ex[2], ex[3])
    return u0, u1, v0, v1


@triton.jit
def _store_chunk(accs, part, ru, rv, lane, d_out, RPS: tl.constexpr, NW: tl.constexpr,
                 USE_ASM: tl.constexpr):
    """One 8-row chunk's accumulators (:func:`_step_dots`) to its rows of ``part``."""
    u0, u1, v0, v1 = accs
    _store_group(u0, part, ru, lane, d_out, 0, NW, USE_ASM)
    _store_group(u1, part, ru, lane, d_out, 1, NW, USE_ASM)
    if RPS == 2:
        _store_group(v0, part, rv, lane, d_out, 0, NW, USE_ASM)
        _store_group(v1, part, rv, lane, d_out, 1, NW, USE_ASM)


@triton.jit
def imma_kernel(rec_ptr, ex_ptr, w_ptr, cent_ptr, tab_ptr, part_ptr, d_out, K_PER,
                N_BLOCKS: tl.constexpr, NPP: tl.constexpr, NW: tl.constexpr, RG: tl.constexpr,
                RPS: tl.constexpr, CH: tl.constexpr, CODE: tl.constexpr, USE_ASM: tl.constexpr,
                A16: tl.constexpr = False):
    """Partial ``y[t, n] = Σ_b ⟨W[n, b], x[t, b]⟩`` (no σ_row, no tail) over K-slice
    ``program_id(1)`` (``K_PER`` blocks, a multiple of 4): ``part[slice, t, n]`` for all
    ``8·CH`` activation rows (``CH`` = 1 or 2 chunks of 8: each decoded block meets both);
    see the module docstring. A program walks ``RG`` sets of ``8·RPS·NW`` rows;
    each warp takes ``RPS`` (1, 2 or 4; 4 only with ``CH`` = 1) groups of 8 rows per step,
    sharing the step's ``A`` fragments between them (4: two pairs of groups, one after the
    other). Launched with ``num_warps = NW``; :func:`imma_finalize_kernel`
    adds the slices. ``A16``: records of 16-bit activations
    (:data:`.tetra48_m1.A16_STEP`): limb 0 is zero, its loads and MMAs are skipped (12 ``A``
    fragment loads and 24 MMAs per step instead of 18 and 36)."""
    _imma_body(rec_ptr, ex_ptr, w_ptr, cent_ptr, tab_ptr, part_ptr, d_out, K_PER, N_BLOCKS, NW,
               RG, RPS, CH, NPP, CODE, USE_ASM, A16)


@triton.jit
def _imma_body(rec_ptr, ex_ptr, w_ptr, cent_ptr, tab_ptr, part_ptr, d_out, K_PER,
               N_BLOCKS: tl.constexpr, NW: tl.constexpr, RG: tl.constexpr, RPS: tl.constexpr,
               CH: tl.constexpr, NPP: tl.constexpr, CODE: tl.constexpr, USE_ASM: tl.constexpr,
               A16: tl.constexpr):
    """:func:`imma_kernel`'s body (``CODE``: 0 for ``tetra48`` words and the batch-1 Tetra
    table, 3 for ``tetra64`` words, 1 for ``planes14`` records and
    ``tables.planes14_m1_table``; ``CH``: 8-row chunks of activation rows, 1 or 2)."""
    NB4: tl.constexpr = ((N_BLOCKS + 3) // 4) * 4
    if CODE == 0:
        STRIDE_W: tl.constexpr = ((6 * N_BLOCKS + 7) // 8) * 2
        base = stage_table(tab_ptr, d_out, USE_ASM)
    elif CODE == 3:  # tetra64 (tetra48.t64_stride)
        STRIDE_W: tl.constexpr = 4 * ((N_BLOCKS + 1) // 2)
        base = stage_table(tab_ptr, d_out, USE_ASM)
    else:
        STRIDE_W: tl.constexpr = 7 * ((N_BLOCKS + 1) // 2)
        base = stage_table(tab_ptr, d_out, USE_ASM, P14_TABLE_PARTS, P14_TABLE_PART)
    e = tl.arange(0, NW * 32)
    sb_rep = sb_copy(e)
    warp = e // 32
    lane = e % 32
    g = lane // 4
    c = lane % 4
    q = g % 2
    gb = g // 2  # the block of this lane's C entries
    active = c == gb  # lanes holding nonzero A words (their own block's records)
    odd = (c % 2) == 1
    src0 = 8 * c + gb  # the lane that decoded (row 2c, block gb)
    src1 = src0 + 4  # (row 2c + 1, block gb)
    ks = tl.program_id(1)
    b_start = ks * K_PER
    b_stop = tl.minimum(b_start + K_PER, NB4)
    part = part_ptr + ks * 8 * CH * d_out
    rec1, ex1, _ = chunk_of(rec_ptr, ex_ptr, 8, NPP)  # the second chunk's records (CH = 2)
    G2: tl.constexpr = 1 if RPS == 1 else 2  # row groups per pair (u, v)
    tl.static_assert(RPS == 1 or RPS == 2 or RPS == 4)
    tl.static_assert(RPS != 4 or CH == 1)  # two pairs of row groups: one chunk of 8 rows
    for i in range(RG):
        ru = (tl.program_id(0) * RG + i) * NW * 8 * RPS + warp * 8 * RPS  # the warp's rows
        rw = ru + 16  # the second pair's rows (RPS = 4)
        ca = _pair_cents(cent_ptr, ru + g, d_out, G2, A16, USE_ASM)
        cb = ca
        if RPS == 4:
            cb = _pair_cents(cent_ptr, rw + g, d_out, G2, A16, USE_ASM)
        z = tl.zeros(e.shape, tl.float32)
        # per chunk, row group (u, v) and half (0, 1): (r0, row 2c), (r0, 2c+1), (r1, 2c),
        # (r1, 2c+1)
        acc0 = ((z, z, z, z), (z, z, z, z), (z, z, z, z), (z, z, z, z))
        acc1 = acc0
        acc2 = acc0  # the second pair's, first chunk (RPS = 4; one chunk)
        blk = b_start + c
        xa = _pair_words(w_ptr, ru + g, d_out, blk, blk < N_BLOCKS, STRIDE_W, G2, CODE, USE_ASM)
        xb = xa
        if RPS == 4:
            xb = _pair_words(w_ptr, rw + g, d_out, blk, blk < N_BLOCKS, STRIDE_W, G2, CODE,
                             USE_ASM)
        for b0 in range(b_start, b_stop, 4):
            blk = b0 + c
            # the step's A fragments (both halves) and exponents first: their latency overlaps
            # the decode
            loads = _step_loads(rec_ptr, ex_ptr, b0, c, q, gb, active, USE_ASM, A16)
            # the next step's words (loaded one step ahead; none past the slice)
            nb = blk + 4
            nok = (nb < N_BLOCKS) & (nb < b_stop)
            na = _pair_words(w_ptr, ru + g, d_out, nb, nok, STRIDE_W, G2, CODE, USE_ASM)
            if RPS == 4:
                nbw = _pair_words(w_ptr, rw + g, d_out, nb, nok, STRIDE_W, G2, CODE, USE_ASM)
            bu, bv, su2, sv2 = _pair_decode(xa, ca, odd, tab_ptr, base, sb_rep, src0, src1, G2,
                                            NW, CODE, USE_ASM)
            acc0 = _step_dots(loads, bu, bv, su2, sv2, acc0, G2, NW, USE_ASM, A16)
            if RPS == 4:  # the second pair meets the same fragments
                bu, bv, su2, sv2 = _pair_decode(xb, cb, odd, tab_ptr, base, sb_rep, src0, src1,
                                                G2, NW, CODE, USE_ASM)
                acc2 = _step_dots(loads, bu, bv, su2, sv2, acc2, G2, NW, USE_ASM, A16)
                xb = nbw
            if CH == 2:  # the same decoded blocks against activation rows 8..15
                loads = _step_loads(rec1, ex1, b0, c, q, gb, active, USE_ASM, A16)
                acc1 = _step_dots(loads, bu, bv, su2, sv2, acc1, G2, NW, USE_ASM, A16)
            xa = na
        _store_chunk(acc0, part, ru, ru + 8, lane, d_out, G2, NW, USE_ASM)
        if RPS == 4:
            _store_chunk(acc2, part, rw, rw + 8, lane, d_out, G2, NW, USE_ASM)
        if CH == 2:
            _store_chunk(acc1, part + 8 * d_out, ru, ru + 8, lane, d_out, G2, NW, USE_ASM)


@triton.jit
def _pair_cents(cent_ptr, row_u, d_out, G2: tl.constexpr, A16: tl.constexpr,
                USE_ASM: tl.constexpr):
    """The centroid pairs of a pair of row groups (row ``row_u`` per lane and, with ``G2`` = 2,
    ``row_u + 8``; zeros past ``d_out``), times 256 with ``A16`` (the MMAs then give x̃/256
    dots)."""
    ok_u = row_u < d_out
    rcu = tl.where(ok_u, row_u, 0)
    cu0 = global_load32(cent_ptr + rcu * 2, ok_u, USE_ASM).to(tl.float32, bitcast=True)
    cu1 = global_load32(cent_ptr + rcu * 2 + 1, ok_u, USE_ASM).to(tl.float32, bitcast=True)
    cv0 = cu0
    cv1 = cu1
    if G2 == 2:
        ok_v = row_u + 8 < d_out
        rcv = tl.where(ok_v, row_u + 8, 0)
        cv0 = global_load32(cent_ptr + rcv * 2, ok_v, USE_ASM).to(tl.float32, bitcast=True)
        cv1 = global_load32(cent_ptr + rcv * 2 + 1, ok_v, USE_ASM).to(tl.float32, bitcast=True)
    if A16:
        cu0 = cu0 * 256.0
        cu1 = cu1 * 256.0
        cv0 = cv0 * 256.0
        cv1 = cv1 * 256.0
    return cu0, cu1, cv0, cv1


@triton.jit
def _pair_words(w_ptr, row_u, d_out, blk, ok, STRIDE_W: tl.constexpr, G2: tl.constexpr,
                CODE: tl.constexpr, USE_ASM: tl.constexpr):
    """The words of block ``blk`` for a pair of row groups (:func:`_block_words` of row ``row_u``
    per lane and, with ``G2`` = 2, of ``row_u + 8``; zeros past ``d_out`` or where not ``ok``)."""
    ok_u = row_u < d_out
    xu = _block_words(w_ptr, tl.where(ok_u, row_u, 0), blk, ok_u & ok, STRIDE_W, CODE, USE_ASM)
    xv = xu
    if G2 == 2:
        ok_v = row_u + 8 < d_out
        xv = _block_words(w_ptr, tl.where(ok_v, row_u + 8, 0), blk, ok_v & ok, STRIDE_W, CODE,
                          USE_ASM)
    return xu, xv


@triton.jit
def _pair_decode(words, cents, odd, tab_ptr, base, sb_rep, src0, src1, G2: tl.constexpr,
                 NW: tl.constexpr, CODE: tl.constexpr, USE_ASM: tl.constexpr):
    """A pair of row groups' blocks decoded (:func:`_decode_block`: value words ``bu``, ``bv``)
    and the row scales each lane's ``C`` entries need (``su2``, ``sv2``: from lanes ``src0``,
    ``src1``)."""
    xu, xv = words
    cu0, cu1, cv0, cv1 = cents
    bu, su = _decode_block(xu, odd, cu0, cu1, tab_ptr, base, sb_rep, CODE, USE_ASM)
    bv = bu
    sv = su
    if G2 == 2:
        bv, sv = _decode_block(xv, odd, cv0, cv1, tab_ptr, base, sb_rep, CODE, USE_ASM)
    su2 = (shfl_idx(su, src0, NW, USE_ASM), shfl_idx(su, src1, NW, USE_ASM))
    sv2 = su2
    if G2 == 2:
        sv2 = (shfl_idx(sv, src0, NW, USE_ASM), shfl_idx(sv, src1, NW, USE_ASM))
    return bu, bv, su2, sv2


@triton.jit
def imma_finalize_kernel(part_ptr, scale_ptr, tail_ptr, xp_ptr, stride_x, y_ptr, stride_y, d_out,
                         n_slices, NPP: tl.constexpr, TAIL_COLS: tl.constexpr,
                         TAIL_P2: tl.constexpr, SLICES: tl.constexpr, BLK: tl.constexpr,
                         T: tl.constexpr = 8):
    """``y[t, n] = σ[n] · Σ_slices part[slice, t, n] + Σ_c tail[n, c] · x[t, tail c]`` for
    activation row ``t = program_id(1)`` and the ``BLK`` rows of ``program_id(0)`` (the tail
    columns from the prepared layout's slots ``48·NPP + c``); ``SLICES``: a power of two
    ≥ ``n_slices`` (all slices in one load), ``TAIL_P2`` one ≥ ``TAIL_COLS`` (the rows' tail
    weights in one 2-D load); ``T``: activation rows per slice of ``part`` (8 or 16)."""
    t = tl.program_id(1)
    n = tl.program_id(0) * BLK + tl.arange(0, BLK)
    ok = n < d_out
    sl = tl.arange(0, SLICES)[:, None]
    scale = tl.load(scale_ptr + n, mask=ok, other=0.0)
    kc = tl.arange(0, TAIL_P2)
    kok = kc < TAIL_COLS
    if TAIL_COLS > 0:
        tails = tl.load(tail_ptr + n[:, None] * TAIL_COLS + kc[None, :],
                        mask=ok[:, None] & kok[None, :], other=0.0)
    parts = tl.load(part_ptr + (sl * T + t) * d_out + n[None, :],
                    mask=(sl < n_slices) & ok[None, :], other=0.0)
    out = tl.sum(parts, axis=0) * scale
    if TAIL_COLS > 0:
        xt = tl.load(xp_ptr + t * stride_x + 48 * NPP + kc, mask=kok, other=0.0)
        out += tl.sum(tails * xt[None, :], axis=1)
    tl.store(y_ptr + t * stride_y + n, out, mask=ok)
