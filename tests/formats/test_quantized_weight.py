"""Canonical quantized weights: validation, the exact int4 arithmetic, the lattice decode on a
device."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from leechq_tiny import lattice_record

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


def test_int4_codes_are_the_nearest_level_lowest_on_a_tie() -> None:
    """Every code is, of all 16 levels ``f32(scale·k) + bias``, the one nearest the weight (the
    lowest on a tie): random rows, a constant group (scale 0 → 1), a short last group, and weights
    on the midpoints between levels."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 200, generator=g) * torch.logspace(-3, 1, 64).unsqueeze(1)
    w[0, :128] = 0.25  # a constant group
    q0 = Int4Weight.quantize(w)
    col = torch.arange(200) // 128
    s, b = q0.scales.float()[:, col], q0.biases.float()[:, col]
    w[1:9] = (s[1:9] * (torch.randint(0, 15, (8, 200), generator=g).float() + 0.5)) + b[1:9]
    for weight in (w, w[:, :192]):
        q = Int4Weight.quantize(weight)
        cols = weight.shape[1]
        s = q.scales.float()[:, torch.arange(cols) // 128]
        b = q.biases.float()[:, torch.arange(cols) // 128]
        levels = torch.arange(16, dtype=torch.float32).view(16, 1, 1)
        err = ((s * levels) + b - weight).abs()  # [16, rows, cols]
        assert torch.equal(q.codes().long(), err.argmin(dim=0))


def test_int4_bad_input() -> None:
    with pytest.raises(UnsupportedShape):
        Int4Weight.quantize(torch.randn(2, 5))
    with pytest.raises(InvalidInput, match="non-finite"):
        Int4Weight.quantize(torch.tensor([[float("nan"), 1.0]]))



@pytest.mark.parametrize("codebook", ["ball", "tetra"])
def test_decode_on_a_named_device_is_the_default_decode(codebook: str) -> None:
    rec = lattice_record(codebook, 9, 24 * 9 + 5, seed=3)  # odd rotation width, a tail
    assert torch.equal(rec.points("cpu"), rec.points())
    assert torch.equal(rec.dequantize_rotated("cpu"), rec.dequantize_rotated())
    assert torch.equal(rec.dequantize(torch.float32, device="cpu"), rec.dequantize())
    assert rec.dequantize(torch.bfloat16, device="cpu").dtype == torch.bfloat16


@pytest.mark.gpu
@pytest.mark.parametrize("codebook", ["ball", "tetra"])
def test_decode_on_cuda_gives_the_host_bits(codebook: str) -> None:
    """Every float64 operation of the decode is one IEEE operation (or a correctly rounded square
    root), so CUDA reproduces the host's bits: tuning and the recipe decode there."""
    for d_out, d_in, seed in ((16, 24 * 16, 0), (9, 24 * 9 + 5, 1), (40, 1536, 2)):
        rec = lattice_record(codebook, d_out, d_in, seed=seed)
        rot = rec.dequantize_rotated("cuda")
        assert rot.device.type == "cuda"
        assert torch.equal(rot.cpu(), rec.dequantize_rotated())
        assert torch.equal(rec.dequantize(device="cuda").cpu(), rec.dequantize())
