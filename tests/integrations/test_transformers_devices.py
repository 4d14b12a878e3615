"""transformers loading onto a device: ``from_pretrained(..., device_map=...)`` and ``.to(device)``
of a bare artifact (lattice + int4 projections, dense embedding) and of full-recipe artifacts (a
4-bit embedding, tied head or an untied 4-bit head). The tables stay packed on the device, and the
model computes what ``leechq.load`` computes on the same device and dtype: the same modules and
kernels, so bit for bit (logits and greedy tokens)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from leechq_tiny import ids, make_artifact
from packed_tiny import packed_artifact

import leechq.integrations.transformers  # noqa: F401  (registers "leechq")
from leechq.models.load import load
from leechq.nn.embedding import PackedEmbedding, PackedHead
from leechq.nn.linear import LeechqLinear

ARTIFACTS = {
    "bare": lambda tmp: make_artifact(tmp, "qwen2")[0],
    "full-tied": lambda tmp: packed_artifact(tmp, "llama", embed_bits=4)[0],
    "full-untied": lambda tmp: packed_artifact(tmp, "qwen3", embed_bits=4, head_bits=4)[0],
}


def _hf(path: Path, device: str, dtype: torch.dtype, how: str) -> Any:
    """The model through ``device_map=device`` or loaded on the CPU then moved by ``.to``."""
    from transformers import AutoModelForCausalLM

    if how == "device_map":
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, device_map=device)
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device)


def _assert_served_on(model: Any, device: str, kind: str) -> None:
    """Every quantized module and packed table is on ``device``; no dense [vocab, dim] tensor."""
    dev = torch.device(device).type
    lins = [m for m in model.modules() if isinstance(m, LeechqLinear)]
    assert lins and all(torch.device(m.execution.device).type == dev for m in lins)
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if kind == "bare":
        assert isinstance(emb, torch.nn.Embedding)
        return
    assert isinstance(emb, PackedEmbedding) and isinstance(head, PackedHead)
    assert head.tied == (kind == "full-tied")
    for table in {id(emb): emb, id(head.table): head.table}.values():
        assert table.qweight.dtype == torch.uint8 and table.qweight.device.type == dev
        assert table.scales.dtype == torch.float16 and table.scales.device.type == dev
    for module in (emb, head):
        assert torch.device(module.execution.device).type == dev
    vocab, dim = emb.num_embeddings, emb.embedding_dim
    dense = [n for n, t in [*model.named_parameters(), *model.named_buffers()]
             if tuple(t.shape) == (vocab, dim)]
    assert not dense, dense


def _check_against_leechq_load(path: Path, device: str, dtype: torch.dtype, how: str,
                               kind: str) -> Any:
    """Load through transformers, check placement, logits and greedy tokens; return the model."""
    hf = _hf(path, device, dtype, how)
    _assert_served_on(hf, device, kind)
    ours, _ = load(path, device=device, dtype=dtype, tokenizer=False)
    x = ids().to(device)
    with torch.no_grad():
        got, want = hf(x).logits, ours(x).logits
        assert got.dtype == dtype and got.device.type == torch.device(device).type
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        gen = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
        out = hf.generate(x[:1], **gen)
        assert out.shape == (1, x.shape[1] + 6)
        torch.testing.assert_close(out, ours.generate(x[:1], **gen), rtol=0, atol=0)
    return hf


@pytest.mark.parametrize("how", ["device_map", "to"])
@pytest.mark.parametrize("kind", list(ARTIFACTS))
def test_cpu_load_matches_leechq_load(tmp_path: Path, kind: str, how: str) -> None:
    _check_against_leechq_load(ARTIFACTS[kind](tmp_path), "cpu", torch.float32, how, kind)


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["device_map", "to"])
@pytest.mark.parametrize("kind", list(ARTIFACTS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_load_matches_leechq_load(tmp_path: Path, kind: str, how: str,
                                       dtype: torch.dtype) -> None:
    """On CUDA every projection and table runs its fused kernel, and the model equals
    ``leechq.load(device="cuda")`` bit for bit, loaded through ``device_map`` or moved by
    ``.to``."""
    hf = _check_against_leechq_load(ARTIFACTS[kind](tmp_path), "cuda", dtype, how, kind)
    served = [m for m in hf.modules() if isinstance(m, LeechqLinear)]
    served += [m for m in (hf.get_input_embeddings(), hf.get_output_embeddings())
               if isinstance(m, (PackedEmbedding, PackedHead))]
    paths = {m.execution.path for m in served}  # an untied head's own table is read by the head
    assert paths == {"fused"}, paths


def test_to_on_the_cpu(tmp_path: Path) -> None:
    """``.to`` on the device the model is on changes nothing; ``.to("meta")`` is refused with a
    clear error (a served module cannot live there)."""
    from leechq.errors import InvalidInput

    path = ARTIFACTS["full-tied"](tmp_path)
    hf = _hf(path, "cpu", torch.float32, "device_map")
    x = ids()
    with torch.no_grad():
        before = hf(x).logits
        hf.to("cpu")
        torch.testing.assert_close(hf(x).logits, before, rtol=0, atol=0)
    with pytest.raises(InvalidInput, match="meta"):
        hf.to("meta")


def _graph_ops(model: Any, x: torch.Tensor) -> set[str]:
    """The call targets of the graph(s) ``torch.compile(model, fullgraph=True)`` traces."""
    import torch._dynamo

    graphs = []

    def capture(gm: torch.fx.GraphModule, _inputs: list) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, fullgraph=True, backend=capture)(x)
    return {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}


def test_cpu_compile_fullgraph_of_a_loaded_model(tmp_path: Path) -> None:
    """``torch.compile(model, fullgraph=True)`` over a full-recipe model loaded by transformers
    traces in one graph, with the packed tables as leechq custom ops, and computes what eager
    does."""
    import torch._dynamo

    hf = _hf(ARTIFACTS["full-untied"](tmp_path), "cpu", torch.float32, "device_map")
    x = ids()
    ops = _graph_ops(hf, x)
    assert any("leechq.packed_embedding" in t for t in ops), ops
    torch._dynamo.reset()
    compiled = torch.compile(hf, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x).logits, hf(x).logits, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores:UserWarning")  # inductor's advice
@pytest.mark.parametrize("kind", ["bare", "full-untied"])
def test_cuda_compile_fullgraph_of_a_loaded_model(tmp_path: Path, kind: str) -> None:
    """What a user does after ``from_pretrained(..., device_map="cuda")``: ``torch.compile(model,
    fullgraph=True)`` with inductor. The fused kernels are leechq custom ops in the traced graph;
    the compiled logits equal eager up to inductor's reordering of float32 elementwise work and
    reductions (per element: 2^-13 relative plus 2^-13 of the logits' RMS)."""
    import torch._dynamo

    hf = _hf(ARTIFACTS[kind](tmp_path), "cuda", torch.float32, "device_map")
    x = ids().cuda()
    ops = _graph_ops(hf, x)
    assert any("leechq.fused_linear" in t for t in ops), ops
    torch._dynamo.reset()
    compiled = torch.compile(hf, fullgraph=True)
    with torch.no_grad():
        want = hf(x).logits
        got = compiled(x).logits
    rms = float(want.double().pow(2).mean().sqrt())
    torch.testing.assert_close(got, want, rtol=2**-13, atol=2**-13 * rms)
