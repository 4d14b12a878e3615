"""The batch-1 kernel's register cap (``ops.m1_maxnreg``) against the compiler in this
environment: compiled offline for sm_90 (Triton's own ptxas, in a subprocess without the
interpreter), every capped geometry of the real model widths uses no local memory and no stack.
The GPU image's Triton (3.6) is checked by ``test_triton_gpu.py::test_m1_register_cap_spills_nothing``; this
test holds the rule to the Triton the CI installs (3.9 when it was written, where a 23-column tail
under the cap spilled)."""

from __future__ import annotations

import pytest
from offline_compile import run_offline

_SCRIPT = r"""
from leechq.kernels.triton import introspect as I
from leechq.kernels.triton import ops
from leechq.kernels.triton.tetra48_m1 import m1_kernel

aligned = ("d_out", "stride_x", "stride_y")
# (blocks, tail): Qwen3 2560/4096/5120/9728/12288, Llama-3 and the rule's edge; chunk rows as
# ops.m1_config chooses them for those shapes on an H200 or larger
for n_blocks, tail, rows in ((106, 16, 32), (170, 16, 112), (213, 8, 216), (405, 8, 64),
                             (448, 16, 64), (512, 0, 64)):
    cap = ops.m1_maxnreg(n_blocks, tail)
    assert cap == ops.M1_MAXNREG, (n_blocks, tail)
    c = I.compile_for(m1_kernel, I.M1_SIGNATURE, dict(
        N_BLOCKS=n_blocks, TAIL_COLS=tail, ROWS=rows, NW=4, BP=32, USE_ASM=True, ILP=2, MB=1,
        PDL=True), num_warps=4, maxnreg=cap, aligned_ints=aligned)
    res = I.resource_usage(c)
    assert res.get("local", 0) == 0 and res.get("stack", 0) == 0, (n_blocks, tail, res)
print("ok")
"""


def test_capped_m1_geometries_do_not_spill() -> None:
    pytest.importorskip("triton")
    out = run_offline(_SCRIPT, timeout=900)
    assert out.strip().endswith("ok"), out[-2000:]
