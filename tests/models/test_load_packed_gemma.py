"""Gemma scales its token embedding by √dim inside the embedding module (transformers' scaled word
embedding): a packed 4/8-bit table loaded by ``leechq.load`` or ``from_pretrained`` keeps that
factor, and the serving engine does not apply it a second time."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

ARCHS = ["gemma2", "gemma3"]


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.float()


@pytest.mark.parametrize("arch", ARCHS)
def test_leechq_load_keeps_the_embedding_scale(tmp_path: Path, arch: str) -> None:
    from packed_tiny import packed_artifact

    from leechq.models.load import load
    from leechq.nn.embedding import PackedEmbedding

    out, dense = packed_artifact(tmp_path, arch, 4, group=16)
    model, _ = load(out, device="cpu")
    emb = model.model.embed_tokens
    assert isinstance(emb, PackedEmbedding)
    d = model.config.hidden_size
    assert emb.embed_scale == pytest.approx(d**0.5)
    ids = torch.tensor([[1, 5, 9, 17, 33, 60]])
    # the same dequantized table behind transformers' own scaled embedding: the reference
    want_rows = dense.model.embed_tokens(ids)
    torch.testing.assert_close(emb(ids), want_rows, rtol=0, atol=0)
    torch.testing.assert_close(_logits(model, ids), _logits(dense, ids), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_from_pretrained_keeps_the_embedding_scale(tmp_path: Path, arch: str) -> None:
    import transformers
    from packed_tiny import packed_artifact

    import leechq.integrations.transformers  # noqa: F401  (registers the quantizer)
    from leechq.nn.embedding import PackedEmbedding

    out, dense = packed_artifact(tmp_path, arch, 8, group=16)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, device_map="cpu",
                                                              dtype=torch.float32).eval()
    emb = model.get_input_embeddings()
    assert isinstance(emb, PackedEmbedding)
    assert emb.embed_scale == pytest.approx(model.config.hidden_size**0.5)
    ids = torch.tensor([[1, 5, 9, 17, 33, 60]])
    torch.testing.assert_close(_logits(model, ids), _logits(dense, ids), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_engine_scales_a_packed_embedding_once(tmp_path: Path, arch: str) -> None:
    from packed_tiny import packed_artifact

    from leechq.models.load import load
    from leechq.serve.build import from_hf_model
    from leechq.serve.cache import KVCache

    out, dense = packed_artifact(tmp_path, arch, 4, group=16)
    model, _ = load(out, device="cpu")
    serving = from_hf_model(model, dtype=torch.float32)
    assert serving.embed is model.model.embed_tokens  # reused: it scales its own rows
    assert serving.args.embed_scale == 1.0
    ids = torch.tensor([[1, 5, 9, 17, 33, 60]])
    cache = KVCache(serving.args, 1, 64, torch.float32, "cpu")
    with torch.no_grad():
        got = serving(ids, torch.arange(ids.shape[1]), torch.zeros(1, dtype=torch.int64),
                      cache.k, cache.v, last_only=False)
    torch.testing.assert_close(got.float(), _logits(dense, ids), rtol=1e-4, atol=1e-4)
