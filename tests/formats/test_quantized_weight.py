"""Canonical quantized weights: validation and the exact int4 arithmetic."""

from __future__ import annotations

import pytest
import torch

from leechq.errors import InvalidInput, UnsupportedShape
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight


def _qw(**over: object) -> QuantizedWeight:
    fields: dict[str, object] = dict(
        codebook="ball",
        d_out=3,
        d_in=50,
        labels=torch.zeros(3, 2, dtype=torch.int64),
        gains=torch.zeros(3, 2, dtype=torch.uint8),
        row_scales=torch.ones(3, dtype=torch.float64),
        centroids=torch.tensor([0.9, 1.1], dtype=torch.float64),
        tail=torch.zeros(3, 2, dtype=torch.float32),
    )
    fields.update(over)
    return QuantizedWeight(**fields)  # type: ignore[arg-type]


def test_validation_names_the_field() -> None:
    assert _qw().n_blocks == 2 and _qw().tail_cols == 2 and _qw().gain_bits == 1
    with pytest.raises(InvalidInput, match="labels"):
        _qw(labels=torch.zeros(3, 3, dtype=torch.int64))
    with pytest.raises(InvalidInput, match="gains"):
        _qw(gains=torch.full((3, 2), 2, dtype=torch.uint8))
    with pytest.raises(InvalidInput, match="ascending"):
        _qw(centroids=torch.tensor([1.1, 0.9], dtype=torch.float64))
    with pytest.raises(InvalidInput, match="tail"):
        _qw(tail=torch.full((3, 2), float("nan")))
    with pytest.raises(UnsupportedShape):
        _qw(d_in=20)


def test_int4_exact_arithmetic_and_layout() -> None:
    torch.manual_seed(0)
    w = torch.randn(4, 260)
    q = Int4Weight.quantize(w)
    assert q.scales.shape == (4, 3)
    codes = q.codes()
    assert int(codes[0, 0]) == int(q.qweight[0, 0] & 15) and int(codes[0, 1]) == int(q.qweight[0, 0] >> 4)
    deq = q.dequantize()
    g = torch.arange(260) // 128
    s = q.scales.float()[:, g]
    b = q.biases.float()[:, g]
    assert torch.equal(deq, (s * codes.float()) + b)
    err = (deq - w).abs()
    assert float((err / s).max()) <= 0.5 + 1e-3  # nearest level under the stored scale/bias


def test_int4_bad_input() -> None:
    with pytest.raises(UnsupportedShape):
        Int4Weight.quantize(torch.randn(2, 5))
    with pytest.raises(InvalidInput, match="non-finite"):
        Int4Weight.quantize(torch.tensor([[float("nan"), 1.0]]))
