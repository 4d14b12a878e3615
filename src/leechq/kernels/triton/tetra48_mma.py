"""Batched Tetra matmul on tensor cores: decode once per (row, block), M rows through ``tl.dot``.

The tiled kernels (:mod:`.tetra48`) decode every block once per 8 activation rows and spend 8 × 24
FMAs per block; the dense path (:mod:`.tetra48_dequant`) writes and re-reads a float16 copy. This
kernel keeps the decoded values in registers and hands them to the tensor cores (issue 4: "a decode
that amortizes over M rows"):

* A program owns ``BN`` output rows and a K-slice (``grid = (ceil(d_out / BN), KSPLIT)``); each
  iteration takes ``BB`` consecutive blocks of those rows, one (row, block) item per lane.
* Decode per item: the batch-1 kernel's header arithmetic and tables
  (:func:`.tetra48_m1.decode_nibbles`), read from global memory in the compact layout
  (``tables.tetra_m1_table_compact``: one copy per pattern entry, so a warp's random entries touch
  8 cache lines per table rather than the 32 of the bank-spread copies; no staged table: Triton may
  use shared memory for the dot operands). Nibble ``j`` of section word ``h_s`` is trio coordinate
  ``t = 8 s + j`` with value ``nib·(2 − 4p) − 14 + 29p``; the item's 24 values (plus 8 zero columns)
  form one 32-wide slice of the weight tile, scaled by ``c_g/‖y‖`` and rounded to float16.
* The activation arrives as float16 ``[M, 32·n_blocks]``: block ``b`` at columns ``32 b + t`` in
  trio order, zeros at ``t ≥ 24`` (:func:`leechq.kernels.triton.ops.mma_activation`). One
  ``tl.dot`` of ``[BN, 32·BB] × [32·BB, BM]`` per iteration, f32 accumulation; partial sums per
  K-slice go to ``part [KSPLIT, M, d_out]`` and the caller adds them, applies σ_row and the tail.

Accuracy: float16 weight values and activations (≲ 2^-11 relative per product), as for the dense
path. Served for 9..64 activation rows only under ``LEECHQ_MMA=1`` (``serve.fused.MMA_ROWS``:
8-row chunks on the int8 kernel are faster end to end; H200 timings in
``ops.tetra48_matmul_mma``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from leechq.kernels.triton.tetra48_m1 import decode_nibbles, inv_norm


@triton.jit
def _item_words(w_ptr, rows, blk, ok, STRIDE_W: tl.constexpr):
    """The 48-bit word of block ``blk`` of row ``rows`` per item as (lo, hi) uint32."""
    odd = (blk & 1) == 1
    pw = w_ptr + rows * STRIDE_W + 3 * (blk // 2)
    w0 = tl.load(pw, mask=ok, other=0).to(tl.uint32)
    w1 = tl.load(pw + 1, mask=ok, other=0).to(tl.uint32)
    w2 = tl.load(pw + 2, mask=ok & odd, other=0).to(tl.uint32)
    lo = tl.where(odd, (w1 >> 16) | (w2 << 16), w0)
    hi = tl.where(odd, w2 >> 16, w1)
    return lo, hi


@triton.jit
def _section_values(h, mp, kq):
    """The 8 values of one section word per item (nibble ``j`` → ``nib·mp + kq``), as int32."""
    v0 = (h & 15).to(tl.int32) * mp + kq
    v1 = ((h >> 4) & 15).to(tl.int32) * mp + kq
    v2 = ((h >> 8) & 15).to(tl.int32) * mp + kq
    v3 = ((h >> 12) & 15).to(tl.int32) * mp + kq
    v4 = ((h >> 16) & 15).to(tl.int32) * mp + kq
    v5 = ((h >> 20) & 15).to(tl.int32) * mp + kq
    v6 = ((h >> 24) & 15).to(tl.int32) * mp + kq
    v7 = ((h >> 28) & 15).to(tl.int32) * mp + kq
    return v0, v1, v2, v3, v4, v5, v6, v7


@triton.jit
def _sq8(v0, v1, v2, v3, v4, v5, v6, v7):
    return v0 * v0 + v1 * v1 + v2 * v2 + v3 * v3 + v4 * v4 + v5 * v5 + v6 * v6 + v7 * v7


@triton.jit
def _tile32(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17,
            f18, f19, f20, f21, f22, f23, z):
    """``[items, 32]`` with column ``t`` = ``f_t`` (``z``, zeros, for t ≥ 24): joins only, so every
    item's 32 values stay in its own thread (the first join makes the slowest index bit)."""
    l1_0 = tl.join(f0, f16)
    l1_1 = tl.join(f1, f17)
    l1_2 = tl.join(f2, f18)
    l1_3 = tl.join(f3, f19)
    l1_4 = tl.join(f4, f20)
    l1_5 = tl.join(f5, f21)
    l1_6 = tl.join(f6, f22)
    l1_7 = tl.join(f7, f23)
    l1_8 = tl.join(f8, z)
    l1_9 = tl.join(f9, z)
    l1_10 = tl.join(f10, z)
    l1_11 = tl.join(f11, z)
    l1_12 = tl.join(f12, z)
    l1_13 = tl.join(f13, z)
    l1_14 = tl.join(f14, z)
    l1_15 = tl.join(f15, z)
    l2_0 = tl.join(l1_0, l1_8)
    l2_1 = tl.join(l1_1, l1_9)
    l2_2 = tl.join(l1_2, l1_10)
    l2_3 = tl.join(l1_3, l1_11)
    l2_4 = tl.join(l1_4, l1_12)
    l2_5 = tl.join(l1_5, l1_13)
    l2_6 = tl.join(l1_6, l1_14)
    l2_7 = tl.join(l1_7, l1_15)
    l3_0 = tl.join(l2_0, l2_4)
    l3_1 = tl.join(l2_1, l2_5)
    l3_2 = tl.join(l2_2, l2_6)
    l3_3 = tl.join(l2_3, l2_7)
    l4_0 = tl.join(l3_0, l3_2)
    l4_1 = tl.join(l3_1, l3_3)
    l5_0 = tl.join(l4_0, l4_1)
    return tl.reshape(l5_0, (f0.shape[0], 32))


@triton.jit
def _scaled(v, scale):
    return (v.to(tl.float32) * scale).to(tl.float16)


@triton.jit
def tetra48_mma_kernel(
    x_ptr, w_ptr, cent_ptr, tab_ptr, part_ptr, d_out, M, K_PER,
    N_BLOCKS: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr, BM: tl.constexpr,
):
    """Partial ``y[m, n] = Σ_b ⟨W[n, b], x[m, b]⟩`` (no σ_row) over this program's K-slice of
    ``K_PER`` blocks; see the module docstring. Grid ``(ceil(d_out / BN), KSPLIT)``."""
    STRIDE_W: tl.constexpr = ((6 * N_BLOCKS + 7) // 8) * 2
    XW: tl.constexpr = 32 * N_BLOCKS
    ITEMS: tl.constexpr = BN * BB
    n0 = tl.program_id(0) * BN
    ks = tl.program_id(1)
    b_start = ks * K_PER
    b_stop = tl.minimum(b_start + K_PER, N_BLOCKS)
    it = tl.arange(0, ITEMS)
    r_of = it // BB
    rows = n0 + r_of
    row_ok = rows < d_out
    rc = tl.where(row_ok, rows, 0)
    cent0 = tl.load(cent_ptr + rc * 2)
    cent1 = tl.load(cent_ptr + rc * 2 + 1)
    m = tl.arange(0, BM)
    kk = tl.arange(0, 32 * BB)
    acc = tl.zeros((BN, BM), tl.float32)
    for b0 in range(b_start, b_stop, BB):
        blk = b0 + it % BB
        ok = row_ok & (blk < b_stop)
        lo, hi = _item_words(w_ptr, rc, blk, ok, STRIDE_W)
        h1, h2, h3, _mp, _kp, g = decode_nibbles(lo, hi, tab_ptr, 0, 0, False, True)
        p = (lo & 1).to(tl.int32)
        mp = tl.where(ok, 2 - 4 * p, 0)  # value = nib·(2 − 4p) − 14 + 29p; 0 past the row
        kq = tl.where(ok, 29 * p - 14, 0)
        a0, a1, a2, a3, a4, a5, a6, a7 = _section_values(h1, mp, kq)
        b0_, b1, b2, b3, b4, b5, b6, b7 = _section_values(h2, mp, kq)
        c0, c1, c2, c3, c4, c5, c6, c7 = _section_values(h3, mp, kq)
        n2 = (_sq8(a0, a1, a2, a3, a4, a5, a6, a7) + _sq8(b0_, b1, b2, b3, b4, b5, b6, b7)
              + _sq8(c0, c1, c2, c3, c4, c5, c6, c7))
        sc = tl.where(g != 0, cent1, cent0) * inv_norm(n2, tab_ptr, 0, 0, False, True)  # c_g / ‖y‖
        tile = _tile32(
            _scaled(a0, sc), _scaled(a1, sc), _scaled(a2, sc), _scaled(a3, sc), _scaled(a4, sc),
            _scaled(a5, sc), _scaled(a6, sc), _scaled(a7, sc), _scaled(b0_, sc), _scaled(b1, sc),
            _scaled(b2, sc), _scaled(b3, sc), _scaled(b4, sc), _scaled(b5, sc), _scaled(b6, sc),
            _scaled(b7, sc), _scaled(c0, sc), _scaled(c1, sc), _scaled(c2, sc), _scaled(c3, sc),
            _scaled(c4, sc), _scaled(c5, sc), _scaled(c6, sc), _scaled(c7, sc),
            tl.zeros(sc.shape, tl.float16))
        wt = tl.reshape(tile, (BN, 32 * BB))
        xcol = b0 * 32 + kk
        xt = tl.load(x_ptr + m[:, None] * XW + xcol[None, :],
                     mask=(m[:, None] < M) & (xcol[None, :] < b_stop * 32), other=0.0)
        acc += tl.dot(wt, tl.trans(xt))
    n = n0 + tl.arange(0, BN)
    out = part_ptr + ks * M * d_out + m[None, :] * d_out + n[:, None]
    tl.store(out, acc, mask=(n[:, None] < d_out) & (m[None, :] < M))
