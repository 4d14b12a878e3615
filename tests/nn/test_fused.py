"""The fused path of ``LeechqLinear`` (``nn.fused.plan``) against the dense reference, and the
reasons it declines a record."""

from __future__ import annotations

import pytest
import torch
from leechq_tiny import int4_record, lattice_record

from leechq.nn.linear import LeechqLinear


@pytest.mark.interp
@pytest.mark.parametrize("kind", ["tetra", "ball", "int4"])
def test_fused_path_matches_dense_under_the_interpreter(kind: str) -> None:
    """The Triton path (kernels.select.plan_linear), run by the CPU interpreter, against the dense
    reference: same record, same input, f32 accumulation error only."""
    from leechq_tiny import max_rel

    rec = int4_record(8, 128, seed=4) if kind == "int4" else lattice_record(kind, 8, 56, seed=4)
    fused = LeechqLinear.from_record(rec, bias=torch.randn(rec.d_out))
    ex = fused.finalize("cpu", torch.float32, prefer="fused")
    assert ex.path == "fused" and ex.kernel is not None and ex.kernel.startswith("triton-")
    dense = LeechqLinear.from_record(rec, bias=fused.bias.detach().clone())
    dense.finalize("cpu", torch.float32, prefer="reference")
    x = torch.randn(3, rec.d_in)
    assert max_rel(fused(x), dense(x)) < 1e-5


@pytest.mark.interp
def test_rotation_odd_factor_beyond_the_kernel_is_declined_with_reason() -> None:
    """2576 = 16·161: the rotation kernel declines k > 64 and says so; the dense path stays exact
    (on an accelerator "auto" takes it with a ReferencePathWarning carrying the same reason)."""
    from leechq.errors import KernelUnavailable

    rec = lattice_record("tetra", 4, 2576, seed=3)
    mod = LeechqLinear.from_record(rec)
    with pytest.raises(KernelUnavailable, match="k=161"):
        mod.finalize("cpu", torch.float32, prefer="fused")
    assert mod.finalize("cpu", torch.float32, prefer="auto").path == "dense"
    x = torch.randn(2, 2576)
    ref = torch.nn.functional.linear(x, rec.dequantize())
    assert torch.allclose(mod(x), ref, rtol=1e-5, atol=1e-5)
