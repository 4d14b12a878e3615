"""The fused kernels' custom ops: fake shapes match the real ones, and torch.compile(fullgraph=True)
traces a module that calls them (on the CPU with a reference callable; under the Triton
interpreter with the real fused plan)."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from leechq_tiny import int4_record, lattice_record

from leechq.errors import InvalidInput
from leechq.nn import custom_ops
from leechq.nn.embedding import PackedEmbedding
from leechq.nn.linear import LeechqLinear


class _Dense:
    """A reference callable ``x -> x Wᵀ`` in ``dtype`` (what a plan computes, without kernels)."""

    def __init__(self, w: torch.Tensor, dtype: torch.dtype) -> None:
        self.w, self.dtype = w, dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.w).to(self.dtype)


class _Gather:
    def __init__(self, table: torch.Tensor) -> None:
        self.table = table

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[ids]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_linear_fake_matches_real(dtype: torch.dtype) -> None:
    fn = _Dense(torch.randn(24, 48), dtype)
    key = custom_ops.register(fn)
    x = torch.randn(2, 3, 48)
    torch.library.opcheck(torch.ops.leechq.fused_linear.default, (x, key, 24, dtype))
    y = torch.ops.leechq.fused_linear(x, key, 24, dtype)
    assert y.shape == (2, 3, 24) and y.dtype == dtype
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = torch.ops.leechq.fused_linear(mode.from_tensor(x), key, 24, dtype)
    assert fake.shape == y.shape and fake.dtype == y.dtype


def test_packed_embedding_fake_matches_real() -> None:
    fn = _Gather(torch.randn(10, 16))
    key = custom_ops.register(fn)
    ids = torch.tensor([[1, 2, 9], [0, 0, 3]])
    torch.library.opcheck(torch.ops.leechq.packed_embedding.default,
                          (ids, key, 16, torch.float32))
    y = torch.ops.leechq.packed_embedding(ids, key, 16, torch.float32)
    assert y.shape == (2, 3, 16)
    torch.testing.assert_close(y, fn.table[ids], rtol=0, atol=0)


def test_freed_kernel_is_a_clear_error() -> None:
    key = custom_ops.register(_Dense(torch.randn(4, 8), torch.float32))  # nothing keeps it alive
    gc.collect()
    with pytest.raises(InvalidInput, match="no live kernel"):
        torch.ops.leechq.fused_linear(torch.randn(1, 8), key, 4, torch.float32)


class _Block(torch.nn.Module):
    """Embedding, projection, bias and a nonlinearity around the two ops."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = _Dense(torch.randn(24, 16), torch.float32)
        self.emb = _Gather(torch.randn(10, 16))
        self.k_lin, self.k_emb = custom_ops.register(self.lin), custom_ops.register(self.emb)
        self.bias = torch.nn.Parameter(torch.randn(24), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = custom_ops.packed_embedding(ids, self.k_emb, 16, torch.float32)
        y = custom_ops.fused_linear(h, self.k_lin, 24, torch.float32) + self.bias
        return torch.relu(y)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph_traces_the_ops(backend: str) -> None:
    import torch._dynamo

    torch._dynamo.reset()
    block = _Block()
    ids = torch.tensor([[1, 2, 3], [4, 5, 9]])
    eager = block(ids)
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    torch.testing.assert_close(compiled(ids), eager, rtol=0, atol=0)
    # The ops are in the graph as opaque calls, not traced through.
    graphs = []

    def capture(gm: torch.fx.GraphModule, _inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(block, fullgraph=True, backend=capture)(ids)
    targets = {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}
    assert "leechq.fused_linear.default" in targets or "leechq.fused_linear" in targets, targets
    assert any("packed_embedding" in t for t in targets), targets


@pytest.mark.interp
@pytest.mark.parametrize("kind", ["tetra", "int4"])
def test_compile_fullgraph_over_the_fused_module(kind: str) -> None:
    """A LeechqLinear on its fused plan (Triton interpreter) compiles with fullgraph=True and
    computes what eager does, bit for bit."""
    import torch._dynamo

    torch._dynamo.reset()
    rec = int4_record(16, 256, seed=3) if kind == "int4" else lattice_record("tetra", 16, 160)
    mod = LeechqLinear.from_record(rec, bias=torch.randn(16))
    assert mod.finalize("cpu", torch.float32, prefer="fused").path == "fused"
    x = torch.randn(1, rec.d_in)
    compiled = torch.compile(mod, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), mod(x), rtol=0, atol=0)


@pytest.mark.interp
def test_compile_fullgraph_over_the_packed_embedding() -> None:
    import torch._dynamo

    from leechq.formats.artifact import GroupAffine

    torch._dynamo.reset()
    ga = GroupAffine.quantize(torch.randn(32, 64), 4, 32)
    emb = PackedEmbedding.from_group_affine(ga)
    assert emb.finalize("cpu", torch.float32, prefer="fused").path == "fused"
    ids = torch.tensor([[0, 5, 31]])
    compiled = torch.compile(emb, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(ids), emb(ids), rtol=0, atol=0)
