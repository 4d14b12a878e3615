"""Geometry and threshold constants of the kernel launches, in one place, one line of provenance
each (what was measured, on which GPU; the comparisons behind each choice are in
docs/decisions.md). The dispatch table (:mod:`leechq.kernels.select`), the host wrappers
(:mod:`leechq.kernels.triton.ops` and its family modules) and the serving groups read them from
here; nothing in this module imports torch or triton."""

from __future__ import annotations

# --- batch-1 kernel (m1) -------------------------------------------------------------------------
M1_MAXNREG = 96
"""Register cap of the one-row ``m1`` geometry: no spill under it (Triton 3.6, sm_90 offline), five
4-warp programs per SM instead of four; H200 sweep, Qwen3-8B groups: 1–4 % faster at equal rows."""

M1_MAX_ROWS = 256
"""Largest row chunk ``ops.m1_config`` picks (the fixup unrolls ``rows / 32`` times)."""

M1_MAX_ROWS_T64 = 1024
"""Largest row chunk of the one-row ``tetra64`` geometry (one wave of programs at Qwen3-8B's
gate|up)."""

M1_RESIDENT = {1: 5, 2: 3, 4: 2}
"""Programs per SM that ``ops.m1_config`` sizes chunks for, by activation rows per launch; H200,
Qwen3-8B projections at two rows: sizing for four programs 4.07 ms against 4.01 for three."""

T64_NUM_WARPS = 4
"""Warps per program of the one-row ``tetra64`` geometry; H200, Qwen3-8B projections: 4 warps × 5
programs 1.836–1.863 ms against 1.996–2.005 (8 × 2) and 2.370–2.389 (16 × 1)."""

PDL_MAX_ROWS = 1
"""Activation rows up to which the rotations and ``m1`` take programmatic dependent launch; H200,
Qwen3-8B decode: batch 1 4.15 ms per step with it against 4.35, batch 2 5.72 against 5.38."""

# --- rotation ------------------------------------------------------------------------------------
ROTATE_SPLITS = 8
"""Programs per (row, group) of the prepared rotation on a GPU; H200, Qwen3-8B one token: 0.506 /
0.450 / 0.398 / 0.380 ms at 1 / 2 / 4 / 8 programs."""

# --- int8 tensor-core kernel ---------------------------------------------------------------------
IMMA_ROWS = 16
"""Activation rows of one int8 launch (two chunks of 8; each decoded block meets both)."""

IMMA_MIN_ROWS = 3
"""From this many rows the int8 kernel replaces ``m1``; H200, Qwen3-8B prepared projections: 2 rows
``m1`` 3.675 against int8 5.624 ms, 3 rows 6.185 against 5.696."""

IMMA_MAXNREG = 0
"""Register cap of the int8 kernel (0: the compiler's); H200, Qwen3-8B at 8 rows: a cap of 232 was
4 % faster on gate|up and up to 15 % slower on the other projections."""

# --- many-row path -------------------------------------------------------------------------------
DENSE_MIN_ROWS = 17
"""From this many rows a serving group multiplies float16 dequantized copies; H200, Qwen3-8B decode
at batch 16 / 32 / 64: 13.8 / 14.0 / 15.0 ms per step on the copy against 9.17 / 17.0 / 32.4."""

EPILOGUE_ROWS = 16
"""Activation rows per program of the float16 GEMM's finalize (σ_row and the tail) from
:data:`EPILOGUE_MIN_ROWS`; measured on the same geometry of the float16 copy's former epilogue,
H200, Qwen3-8B prefill, 144 launches: 512 rows 4.29 → 2.41 ms."""

EPILOGUE_MIN_ROWS = 128
"""Rows from which the finalize takes :data:`EPILOGUE_ROWS` per program; H200, 32 rows: 0.54 ms with
one row per program against 0.99 with sixteen."""

# --- decode attention ----------------------------------------------------------------------------
DECODE_ATTN_BLOCK_N = 64
"""Keys per ``tl.dot`` tile of the decode attention."""

DECODE_ATTN_MAX_SPLITS = 64
"""At most this many key splits per (row, key/value head); a split holds whole tiles."""

# --- float16 tensor-core GEMM (decode once per tile) ---------------------------------------------
GEMM_MIN_ROWS = 3
GEMM_MAX_ROWS = 64
"""A serving group's rows from ``GEMM_MIN_ROWS`` to ``GEMM_MAX_ROWS`` take the float16
tensor-core GEMM (``ops_gemm``: each weight block decoded once per launch); H200, Qwen3-8B
projections per decode step (``bench_gemm.py``, 96c2f07): 2 rows ``m1`` 2.99 ms against the GEMM
3.88; 4 / 8 / 16 / 32 / 64 rows GEMM 3.90 / 3.96 / 4.10 / 5.71 / 7.02 against the int8 kernel or
the float16 copy 4.98 / 5.05 / 7.36 / 10.26 / 10.58; 128 rows 13.10 against the copy's 11.59."""

GEMM_CONFIG = (4, 2, 4)
"""``(num_warps, rows_per_step, programs_per_sm)`` of the float16 tensor-core GEMM; H200,
Qwen3-8B (``bench_gemm.py``): (4, 2, ·) the fastest of ``GEMM_SWEEP`` at every row count from 2
to 128 (96c2f07; 16 rows 4.10 ms against 4.67 / 5.53 / 4.87), and 4 programs per SM the fastest
of 3..7 at 4..64 rows (745bc96; 8 rows 3.885 ms against 3.964 / 3.988 / 4.047 / 4.046); H100,
867b6c4: still the fastest at 4, 8, 16 and 64 rows against 4x1x4/6/7, 4x2x3, 4x2x6 and 8x1x4
(16 rows 3.631 ms against 3.784 for 4x2x6), level with 4x2x6 at 32."""

GEMM_P14_ONE_GROUP_TILES = 2
"""8-row activation tiles (``MT``) at which a ``planes14`` GEMM in the default geometry takes one
row group per step (9..16 activation rows); H200, Qwen3-8B ball projections (``bench_gemm.py
--codebook ball``, tree 2ee1a3b): 12 rows 5.06 ms with (4, 1, 4) against 6.86 with (4, 2, 4),
16 rows 5.19 against 7.00 (two groups: 254 registers offline); at 4, 8, 24 and 32 rows (4, 2, 4)
is the faster (4.94 / 5.00 / 6.00 / 6.23 ms against 5.01 / 5.08 / 6.57 / 6.94)."""

GEMM_SWEEP = ((4, 1, 4), (4, 1, 2), (4, 2, 4), (8, 1, 2))
"""Candidate ``(num_warps, rows_per_step, programs_per_sm)`` geometries of the float16
tensor-core GEMM that ``benchmarks/bench_gemm.py`` times. Offline sm_90 registers: (4, 1) 78 at
≤ 8 activation rows, 255 with a small spill at 128; (4, 2) 187 at 16 rows, 254 at 64 (above 64
rows ``ops_gemm`` takes one row group per step)."""
