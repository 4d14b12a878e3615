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
from leechq.kernels.select import Request, choose

CPU = torch.device("cpu")


def _mv(layout: str, rows: int = 1, **kw) -> Request:
    return Request(layout, rows, CPU, n_blocks=4, d_out=16, d_in=96, **kw)


def test_cpu_tensors_get_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for layout in ("tetra48", "planes14", "int4", "int8"):
        k = choose(_mv(layout))
        assert k.backend == "reference" and layout in k.layouts
        assert k.family(layout) == f"reference-{layout}-matvec"
    rot = Request("rotation", 1, CPU, op="rotate", d_in=96, odd=3)
    assert choose(rot).name == "reference-rotate"


def test_triton_first_when_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    k = choose(_mv("tetra48"))
    assert k.backend == "triton" and k.family("tetra48") == "triton-tetra48-matvec"
    assert choose(_mv("int4")).name == "triton-int4-matvec"
    # Too many activation rows for the Triton int4 kernel: falls through to the reference.
    assert choose(_mv("int4", 9)).name == "reference-int4-matvec"


def test_unavailable_lists_every_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(KernelUnavailable, match="needs CUDA"):
        choose(_mv("tetra48"), prefer="triton")
    monkeypatch.setenv("LEECHQ_DISABLE_KERNELS", "reference-int4-matvec")
    with pytest.raises(KernelUnavailable, match="triton-int4-matvec"):
        choose(_mv("int4"))
    with pytest.raises(KernelUnavailable, match="no entry serves"):
        choose(Request("tetra48", 1, CPU, op="gemm"))
    with pytest.raises(InvalidInput, match="prefer"):
        choose(_mv("tetra48"), prefer="cuda")


def test_can_implement_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ok, why = select.TritonInt4Matvec.can_implement(Request("int4", 1, CPU, d_out=8, d_in=100))
    assert not ok and "multiple of 8" in why
    ok, why = select.TritonRotate.can_implement(Request("rotation", 1, CPU, op="rotate",
                                                        d_in=97 * 64, odd=97))
    assert not ok and "k=97" in why
    ok, why = select.Tiled.can_implement(Request("int4", 1, CPU))
    assert not ok and "layout" in why
    ok, why = select.M1.can_implement(Request("tetra48", 1, CPU, op="rotate"))
    assert not ok and "op 'rotate'" in why


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


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_plan_linear_many_rows_of_a_16bit_layer(monkeypatch: pytest.MonkeyPatch,
                                                dtype: torch.dtype) -> None:
    """A 16-bit Triton lattice layer (the interpreter deciding as a GPU does) runs the GEMM's rows
    (3..64; 3..8 here) in one float16 tensor-core GEMM call from natural order and more rows on
    the float16 copy, at
    the 16-bit model's precision; one or two rows, and every row of a float32 layer, stay on
    the lattice matvec."""
    pytest.importorskip("triton")
    from leechq.kernels.triton import ops

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(select, "_interpreter_costs", lambda: False)
    monkeypatch.setattr(select, "GEMM_MAX_ROWS", 8)  # the copy from 17 rows, kept small here
    calls: list[tuple[str, int]] = []
    for name in ("matmul_gemm", "tetra48_matmul_dense"):
        real = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda x, w, *a, _n=name, _f=real, **k: (
            calls.append((_n, int(x.shape[0]))), _f(x, w, *a, **k))[1])
    g = torch.Generator().manual_seed(3)
    qw = QuantizedWeight("tetra", 40, 96, torch.randint(0, 2**47, (40, 4), generator=g),
                         torch.randint(0, 2, (40, 4), generator=g, dtype=torch.uint8),
                         torch.rand(40, dtype=torch.float64, generator=g) + 0.5,
                         torch.tensor([0.8, 1.2], dtype=torch.float64), torch.zeros(40, 0))
    plan = select.plan_linear(qw, "cpu", dtype)
    dense = qw.dequantize(torch.float64)
    for rows in (2, 5, 18) if dtype != torch.float32 else (5,):
        x = torch.randn(rows, 96, generator=g).to(dtype)
        y = plan(x)
        want = x.double() @ dense.T
        assert y.dtype == dtype and (y.double() - want).abs().max() <= 4e-3 * want.abs().max()
    if dtype == torch.float32:
        assert calls == []
    else:
        assert calls == [("matmul_gemm", 5), ("tetra48_matmul_dense", 18)]


def test_reference_twins_share_signatures() -> None:
    import inspect

    from leechq.kernels.triton import ops, ops_rotate

    for name in ("tetra48_matvec", "planes14_matvec", "int4_matvec", "int8_matvec",
                 "int4_embedding", "int8_embedding", "prepare_activation", "rotate"):
        a = list(inspect.signature(getattr(ref, name)).parameters)
        module = ops_rotate if name == "rotate" else ops
        b = list(inspect.signature(getattr(module, name)).parameters)
        assert b[: len(a)] == a, name
