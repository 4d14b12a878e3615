"""Batch-1 Tetra matvec over the ``tetra48`` layout: activation-stationary, integer dot products.

Implements docs/kernels.md for one activation row in a geometry of
our own :

* **Activation-stationary split-K.** A program owns a K-slice of 32 block pairs (lane ℓ ↔ pair
  ``32·s + ℓ``) and a chunk of ``ROWS`` output rows; each of its ``NW`` warps walks rows
  ``w, w + NW, …`` of the chunk. The slice's activation is read once per program, converted once and
  kept in registers for every row, so the hot loop reads only weight words and tables. A row's
  partial (sum over the 32 lanes: warp shuffles) goes to a scratch ``[n_slices, d_out]``; the last
  program of a chunk to finish (an acq_rel ticket per chunk, reset by that program) adds the slices
  in slice order, applies ``σ_row`` and the tail and writes ``y`` — deterministic, one launch.
* **Integer block dot.** Each block's 24 activation values become one exponent ``E_b = 2^e`` and
  24-bit integers ``x̃ = rint(x / E_b)`` (``|x̃| ≤ 2^22``, relative rounding ≤ 2^-23 of the block's
  largest value) split into three byte limbs, packed four coordinates per word in the nibble order
  of the decoder. The weights are decoded straight to signed bytes and multiplied with ``dp4a``
  (3 limbs × 6 words); ``‖y‖²`` is 6 more ``dp4a`` of the value bytes with themselves. No
  per-coordinate float conversion or FMA remains. With ``A16`` (``ops_common.A16``, the serving default)
  ``x̃`` is rounded to a multiple of 256 (16 significant bits per block), limb 0 is zero and its
  6 ``dp4a`` are skipped (12 + 6 per block).
* **Decode** (``leechq.kernels.tables.tetra_m1_table``; the helpers of :mod:`.tetra48_decode`
  for both word layouts): ``h = f[row] ^ PA[s8] ^ PB[b1, b2, b3]``
  per section (three table words and two 16-byte table reads — the Golay pattern is F2-linear in
  its twelve index bits, split six and six; both pattern tables in eight copies so that the eight
  lanes of a 16-byte shared-load phase never share a bank; the middle section's class-1 rows
  reached by one multiply-add), then per 4-coordinate half-section the
  value bytes ``p + (−1)^p·2·(h − 7) + 128`` come from one multiply-add on the nibbles; the block
  scale is ``centroid[g] · rsqrt(‖y‖²) · E_b`` (the other decoders read ``1/‖y‖`` from the table).
* **Tables in shared memory**: the 32 KiB table is copied into shared memory once per program
  (``_bits.reserve_smem`` / ``smem_store32``) and read with ``ld.shared``; under the interpreter the
  same lookups read the global table.
* **Several rows and the other layout**: :func:`m1_kernel` serves ``MB`` (1, 2 or 4) activation
  rows per launch, one decode each block for all of them, and with ``CODE = PLANES14`` runs the
  same loop over Planes14 records (the decode of :mod:`.planes14_m1`); with ``CODE = TETRA_64``
  over the ``tetra64`` layout (``formats.layouts.tetra64``: the table addresses and shells stored,
  every coordinate ``2h − 14 − p`` on the raw nibbles, :func:`_pair_dot64` — the served default on a
  GPU), whose Golay pattern comes as one word per table (:data:`.tetra48_decode.T64_PBITS`
  copies) spread into nibble masks (:func:`.tetra48_decode.decode_block64_bits_split`).

The result differs from the f32 reference only by the activation rounding (≤ 2^-23 of each block's
largest value; with ``A16`` ≤ 2^-14, the twin ``reference.round_activation``), the hardware
reciprocal square root (≤ 2^-22.9 relative) and f32 accumulation — with 24 bits far inside the
1e-5·Σ|w·x| row bound of docs/kernels.md; with 16 bits that bound holds against the rounded
activation.
"""

from __future__ import annotations

import triton
import triton.language as tl

from leechq.kernels.triton import planes14_m1
from leechq.kernels.triton._bits import (
    await_previous_grid,
    dp4a,
    global_load64f_all,
    global_load128_all,
    prmt,
    reserve_smem,
    shfl_xor,
    smem_base,
    smem_store32,
    xor_and,
)
from leechq.kernels.triton.planes14_m1 import TABLE_PART as P14_TABLE_PART
from leechq.kernels.triton.planes14_m1 import TABLE_PARTS as P14_TABLE_PARTS
from leechq.kernels.triton.tetra48_decode import (
    T64_PBITS,
    _block_decode64,
    decode_nibbles,
    sb_copy,
    section_values,
)

MAGIC_RINT = tl.constexpr(12582912.0)
"""1.5·2^23: ``fma(x, s, MAGIC_RINT)`` has bits ``0x4B400000 + rint(x·s)`` for |x·s| < 2^22."""
A16_STEP = 256
"""With ``A16`` the activation integers x̃ (|x̃| < 2^22 per block) are rounded to multiples of this:
16 significant bits per block instead of 24, so limb 0 is zero and the kernels skip its ``dp4a``
(batch-1) or MMAs (int8 kernel). Error per coordinate ≤ 128·E_b ≤ 2^-14 of the block's largest
|value| (``reference.round_activation``)."""
A16_INV = tl.constexpr(1.0 / 256)


@triton.jit
def stage_table(tab_ptr, d_out, USE_ASM: tl.constexpr, PARTS: tl.constexpr = 2,
                PART: tl.constexpr = 4096):
    """Copy a table of ``PARTS · PART`` words (default: the batch-1 Tetra table) into shared memory
    (GPU) once per program, reserving 32 KiB; returns its base address (0 under the interpreter,
    where lookups read ``tab_ptr``)."""
    if USE_ASM:
        reserve_smem(tab_ptr, d_out < 0, 8192)
        base = smem_base(d_out)
        e = tl.arange(0, PART)
        for k in tl.static_range(PARTS):
            smem_store32(base + (k * PART + e) * 4, tl.load(tab_ptr + k * PART + e), e >= 0)
        tl.debug_barrier()
    else:
        base = d_out * 0
    return base


@triton.jit
def _limbs_of_quad(xa, xb, xc, xd, USE_ASM: tl.constexpr, A16: tl.constexpr = False):
    """The three limb words of four rounded coordinates: word L holds byte L of x̃_a … x̃_d in bytes
    0..3 (x̃ = b2·2^16 + b1·2^8 + b0: b0 and b1 unsigned bytes, b2 a signed byte). Seven byte
    permutes: (a0 b0 a1 b1), (c0 d0 c1 d1) → limbs 0 and 1; (a2 b2), (c2 d2) → limb 2. With
    ``A16`` the inputs are the 16-bit integers x̃/256 (:func:`_x_limbs`): their bytes 0 and 1 are
    limbs 1 and 2, limb 0 is zero — four permutes."""
    a = xa.to(tl.uint32, bitcast=True)
    b = xb.to(tl.uint32, bitcast=True)
    c = xc.to(tl.uint32, bitcast=True)
    d = xd.to(tl.uint32, bitcast=True)
    s01 = tl.full(a.shape, 0x5140, tl.uint32)
    ab = prmt(a, b, s01, USE_ASM)
    cd = prmt(c, d, s01, USE_ASM)
    l0 = prmt(ab, cd, tl.full(a.shape, 0x5410, tl.uint32), USE_ASM)
    l1 = prmt(ab, cd, tl.full(a.shape, 0x7632, tl.uint32), USE_ASM)
    if A16:
        return tl.zeros(a.shape, tl.uint32), l0, l1
    s2 = tl.full(a.shape, 0x0062, tl.uint32)
    l2 = prmt(prmt(a, b, s2, USE_ASM), prmt(c, d, s2, USE_ASM),
              tl.full(a.shape, 0x5410, tl.uint32), USE_ASM)
    return l0, l1, l2


@triton.jit
def block_scale(mx):
    """The integer scale of a block whose largest |value| is ``mx`` (float32): ``s`` and the block
    exponent ``E = 1/s``, both powers of two. From the biased exponent ``eb`` of ``mx`` (clamped
    so both stay normal floats), ``s = 2^(148 − eb)`` maps the maximum into [2^21, 2^22) and
    ``E = 2^(eb − 148)``."""
    eb = tl.maximum((mx.to(tl.int32, bitcast=True) >> 23) & 0xFF, 22)
    s = ((275 - eb) << 23).to(tl.float32, bitcast=True)
    e_blk = ((eb - 21) << 23).to(tl.float32, bitcast=True)
    return s, e_blk


@triton.jit
def _block_q(xb, NPP: tl.constexpr, PAR: tl.constexpr, A16: tl.constexpr = False,
             RAW: tl.constexpr = False):
    """One block per lane of the prepared activation (parity PAR): its exponent ``E`` (float32)
    and its 24 rounded integers ``q`` (trio order): ``x̃ = rint(x / E)`` (``|x̃| < 2^22``), with
    ``A16`` the 16-bit ``rint(x̃ / 256)`` (:data:`A16_STEP`, ``reference.round_activation``).
    ``RAW``: each ``q`` as the bits of its magic-number float, ``q + 0x4B400000`` (its low 22 bits
    are ``q``'s two's complement: the bytes a consumer of 16-bit integers reads, one subtraction
    fewer per coordinate)."""
    base = xb + PAR * 24 * NPP
    (m_e, x0, x2, x4, x6, x8, x10, x12, x14, x16, x18, x20,
     x22) = _x_half64(base, NPP)
    (m_o, x1, x3, x5, x7, x9, x11, x13, x15, x17, x19, x21,
     x23) = _x_half64(base + NPP, NPP)
    mx = tl.maximum(m_e, m_o)
    s, e_blk = block_scale(mx)
    if A16:
        s = s * A16_INV  # x̃ / 256, rounded; its bytes become limbs 1 and 2
    return (e_blk, _rint(x0, s, RAW), _rint(x1, s, RAW), _rint(x2, s, RAW), _rint(x3, s, RAW),
            _rint(x4, s, RAW), _rint(x5, s, RAW), _rint(x6, s, RAW), _rint(x7, s, RAW),
            _rint(x8, s, RAW), _rint(x9, s, RAW), _rint(x10, s, RAW), _rint(x11, s, RAW),
            _rint(x12, s, RAW), _rint(x13, s, RAW), _rint(x14, s, RAW), _rint(x15, s, RAW),
            _rint(x16, s, RAW), _rint(x17, s, RAW), _rint(x18, s, RAW), _rint(x19, s, RAW),
            _rint(x20, s, RAW), _rint(x21, s, RAW), _rint(x22, s, RAW), _rint(x23, s, RAW))


@triton.jit
def _x_limbs(xb, NPP: tl.constexpr, PAR: tl.constexpr, USE_ASM: tl.constexpr,
             A16: tl.constexpr = False):
    """One block per lane of the prepared activation (parity PAR): the exponent ``E`` (float32)
    and the 18 limb words ``L[limb][section][half]`` in the order the decoder consumes them.
    ``A16``: each coordinate rounded to a multiple of 256 (16 significant bits, :data:`A16_STEP`;
    ``reference.round_activation``), so every limb-0 word is zero and the consumers skip it."""
    (e_blk, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15, q16, q17, q18,
     q19, q20, q21, q22, q23) = _block_q(xb, NPP, PAR, A16)
    # half 0 of section k holds coordinates 8k + 0, 2, 4, 6 (the even nibbles), half 1 the odd ones
    a00, b00, c00 = _limbs_of_quad(q0, q2, q4, q6, USE_ASM, A16)
    a01, b01, c01 = _limbs_of_quad(q1, q3, q5, q7, USE_ASM, A16)
    a10, b10, c10 = _limbs_of_quad(q8, q10, q12, q14, USE_ASM, A16)
    a11, b11, c11 = _limbs_of_quad(q9, q11, q13, q15, USE_ASM, A16)
    a20, b20, c20 = _limbs_of_quad(q16, q18, q20, q22, USE_ASM, A16)
    a21, b21, c21 = _limbs_of_quad(q17, q19, q21, q23, USE_ASM, A16)
    return (e_blk, a00, a01, a10, a11, a20, a21, b00, b01, b10, b11, b20, b21,
            c00, c01, c10, c11, c20, c21)


@triton.jit
def _x_limbs64(xb, NPP: tl.constexpr, PAR: tl.constexpr, USE_ASM: tl.constexpr):
    """What the ``tetra64`` decode (:func:`_pair_dot64`) needs of one block per lane of the
    prepared activation (parity PAR), always with 16-bit activations: ``F = 8·E`` (float32),
    ``−112·S`` and ``−120·S`` (int32; ``S = Σ q``, the block's integer sum: the offsets of
    ``8·⟨y, q⟩`` for ``p = 0`` and ``p = 1``), then the 12 limb words ``L[limb 1, 2][section]
    [half]`` of :func:`_x_limbs` (limb 1 unsigned bytes, limb 2 signed)."""
    (e_blk, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15, q16, q17, q18,
     q19, q20, q21, q22, q23) = _block_q(xb, NPP, PAR, True, True)  # raw: q + 0x4B400000
    _a, b00, c00 = _limbs_of_quad(q0, q2, q4, q6, USE_ASM, True)
    _a, b01, c01 = _limbs_of_quad(q1, q3, q5, q7, USE_ASM, True)
    _a, b10, c10 = _limbs_of_quad(q8, q10, q12, q14, USE_ASM, True)
    _a, b11, c11 = _limbs_of_quad(q9, q11, q13, q15, USE_ASM, True)
    _a, b20, c20 = _limbs_of_quad(q16, q18, q20, q22, USE_ASM, True)
    _a, b21, c21 = _limbs_of_quad(q17, q19, q21, q23, USE_ASM, True)
    s = ((((q0 + q1) + (q2 + q3)) + ((q4 + q5) + (q6 + q7))
          + (((q8 + q9) + (q10 + q11)) + ((q12 + q13) + (q14 + q15)))
          + (((q16 + q17) + (q18 + q19)) + ((q20 + q21) + (q22 + q23))))
         - 0x0E000000)  # 24·0x4B400000 mod 2^32: wrapping int32, the exact sum (|S| < 2^19)
    return (e_blk * 8.0, s * -112, s * -120, b00, b01, b10, b11, b20, b21,
            c00, c01, c10, c11, c20, c21)


@triton.jit
def _x_half64(src, NPP: tl.constexpr):
    """The twelve coordinates of one half block of the prepared activation (trio positions
    ``8k + 2j + half``, ``src`` at the half's first one) and their largest magnitude (float32);
    :func:`_block_q` reads a block as its two halves."""
    x0 = tl.load(src + 0 * NPP)
    x1 = tl.load(src + 2 * NPP)
    x2 = tl.load(src + 4 * NPP)
    x3 = tl.load(src + 6 * NPP)
    x4 = tl.load(src + 8 * NPP)
    x5 = tl.load(src + 10 * NPP)
    x6 = tl.load(src + 12 * NPP)
    x7 = tl.load(src + 14 * NPP)
    x8 = tl.load(src + 16 * NPP)
    x9 = tl.load(src + 18 * NPP)
    x10 = tl.load(src + 20 * NPP)
    x11 = tl.load(src + 22 * NPP)
    m0 = tl.maximum(tl.maximum(tl.abs(x0), tl.abs(x1)), tl.maximum(tl.abs(x2), tl.abs(x3)))
    m1 = tl.maximum(tl.maximum(tl.abs(x4), tl.abs(x5)), tl.maximum(tl.abs(x6), tl.abs(x7)))
    m2 = tl.maximum(tl.maximum(tl.abs(x8), tl.abs(x9)), tl.maximum(tl.abs(x10), tl.abs(x11)))
    return (tl.maximum(tl.maximum(m0, m1), m2), x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10,
            x11)


@triton.jit
def rounded_quads(x, A16: tl.constexpr = False):
    """A tile of two blocks per pair in limb-word order (``x`` float32 [64, PRS], row
    ``((parity·4 + section)·2 + half)·4 + j``, section 3 zero) rounded as :func:`_x_limbs` does:
    the 24-bit integers ``q`` int32 [16, 4, PRS] (``[(parity, section, half), j]``; with ``A16``
    multiples of 256) and each block's exponent ``E_b`` float32 [2, PRS] — the same block
    maximum, :func:`block_scale` and fused round."""
    PRS: tl.constexpr = x.shape[1]
    x3 = tl.reshape(x, (2, 32, PRS))
    scale, e_blk = block_scale(tl.max(tl.abs(x3), axis=1))  # [2, PRS]: per block
    s = scale[:, None, :]
    if A16:  # x̃ / 256, rounded, back to a multiple of 256
        s = s * A16_INV
    q = _rint(x3, s)
    if A16:
        q = q << 8
    return tl.reshape(q, (16, 4, PRS)), e_blk


@triton.jit
def limb_words(q, limb: tl.constexpr):
    """Byte ``limb`` of the four integers ``q[:, j, :]`` (int32 [16, 4, PRS], from
    :func:`rounded_quads`) packed into one word per row and pair, ``j`` in byte ``j`` (int32
    [16, PRS]; the bytes are disjoint, so the sum is an OR)."""
    jj = tl.arange(0, 4)[None, :, None]
    return tl.sum(((q >> (8 * limb)) & 0xFF) << (8 * jj), axis=1)


@triton.jit
def _rint(x, s, RAW: tl.constexpr = False):
    """``rint(x·s)`` as int32 for |x·s| < 2^22 (the magic-number add; no F2I); ``RAW``: the
    float's bits, ``rint(x·s) + 0x4B400000``."""
    bits = tl.fma(x, s, MAGIC_RINT).to(tl.int32, bitcast=True)
    if RAW:
        return bits
    return bits - 0x4B400000


@triton.jit
def _row_dot(ev1, od1, ev2, od2, ev3, od3, x, USE_ASM: tl.constexpr, A16: tl.constexpr = False):
    """``⟨y, x⟩ / E_b`` of one activation row's block per element as int32 (its three limb sums
    recombined; no wrap: ``Σ|y_i| ≤ √(24·‖y‖²) < 111`` and ``|x̃| ≤ 2^22``), from the block's value bytes
    (:func:`section_values` of its three sections) and the row's limb words ``x``
    (:func:`_x_limbs`; ``A16``: its limb-0 words are zero, their six ``dp4a`` skipped)."""
    (_e, a00, a01, a10, a11, a20, a21, b00, b01, b10, b11, b20, b21,
     c00, c01, c10, c11, c20, c21) = x
    z = tl.zeros(ev1.shape, tl.int32)
    acc1 = dp4a(od1, b01, dp4a(ev1, b00, z, False, USE_ASM), False, USE_ASM)
    acc2 = dp4a(od1, c01, dp4a(ev1, c00, z, True, USE_ASM), True, USE_ASM)
    acc1 = dp4a(od2, b11, dp4a(ev2, b10, acc1, False, USE_ASM), False, USE_ASM)
    acc2 = dp4a(od2, c11, dp4a(ev2, c10, acc2, True, USE_ASM), True, USE_ASM)
    acc1 = dp4a(od3, b21, dp4a(ev3, b20, acc1, False, USE_ASM), False, USE_ASM)
    acc2 = dp4a(od3, c21, dp4a(ev3, c20, acc2, True, USE_ASM), True, USE_ASM)
    if A16:
        return (acc2 << 16) + (acc1 << 8)
    acc0 = dp4a(od1, a01, dp4a(ev1, a00, z, False, USE_ASM), False, USE_ASM)
    acc0 = dp4a(od2, a11, dp4a(ev2, a10, acc0, False, USE_ASM), False, USE_ASM)
    acc0 = dp4a(od3, a21, dp4a(ev3, a20, acc0, False, USE_ASM), False, USE_ASM)
    return (acc2 << 16) + (acc1 << 8) + acc0


@triton.jit
def _chain3(a1, b1, a2, b2, a3, b3, acc, B_SIGNED: tl.constexpr, USE_ASM: tl.constexpr):
    """``acc + Σ_k ⟨a_k, b_k⟩`` over three word pairs: a ``dp4a`` chain with unsigned ``a``
    bytes (the nibble words) and ``b`` bytes unsigned or signed (``B_SIGNED``)."""
    acc = dp4a(a1, b1, acc, B_SIGNED, USE_ASM, False)
    acc = dp4a(a2, b2, acc, B_SIGNED, USE_ASM, False)
    return dp4a(a3, b3, acc, B_SIGNED, USE_ASM, False)


@triton.jit
def _row_dot64(he1, ho1, he2, ho2, he3, ho3, p, x, USE_ASM: tl.constexpr):
    """``8·⟨y, q⟩`` (int32) of one activation row's block per element for the ``tetra64``
    decode: ``he``/``ho`` the block's even / odd nibbles of each section (bytes ``h`` and
    ``16·h``), ``p`` its parity (bool), ``x`` the row's :func:`_x_limbs64`. Every coordinate is
    ``2h − 14 − p``, so ``8·⟨y, q⟩ = 16·Σ h·q − (112 + 8p)·S``: four ``dp4a`` chains (limb 1 / 2
    × even / odd nibbles) of three sections, the offset as the first chain's start (no wrap:
    ``|16·Σ h·q| ≤ 16·15·24·2^14 < 2^27``)."""
    (_f, nk0, nk1, b00, b01, b10, b11, b20, b21, c00, c01, c10, c11, c20, c21) = x
    z = tl.zeros(he1.shape, tl.int32)
    e1 = _chain3(he1, b00, he2, b10, he3, b20, z, False, USE_ASM)
    o1 = _chain3(ho1, b01, ho2, b11, ho3, b21, tl.where(p, nk1, nk0), False, USE_ASM)
    e2 = _chain3(he1, c00, he2, c10, he3, c20, z, True, USE_ASM)
    o2 = _chain3(ho1, c01, ho2, c11, ho3, c21, z, True, USE_ASM)
    return ((e2 * 16 + o2) << 8) + (e1 * 16 + o1)


@triton.jit
def _block_dot64(f1, k1, f2, k2, f3, k3, p, scale, x0, x1, x2, x3, MB: tl.constexpr,
                 USE_ASM: tl.constexpr):
    """``⟨y, x_m⟩ · centroid[g] / ‖y‖`` of one ``tetra64`` block per element for the first ``MB``
    activation rows, from its sections' nibble words ``h = f ^ k`` (:func:`_decode64`), ``p``
    and the block's ``scale = centroid[g] · rsqrt(m)`` (:func:`_block_decode64`;
    ``1/‖y‖ = rsqrt(m) / 4``, the 4 folded into ``F``): each section's even and odd nibble
    bytes by one :func:`._bits.xor_and` each."""
    lo = tl.full(f1.shape, 0x0F0F0F0F, tl.uint32)
    hi = tl.full(f1.shape, 0xF0F0F0F0, tl.uint32)
    he1 = xor_and(f1, k1, lo, USE_ASM)
    ho1 = xor_and(f1, k1, hi, USE_ASM)
    he2 = xor_and(f2, k2, lo, USE_ASM)
    ho2 = xor_and(f2, k2, hi, USE_ASM)
    he3 = xor_and(f3, k3, lo, USE_ASM)
    ho3 = xor_and(f3, k3, hi, USE_ASM)
    d0 = _row_dot64(he1, ho1, he2, ho2, he3, ho3, p, x0, USE_ASM).to(tl.float32) * (scale * x0[0])
    d1 = d0
    d2 = d0
    d3 = d0
    if MB >= 2:
        d1 = (_row_dot64(he1, ho1, he2, ho2, he3, ho3, p, x1, USE_ASM).to(tl.float32)
              * (scale * x1[0]))
    if MB >= 4:
        d2 = (_row_dot64(he1, ho1, he2, ho2, he3, ho3, p, x2, USE_ASM).to(tl.float32)
              * (scale * x2[0]))
        d3 = (_row_dot64(he1, ho1, he2, ho2, he3, ho3, p, x3, USE_ASM).to(tl.float32)
              * (scale * x3[0]))
    return d0, d1, d2, d3


@triton.jit
def _pair_dot64(w0, w1, w2, w3, cent0, cent1, tab_ptr, base, sbr, xs, MB: tl.constexpr,
                USE_ASM: tl.constexpr):
    """:func:`_pair_dot` for a block pair in the ``tetra64`` layout (``w0..w3``, uint32;
    ``formats.layouts.tetra64``): both blocks by :func:`decode_block64` (each table address one
    mask or one shift of a word, the lane's pattern-copy byte offset ``sbr`` merged in; the
    shells the words' top five bits, at least 1 in every stored block); ``PBITS`` (8, 16 or
    32): by :func:`decode_block64_bits_split` on the pattern-bits table with that many copies.
    Each block is decoded (:func:`_block_decode64`; ``SPLIT`` False: the pattern XOR as its own
    instruction), then met with the activation rows
    (:func:`_block_dot64`) before the next is decoded: the order the hot loop was timed in
    (:func:`_pair_decode64` and :func:`_pair_dot_decoded64` split the same steps for the peeled
    trip)."""
    (xe0, xo0, xe1, xo1, xe2, xo2, xe3, xo3) = xs
    even = tl.full(w0.shape, False, tl.int1)
    f1, k1, f2, k2, f3, k3, p, sc = _block_decode64(w0, w1, w2, w3, even, cent0, cent1, tab_ptr,
                                                    base, sbr, USE_ASM)
    e0, e1, e2, e3 = _block_dot64(f1, k1, f2, k2, f3, k3, p, sc, xe0, xe1, xe2, xe3, MB, USE_ASM)
    f1, k1, f2, k2, f3, k3, p, sc = _block_decode64(w0, w1, w2, w3, ~even, cent0, cent1, tab_ptr,
                                                    base, sbr, USE_ASM)
    o0, o1, o2, o3 = _block_dot64(f1, k1, f2, k2, f3, k3, p, sc, xo0, xo1, xo2, xo3, MB, USE_ASM)
    return e0 + o0, e1 + o1, e2 + o2, e3 + o3


@triton.jit
def _block_dot(lo, hi, cent0, cent1, tab_ptr, base, sb_rep, x0, x1, x2, x3, MB: tl.constexpr,
               USE_ASM: tl.constexpr, A16: tl.constexpr = False):
    """``⟨y, x_m⟩ · centroid[g] / ‖y‖`` of one block per element for the first ``MB`` (1, 2 or 4)
    activation rows ``m`` (words ``lo``, ``hi``: uint32; ``x_m``: row m's block exponent and limb
    words, :func:`_x_limbs`): one decode, then 18 ``dp4a`` per row. Every tensor stays 1-D in
    the layout of one row — a 2-D [rows, tile] form lets Triton's layout passes (with the
    launch-time divisibility hints) spread the rows over warps and convert layouts through shared
    memory, over the staged table. The unused results (``m ≥ MB``) repeat row 0."""
    h1, h2, h3, mp, kp, g = decode_nibbles(lo, hi, tab_ptr, base, sb_rep, USE_ASM)
    zn = tl.zeros(lo.shape, tl.int32)
    ev1, od1, n2 = section_values(h1, mp, kp, zn, USE_ASM)
    ev2, od2, n2 = section_values(h2, mp, kp, n2, USE_ASM)
    ev3, od3, n2 = section_values(h3, mp, kp, n2, USE_ASM)
    # 1/‖y‖ on the special-function unit (rel. error ≤ 2^-22.9; no shared-memory request)
    invn = tl.math.rsqrt(tl.maximum(n2, 1).to(tl.float32))
    scale = tl.where(g != 0, cent1, cent0) * invn
    d0 = _row_dot(ev1, od1, ev2, od2, ev3, od3, x0, USE_ASM, A16).to(tl.float32) * (scale * x0[0])
    d1 = d0
    d2 = d0
    d3 = d0
    if MB >= 2:
        d1 = (_row_dot(ev1, od1, ev2, od2, ev3, od3, x1, USE_ASM, A16).to(tl.float32)
              * (scale * x1[0]))
    if MB >= 4:
        d2 = (_row_dot(ev1, od1, ev2, od2, ev3, od3, x2, USE_ASM, A16).to(tl.float32)
              * (scale * x2[0]))
        d3 = (_row_dot(ev1, od1, ev2, od2, ev3, od3, x3, USE_ASM, A16).to(tl.float32)
              * (scale * x3[0]))
    return d0, d1, d2, d3


@triton.jit
def _pair_dot(w0, w1, w2, cent0, cent1, tab_ptr, base, sb_rep, xs, MB: tl.constexpr,
              USE_ASM: tl.constexpr, A16: tl.constexpr = False):
    """The sums of the two block dots of a block pair (its three words ``w0..w2``) for each of
    the ``MB`` activation rows (``xs``: the rows' even- and odd-block limbs, :func:`_row_limbs`)."""
    (xe0, xo0, xe1, xo1, xe2, xo2, xe3, xo3) = xs
    e0, e1, e2, e3 = _block_dot(w0, w1, cent0, cent1, tab_ptr, base, sb_rep, xe0, xe1, xe2, xe3,
                                MB, USE_ASM, A16)
    o0, o1, o2, o3 = _block_dot((w1 >> 16) | (w2 << 16), w2 >> 16, cent0, cent1, tab_ptr, base,
                                sb_rep, xo0, xo1, xo2, xo3, MB, USE_ASM, A16)
    return e0 + o0, e1 + o1, e2 + o2, e3 + o3


@triton.jit
def _block_limbs(xb, NPP: tl.constexpr, PAR: tl.constexpr, USE_ASM: tl.constexpr,
                 A16: tl.constexpr = False, X64: tl.constexpr = False):
    """One block per lane converted from the prepared layout (:func:`_x_limbs`; ``A16``: 16-bit
    activations; ``X64``: what the ``tetra64`` decode reads, :func:`_x_limbs64`)."""
    if X64:
        return _x_limbs64(xb, NPP, PAR, USE_ASM)
    else:
        return _x_limbs(xb, NPP, PAR, USE_ASM, A16)


@triton.jit
def _row_limbs(xr, stride_x, NPP: tl.constexpr, MB: tl.constexpr, USE_ASM: tl.constexpr,
               A16: tl.constexpr = False, X64: tl.constexpr = False):
    """Even- and odd-block limbs (:func:`_x_limbs`) of the first ``MB`` activation rows (``xr``:
    row 0's pointers per lane, rows ``stride_x`` apart, prepared rows), as one tuple
    ``(even_0, odd_0, …, even_3, odd_3)``; rows ``m ≥ MB`` repeat
    row 0 (never used); ``X64``: :func:`_x_limbs64` tuples."""
    xe0 = _block_limbs(xr, NPP, 0, USE_ASM, A16, X64)
    xo0 = _block_limbs(xr, NPP, 1, USE_ASM, A16, X64)
    xe1 = xe0
    xo1 = xo0
    xe2 = xe0
    xo2 = xo0
    xe3 = xe0
    xo3 = xo0
    if MB >= 2:
        xe1 = _block_limbs(xr + stride_x, NPP, 0, USE_ASM, A16, X64)
        xo1 = _block_limbs(xr + stride_x, NPP, 1, USE_ASM, A16, X64)
    if MB >= 4:
        xe2 = _block_limbs(xr + 2 * stride_x, NPP, 0, USE_ASM, A16, X64)
        xo2 = _block_limbs(xr + 2 * stride_x, NPP, 1, USE_ASM, A16, X64)
        xe3 = _block_limbs(xr + 3 * stride_x, NPP, 0, USE_ASM, A16, X64)
        xo3 = _block_limbs(xr + 3 * stride_x, NPP, 1, USE_ASM, A16, X64)
    return xe0, xo0, xe1, xo1, xe2, xo2, xe3, xo3


@triton.jit
def _geometry(N_BLOCKS: tl.constexpr, NW: tl.constexpr, BP: tl.constexpr):
    """Program → K-slice ``pid % NS`` and its first row chunk ``pid // NS`` (the grid is a multiple
    of NS, so a program keeps its slice); flat tile element → (row of the iteration, pair)."""
    NP: tl.constexpr = (N_BLOCKS + 1) // 2
    NS: tl.constexpr = (NP + BP - 1) // BP
    pid = tl.program_id(0)
    sl = pid % NS
    c0 = pid // NS
    cstep = tl.num_programs(0) // NS
    e = tl.arange(0, NW * 32)
    sub = e // BP  # the NW·32/BP rows of one iteration
    lane = e % BP
    pair = sl * BP + lane
    return sl, c0, cstep, e, sub, lane, pair


TETRA = tl.constexpr(0)
"""``m1_kernel``'s ``CODE`` for a ``tetra48`` matrix (3 words per block pair, the Tetra decode)."""
PLANES14 = tl.constexpr(1)
"""``m1_kernel``'s ``CODE`` for a ``planes14`` matrix (7 words per record pair, the decode of
:mod:`.planes14_m1`; the activation prepared in ``tables.planes14_m1_order``)."""
TETRA_64 = tl.constexpr(3)
"""``m1_kernel``'s ``CODE`` for a Tetra matrix in the ``tetra64`` layout
(``formats.layouts.tetra64``: 4 words per block pair holding the table addresses and shells;
:func:`_pair_dot64`; 16-bit activations only)."""

@triton.jit
def m1_kernel(
    xp_ptr, w_ptr, scale_ptr, cent_ptr, tail_ptr, tab_ptr, part_ptr, cnt_ptr, y_ptr, d_out,
    stride_x, stride_y, m_rows,
    N_BLOCKS: tl.constexpr, TAIL_COLS: tl.constexpr, ROWS: tl.constexpr, NW: tl.constexpr,
    BP: tl.constexpr, USE_ASM: tl.constexpr, ILP: tl.constexpr = 1, MB: tl.constexpr = 1,
    CODE: tl.constexpr = 0, SEL_TABLE: tl.constexpr = True, PDL: tl.constexpr = False,
    A16: tl.constexpr = False,
):
    """``y = W x`` for ``MB`` activation rows (``m_rows ≤ MB`` of them real; prepared rows
    ``stride_x`` apart, output rows ``stride_y`` apart); see the module docstring. Launched with
    ``num_warps = NW`` and a grid that is a multiple of ``NS = ceil(pairs / BP)``; program ``pid``
    keeps K-slice ``pid % NS`` and walks row chunks ``pid // NS + k·(grid / NS)``. ``ILP`` (1 or 2)
    is the number of rows a warp decodes per loop trip (two independent decode chains in flight);
    ``ROWS`` must be a multiple of ``ILP · NW · 32 / BP``. Each decoded block meets the ``MB``
    activation rows' limbs (kept in registers: ``19·MB`` words per block), so the decode is paid
    once for all of them; the scratch holds ``[NS, MB, d_out]`` partials. ``CODE``: :data:`TETRA`
    (``w_ptr``: the ``tetra48`` words; ``tab_ptr``: ``tables.tetra_m1_table``), :data:`TETRA_64`
    (the ``tetra64`` words; ``tab_ptr``: ``tables.tetra_m1_bits_table`` with :data:`T64_PBITS`
    copies) or :data:`PLANES14` (``w_ptr``: the records; ``tab_ptr``: ``tables.planes14_m1_table``;
    ``SEL_TABLE``: the permute selectors from that table, else built in registers). ``PDL``: the
    program stages its table and loads its first words before it waits for the previous grid
    (:func:`._bits.await_previous_grid`; launched with ``launch_pdl=True``). ``A16``: the
    activation rounded to 16 bits per block (:data:`A16_STEP`), 12 ``dp4a`` per block and row
    instead of 18."""
    NP: tl.constexpr = (N_BLOCKS + 1) // 2
    NPP: tl.constexpr = ((NP + 63) // 64) * 64
    NS: tl.constexpr = (NP + BP - 1) // BP
    RI: tl.constexpr = NW * 32 // BP  # rows per row set
    IPC: tl.constexpr = ROWS // (RI * ILP)  # loop trips per chunk
    if CODE == 0:
        STRIDE_W: tl.constexpr = ((6 * N_BLOCKS + 7) // 8) * 2  # tetra48.stride_u32
    elif CODE == 3:
        STRIDE_W: tl.constexpr = 4 * NP  # tetra48.t64_stride
        tl.static_assert(A16, "the tetra64 decode needs 16-bit activations (A16)")
    else:
        STRIDE_W: tl.constexpr = 7 * NP
    sl, c0, cstep, e, sub, lane, pair = _geometry(N_BLOCKS, NW, BP)
    if CODE == 1:
        base = stage_table(tab_ptr, d_out, USE_ASM, P14_TABLE_PARTS, P14_TABLE_PART)
    elif CODE == 3:  # 4096 + 2·64·T64_PBITS words, in parts of 128·T64_PBITS
        base = stage_table(tab_ptr, d_out, USE_ASM, 32 // T64_PBITS + 1, 128 * T64_PBITS)
    else:
        base = stage_table(tab_ptr, d_out, USE_ASM)
    if CODE == 3:  # one 4-byte copy per lane (mod T64_PBITS)
        sb_rep = ((e % T64_PBITS) * 4).to(tl.uint32)
    else:
        sb_rep = sb_copy(e)
    ok_e = pair * 2 < N_BLOCKS
    ok_o = pair * 2 + 1 < N_BLOCKS
    n_chunks = (d_out + ROWS - 1) // ROWS
    n_iter = tl.maximum((n_chunks - c0 + cstep - 1) // cstep, 0) * IPC
    rows = c0 * ROWS + sub
    part = part_ptr + sl * MB * d_out
    if CODE == 3:  # tetra64: lanes past the row's pairs read its last pair (their activation is
        pair = tl.minimum(pair, NP - 1)  # the zero padding), so no load needs a mask
    w, ca, cb = _load_words(w_ptr, cent_ptr, rows, pair, d_out, ok_e, ok_o, STRIDE_W, CODE,
                            USE_ASM)
    if ILP == 2:
        v, va, vb = _load_words(w_ptr, cent_ptr, rows + RI, pair, d_out, ok_e, ok_o, STRIDE_W,
                                CODE, USE_ASM)
    # the table and the first words (read-only) are in flight before the activation is ready
    await_previous_grid(PDL)
    # pairs past NP read the zero padding of the prepared layout (NPP ≥ BP·NS); rows past m_rows
    # read its zero rows (the prepared buffer has a power-of-two row count ≥ MB)
    xs = _row_limbs(xp_ptr + sl * BP + lane, stride_x, NPP, MB, USE_ASM, A16, CODE == 3)
    for k in range(n_iter):
        # the next trip's rows (the next chunk of this program after the last trip of a chunk);
        # words and centroids are loaded one trip ahead
        nxt = _next_rows(rows, k, cstep, ROWS, ILP * RI, IPC)
        nrow = tl.where(k + 1 < n_iter, nxt, d_out)
        n, na, nb = _load_words(w_ptr, cent_ptr, nrow, pair, d_out, ok_e, ok_o, STRIDE_W, CODE,
                                USE_ASM)
        if ILP == 2:
            m, ma, mb = _load_words(w_ptr, cent_ptr, nrow + RI, pair, d_out, ok_e, ok_o,
                                    STRIDE_W, CODE, USE_ASM)
        a0, a1, a2, a3 = _pair_dots(w, ca, cb, tab_ptr, base, sb_rep, xs, MB, CODE, SEL_TABLE,
                                    USE_ASM, A16)
        b0, b1, b2, b3 = a0, a1, a2, a3
        if ILP == 2:
            b0, b1, b2, b3 = _pair_dots(v, va, vb, tab_ptr, base, sb_rep, xs, MB, CODE,
                                        SEL_TABLE, USE_ASM, A16)
            v, va, vb = m, ma, mb
        _trip_out(a0, a1, a2, a3, b0, b1, b2, b3, rows, k, c0, cstep, e, lane, part, cnt_ptr,
                  part_ptr, scale_ptr, tail_ptr, xp_ptr, y_ptr, d_out, stride_x, stride_y,
                  m_rows, NS, ROWS, NW, BP, TAIL_COLS, NPP, MB, ILP, IPC, USE_ASM)
        rows = nxt
        w, ca, cb = n, na, nb


@triton.jit
def _next_rows(rows, k, cstep, ROWS: tl.constexpr, STEP: tl.constexpr, IPC: tl.constexpr):
    """The rows of the trip after trip ``k`` (``STEP`` rows per trip, ``IPC`` trips per chunk):
    the next ``STEP`` rows of the chunk, or after a chunk's last trip the program's next chunk
    (``cstep`` chunks on)."""
    return tl.where(k % IPC == IPC - 1, rows + (cstep - 1) * ROWS + STEP, rows + STEP)


@triton.jit
def _trip_out(a0, a1, a2, a3, b0, b1, b2, b3, rows, k, c0, cstep, e, lane, part, cnt_ptr,
              part_ptr, scale_ptr, tail_ptr, xp_ptr, y_ptr, d_out, stride_x, stride_y, m_rows,
              NS: tl.constexpr, ROWS: tl.constexpr, NW: tl.constexpr, BP: tl.constexpr,
              TAIL_COLS: tl.constexpr, NPP: tl.constexpr, MB: tl.constexpr, ILP: tl.constexpr,
              IPC: tl.constexpr, USE_ASM: tl.constexpr):
    """The end of loop trip ``k`` of an ``m1`` program: its row sums stored as partials (``a*``
    at ``rows``, with ``ILP`` 2 ``b*`` at the next row set), then after a chunk's last trip the
    ticket and, for the last program of the chunk, the fixup (:func:`_ticket_fixup`)."""
    if ILP == 2:
        RI: tl.constexpr = NW * 32 // BP
        _store_rows_ilp2(a0, a1, a2, a3, b0, b1, b2, b3, rows, rows + RI, lane, part, d_out,
                         NW, BP, MB, USE_ASM)
    else:
        _store_rows(a0, a1, a2, a3, rows, lane, part, d_out, NW, BP, MB)
    if k % IPC == IPC - 1:
        chunk = c0 + (k // IPC) * cstep
        _ticket_fixup(cnt_ptr, part_ptr, scale_ptr, tail_ptr, xp_ptr, y_ptr, chunk, e, lane,
                      d_out, stride_x, stride_y, m_rows, NS, ROWS, NW, BP, TAIL_COLS, NPP, MB)


@triton.jit
def _load_words(w_ptr, cent_ptr, rows, pair, d_out, ok_e, ok_o, STRIDE_W: tl.constexpr,
                CODE: tl.constexpr, USE_ASM: tl.constexpr = False):
    """The words of each element's block (record) pair as a tuple — 3 for Tetra, 4 for
    ``tetra64``, 7 for Planes14 — and its row's centroid pair (zeros past ``d_out``; ``tetra64``:
    rows past ``d_out`` read the last row, whose sums are not stored for them, and no load is
    masked)."""
    if CODE == 3:
        rc = tl.minimum(rows, d_out - 1).to(tl.int64)
        w0, w1, w2, w3 = global_load128_all((w_ptr + 4 * pair) + rc * STRIDE_W, USE_ASM)
        ca, cb = global_load64f_all(cent_ptr + rc * 2, USE_ASM)
        words = (w0.to(tl.uint32, bitcast=True), w1.to(tl.uint32, bitcast=True),
                 w2.to(tl.uint32, bitcast=True), w3.to(tl.uint32, bitcast=True))
    elif CODE != 1:
        w0, w1, w2, ca, cb = _load_row(w_ptr, cent_ptr, rows, pair, d_out, ok_e, ok_o, STRIDE_W)
        words = (w0, w1, w2)
    else:
        words, ca, cb = planes14_m1.load_row(w_ptr, cent_ptr, rows, pair, d_out, ok_e, ok_o,
                                             STRIDE_W)
    return words, ca, cb


@triton.jit
def _pair_dots(words, ca, cb, tab_ptr, base, sb_rep, xs, MB: tl.constexpr, CODE: tl.constexpr,
               SEL_TABLE: tl.constexpr, USE_ASM: tl.constexpr, A16: tl.constexpr = False):
    """The pair sums of every activation row (:func:`_pair_dot` or ``planes14_m1.pair_dot``)."""
    if CODE == 3:
        w0, w1, w2, w3 = words
        d0, d1, d2, d3 = _pair_dot64(w0, w1, w2, w3, ca, cb, tab_ptr, base, sb_rep, xs, MB,
                                     USE_ASM)
    elif CODE != 1:
        w0, w1, w2 = words
        d0, d1, d2, d3 = _pair_dot(w0, w1, w2, ca, cb, tab_ptr, base, sb_rep, xs, MB, USE_ASM,
                                   A16)
    else:
        d0, d1, d2, d3 = planes14_m1.pair_dot(words, ca, cb, tab_ptr, base, xs, MB, SEL_TABLE,
                                              USE_ASM, A16)
    return d0, d1, d2, d3


@triton.jit
def _load_row(w_ptr, cent_ptr, rows, pair, d_out, ok_e, ok_o, STRIDE_W: tl.constexpr):
    """The words of each element's block pair and its row's centroid pair (zeros past ``d_out``;
    issued one trip ahead of their use)."""
    row_ok = rows < d_out
    rc = tl.where(row_ok, rows, 0)
    w0, w1, w2 = load_pair_words(w_ptr, rc, pair, row_ok & ok_e, row_ok & ok_o, STRIDE_W)
    return w0, w1, w2, tl.load(cent_ptr + rc * 2), tl.load(cent_ptr + rc * 2 + 1)


@triton.jit
def load_pair_words(w_ptr, rows, pair, ok_e, ok_o, STRIDE_W: tl.constexpr):
    """The three u32 words of each element's block pair of row ``rows`` (a valid row); zeros
    where the even (``ok_e``) or odd (``ok_o``) block is absent."""
    pw = w_ptr + rows * STRIDE_W + 3 * pair
    w0 = tl.load(pw, mask=ok_e, other=0).to(tl.uint32)
    w1 = tl.load(pw + 1, mask=ok_e, other=0).to(tl.uint32)
    w2 = tl.load(pw + 2, mask=ok_o, other=0).to(tl.uint32)
    return w0, w1, w2


@triton.jit
def _warp_bcast(v, NW: tl.constexpr):
    """Per warp, the maximum of ``v`` (int32 flat tile) over its 32 lanes, broadcast back to every
    lane (warp shuffles only — no shared memory)."""
    m = tl.max(tl.reshape(v, (NW, 32)), axis=1)
    return tl.reshape(tl.broadcast_to(m[:, None], (NW, 32)), (NW * 32,))


@triton.jit
def _store_partial(acc, rows, lane, out_ptr, d_out, NW: tl.constexpr, BP: tl.constexpr):
    """Sum each output row's BP lanes of ``acc`` (shuffles) and store it from the row's first lane
    at ``out_ptr[row]``."""
    R: tl.constexpr = NW * 32 // BP
    tot = tl.sum(tl.reshape(acc, (R, BP)), axis=1)
    flat = tl.reshape(tl.broadcast_to(tot[:, None], (R, BP)), (NW * 32,))
    tl.store(out_ptr + rows, flat, mask=(lane == 0) & (rows < d_out))


@triton.jit
def _store_two(a, b, rows_a, rows_b, lane, out_ptr, d_out, NW: tl.constexpr,
               USE_ASM: tl.constexpr):
    """:func:`_store_partial` of two rows at once for ``BP = 32`` (one row per warp in each of
    ``a`` and ``b``): the warp's halves first trade the row they do not keep (one shuffle: lanes
    0..15 keep ``a``'s row, 16..31 ``b``'s), then each half sums its 16 lanes — 5 shuffles and
    adds for both rows instead of 10. Lanes 0 and 16 store."""
    hi = lane >= 16
    s = tl.where(hi, b, a) + shfl_xor(tl.where(hi, a, b), 16, NW, USE_ASM)
    tot = tl.sum(tl.reshape(s, (NW * 2, 16)), axis=1)
    flat = tl.reshape(tl.broadcast_to(tot[:, None], (NW * 2, 16)), (NW * 32,))
    rows = tl.where(hi, rows_b, rows_a)
    tl.store(out_ptr + rows, flat, mask=(lane % 16 == 0) & (rows < d_out))


@triton.jit
def _store_rows_ilp2(a0, a1, a2, a3, b0, b1, b2, b3, rows, rows_b, lane, out_ptr, d_out,
                     NW: tl.constexpr, BP: tl.constexpr, MB: tl.constexpr,
                     USE_ASM: tl.constexpr):
    """:func:`_store_rows` of a loop trip's two rows (``a*`` at ``rows``, ``b*`` at ``rows_b``):
    with ``BP = 32`` through :func:`_store_two`."""
    if BP == 32:
        _store_two(a0, b0, rows, rows_b, lane, out_ptr, d_out, NW, USE_ASM)
        if MB >= 2:
            _store_two(a1, b1, rows, rows_b, lane, out_ptr + d_out, d_out, NW, USE_ASM)
        if MB >= 4:
            _store_two(a2, b2, rows, rows_b, lane, out_ptr + 2 * d_out, d_out, NW, USE_ASM)
            _store_two(a3, b3, rows, rows_b, lane, out_ptr + 3 * d_out, d_out, NW, USE_ASM)
    else:
        _store_rows(b0, b1, b2, b3, rows_b, lane, out_ptr, d_out, NW, BP, MB)
        _store_rows(a0, a1, a2, a3, rows, lane, out_ptr, d_out, NW, BP, MB)


@triton.jit
def _store_rows(a0, a1, a2, a3, rows, lane, out_ptr, d_out, NW: tl.constexpr, BP: tl.constexpr,
                MB: tl.constexpr):
    """:func:`_store_partial` of the first ``MB`` activation rows' sums ``a0..a3`` at
    ``out_ptr + m·d_out``."""
    _store_partial(a0, rows, lane, out_ptr, d_out, NW, BP)
    if MB >= 2:
        _store_partial(a1, rows, lane, out_ptr + d_out, d_out, NW, BP)
    if MB >= 4:
        _store_partial(a2, rows, lane, out_ptr + 2 * d_out, d_out, NW, BP)
        _store_partial(a3, rows, lane, out_ptr + 3 * d_out, d_out, NW, BP)


@triton.jit
def _ticket_fixup(cnt_ptr, part_ptr, scale_ptr, tail_ptr, xp_ptr, y_ptr, chunk, e, lane, d_out,
                  stride_x, stride_y, m_rows, NS: tl.constexpr, ROWS: tl.constexpr,
                  NW: tl.constexpr, BP: tl.constexpr, TAIL_COLS: tl.constexpr, NPP: tl.constexpr,
                  MB: tl.constexpr):
    """After a warp's last iteration on ``chunk``: each lane that stored partials takes a ticket
    (acq_rel, after its own stores); the warp holding the last of the ``NS · ROWS / (rows per
    storing lane)`` tickets adds the K-slices in slice order, applies σ_row and the tail, writes
    ``y`` for the chunk's rows (one per lane) and each of the ``m_rows`` activation rows, and
    resets the ticket counter. Everything is per warp: no barrier, no shared memory."""
    RI: tl.constexpr = NW * 32 // BP
    TICKETS: tl.constexpr = NS * RI  # storing lanes per chunk, over all programs of the chunk
    taker = lane == 0
    old = tl.atomic_add(cnt_ptr + chunk + e * 0, 1, sem="acq_rel", scope="gpu", mask=taker)
    last = _warp_bcast(tl.where(taker & (old == TICKETS - 1), 1, 0), NW)
    lane32 = e % 32
    rr = chunk * ROWS + lane32
    for m in tl.static_range(MB):
        for r0 in tl.static_range(0, ROWS, 32):
            ok = (last != 0) & (lane32 + r0 < ROWS) & (rr + r0 < d_out) & (e * 0 + m < m_rows)
            tot = tl.zeros(e.shape, tl.float32)
            for s in range(NS):  # a loop, not unrolled: its register use must not grow with NS
                tot += tl.load(part_ptr + (s * MB + m) * d_out + rr + r0, mask=ok, other=0.0,
                               cache_modifier=".cg")
            out = tot * tl.load(scale_ptr + rr + r0, mask=ok, other=0.0)
            for c in range(TAIL_COLS):
                out += (tl.load(tail_ptr + (rr + r0) * TAIL_COLS + c, mask=ok, other=0.0)
                        * tl.load(xp_ptr + m * stride_x + 48 * NPP + c + e * 0))
            tl.store(y_ptr + m * stride_y + rr + r0, out, mask=ok)
    tl.atomic_xchg(cnt_ptr + chunk + e * 0, 0, mask=(last != 0) & (e % 32 == 0))
