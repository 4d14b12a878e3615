"""LeechqLinear(x) ≈ F.linear(x, dequantize(W)) for ball, Tetra and int4 records, plus the
rotated-basis algebra, serialization and the fused-path seam.

Products are checked per output against the float64 product with a tolerance derived from the
dtypes (``tests/tolerance.py``); the fused path's activation precision is the contract of
``docs/contracts.md``."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from leechq_tiny import have_codebook, int4_record, lattice_record
from tolerance import assert_matmul_close, matmul_tolerance

from leechq.errors import InvalidInput, KernelUnavailable
from leechq.formats.quantized_weight import QuantizedWeight
from leechq.formats.rotation import apply_rotation
from leechq.nn.fused import SharedRotation
from leechq.nn.linear import LeechqLinear
from leechq.nn.records import record_from_tensors, record_tensor_specs, rotation_key

CODEBOOKS = [
    "tetra",
    pytest.param(
        "ball",
        marks=pytest.mark.skipif(
            not have_codebook("ball"), reason="ball codebook not in this build yet"
        ),
    ),
]

# (d_in, d_out): widths with and without a tail; odd rotation factors k = 3, 7, 1, 5.
SHAPES = [(48, 20), (56, 16), (64, 24), (80, 12)]


@pytest.mark.parametrize("codebook", CODEBOOKS)
@pytest.mark.parametrize("rotate", [True, False])
@pytest.mark.parametrize("d_in,d_out", SHAPES)
def test_lattice_matches_dense_dequantize(
    codebook: str, rotate: bool, d_in: int, d_out: int
) -> None:
    rec = lattice_record(codebook, d_out, d_in, rotate=rotate, seed=d_in)
    bias = torch.randn(d_out)
    mod = LeechqLinear.from_record(rec, bias=bias)
    ex = mod.finalize("cpu", torch.float32)
    assert ex.path == "dense" and ex.reason is None
    x = torch.randn(3, 5, d_in)
    y = mod(x)
    ref = F.linear(x, rec.dequantize(torch.float32), bias)
    assert y.shape == (3, 5, d_out)
    torch.testing.assert_close(y, ref, rtol=0, atol=0)  # the same weight: bit-identical


@pytest.mark.parametrize("codebook", CODEBOOKS)
@pytest.mark.parametrize("d_in,d_out", SHAPES)
def test_rotated_basis_algebra(codebook: str, d_in: int, d_out: int) -> None:
    """Ŵ x = Ŵ'(Q x): the dense path agrees with "rotate the activation, dot with the rotated-basis
    weight" (the fused kernels' algebra) within f32 accumulation error."""
    rec = lattice_record(codebook, d_out, d_in, rotate=True, seed=7 + d_in)
    mod = LeechqLinear.from_record(rec)
    mod.finalize("cpu")
    x = torch.randn(4, d_in, dtype=torch.float64)
    xr, wr = apply_rotation(x, rec.rotation), rec.dequantize_rotated()
    assert_matmul_close(mod(x.to(torch.float32)), xr @ wr.T, xr, wr, torch.float32)


def test_rotation_changes_the_answer() -> None:
    """Guard against a test that cannot fail: dropping the rotation gives a different output."""
    rec = lattice_record("tetra", 16, 48, rotate=True, seed=3)
    x = torch.randn(2, 48)
    w = rec.dequantize()
    with_rot = F.linear(x, w)
    rec.rotation = None
    err = (F.linear(x, rec.dequantize()) - with_rot).abs().double()
    assert bool((err > 100 * matmul_tolerance(x, w, torch.float32)).all())


@pytest.mark.parametrize("d_in,d_out", [(256, 8), (200, 6), (56, 16)])
def test_int4_matches_dense_dequantize(d_in: int, d_out: int) -> None:
    rec = int4_record(d_out, d_in, seed=1)
    mod = LeechqLinear.from_record(rec)
    mod.finalize("cpu")
    x = torch.randn(7, d_in)
    torch.testing.assert_close(mod(x), F.linear(x, rec.dequantize()), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_dtypes(dtype: torch.dtype) -> None:
    rec = lattice_record("tetra", 24, 72, seed=5)
    mod = LeechqLinear.from_record(rec, bias=torch.randn(24))
    mod.finalize("cpu", dtype)
    x = torch.randn(3, 72).to(dtype)
    y = mod(x)
    assert y.dtype == dtype
    xa, wa = with_bias(x, rec.dequantize(torch.float32), mod.bias)
    assert_matmul_close(y, xa.double() @ wa.double().T, xa, wa, dtype)


def with_bias(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., k]``, ``w [n, k]`` with the bias as one more column (x gets a column of ones), so
    ``x @ w.T + b`` is one product whose tolerance covers the bias: float64 on x's device."""
    x64 = x.detach().to(torch.float64)
    w64 = w.detach().to(device=x64.device, dtype=torch.float64)
    if bias is None:
        return x64, w64
    ones = torch.ones(*x64.shape[:-1], 1, dtype=torch.float64, device=x64.device)
    b = bias.detach().to(device=x64.device, dtype=torch.float64)[:, None]
    return torch.cat([x64, ones], dim=-1), torch.cat([w64, b], dim=1)


def test_unfinalized_forward_raises() -> None:
    mod = LeechqLinear.from_record(lattice_record("tetra", 8, 48))
    with pytest.raises(RuntimeError, match="never finalized"):
        mod(torch.randn(1, 48))


def test_bad_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = lattice_record("tetra", 8, 48)
    with pytest.raises(InvalidInput, match="bias"):
        LeechqLinear.from_record(rec, bias=torch.zeros(9))
    mod = LeechqLinear(48, 9)
    with pytest.raises(InvalidInput, match="shape"):
        mod.set_record(rec)
    with pytest.raises(InvalidInput, match="no record"):
        LeechqLinear(48, 8).finalize("cpu")
    ok = LeechqLinear.from_record(rec)
    with pytest.raises(InvalidInput, match="float32/float16/bfloat16"):
        ok.finalize("cpu", torch.float64)
    with pytest.raises(InvalidInput, match="meta"):
        ok.finalize("meta")
    monkeypatch.setenv("LEECHQ_DISABLE_KERNELS", "triton-tetra48-matvec")
    with pytest.raises(KernelUnavailable, match="no kernel for matvec"):
        ok.finalize("cpu", prefer="fused")


@pytest.mark.parametrize("kind", ["tetra", "int4"])
def test_state_dict_is_the_canonical_record(kind: str) -> None:
    rec = lattice_record("tetra", 16, 56, seed=2) if kind == "tetra" else int4_record(16, 56)
    mod = LeechqLinear.from_record(rec, bias=torch.randn(16))
    mod.finalize("cpu")
    sd = mod.state_dict()
    assert "weight_dense" not in sd and "bias" in sd
    desc = _descriptor(rec)
    suffixes = set(record_tensor_specs(desc))
    assert suffixes <= set(sd)
    rot = {rotation_key(rec.rotation): rec.rotation} if kind == "tetra" else {}
    back = record_from_tensors("m", desc, {s: sd[s] for s in suffixes}, rot)
    torch.testing.assert_close(back.dequantize(), rec.dequantize(), rtol=0, atol=0)


def test_placeholder_materialize_round_trip() -> None:
    rec = lattice_record("tetra", 16, 56, seed=4)
    desc = _descriptor(rec)
    with torch.device("meta"):
        ph = LeechqLinear.placeholder("layer.q", desc, bias=False)
    assert ph.codes.device.type == "meta"
    from leechq.errors import ArtifactError

    with pytest.raises(ArtifactError, match="never loaded"):
        ph.materialize({rotation_key(rec.rotation): rec.rotation})
    mod = LeechqLinear.from_record(rec)
    for suffix, t in mod.state_dict().items():
        setattr(ph, suffix, t)  # what the host framework's loader does, by name
    ph.materialize({rotation_key(rec.rotation): rec.rotation})
    assert not hasattr(ph, "codes")
    ph.finalize("cpu")
    x = torch.randn(2, 56)
    torch.testing.assert_close(ph(x), F.linear(x, rec.dequantize()), rtol=0, atol=0)


def test_shared_rotation_keys_on_identity_and_version() -> None:
    rec = lattice_record("tetra", 8, 48, seed=1)
    slot = SharedRotation(rec.rotation)  # members=0: never dropped by count
    calls = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return apply_rotation(x, rec.rotation)

    x = torch.randn(2, 48)
    a = slot.rotate(x, fn)
    b = slot.rotate(x, fn)
    assert a is b and len(calls) == 1
    x.mul_(2.0)  # in place: same object, new version → recomputed
    c = slot.rotate(x, fn)
    assert len(calls) == 2
    torch.testing.assert_close(c, 2.0 * a)
    y = x.clone()  # equal values, different tensor → recomputed (never keyed by value or address)
    slot.rotate(y, fn)
    assert len(calls) == 3
    slot.rotate(y.view(2, 48), fn)  # a new view object of the same data: served from the slot
    assert len(calls) == 3
    y[0, 0] = 1.0  # written through another view: version bumped → recomputed
    slot.rotate(y.view(2, 48), fn)
    assert len(calls) == 4


def test_shared_rotation_lives_one_round() -> None:
    """With 3 members the slot is dropped after the third use: no activation is held between
    passes, and a later pass over the same buffer recomputes."""
    rec = lattice_record("tetra", 8, 48, seed=1)
    slot = SharedRotation(rec.rotation, members=3)
    calls = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return apply_rotation(x, rec.rotation)

    x = torch.randn(2, 48)
    for _ in range(3):
        slot.rotate(x, fn)
    assert len(calls) == 1 and slot._rotated is None and slot._x is None
    slot.rotate(x, fn)
    assert len(calls) == 2


def _descriptor(rec: object) -> dict:
    from leechq.formats.artifact import build_tensors
    from leechq.formats.quantized_weight import QuantizedWeight

    cb = rec.codebook if isinstance(rec, QuantizedWeight) else "tetra"
    gb = rec.gain_bits if isinstance(rec, QuantizedWeight) else 1
    _, desc, _, _ = build_tensors({"m": rec}, {}, cb, gb)
    return desc["m"]


# ---------------------------------------------------------------------------------- GPU (the lead)

# Real widths (tails of 16 and 8 columns; odd rotation factors 5, 19, 19). Widths whose odd factor
# exceeds the rotation kernel's limit (e.g. 2576 = 16·161) fall back to the dense path instead.
GPU_SHAPES = [(2560, 256), (4864, 128), (9728, 64)]

FUSED_KERNEL = {"tetra": "triton-tetra48-matvec", "ball": "triton-planes14-matvec",
                "int4": "triton-int4-matvec"}
"""The kernel family ``finalize`` must pick on CUDA for each record kind."""


def _gpu_record(kind: str, d_in: int, d_out: int):
    if kind == "int4":
        return int4_record(d_out, d_in, seed=d_in)
    return lattice_record(kind, d_out, d_in, seed=d_in)


def fused_activation_dtype(kind: str, dtype: torch.dtype) -> torch.dtype:
    """The precision the fused path computes at (docs/contracts.md): lattice kernels round the
    activation to 16 bits whatever the caller's dtype (float16's tolerance; a bfloat16 caller's
    activation is already coarser), the int4 kernel reads it as the caller gave it."""
    if kind == "int4" or dtype == torch.bfloat16:
        return dtype
    return torch.float16


def kernel_basis(rec, x: torch.Tensor, bias: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The operands in the basis the fused kernels multiply in (float64, bias as a column): the
    rotated activation and rotated-basis weight for lattice records, ``x`` and ``W`` for int4."""
    x64 = x.detach().to(torch.float64).cpu()
    if isinstance(rec, QuantizedWeight):
        xr = apply_rotation(x64, rec.rotation) if rec.rotation is not None else x64
        return with_bias(xr, rec.dequantize_rotated(), bias)
    return with_bias(x64, rec.dequantize(torch.float32), bias)


def assert_fused_close(y: torch.Tensor, rec, x: torch.Tensor, bias: torch.Tensor | None,
                       kind: str, dtype: torch.dtype, what: str = "") -> None:
    """``y`` (a fused output) within the per-output tolerance of the contract's precision."""
    xa, wa = kernel_basis(rec, x, bias)
    assert_matmul_close(y.cpu(), xa @ wa.T, xa, wa, fused_activation_dtype(kind, dtype), what=what)


@pytest.mark.interp
@pytest.mark.parametrize("kind", ["tetra", "ball", "int4"])
def test_interp_fused_meets_the_contract(kind: str) -> None:
    """The fused kernels (Triton interpreter, one row: the 16-bit activation decode for lattice
    records) agree output by output at the contract's precision, in the caller's dtype."""
    rec = _gpu_record(kind, 256 if kind == "int4" else 160, 16)
    bias = torch.randn(16)
    mod = LeechqLinear.from_record(rec, bias=bias)
    ex = mod.finalize("cpu", torch.float32, prefer="fused")
    assert ex.kernel == FUSED_KERNEL[kind]
    x = torch.randn(1, rec.d_in)
    y = mod(x)
    assert y.dtype == torch.float32
    assert_fused_close(y, rec, x, bias, kind, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["tetra", "ball", "int4"])
@pytest.mark.parametrize("d_in,d_out", GPU_SHAPES)
@pytest.mark.parametrize("m_rows", [1, 3, 8, 33])
def test_cuda_fused_matches_reference(kind: str, d_in: int, d_out: int, m_rows: int) -> None:
    """On CUDA the fused kernel of each kind serves an f32 caller (no fallback, no warning) and
    agrees, output by output, with the f64 product at the contract's activation precision; the
    dense reference path agrees at f32's."""
    rec = _gpu_record(kind, d_in, d_out)
    bias = torch.randn(d_out)
    x = torch.randn(m_rows, d_in, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a first-use check that falls back fails
        fused = LeechqLinear.from_record(rec, bias=bias)
        ex = fused.finalize("cuda", torch.float32)
        assert ex.path == "fused", ex.reason
        assert ex.kernel == FUSED_KERNEL[kind]
        y = fused(x)
        torch.cuda.synchronize()
    assert y.shape == (m_rows, d_out) and y.dtype == torch.float32
    assert_fused_close(y, rec, x, bias, kind, torch.float32, what=f"{kind} fused")
    dense = LeechqLinear.from_record(rec, bias=bias)
    dense.finalize("cuda", torch.float32, prefer="reference")
    xa, wa = with_bias(x.cpu(), rec.dequantize(torch.float32), bias)
    assert_matmul_close(dense(x).cpu(), xa @ wa.T, xa, wa, torch.float32, what=f"{kind} dense")


@pytest.mark.gpu
def test_cuda_fused_vocabulary_sized_head() -> None:
    """A lattice-coded head's shape (``--lattice-head``: Qwen2.5's 151 936 vocabulary rows × 896)
    runs the fused kernel, no fallback, at a decode-sized and a prefill-sized call, and agrees
    with the f64 product."""
    rec = lattice_record("tetra", 151936, 896, seed=21)
    mod = LeechqLinear.from_record(rec)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        ex = mod.finalize("cuda", torch.float32)
        assert ex.path == "fused", ex.reason
        x = torch.randn(6, 896, device="cuda")
        y = torch.cat([mod(x[:1]), mod(x[1:])])  # one row, then five
        torch.cuda.synchronize()
    assert y.shape == (6, 151936)
    assert_fused_close(y, rec, x, None, "tetra", torch.float32, what="vocabulary-sized head")


@pytest.mark.gpu
@pytest.mark.parametrize("kind,kernel", [("tetra", "m1_kernel"), ("ball", "m1_kernel"),
                                         ("int4", "intq_matvec_kernel")])
def test_cuda_one_row_runs_the_decode_kernel(kind: str, kernel: str) -> None:
    """A batch-1 product launches the batch-1 decode kernel (Triton function ``kernel``), not the
    tiled kernel a failed first-use check falls back to: the profiler lists what ran."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    rec = _gpu_record(kind, 2560, 256)
    mod = LeechqLinear.from_record(rec)
    x = torch.randn(1, 2560, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a fallback warning fails the test
        warnings.filterwarnings("ignore", "Warning: Profiler clears events", UserWarning)
        assert mod.finalize("cuda", torch.float32).kernel == FUSED_KERNEL[kind]
        mod(x)  # first use: compilation and the first-use check
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            mod(x)
            torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type == DeviceType.CUDA}
    assert any(kernel in n for n in names), names
    assert not any("tetra48_matvec_kernel" in n for n in names), names


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_fused_half_dtypes(dtype: torch.dtype) -> None:
    rec = lattice_record("tetra", 256, 2560, seed=11)
    fused = LeechqLinear.from_record(rec)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        ex = fused.finalize("cuda", dtype)
        assert ex.path == "fused" and ex.kernel == FUSED_KERNEL["tetra"], ex
        x = torch.randn(2, 2560, device="cuda").to(dtype)
        y = fused(x)
    assert y.dtype == dtype
    assert_fused_close(y, rec, x, None, "tetra", dtype)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores:UserWarning")  # inductor's advice
@pytest.mark.parametrize("kind", ["tetra", "int4"])
def test_cuda_forward_compiles_fullgraph(kind: str) -> None:
    """forward has no host sync or lazy state, and the fused kernels are one opaque custom op, so
    torch.compile(fullgraph=True) with inductor traces and runs it (dense and fused path)."""
    import torch._dynamo

    rec = _gpu_record(kind, 2560, 128)
    bias = torch.randn(128)
    x = torch.randn(3, 2560, device="cuda")
    for prefer in ("reference", "auto"):
        torch._dynamo.reset()
        mod = LeechqLinear.from_record(rec, bias=bias)
        ex = mod.finalize("cuda", torch.float32, prefer=prefer)
        assert ex.path == ("dense" if prefer == "reference" else "fused")
        compiled = torch.compile(mod, fullgraph=True)
        y = compiled(x)
        assert y.shape == (3, 128) and y.dtype == torch.float32
        if ex.path == "fused":
            torch.testing.assert_close(y, mod(x), rtol=0, atol=0)  # the same kernel, opaque
            assert_fused_close(y, rec, x, bias, kind, torch.float32, what="compiled fused")
        else:
            xa, wa = with_bias(x.cpu(), rec.dequantize(torch.float32), bias)
            assert_matmul_close(y.cpu(), xa @ wa.T, xa, wa, torch.float32, what="compiled dense")
