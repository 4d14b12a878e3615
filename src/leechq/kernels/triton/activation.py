"""Activation-side kernels: the input rotation ``Q x`` and the *prepared* activation layout.

Rotation (layouts-kernels-recipe.md §0.5, §3.6; tetra-format.md §1.6 forward semantics):
``Q = (Q_odd ⊗ H_m)·D`` with ``n = k·m``. Because ``(Q_odd ⊗ H_m)·v`` has group ``g`` equal to
``H_m · Σ_t Q_odd[g][t] · v_t``, the groups are mixed *first* (k multiply-adds per coordinate on the
sign-flipped input) and then transformed: one program per (activation row, group), each loading the
whole row once, mixing, and running one Walsh–Hadamard transform by butterflies (``(a, b) → (a+b,
a−b)``; each stage pairs the lowest index bit and then rotates the index bits, so ``log2 m`` stages
visit every bit), scaled by ``1/√m`` (f32 of the f64 reciprocal, passed in). No scratch, no barrier,
``M·k`` programs instead of one long program per row (the recipe's single-CTA design, §3.6, was a
CUDA shared-memory choice). The output is written either in natural order or directly in the
prepared layout below.

Prepared layout (what the lattice matvec kernels read): for a row of ``n_blocks`` blocks, pairs
are padded to ``NPP = 64·ceil(ceil(n_blocks/2) / 64)``; coordinate ``t`` of block ``b`` (parity
``b & 1``, pair ``b >> 1``) sits at ``((b & 1)·24 + t)·NPP + (b >> 1)`` and tail column ``i`` at
``48·NPP + i``; width ``48·NPP + 32``; every other slot holds 0, and the buffer has ``MP`` rows (the
next power of two ≥ M; rows past M are 0). ``t`` is the trio position for Tetra (value
``x[24 b + order[t]]``) and the natural position for Planes14. Lanes owning consecutive pairs then
read consecutive addresses, and the matvec kernels read it without masks.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _prepared_pos(nat, n_blocks, NPP, inv_ptr):
    """Position in the prepared layout of natural column ``nat`` (int32 tensor)."""
    blk = nat // 24
    j = nat - blk * 24
    in_blocks = blk < n_blocks
    t = tl.load(inv_ptr + j, mask=in_blocks, other=0)
    pos_blk = ((blk & 1) * 24 + t) * NPP + (blk >> 1)
    pos_tail = 48 * NPP + (nat - n_blocks * 24)
    return tl.where(in_blocks, pos_blk, pos_tail)


@triton.jit
def prepare_kernel(x_ptr, stride_xm, out_ptr, stride_om, order_ptr, M, n, n_blocks, NPP,
                   BLOCK: tl.constexpr):
    """Fill one row of the prepared layout (every slot, zeros included) from ``x`` (natural order,
    any float dtype); rows ``m ≥ M`` are zero."""
    m = tl.program_id(0)
    pos = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    width = 48 * NPP + 32
    in_row = pos < width
    body = pos < 48 * NPP
    pt = pos // NPP
    par = pt // 24
    t = pt - par * 24
    blk = 2 * (pos - pt * NPP) + par
    nat = tl.load(order_ptr + t, mask=body, other=0)
    src_blk = blk * 24 + nat
    k = pos - 48 * NPP
    src = tl.where(body, src_blk, n_blocks * 24 + k)
    valid = (body & (blk < n_blocks)) | ((pos >= 48 * NPP) & (k < n - n_blocks * 24))
    valid = valid & ((pos * 0 + m) < M)
    v = tl.load(x_ptr + m * stride_xm + src, mask=valid & in_row, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + pos, v, mask=in_row)


@triton.jit
def _wht(v, MW: tl.constexpr, LOG2M: tl.constexpr):
    """Unnormalized Walsh–Hadamard transform of a 1-D tensor of size MW = 2**LOG2M."""
    for _ in tl.static_range(LOG2M):
        a, b = tl.split(tl.reshape(v, (MW // 2, 2)))
        v = tl.reshape(tl.join(a + b, a - b), (MW // 2, 2))
        v = tl.reshape(tl.trans(v), (MW,))
    return v


@triton.jit
def rotate_kernel(
    x_ptr, stride_xm, signs_ptr, small_ptr, out_ptr, stride_om, inv_ptr, inv_sqrt_m, n_blocks, NPP,
    K: tl.constexpr, MW: tl.constexpr, LOG2M: tl.constexpr, PREPARED: tl.constexpr,
):
    """Group ``program_id(1)`` of ``Q x`` for activation row ``program_id(0)``; see the module
    docstring. Grid ``(M, K)``."""
    row = tl.program_id(0)
    g = tl.program_id(1)
    j = tl.arange(0, MW)
    xrow = x_ptr + row * stride_xm
    if K == 1:
        z = tl.load(xrow + j).to(tl.float32) * tl.load(signs_ptr + j)
    else:
        z = tl.zeros((MW,), tl.float32)
        for t in range(K):
            coef = tl.load(small_ptr + g * K + t)
            xt = tl.load(xrow + t * MW + j).to(tl.float32)
            z += coef * (xt * tl.load(signs_ptr + t * MW + j))
    v = _wht(z, MW, LOG2M) * inv_sqrt_m
    nat = g * MW + j
    if PREPARED:
        tl.store(out_ptr + row * stride_om + _prepared_pos(nat, n_blocks, NPP, inv_ptr), v)
    else:
        tl.store(out_ptr + row * stride_om + nat, v)
