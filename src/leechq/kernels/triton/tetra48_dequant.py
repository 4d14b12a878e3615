"""Dequantize a ``tetra48`` record to a float16 matrix: the many-row path (prefill, batched decode).

At batch 1 the fused matvec (:mod:`.tetra48_m1`) reads each 48-bit word once per token. With many
activation rows (a prompt, a batch of 16) the tiled kernels decode every block once per 8 rows and
spend 8 × 24 FMAs per block, far slower than a tensor-core GEMM. This kernel decodes a record once
into float16 values ``y_t · c_g / ‖y‖`` (no σ_row) so that cuBLAS can take the product; σ_row, the
tail columns and the column order are applied around the GEMM (``ops.tetra48_matmul_dense``).

Decode: the batch-1 kernel's table and arithmetic (:func:`.tetra48_m1.decode_nibbles`, layouts-
kernels-recipe.md §2.5–§2.6): per section the value bytes of the even and odd trio coordinates, the
squared norm by ``dp4a``, ``1/‖y‖`` from the table. Each value is converted once (int8 → f32),
multiplied by ``c_g·(1/‖y‖)`` in f32 and rounded to float16.

Output columns: block ``b`` occupies columns ``24 b .. 24 b + 23`` in *word order*: column
``24 b + 8 s + 4 h + i`` holds trio coordinate ``t = 8 s + 2 i + h`` (section ``s``, half ``h``
= 0 for the even nibbles, byte ``i``), i.e. natural coordinate ``order[t]``
(:func:`dequant_natural_index`). Two float16 values are packed per int32 store, 12 per block.

Geometry: a grid-stride loop over (row, block pair) items, one item per lane, consecutive lanes on
consecutive pairs of a row (coalesced word loads and stores); the table is staged in shared memory
once per program.
"""

from __future__ import annotations

import triton
import triton.language as tl

from leechq.kernels.triton._bits import global_store128
from leechq.kernels.triton.tetra48_m1 import (
    decode_nibbles,
    inv_norm,
    load_pair_words,
    sb_copy,
    section_values,
    stage_table,
)


@triton.jit
def _pack_f16_pair(word, i: tl.constexpr, scale):
    """Bytes ``i`` and ``i + 1`` of ``word`` (signed) times ``scale``, as two float16 in one int32
    (byte ``i`` in the low half)."""
    a = (((word >> (8 * i)) & 0xFF) ^ 0x80).to(tl.int32) - 0x80
    b = (((word >> (8 * i + 8)) & 0xFF) ^ 0x80).to(tl.int32) - 0x80
    fa = (a.to(tl.float32) * scale).to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    fb = (b.to(tl.float32) * scale).to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
    return fa | (fb << 16)


@triton.jit
def _store_words(ptr, word, scale, ok):
    """The 4 values of one section half: two packed int32 at ``ptr``, ``ptr + 1``."""
    tl.store(ptr, _pack_f16_pair(word, 0, scale), mask=ok)
    tl.store(ptr + 1, _pack_f16_pair(word, 2, scale), mask=ok)


@triton.jit
def _store_section(ptr, ev, od, scale, ok, VEC: tl.constexpr, USE_ASM: tl.constexpr):
    """The 8 values of one section (even-nibble word, then odd): 16 bytes at ``ptr`` — one vector
    store per element with ``VEC``, else four 4-byte stores."""
    if VEC:
        global_store128(ptr, _pack_f16_pair(ev, 0, scale), _pack_f16_pair(ev, 2, scale),
                        _pack_f16_pair(od, 0, scale), _pack_f16_pair(od, 2, scale), ok, USE_ASM)
    else:
        _store_words(ptr, ev, scale, ok)
        _store_words(ptr + 2, od, scale, ok)


@triton.jit
def _dequant_block(lo, hi, cent0, cent1, tab_ptr, base, sb_rep, out, ok, VEC: tl.constexpr,
                   USE_ASM: tl.constexpr):
    """Decode one block per element and store its 24 float16 values (12 int32) at ``out``."""
    h1, h2, h3, mp, kp, g = decode_nibbles(lo, hi, tab_ptr, base, sb_rep, USE_ASM)
    e1, o1, n2 = section_values(h1, mp, kp, tl.zeros(lo.shape, tl.int32), USE_ASM)
    e2, o2, n2 = section_values(h2, mp, kp, n2, USE_ASM)
    e3, o3, n2 = section_values(h3, mp, kp, n2, USE_ASM)
    scale = tl.where(g != 0, cent1, cent0) * inv_norm(n2, tab_ptr, base, sb_rep, USE_ASM)
    _store_section(out + 0, e1, o1, scale, ok, VEC, USE_ASM)
    _store_section(out + 4, e2, o2, scale, ok, VEC, USE_ASM)
    _store_section(out + 8, e3, o3, scale, ok, VEC, USE_ASM)


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
def tetra48_dequant_kernel(w_ptr, cent_ptr, tab_ptr, out_ptr, d_out, N_BLOCKS: tl.constexpr,
                           NW: tl.constexpr, USE_ASM: tl.constexpr, VEC: tl.constexpr = False):
    """float16 ``[d_out, 24·N_BLOCKS]`` (written as int32 pairs) from the words; see the module
    docstring. Any grid; ``num_warps = NW``."""
    NP: tl.constexpr = (N_BLOCKS + 1) // 2
    STRIDE_W: tl.constexpr = ((6 * N_BLOCKS + 7) // 8) * 2
    OUT_W: tl.constexpr = 12 * N_BLOCKS
    LANES: tl.constexpr = NW * 32
    base = stage_table(tab_ptr, d_out, USE_ASM)
    e = tl.arange(0, LANES)
    sb_rep = sb_copy(e)
    n_items = d_out * NP
    for start in range(tl.program_id(0) * LANES, n_items, tl.num_programs(0) * LANES):
        ok, row, pair, ok_e, ok_o = pair_items(start + e, n_items, NP, N_BLOCKS)
        w0, w1, w2 = load_pair_words(w_ptr, row, pair, ok_e, ok_o, STRIDE_W)
        cent0 = tl.load(cent_ptr + row * 2, mask=ok, other=0.0)
        cent1 = tl.load(cent_ptr + row * 2 + 1, mask=ok, other=0.0)
        out = out_ptr + row * OUT_W + 24 * pair
        _dequant_block(w0, w1, cent0, cent1, tab_ptr, base, sb_rep, out, ok_e, VEC, USE_ASM)
        _dequant_block((w1 >> 16) | (w2 << 16), w2 >> 16, cent0, cent1, tab_ptr, base, sb_rep,
                       out + 12, ok_o, VEC, USE_ASM)
