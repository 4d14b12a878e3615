"""``PackedEmbedding.embed_scale``: rows times the factor rounded to the output dtype, exactly as
transformers' scaled word embedding multiplies its dense rows."""

from __future__ import annotations

import pytest
import torch

from leechq.formats.artifact import GroupAffine
from leechq.nn.embedding import PackedEmbedding


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bits", [4, 8])
def test_scaled_rows_equal_the_dense_scaled_embedding(dtype: torch.dtype, bits: int) -> None:
    w = torch.randn(40, 48, generator=torch.Generator().manual_seed(3))
    ga = GroupAffine.quantize(w, bits, 16)
    emb = PackedEmbedding.from_group_affine(ga)
    emb.embed_scale = 48**0.5
    emb.finalize("cpu", dtype)
    ids = torch.tensor([[0, 7, 39, 7]])
    dense = ga.dequantize().to(dtype)[ids]
    want = dense * torch.tensor(48**0.5).to(dtype)  # transformers: rows · embed_scale.to(dtype)
    assert torch.equal(emb(ids), want)
    emb.embed_scale = 1.0
    assert torch.equal(emb(ids), dense)


def test_a_dtype_cast_rerounds_the_scale() -> None:
    ga = GroupAffine.quantize(torch.randn(8, 32), 8, 16)
    emb = PackedEmbedding.from_group_affine(ga)
    emb.embed_scale = 3.3
    emb.finalize("cpu", torch.float32)
    emb.to(torch.bfloat16)
    ids = torch.tensor([1, 2])
    want = ga.dequantize().to(torch.bfloat16)[ids] * torch.tensor(3.3).to(torch.bfloat16)
    assert torch.equal(emb(ids), want)
