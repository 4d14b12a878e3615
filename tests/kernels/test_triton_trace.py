"""``torch.compile(fullgraph=True)`` can trace the Triton entry points (no lazy state in
forward, docs/architecture.md: a module's forward has no host sync or untraceable Python), checked on the CPU.

The GPU test ``tests/nn/test_linear.py::test_cuda_forward_compiles_fullgraph`` compiles a whole
fused layer, but CI has no GPU. Here Dynamo only *traces* ``ops`` calls: in a subprocess without
``TRITON_INTERPRET`` (so the kernels are real ``JITFunction``s that Dynamo records as kernel
nodes), with Dynamo's Triton support switched on although no GPU is present, the device checks
relaxed, and a backend that reports the traced graph instead of running it. A construct Dynamo
cannot trace (e.g. ``kernel is other_kernel`` between two Triton kernels, which broke the GPU test
once) fails here as ``Unsupported``; so does a ``tl.constexpr`` object passed as a kernel argument
(traced by torch 2.13, rejected by the GPU image's torch 2.11).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

_SCRIPT = r"""
import re
import sys
import torch
import torch.utils._triton as dynamo_triton
import triton.language as tl
from torch._dynamo.variables.user_defined import UserDefinedObjectVariable
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

dynamo_triton.has_triton = lambda: True  # record Triton kernels as kernel nodes without a GPU

from leechq.formats.layouts.planes14 import random_planes14
from leechq.formats.layouts.tetra48 import random_tetra48
from leechq.formats.rotation import generate_rotation
from leechq.kernels.triton import ops
from leechq.serve.random_codes import random_int4

from leechq.kernels.triton import (ops_attention, ops_common, ops_dense, ops_imma, ops_intq,
                                   ops_rotate)

# CPU tensors pass the argument checks; kernels stay JITFunctions
for _mod in (ops, ops_common, ops_dense, ops_imma, ops_intq, ops_attention, ops_rotate):
    if hasattr(_mod, "interpreting"):
        _mod.interpreting = lambda: True
# the dispatch table: CPU tensors allowed, the GPU's choice for several rows (the many-row m1 in
# row groups; the int8 kernel is traced by its own entry point below), not the interpreter's
import os
from leechq.kernels import select
select._interpreting = lambda: True
select._interpreter_costs = lambda: False
os.environ["LEECHQ_DISABLE_KERNELS"] = "imma"


class Traced(Exception):
    pass


def backend(gm, inputs):
    nodes = [n for n in gm.graph.nodes if "triton_kernel_wrapper" in str(n.target)]
    # torch 2.11's Inductor fails at run time ("launcher() missing ... '_grid_1'") on a kernel
    # call that leaves a parameter to its default, so every call must pass every parameter
    for n in nodes:
        kernel = kernel_side_table.get_kernel(n.kwargs["kernel_idx"])
        passed = set(n.kwargs["kwargs"]) | set(
            kernel_side_table.get_constant_args(n.kwargs["constant_args_idx"]))
        missing = [a for a in getattr(kernel, "arg_names", []) if a not in passed]
        if missing:
            raise Traced(f"defaulted={','.join(missing)}")
    raise Traced(f"kernels={len(nodes)}")


# torch 2.13 unwraps a tl.constexpr object passed as a kernel argument; the GPU image's torch 2.11
# rejects it ("Unexpected argument type for a Triton kernel"), so here it is rejected too
_as_constant = UserDefinedObjectVariable.as_python_constant


def _reject_constexpr_objects(self):
    if isinstance(self.value, tl.constexpr):
        raise TypeError(f"a tl.constexpr object ({self.value!r}) passed as a Triton argument")
    return _as_constant(self)


UserDefinedObjectVariable.as_python_constant = _reject_constexpr_objects


tetra = random_tetra48(16, 4 * 24 + 3, seed=1)
planes = random_planes14(16, 4 * 24 + 3, seed=1)
rot = generate_rotation(96, 3)
int4 = random_int4(16, 256, torch.Generator().manual_seed(0))
order = ops.tetra_kernel_tables("cpu").order
# the lazily built tables, as the eager first call of a served model builds them
ops.tetra_m1_table("cpu"), ops.planes14_m1_table("cpu"), ops.planes14_kernel_table("cpu")
ops.planes14_m1_order("cpu")
cases = [
    ("tetra48 M=1", lambda x: ops.tetra48_matvec(x, tetra), 1, tetra.d_in),
    ("tetra48 M=3", lambda x: ops.tetra48_matvec(x, tetra), 3, tetra.d_in),
    ("tetra48 M=6", lambda x: ops.tetra48_matvec(x, tetra), 6, tetra.d_in),
    ("planes14 M=1", lambda x: ops.planes14_matvec(x, planes), 1, planes.d_in),
    ("planes14 M=3", lambda x: ops.planes14_matvec(x, planes), 3, planes.d_in),
    ("tetra48 int8 mma M=6", lambda x: ops.tetra48_matvec_imma_prepared(
        ops.prepare_activation(x, tetra.n_blocks, order), tetra, 6), 6, tetra.d_in),
    ("tetra48 dense M=17", lambda x: ops.tetra48_matmul_dense(x, tetra), 17, tetra.d_in),
    ("planes14 int8 mma M=4", lambda x: ops.planes14_matvec_imma_prepared(
        ops.prepare_activation(x, planes.n_blocks, ops.planes14_m1_order("cpu")), planes, 4), 4,
     planes.d_in),
    ("planes14 dense M=17", lambda x: ops.planes14_matmul_dense(x, planes), 17, planes.d_in),
    ("rotate", lambda x: ops_rotate.rotate(x, ops_rotate.DeviceRotation.from_tables(rot, "cpu"),
                                           prepared_order=order), 2, 96),
    ("int4 M=2", lambda x: ops.int4_matvec(x, int4), 2, 256),
    ("norm_rotate", lambda x: ops_rotate.norm_rotate(
        x.half(), torch.ones(96).half(), 1e-6, ops_rotate.DeviceRotation.from_tables(rot, "cpu"),
        delta=x, prepared_order=order)[1], 2, 96),
    ("silu_mul_rotate", lambda x: ops_rotate.silu_mul_rotate(
        x, torch.float16, ops_rotate.DeviceRotation.from_tables(rot, "cpu"), prepared_order=order),
     2, 192),
]
for name, fn, m_rows, d_in in cases:
    torch._dynamo.reset()
    try:
        torch.compile(fn, fullgraph=True, backend=backend)(torch.randn(m_rows, d_in))
        print(f"{name}: ran without tracing?")
    except Exception as exc:  # the backend's Traced arrives wrapped
        text = str(exc)
        found = re.search(r"Traced: ((kernels|defaulted)=\S+)", text)
        print(f"{name}: " + (found.group(1) if found
                             else type(exc).__name__ + " " + text[:1500].replace(chr(10), " | ")))
"""


def test_entry_points_trace_fullgraph() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600, cwd=root)
    lines = [ln for ln in proc.stdout.splitlines() if ": " in ln]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(lines) == 13, proc.stdout + proc.stderr[-3000:]
    for line in lines:
        result = line.split(": ", 1)[1]
        assert result.startswith("kernels=") and int(result.split("=")[1]) >= 1, line
