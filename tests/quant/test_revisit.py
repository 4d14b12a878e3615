"""The discrete code pass (leechq.quant.revisit): the gradient it collects is autograd's, a block
takes a new code only where the linearized loss goes down, the rest of the record is untouched,
and the monitor never gets worse."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from leechq.codebooks.base import BLOCK
from leechq.config import QuantConfig
from leechq.errors import InvalidInput
from leechq.formats.quantized_weight import QuantizedWeight
from leechq.formats.rotation import apply_rotation
from leechq.quant.coders import ShapeGainCoder
from leechq.quant.embedding import encode_embedding
from leechq.quant.revisit import revisit_codes, revisit_record, weight_gradients


def _record(codebook: str, d_out: int = 40, d_in: int = 53, seed: int = 0
            ) -> tuple[QuantizedWeight, torch.Tensor]:
    w = torch.randn(d_out, d_in, generator=torch.Generator().manual_seed(seed))
    return encode_embedding(w, QuantConfig(codebook=codebook, device="cpu")), w


@pytest.mark.parametrize("codebook", ["tetra", "ball"])
def test_changed_blocks_lower_the_linearized_loss_and_nothing_else_moves(codebook: str) -> None:
    rec, w = _record(codebook, seed=3)
    far = 3.0 * w  # a target far from the codes: the step must move many blocks toward it
    grad = rec.dequantize() - far  # ∂/∂W of ½‖W − far‖²
    new, frac = revisit_record(rec, grad, 1.0, ShapeGainCoder(codebook, rec.gain_bits))
    assert 0.0 < frac <= 1.0
    assert torch.equal(new.row_scales, rec.row_scales)
    assert torch.equal(new.centroids, rec.centroids)
    assert torch.equal(new.tail, rec.tail)
    assert new.rotation is rec.rotation
    moved = (new.labels != rec.labels) | (new.gains != rec.gains)
    assert abs(float(moved.double().mean()) - frac) < 1e-12
    g = apply_rotation(grad.double(), rec.rotation)[:, : rec.n_blocks * BLOCK]
    delta = (new.dequantize_rotated() - rec.dequantize_rotated())[:, : rec.n_blocks * BLOCK]
    per_block = (g * delta).reshape(rec.d_out, rec.n_blocks, BLOCK).sum(-1)
    assert bool((per_block[moved] < 0).all())
    assert bool((delta.reshape(rec.d_out, rec.n_blocks, BLOCK)[~moved] == 0).all())
    # the same inner product in the model's basis (the rotation is orthogonal, to the precision
    # of its stored tables)
    diff = new.dequantize(torch.float64) - rec.dequantize(torch.float64)
    total = float((grad.double() * diff).sum())
    assert total < 0 and abs(total - float(per_block.sum())) < 1e-6 * abs(total)
    assert float((new.dequantize() - far).norm()) < float((rec.dequantize() - far).norm())


def test_no_gradient_changes_no_code_and_bad_input_is_refused() -> None:
    rec, _ = _record("tetra", seed=5)
    coder = ShapeGainCoder("tetra", rec.gain_bits)
    same, frac = revisit_record(rec, torch.zeros(rec.d_out, rec.d_in), 0.5, coder)
    assert same is rec and frac == 0.0
    with pytest.raises(InvalidInput, match="gradient"):
        revisit_record(rec, torch.zeros(rec.d_out, rec.d_in + 1), 0.5, coder)
    for step in (0.0, -1.0, float("nan")):
        with pytest.raises(InvalidInput, match="step"):
            revisit_record(rec, torch.ones(rec.d_out, rec.d_in), step, coder)
    with pytest.raises(InvalidInput, match="codebook"):
        revisit_record(rec, torch.ones(rec.d_out, rec.d_in), 0.5,
                       ShapeGainCoder("ball", rec.gain_bits))


def _tiny():  # type: ignore[no-untyped-def]
    pytest.importorskip("transformers")
    from recipe_tiny import logits, quantized, windows

    reference, student, enc = quantized("llama", 0)
    calib, monitor = windows(3, seed=7), windows(2, seed=8)
    t_calib = [logits(reference, calib[i : i + 1]) for i in range(calib.shape[0])]
    t_mon = [logits(reference, monitor[i : i + 1]) for i in range(monitor.shape[0])]
    return reference, student, enc, calib, monitor, t_calib, t_mon


def test_weight_gradients_are_autograds() -> None:
    from leechq.quant.row_scales import kl_loss, model_logits

    _, student, enc, calib, _, t_calib, _ = _tiny()
    names = sorted(n for n, r in enc.records.items() if isinstance(r, QuantizedWeight))[:3]
    got = weight_gradients(student, t_calib, calib, names)
    weights = [student.get_submodule(n).weight for n in names]
    for p in student.parameters():
        p.requires_grad_(False)
    for p in weights:
        p.requires_grad_(True)
        p.grad = None
    for i in range(calib.shape[0]):
        (kl_loss(t_calib[i], model_logits(student, calib[i : i + 1])) / calib.shape[0]).backward()
    for n, p in zip(names, weights, strict=True):
        assert got[n].dtype == torch.float64 and got[n].shape == p.shape
        torch.testing.assert_close(got[n].float(), p.grad, rtol=1e-4, atol=1e-7)
    with pytest.raises(InvalidInput, match="teacher logits"):
        weight_gradients(student, t_calib[:1], calib, names)


def test_revisit_codes_keeps_the_best_monitor_and_the_student_evaluates_it() -> None:
    from recipe_tiny import logits

    from leechq.quant.row_scales import mean_kl

    _, student, enc, calib, monitor, t_calib, t_mon = _tiny()
    records = dict(enc.records)
    res = revisit_codes(student, records, t_calib, calib, t_mon, monitor, steps=(0.5, 4.0))
    assert set(res.monitor_kl) == {0.0, 0.5, 4.0} and res.changed[0.0] == 0.0
    assert res.monitor_kl[res.step] == min(res.monitor_kl.values())
    assert any(res.changed[s] > 0 for s in (0.5, 4.0))
    assert abs(mean_kl(student, None, monitor, teacher_logits=t_mon) - res.monitor_kl[res.step]) \
        < 1e-6
    for name, rec in res.records.items():
        torch.testing.assert_close(student.get_submodule(name).weight,
                                   rec.dequantize(torch.float32))
        if res.step == 0.0:
            assert rec is records[name]
    assert logits(student, monitor[:1]).isfinite().all()
    with pytest.raises(InvalidInput, match="positive"):
        revisit_codes(student, records, t_calib, calib, t_mon, monitor, steps=(0.0,))
    with pytest.raises(InvalidInput, match="no lattice record"):
        revisit_codes(student, {}, t_calib, calib, t_mon, monitor)
