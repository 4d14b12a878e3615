"""Block GPTQ (docs/quantizer.md §5): the reference controls and the format invariants.

* an identity quantizer leaves a matrix unchanged bit for bit; with the rotation, up to f32
  rounding;
* the batched loop equals the serial per-row reference bit for bit;
* the GPTQ proxy loss is below plain rounding with the same codebook;
* reconstructed block magnitudes take at most 2^gain_bits values per (matrix, row scale) (P2);
* the record decodes to exactly the weights the loop evaluated (P13); the tail is kept exact;
* the one-block update equals the dense OBS correction.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from standin_codebook import register, registered

from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput, UnsupportedShape
from leechq.formats.quantized_weight import Int4Weight
from leechq.formats.rotation import apply_rotation, generate_rotation, rotation_seed
from leechq.quant.coders import IdentityCoder, ScalarRoundCoder, ShapeGainCoder, row_scales
from leechq.quant.gptq import gptq_quantize, gptq_quantize_reference, proxy_loss, quantize_int4
from leechq.quant.hessian import damp, inverse_cholesky_factor, prepare_factor, rotate_hessian


@pytest.fixture(autouse=True)
def _standin() -> Iterator[str]:
    with registered() as name:
        yield name


def _problem(d_out: int, d_in: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight matrix and a correlated activation Hessian (f64)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(d_out, d_in, generator=g) * 0.05
    mix = torch.randn(d_in, d_in, generator=g, dtype=torch.float64) / d_in**0.5
    x = torch.randn(4 * d_in, d_in, generator=g, dtype=torch.float64) @ (
        torch.eye(d_in, dtype=torch.float64) + 2 * mix
    )
    x[:, 3] *= 20.0  # an outlier channel, which the rotation spreads
    return w, x.T @ x / x.shape[0]


def _rotated(w: torch.Tensor, rot) -> torch.Tensor:  # type: ignore[no-untyped-def]
    q = torch.from_numpy(rot.to_matrix())
    return w.double() @ q.T


@pytest.mark.parametrize("d_in", [96, 100])
def test_identity_leaves_the_matrix_unchanged(d_in: int) -> None:
    w, h = _problem(16, d_in)
    u = inverse_cholesky_factor(damp(h, 0.01))
    res = gptq_quantize(w, u, IdentityCoder())
    assert torch.equal(res.dequantize(), w)
    rot = generate_rotation(d_in, rotation_seed(2, 1))
    res = gptq_quantize(w, prepare_factor(h, rot, 0.01), IdentityCoder(), rot)
    assert torch.allclose(
        res.dequantize(), w, rtol=0, atol=4 * torch.finfo(torch.float32).eps * float(w.abs().max())
    )


@pytest.mark.parametrize("coder_kind", ["scalar", "standin"])
def test_batched_equals_serial_bit_for_bit(coder_kind: str) -> None:
    w, h = _problem(12, 100, seed=1)
    rot = generate_rotation(100, rotation_seed(0, 0))
    u = prepare_factor(h, rot, 0.01)
    coder = (
        ScalarRoundCoder(0.7) if coder_kind == "scalar" else ShapeGainCoder(register(), gain_bits=1)
    )
    a = gptq_quantize(w, u, coder, rot)
    b = gptq_quantize_reference(w, u, coder, rot)
    assert torch.equal(a.weight_rot, b.weight_rot)
    assert torch.equal(a.labels, b.labels) and torch.equal(a.gains, b.gains)


@pytest.mark.parametrize("coder_kind", ["scalar", "standin"])
def test_gptq_beats_plain_rounding_on_the_proxy(coder_kind: str) -> None:
    w, h = _problem(24, 96, seed=2)
    rot = generate_rotation(96, 77)
    coder = (
        ScalarRoundCoder(1.0) if coder_kind == "scalar" else ShapeGainCoder(register(), gain_bits=1)
    )
    h_rot = rotate_hessian(h, rot)
    w_rot = _rotated(w, rot)
    fed = gptq_quantize(w, prepare_factor(h, rot, 0.01), coder, rot)
    plain = gptq_quantize(w, None, coder, rot)
    loss_fed = proxy_loss(fed.weight_rot - w_rot, h_rot)
    loss_plain = proxy_loss(plain.weight_rot - w_rot, h_rot)
    assert loss_fed < 0.9 * loss_plain


@pytest.mark.parametrize("gain_bits", [0, 1, 2])
def test_block_magnitudes_take_at_most_2_to_the_k_values(gain_bits: int) -> None:
    """P2: a gain code is one of 2^k levels relative to the frozen row scale — never a free norm."""
    w, h = _problem(10, 120, seed=3)
    rot = generate_rotation(120, 9)
    res = gptq_quantize(w, prepare_factor(h, rot, 0.01), ShapeGainCoder(register(), gain_bits), rot)
    assert res.centroids.numel() == 2**gain_bits
    blocks = res.weight_rot[:, :120].reshape(10, 5, BLOCK)
    rel = blocks.norm(dim=-1) / res.row_scales[:, None]
    dist = (rel[..., None] - res.centroids[None, None, :]).abs().min(dim=-1).values
    assert float(dist.max()) < 1e-12
    for i in range(10):
        assert len(torch.unique(torch.round(rel[i] * 1e9))) <= 2**gain_bits


def test_record_decodes_to_the_evaluated_weights_and_tail_is_kept_exact() -> None:
    """P13 + KeepExact: dequantize(record) == what the loop evaluated, bit for bit."""
    w, h = _problem(8, 104, seed=4)  # 4 blocks + 8 tail columns
    rot = generate_rotation(104, rotation_seed(1, 3))
    res = gptq_quantize(w, prepare_factor(h, rot, 0.01), ShapeGainCoder(register(), 1), rot)
    qw = res.to_quantized_weight()
    assert qw.rotation is rot and qw.rotation.seed == rotation_seed(1, 3)
    assert torch.equal(qw.dequantize_rotated(), res.weight_rot)
    assert torch.equal(qw.dequantize(), res.dequantize())
    # frozen row scales: RMS block norm of the full rotated row (tail included), before GPTQ
    assert torch.equal(qw.row_scales, row_scales(apply_rotation(w.double(), rot)))
    # the tail received corrections (it differs from the rounded original) and is stored as f32
    tail_orig = _rotated(w, rot)[:, 96:]
    assert not torch.allclose(res.weight_rot[:, 96:], tail_orig, atol=1e-6)
    assert torch.equal(res.weight_rot[:, 96:], qw.tail.double())
    plain = gptq_quantize(w, None, ShapeGainCoder(register(), 1), rot)
    assert torch.equal(plain.weight_rot[:, 96:], tail_orig.float().double())


def test_one_block_update_is_the_obs_correction() -> None:
    """-U_QQ⁻¹ U_QR = H_QR H_RR⁻¹ on the damped Hessian: the first block's update equals
    E·H_QR·H_RR⁻¹."""
    w, h = _problem(6, 72, seed=5)
    hd = damp(h, 0.01)
    u = inverse_cholesky_factor(hd)
    res = gptq_quantize(w, u, ScalarRoundCoder(1.5))
    trunc = w.double().clone()
    q0 = res.weight_rot[:, :24]
    err = trunc[:, :24] - q0
    want_rest = trunc[:, 24:] + err @ hd[:24, 24:] @ torch.linalg.inv(hd[24:, 24:])

    # compare the state after block 0 only: rerun with the rest un-quantized (identity after block
    # 0)
    class FirstBlockOnly(ScalarRoundCoder):
        calls = 0

        def code(self, v, s, c):  # type: ignore[no-untyped-def]
            FirstBlockOnly.calls += 1
            return (
                super().code(v, s, c)
                if FirstBlockOnly.calls == 1
                else IdentityCoder().code(v, s, c)
            )

    res1 = gptq_quantize(w, u, FirstBlockOnly(1.5))
    assert torch.equal(res1.weight_rot[:, :24], q0)
    assert torch.allclose(res1.weight_rot[:, 24:], want_rest, rtol=1e-9, atol=1e-12)


def test_int4_path() -> None:
    w, h = _problem(16, 256, seed=6)
    rtn = quantize_int4(w)
    ref = Int4Weight.quantize(w)
    assert torch.equal(rtn.qweight, ref.qweight) and torch.equal(rtn.scales, ref.scales)
    u = inverse_cholesky_factor(damp(h, 0.01))
    fed = quantize_int4(w, u)
    assert torch.equal(fed.scales, ref.scales) and torch.equal(fed.biases, ref.biases)
    loss_rtn = proxy_loss(rtn.dequantize().double() - w.double(), h)
    loss_fed = proxy_loss(fed.dequantize().double() - w.double(), h)
    assert loss_fed < loss_rtn


def test_bad_inputs() -> None:
    coder = IdentityCoder()
    with pytest.raises(InvalidInput, match="non-finite"):
        gptq_quantize(torch.tensor([[float("nan")] * 24]), None, coder, name="bad")
    with pytest.raises(UnsupportedShape, match="smaller than one"):
        gptq_quantize(torch.zeros(2, 20), None, coder)
    with pytest.raises(UnsupportedShape, match="refuse"):
        gptq_quantize(torch.zeros(2, 30), None, coder, tail_policy="refuse")
    with pytest.raises(InvalidInput, match="rotation width"):
        gptq_quantize(torch.zeros(2, 48), None, coder, generate_rotation(24, 1))
    with pytest.raises(InvalidInput, match="lattice"):
        gptq_quantize(torch.zeros(2, 48), None, coder).to_quantized_weight()


def test_zero_rows_code_to_the_origin() -> None:
    w = torch.zeros(3, 48)
    w[1] = torch.randn(48)
    res = gptq_quantize(w, None, ShapeGainCoder(register(), 1))
    qw = res.to_quantized_weight()
    assert float(qw.row_scales[0]) == 0.0 and int(qw.labels[0].abs().sum()) == 0
    assert torch.equal(qw.dequantize()[0], torch.zeros(48)) and torch.equal(
        qw.dequantize()[2], torch.zeros(48)
    )


def _real_codebooks() -> list[object]:
    """Registered shipped codebooks (both run in the default tier: a fraction of a second each)."""
    from leechq.codebooks import names

    out: list[object] = []
    if "ball" in names():
        out.append("ball")
    if "tetra" in names():
        out.append("tetra")
    return out


@pytest.mark.parametrize("codebook", _real_codebooks())
def test_real_codebook_controls(codebook: str) -> None:
    """The shipped codebooks through the whole loop: batched == serial, P2, and the record decodes
    to
    the loop's weights through the shared shape–gain reconstruction."""
    from leechq.codebooks import get, shape_gain

    w, h = _problem(3, 56, seed=7)  # 2 blocks + 8 tail columns per row
    rot = generate_rotation(56, rotation_seed(0, 1))
    u = prepare_factor(h, rot, 0.01)
    coder = ShapeGainCoder(codebook, 1)
    a = gptq_quantize(w, u, coder, rot)
    b = gptq_quantize_reference(w, u, coder, rot)
    assert torch.equal(a.weight_rot, b.weight_rot) and torch.equal(a.labels, b.labels)
    qw = a.to_quantized_weight()
    pts = get(codebook).decode(qw.labels.reshape(-1))
    scales = qw.row_scales[:, None].expand(-1, qw.n_blocks).reshape(-1)
    blocks = shape_gain.reconstruct(pts, qw.gains.reshape(-1).long(), scales, qw.centroids)
    assert torch.equal(blocks.reshape(3, 48), a.weight_rot[:, :48])
    rel = blocks.norm(dim=-1) / scales
    assert float((rel[:, None] - qw.centroids[None]).abs().min(dim=1).values.max()) < 1e-12
    assert float((qw.dequantize() - w).norm() / w.norm()) < 0.6


@pytest.mark.parametrize("codebook", _real_codebooks())
def test_real_codebook_record_dequantize_is_bit_exact(codebook: str) -> None:
    """P13 through ``QuantizedWeight.dequantize`` (formats): equals the loop's weights bit for bit.

    The blocks are chosen so that the winning direction lies in shell 2 (‖p‖² = 32), where torch's
    vectorized CPU f64 ``sqrt`` is one ulp low: decoder and loop must both use the correctly
    rounded root (``shape_gain.exact_norms``).
    """
    from leechq.codebooks import get

    # blocks whose best direction is a shell-2 point (4,4,0,...): ‖p‖² = 32
    w = torch.zeros(2, 48)
    w[:, 0] = 1.0
    w[:, 1] = 1.0
    w[:, 24:] = torch.randn(2, 24, generator=torch.Generator().manual_seed(8))
    res = gptq_quantize(w, None, ShapeGainCoder(codebook, 1))
    qw = res.to_quantized_weight()
    if codebook == "ball":  # Tetra's nearest direction for this block lies elsewhere
        assert int((get(codebook).decode(qw.labels[:, 0]).long() ** 2).sum(dim=-1)[0]) == 32
    assert torch.equal(qw.dequantize_rotated(), res.weight_rot)
    assert torch.equal(qw.dequantize(), res.dequantize())
