"""``fuse_linears`` / ``LeechqGroup``: rows of the group are the rows of its members; lattice
members with identical rotation tables share one rotation slot."""

from __future__ import annotations

import pytest
import torch
from leechq_tiny import int4_record, lattice_record

from leechq.errors import InvalidInput
from leechq.nn.fused import LeechqGroup, fuse_linears
from leechq.nn.linear import LeechqLinear


def _members() -> list[LeechqLinear]:
    q = lattice_record("tetra", 32, 56, seed=1, rotation_seed_value=9)
    k = lattice_record("tetra", 16, 56, seed=2, rotation_seed_value=9)
    v = int4_record(16, 56, seed=3)
    mods = [LeechqLinear.from_record(r, bias=torch.randn(r.d_out)) for r in (q, k, v)]
    for m in mods:
        m.finalize("cpu")
    return mods


def test_group_rows_are_member_rows() -> None:
    members = _members()
    group = fuse_linears(members)
    assert isinstance(group, LeechqGroup) and group.out_features == 64 and group.in_features == 56
    x = torch.randn(2, 3, 56)
    ref = torch.cat([m(x) for m in members], dim=-1)
    torch.testing.assert_close(group(x), ref, rtol=0, atol=0)
    # q and k share one slot; v (int4) reads the unrotated input and has none
    assert members[0]._shared_rotation is members[1]._shared_rotation is not None
    assert members[2]._shared_rotation is None


def test_single_member_and_errors() -> None:
    members = _members()
    assert fuse_linears(members[:1]) is members[0]
    with pytest.raises(InvalidInput, match="d_in"):
        LeechqGroup([members[0], torch.nn.Linear(48, 8)])


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
def test_group_rotates_once_under_the_interpreter() -> None:
    """q and k share one rotation slot: one rotation per call of the group, the same numbers."""
    members = _members()[:2]
    for m in members:
        m.finalize("cpu", torch.float32, prefer="fused")
    calls = []
    plan = members[0]._fused
    inner = plan.rotate

    def counting(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return inner(x)

    plan.rotate = counting
    members[1]._fused.rotate = counting
    group = fuse_linears(members)
    x = torch.randn(2, 56)
    y = group(x)
    assert len(calls) == 1
    assert members[0]._shared_rotation._rotated is None  # the round is over: nothing held
    ref = torch.cat([m(x) for m in members], dim=-1)
    assert len(calls) == 2  # a new round: rotated once more, shared again
    torch.testing.assert_close(y, ref, rtol=0, atol=0)


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
