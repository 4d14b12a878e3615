"""Coding a token embedding on the lattice (``leechq.quant.embedding``): the record is what block
GPTQ gives with no error feedback (an identity Hessian), under the first block's attention-input
rotation."""

from __future__ import annotations

import pytest
import torch

from leechq.config import QuantConfig
from leechq.errors import InvalidInput, UnsupportedShape
from leechq.formats.rotation import generate_rotation, rotation_seed
from leechq.quant.embedding import encode_embedding
from leechq.quant.gptq import gptq_quantize
from leechq.quant.layerwise import make_coder


@pytest.mark.parametrize("codebook", ["tetra", "ball"])
def test_the_record_is_gptq_without_error_feedback(codebook: str) -> None:
    w = torch.randn(30, 53, generator=torch.Generator().manual_seed(3))
    cfg = QuantConfig(codebook=codebook, device="cpu")
    rec = encode_embedding(w, cfg)
    assert (rec.d_out, rec.d_in, rec.codebook) == (30, 53, codebook)
    assert rec.rotation is not None and rec.rotation.seed == rotation_seed(0, 0, cfg.rotation_seed)
    rot = generate_rotation(53, rotation_seed(0, 0, cfg.rotation_seed))
    want = gptq_quantize(w, None, make_coder(cfg), rot).to_quantized_weight()
    assert torch.equal(rec.labels, want.labels) and torch.equal(rec.gains, want.gains)
    assert torch.equal(rec.row_scales, want.row_scales) and torch.equal(rec.tail, want.tail)
    err = (rec.dequantize() - w).norm() / w.norm()
    assert 0.1 < float(err) < 0.4  # a 2-bit code: far from exact, far from noise
    plain = encode_embedding(w, cfg.replace(rotate=False))
    assert plain.rotation is None


def test_bad_tables_are_refused() -> None:
    cfg = QuantConfig(codebook="tetra", device="cpu")
    with pytest.raises(InvalidInput, match="non-finite"):
        encode_embedding(torch.full((4, 24), float("nan")), cfg)
    with pytest.raises(InvalidInput, match="2-D"):
        encode_embedding(torch.zeros(4, 24, 2), cfg)
    with pytest.raises(UnsupportedShape, match="smaller than one"):
        encode_embedding(torch.zeros(4, 20), cfg)
    with pytest.raises(InvalidInput, match="does not produce lattice codes"):
        encode_embedding(torch.zeros(4, 24), cfg.replace(codebook="identity"))
    with pytest.raises(InvalidInput, match="expected a tensor"):
        encode_embedding([[0.0] * 24], cfg)  # type: ignore[arg-type]


def test_progress_counts_every_column_group(capsys: pytest.CaptureFixture[str]) -> None:
    """The bar advances once per 24-column group; the record is the same with or without it."""
    w = torch.randn(20, 77, generator=torch.Generator().manual_seed(4))
    cfg = QuantConfig(codebook="tetra", device="cpu")
    steps: list[int] = []
    rot = generate_rotation(77, rotation_seed(0, 0, cfg.rotation_seed))
    gptq_quantize(w, None, make_coder(cfg), rot, on_step=steps.append)
    assert sum(steps) == 77 // 24
    quiet = encode_embedding(w, cfg)
    shown = encode_embedding(w, cfg, name="emb", progress=True)
    assert torch.equal(quiet.labels, shown.labels) and torch.equal(quiet.gains, shown.gains)
    assert "lattice emb" in capsys.readouterr().err
