"""``leechq.load`` keeps 4/8-bit embedding and head tables packed: module types, no dense table held,
logits equal to the old dense-dequantized model, save round trip, kernel preference (interpreter),
and on CUDA (gpu marker)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from leechq_tiny import ids
from packed_tiny import EMBED, packed_artifact

from leechq.formats.artifact import read_artifact
from leechq.models.load import load
from leechq.nn.embedding import PackedEmbedding, PackedHead

CASES = [("llama", 4, None), ("qwen3", 8, 8), ("qwen3", 4, None)]


def dense_tables(model: torch.nn.Module) -> list[str]:
    """Names of floating tensors with a full [vocab, dim] table shape."""
    shape = (model.config.vocab_size, model.config.hidden_size)
    tensors = list(model.named_parameters(remove_duplicate=False))
    tensors += list(model.named_buffers(remove_duplicate=False))
    return [n for n, t in tensors if t.is_floating_point() and tuple(t.shape) == shape]


def test_tied_4_bit_embedding_stays_packed(tmp_path: Path) -> None:
    out, dense = packed_artifact(tmp_path, "llama", 4)
    model, _ = load(out, device="cpu", tokenizer=False)
    emb, head = model.model.embed_tokens, model.lm_head
    assert isinstance(emb, PackedEmbedding) and emb.bits == 4
    assert isinstance(head, PackedHead) and head.tied and head.table is emb
    assert model.get_input_embeddings() is emb and model.get_output_embeddings() is head
    assert dense_tables(model) == [] and dense_tables(dense) != []
    ga = read_artifact(out).raw_quant[EMBED]
    assert torch.equal(emb.qweight, ga.qweight) and torch.equal(emb.scales, ga.scales)
    # one packed table: 4 bits a weight + two f16 per group of 64, instead of 32 bits (f32 CPU)
    v, d = model.config.vocab_size, model.config.hidden_size
    assert emb.packed_bytes() == v * d // 2 + 4 * v * 1
    held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in [*model.parameters(), *model.buffers()]}
    held_dense = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                  for t in [*dense.parameters(), *dense.buffers()]}
    assert sum(held_dense.values()) - sum(held.values()) == 4 * v * d - emb.packed_bytes()
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, dense(x).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch,embed_bits,head_bits", CASES)
def test_logits_match_the_dense_dequantized_model(
    tmp_path: Path, arch: str, embed_bits: int, head_bits: int | None
) -> None:
    out, dense = packed_artifact(tmp_path, arch, embed_bits, head_bits)
    model, _ = load(out, device="cpu", tokenizer=False)
    assert isinstance(model.model.embed_tokens, PackedEmbedding)
    assert model.model.embed_tokens.bits == embed_bits
    head = model.lm_head
    if model.config.tie_word_embeddings:
        assert isinstance(head, PackedHead) and head.tied and head.table is model.model.embed_tokens
        assert dense_tables(model) == []
    elif head_bits is None:
        assert type(head) is torch.nn.Linear  # a dense untied head stays dense
        assert dense_tables(model) == ["lm_head.weight"]
    else:
        assert isinstance(head, PackedHead) and head.table.bits == head_bits
        assert not head.tied and head.table is not model.model.embed_tokens
        assert dense_tables(model) == []
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, dense(x).logits, rtol=0, atol=1e-5)
    m16, _ = load(out, device="cpu", dtype="bfloat16", tokenizer=False)
    assert m16.model.embed_tokens(x).dtype == torch.bfloat16
    with torch.no_grad():
        a, b = dense(x).logits, m16(x).logits.float()
    assert (a - b).abs().max() < 0.1 * a.abs().max()


@pytest.mark.parametrize("arch,embed_bits,head_bits", [("llama", 4, None), ("qwen3", 8, 8)])
def test_save_round_trip_keeps_the_tables(
    tmp_path: Path, arch: str, embed_bits: int, head_bits: int | None
) -> None:
    from safetensors.torch import load_file

    from leechq.models.save import save

    out, _ = packed_artifact(tmp_path, arch, embed_bits, head_bits)
    model, tok = load(out, device="cpu")
    again = save(model, tmp_path / "again", tokenizer=tok)
    a, b = read_artifact(out), read_artifact(again)
    assert set(a.raw_quant) == set(b.raw_quant) and a.tied == b.tied
    assert set(a.raw) == set(b.raw)
    fa, fb = load_file(str(out / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert set(fa) == set(fb)
    for k in fa:
        assert fa[k].dtype == fb[k].dtype and torch.equal(fa[k], fb[k]), k
    m2, _ = load(again, device="cpu", tokenizer=False)
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(m2(x).logits, model(x).logits, rtol=0, atol=0)


def test_prefer_reference_and_bad_tables(tmp_path: Path) -> None:
    from leechq.errors import InvalidInput

    out, _ = packed_artifact(tmp_path, "qwen3", 8, 8)
    model, _ = load(out, device="cpu", prefer="reference", tokenizer=False)
    assert model.model.embed_tokens.execution.path == "reference"
    assert model.lm_head.execution.path == "reference"
    with pytest.raises(InvalidInput, match="prefer"):
        load(out, device="cpu", prefer="quick", tokenizer=False)


@pytest.mark.interp
def test_fused_tables_in_a_loaded_model(tmp_path: Path) -> None:
    # load(prefer="fused") would also interpret every lattice kernel (over a minute on 2 cores):
    # the tables alone are switched to the Triton kernels here (load's prefer is tested above).
    out, dense = packed_artifact(tmp_path, "qwen3", 8, 8)
    model, _ = load(out, device="cpu", tokenizer=False)
    emb, head = model.model.embed_tokens, model.lm_head
    emb.finalize("cpu", torch.float32, prefer="fused")
    head.finalize("cpu", torch.float32, prefer="fused")
    assert emb.execution.kernel == "triton-int8-embedding"
    assert head.execution.path == "fused" and "triton-int8-matvec" in head.execution.kernel
    x = ids(n=3, batch=1)  # 3 rows: the matvec kernel
    with torch.no_grad():
        got, want = model(x).logits, dense(x).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("arch,embed_bits,head_bits", [("llama", 4, None), ("qwen3", 8, 8)])
def test_cuda_load_keeps_tables_packed_and_fused(
    tmp_path: Path, arch: str, embed_bits: int, head_bits: int | None
) -> None:
    out, dense = packed_artifact(tmp_path, arch, embed_bits, head_bits)
    model, _ = load(out, device="cuda", dtype="float32", tokenizer=False)
    emb, head = model.model.embed_tokens, model.lm_head
    assert emb.qweight.is_cuda and emb.execution.path == "fused"
    assert isinstance(head, PackedHead) and head.execution.path == "fused"
    assert dense_tables(model) == []
    for n in (1, 12):  # decode-sized (matvec kernel) and prefill-sized (chunked) head calls
        x = ids(n=n)
        with torch.no_grad():
            got, want = model(x.cuda()).logits.cpu(), dense(x).logits
        assert float((got - want).abs().max() / want.abs().max()) < 1e-3, n
    m16, _ = load(out, device="cuda", dtype="bfloat16", tokenizer=False)
    with torch.no_grad():
        a, b = dense(ids()).logits, m16(ids().cuda()).logits.float().cpu()
    assert (a - b).abs().max() < 0.1 * a.abs().max()

