"""Serving an artifact whose embedding/head tables are 4/8-bit: ``from_hf_model`` keeps them packed
(the same modules), greedy tokens equal those of the old dense-dequantized model, and the memory
report counts the packed bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

CASES = [("llama", 4, None), ("qwen3", 8, 8), ("gemma3", 4, None)]


def _hf_greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
            pad_token_id=0, eos_token_id=None,
        )
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch,embed_bits,head_bits", CASES)
def test_generate_with_packed_tables_matches_the_dense_model(
    tmp_path: Path, arch: str, embed_bits: int, head_bits: int | None
) -> None:
    from packed_tiny import packed_artifact

    from leechq.models.load import load
    from leechq.nn.embedding import PackedEmbedding, PackedHead
    from leechq.serve.build import from_hf_model
    from leechq.serve.generate import Engine

    out, dense = packed_artifact(tmp_path, arch, embed_bits, head_bits)
    model, tok = load(out, device="cpu")
    serving = from_hf_model(model)
    assert serving.embed is model.model.embed_tokens  # reused, still packed
    assert isinstance(serving.embed, PackedEmbedding)
    assert serving.head is model.lm_head and isinstance(serving.head, PackedHead)
    prompt = tok.encode("the model reads the words", add_special_tokens=False)
    engine = Engine(serving)
    got = engine.generate_ids([prompt], 12).tokens[0]
    want = _hf_greedy(dense, prompt, 12)  # the dense-dequantized model: the old path
    assert len(got) >= 1 and got == want[: len(got)]
    assert _hf_greedy(model, prompt, 12) == want  # transformers' loop over the packed modules
    mem = engine.memory()
    tables = serving.embed.packed_bytes() + (0 if serving.head.tied else serving.head.packed_bytes())
    assert mem["embed_head"] == tables
    v, d = model.config.vocab_size, model.config.hidden_size
    assert mem["embed_head"] < 4 * v * d * (1 if serving.head.tied else 2) / 3


def test_serving_dtype_follows_the_packed_embedding(tmp_path: Path) -> None:
    from packed_tiny import packed_artifact

    from leechq.models.load import load
    from leechq.serve.build import from_hf_model
    from leechq.serve.generate import Engine

    out, dense = packed_artifact(tmp_path, "llama", 4)
    model, _ = load(out, device="cpu", dtype="bfloat16", tokenizer=False)
    serving = from_hf_model(model)
    assert Engine(serving).dtype == torch.bfloat16
    m32, _ = load(out, device="cpu", tokenizer=False)
    s32 = from_hf_model(m32, dtype=torch.float32)
    assert s32.embed.execution.dtype == torch.float32
    tokens = torch.tensor([[5, 6, 7]])
    assert s32.embed(tokens).dtype == torch.float32
    with torch.no_grad():
        torch.testing.assert_close(
            s32.head(torch.ones(1, model.config.hidden_size)),
            dense.lm_head(torch.ones(1, model.config.hidden_size)), rtol=0, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("arch,embed_bits,head_bits", CASES)
def test_cuda_generate_with_packed_tables(
    tmp_path: Path, arch: str, embed_bits: int, head_bits: int | None
) -> None:
    from packed_tiny import packed_artifact

    from leechq.models.load import load
    from leechq.serve.build import from_hf_model
    from leechq.serve.generate import Engine

    out, dense = packed_artifact(tmp_path, arch, embed_bits, head_bits)
    model, tok = load(out, device="cuda", dtype="float32")
    serving = from_hf_model(model)
    assert serving.embed.execution.path == "fused" and serving.head.execution.path == "fused"
    prompt = tok.encode("the model reads the words", add_special_tokens=False)
    got = Engine(serving).generate_ids([prompt], 12).tokens[0]
    want = _hf_greedy(dense, prompt, 12)
    assert len(got) >= 1 and got == want[: len(got)]
