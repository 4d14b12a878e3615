"""The epilogue of the many-row products (``ops.tetra48_matmul_dense``,
``ops.planes14_matmul_dense``, ``ops.matmul_dense_ordered`` and the tensor-core kernel): σ_row and
the unquantized tail columns on the blocks' product, in one launch.

A float16 copy's product ``y16 = x16 · W16ᵀ`` leaves out σ_row (per output row) and the
``d_in mod 24`` tail columns (docs/kernels.md: kept in float32). This kernel writes
``y[m, o] = f32(y16[m, o]) · σ[o] + Σ_t f32(x[m, t]) · tail[o, t]`` (f32, the tail summed in the
kernel's order) for every activation row — where torch would take a widening multiply and a
tail GEMM (two launches per product, ≈ 4 µs each on the H200 inside a CUDA graph).

Geometry: one program per (``BM`` activation rows, ``BO`` output rows); the scales and the tail
tile ``[BO, TP]`` (``TP`` the next power of two of the tail width, ≤ 32) are read once per program
and serve its ``BM`` rows (one row per program re-read the tile for every row: at 512 prompt rows
of Qwen3-8B that was 4.3 ms of the prefill's 28 ms, ``benchmarks/step_breakdown.py``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def scale_tail_kernel(y_ptr, stride_ym, scale_ptr, x_ptr, stride_xm, tail_ptr, out_ptr, d_out,
                      m_rows, TAIL: tl.constexpr, TP: tl.constexpr, BO: tl.constexpr,
                      BM: tl.constexpr):
    """``out [M, d_out]`` (f32, contiguous) from ``y`` (any float, row stride ``stride_ym``),
    ``scale [d_out]`` (f32), the tail activation ``x`` (any float, ``TAIL`` columns, row stride
    ``stride_xm``) and ``tail [d_out, TAIL]`` (f32, contiguous); ``M = m_rows``. Grid
    ``(⌈M / BM⌉, ⌈d_out / BO⌉)``."""
    o = tl.program_id(1) * BO + tl.arange(0, BO)
    ok = o < d_out
    scale = tl.load(scale_ptr + o, mask=ok, other=0.0)
    t = tl.arange(0, TP)
    tok = t < TAIL
    if TAIL > 0:
        tw = tl.load(tail_ptr + o[:, None] * TAIL + t[None, :], mask=ok[:, None] & tok[None, :],
                     other=0.0)
    for i in range(BM):
        m = tl.program_id(0) * BM + i
        o_ok = ok & (tl.zeros([BO], tl.int32) + m < m_rows)
        y = tl.load(y_ptr + m * stride_ym + o, mask=o_ok, other=0.0).to(tl.float32)
        y = y * scale
        if TAIL > 0:
            t_ok = tok & (tl.zeros([TP], tl.int32) + m < m_rows)
            xt = tl.load(x_ptr + m * stride_xm + t, mask=t_ok, other=0.0).to(tl.float32)
            y = y + tl.sum(tw * xt[None, :], axis=1)
        tl.store(out_ptr + m * d_out + o, y, mask=o_ok)
