"""Kernel selection: order, reasons, preferences, and the linear-layer plan on the CPU."""

from __future__ import annotations

import pytest
import torch

from leechq.errors import InvalidInput, KernelUnavailable
from leechq.formats.layouts import tetra48
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import generate_rotation
from leechq.kernels import reference as ref
from leechq.kernels import select
from leechq.kernels.select import Shape, choose_kernel


def test_cpu_tensors_get_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for layout in ("tetra48", "planes14", "int4", "int8"):
        k = choose_kernel("matvec", layout, Shape(16, 96), "cpu")
        assert k.backend == "reference" and layout in k.layouts
    assert choose_kernel("rotate", "rotation", Shape(0, 96, odd=3), "cpu").name == "reference-rotate"


def test_triton_first_when_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert choose_kernel("matvec", "tetra48", Shape(16, 96), "cpu").name == "triton-tetra48-matvec"
    # Too many activation rows for the Triton kernels: falls through to the reference.
    assert choose_kernel("matvec", "tetra48", Shape(16, 96, m_rows=9), "cpu").backend == "reference"


def test_unavailable_lists_every_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(KernelUnavailable, match="needs CUDA"):
        choose_kernel("matvec", "tetra48", Shape(16, 96), "cpu", preference="triton")
    monkeypatch.setenv("LEECHQ_DISABLE_KERNELS", "reference-int4-matvec")
    with pytest.raises(KernelUnavailable, match="triton-int4-matvec"):
        choose_kernel("matvec", "int4", Shape(16, 96), "cpu")
    with pytest.raises(KernelUnavailable, match="no kernel serves"):
        choose_kernel("gemm", "tetra48", Shape(16, 96), "cpu")
    with pytest.raises(InvalidInput, match="preference"):
        choose_kernel("matvec", "tetra48", Shape(16, 96), "cpu", preference="cuda")


def test_can_implement_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ok, why = select.TritonInt4Matvec.can_implement("matvec", "int4", Shape(8, 100), torch.device("cpu"))
    assert not ok and "multiple of 8" in why
    ok, why = select.TritonRotate.can_implement("rotate", "rotation", Shape(0, 97 * 64, odd=97),
                                                torch.device("cpu"))
    assert not ok and "k=97" in why
    ok, why = select.TritonTetra48Matvec.can_implement("matvec", "planes14", Shape(8, 48),
                                                       torch.device("cpu"))
    assert not ok and "layout" in why


def test_plan_linear_reference_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    g = torch.Generator().manual_seed(0)
    rot = generate_rotation(96, 5)
    qw = QuantizedWeight("tetra", 8, 96, torch.randint(0, 2**47, (8, 4), generator=g),
                         torch.randint(0, 2, (8, 4), generator=g, dtype=torch.uint8),
                         torch.rand(8, dtype=torch.float64, generator=g) + 0.5,
                         torch.tensor([0.8, 1.2], dtype=torch.float64),
                         torch.zeros(8, 0), rotation=rot)
    plan = select.plan_linear(qw, "cpu", torch.float32)
    assert plan.kernel_name == "reference-tetra48-matvec" and plan.rotate is not None
    x = torch.randn(2, 5, 96, generator=g)
    dense = qw.dequantize(torch.float64)
    want = (x.double() @ dense.T).float()
    assert torch.allclose(plan(x), want, rtol=1e-5, atol=1e-5)
    q4 = Int4Weight.quantize(torch.randn(8, 64, generator=g))
    p4 = select.plan_linear(q4, "cpu", torch.float32)
    assert torch.allclose(p4(x[..., :64]), (x[..., :64].double() @ q4.dequantize().double().T).float(),
                          rtol=1e-5, atol=1e-5)
    with pytest.raises(InvalidInput):
        select.plan_linear(tetra48.pack(qw), "cpu", torch.float32)


def test_reference_twins_share_signatures() -> None:
    import inspect

    from leechq.kernels.triton import ops

    for name in ("tetra48_matvec", "planes14_matvec", "int4_matvec", "int8_matvec",
                 "int4_embedding", "int8_embedding", "prepare_activation", "rotate"):
        a = list(inspect.signature(getattr(ref, name)).parameters)
        b = list(inspect.signature(getattr(ops, name)).parameters)
        assert b[: len(a)] == a, name
