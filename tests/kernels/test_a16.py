"""16-bit activations in the integer kernels (``ops_common.A16``, the default): the reference rounding
(``reference.round_activation``, exact against a per-coordinate computation), and under the
Triton interpreter the ``m1`` kernel, the int8 tensor-core kernel and the records the rotation
writes for them — each against the f64 product with the
rounded activation, bit for bit where two kernels must agree; offline, the compiled kernels'
``dp4a`` and MMA counts."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from offline_compile import run_offline

from leechq.formats.rotation import generate_rotation
from leechq.kernels import reference as ref

interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                            reason="the Triton interpreter (TRITON_INTERPRET=1) is off")


def _ops():  # imported lazily: TRITON_INTERPRET must be set before triton compiles anything
    pytest.importorskip("triton")
    from leechq.kernels.triton import ops

    return ops


def _ops_rotate():  # imported lazily, as :func:`_ops`
    from leechq.kernels.triton import ops_rotate

    return ops_rotate


def _mixed(m_rows: int, d_in: int, seed: int) -> torch.Tensor:
    """Rows of very different magnitudes, one with exact ties of the 16-bit rounding."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m_rows, d_in, generator=g)
    x *= torch.logspace(-20, 4, m_rows)[:, None]
    x[0, :24] = torch.arange(24) * 0.25 - 3.0  # max 3.0: s = 2^20, step 256/s = 2^-12
    x[0, 5] = 2.5 * 2.0 ** -12  # ties: 2.5 and 3.5 steps round to even (2 and 4)
    x[0, 6] = 3.5 * 2.0 ** -12
    return x


def test_round_activation_is_the_16_bit_rounding() -> None:
    """Per coordinate with Python floats: ``round(v / step) · step``, ``step = 256 / s`` with
    ``s = 2^(148 − eb)`` from the block's largest |value| (``eb`` ≥ 22), ties to even; at most
    2^-14 of the block maximum away; the tail columns unchanged."""
    n_blocks, tail = 4, 7
    x = _mixed(3, 24 * n_blocks + tail, 1)
    got = ref.round_activation(x, n_blocks)
    assert got.dtype == torch.float64 and got.shape == x.shape
    assert float(got[0, 5]) == 2 * 2.0 ** -12 and float(got[0, 6]) == 4 * 2.0 ** -12
    for r in range(x.shape[0]):
        for b in range(n_blocks):
            vals = [float(v) for v in x[r, 24 * b: 24 * b + 24]]
            mx = max(abs(v) for v in vals)
            eb = max((torch.tensor(mx).view(torch.int32).item() >> 23) & 0xFF, 22)
            step = 256 * 2.0 ** (eb - 148)
            for t, v in enumerate(vals):
                want = round(v / step) * step
                assert float(got[r, 24 * b + t]) == want, (r, b, t)
                assert abs(want - v) <= 2.0 ** -14 * mx
        assert torch.equal(got[r, 24 * n_blocks:], x[r, 24 * n_blocks:].double())


def _tetra(d_out: int, d_in: int, dev: str = "cpu"):
    from leechq.formats.layouts.tetra48 import random_tetra48

    return random_tetra48(d_out, d_in, seed=d_in + d_out, device=dev)


@interp
@pytest.mark.parametrize(("d_out", "d_in", "m_rows", "planes14"), [
    (40, 256, 1, False), (24, 1560, 2, False), (40, 256, 1, True)])
def test_m1_on_16_bit_activations(monkeypatch: pytest.MonkeyPatch, d_out: int, d_in: int,
                                  m_rows: int, planes14: bool) -> None:
    """16-bit activations (the default; ``ops_common.A16`` False for the 24-bit result): the ``m1``
    kernel (Tetra one row, two in one launch over two K-slices; Planes14) is within 1e-5 of the
    f64 product with the rounded activation, and it is a different result from the 24-bit one
    (the rounding reached the kernel)."""
    ops = _ops()
    from leechq.formats.layouts.planes14 import random_planes14

    w = random_planes14(d_out, d_in, seed=7, device="cpu") if planes14 else _tetra(d_out, d_in)
    x = _mixed(m_rows, d_in, 3) * 1e3
    cfg = ops.m1_config(d_out, w.n_blocks, torch.device("cpu"), m_rows=m_rows)
    if planes14:
        xp = ops.prepare_activation(x, w.n_blocks, ops.planes14_m1_order("cpu"))
        plan = ops.planes14_m1_groups(w, m_rows, torch.device("cpu"), cfg)

        def matvec(**kw):
            return ops.planes14_matvec_planned(xp, w, m_rows, plan, **kw)
        dense = ref.planes14_dequantize_rotated(w)
    else:
        xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables("cpu").order)

        def matvec(**kw):
            return ops.tetra48_matvec_prepared(xp, w, m_rows, cfg, **kw)
        dense = ref.tetra48_dequantize_rotated(w)
    from leechq.kernels.triton import ops_common

    monkeypatch.setattr(ops_common, "A16", False)
    full = matvec()
    from leechq.kernels.triton import ops_common

    monkeypatch.setattr(ops_common, "A16", True)
    y = matvec()
    assert ref.row_bound_error(y, ref.round_activation(x, w.n_blocks), dense) <= 1e-5
    assert not torch.equal(y, full)


@interp
def test_imma_on_16_bit_activations(monkeypatch: pytest.MonkeyPatch) -> None:
    """16-bit activations: the int8 tensor-core kernel (3 rows, Tetra and Planes14) is within 1e-5
    of the f64 product with the rounded activation; the ``A`` words the one-group rotation writes
    equal those of the activation-record launch, and so does the output from either."""
    ops = _ops()
    ops_rotate = _ops_rotate()
    from leechq.formats.layouts.planes14 import random_planes14

    from leechq.kernels.triton import ops_common

    assert ops_common.A16
    n, m_rows = 256, 3
    rot = ops_rotate.DeviceRotation.from_tables(generate_rotation(n, 1), "cpu")
    x = _mixed(m_rows, n, 4)
    for planes14 in (False, True):
        order = ops.planes14_m1_order("cpu") if planes14 else ops.tetra_kernel_tables("cpu").order
        w = (random_planes14(16, n, seed=5, device="cpu") if planes14 else _tetra(16, n))
        rec, ex = ops.imma_records(w.n_blocks, "cpu", m_rows)
        xp = ops_rotate.rotate(x, rot, prepared_order=order, records=(rec, ex))
        launched = ops.imma_activation(xp, m_rows, w.n_blocks)
        assert torch.equal(rec, launched[0])  # (exponents of rows past the rotation's differ)
        matvec = (ops.planes14_matvec_imma_prepared if planes14
                  else ops.tetra48_matvec_imma_prepared)
        dense = (ref.planes14_dequantize_rotated(w) if planes14
                 else ref.tetra48_dequantize_rotated(w))
        y = matvec(xp, w, m_rows, acts=(rec, ex), num_warps=1)
        assert torch.equal(y, matvec(xp, w, m_rows, acts=launched, num_warps=1))
        # four row groups per step: the same sums (each C entry is one block's dot)
        assert torch.equal(matvec(xp, w, m_rows, acts=launched, num_warps=1, k_per=4),
                           matvec(xp, w, m_rows, acts=launched, num_warps=1, k_per=4,
                                  rows_per_step=4))
        xr = ref.unprepare_activation(xp, m_rows, n, order)
        assert ref.row_bound_error(y, ref.round_activation(xr, w.n_blocks), dense) <= 1e-5


@interp
def test_four_row_m1_on_16_bit_activations() -> None:
    """The four-row ``m1`` launch (``mb = 4``, three real rows and a zero pad row) on 16-bit
    activations: within 1e-5 of the f64 product with the rounded activation."""
    ops = _ops()
    w = _tetra(24, 256)
    x = _mixed(3, 256, 11)
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables("cpu").order)
    cfg = ops.m1_config(24, w.n_blocks, torch.device("cpu"), m_rows=4)
    assert cfg.mb == 4
    y = ops.tetra48_matvec_prepared(xp, w, 3, cfg)
    dense = ref.tetra48_dequantize_rotated(w)
    assert ref.row_bound_error(y, ref.round_activation(x, w.n_blocks), dense) <= 1e-5


_SASS = r"""
from leechq.kernels.triton import introspect as I
from leechq.kernels.triton.tetra48_imma import imma_kernel
from leechq.kernels.triton.tetra48_m1 import m1_kernel

counts = {}
for a16 in (False, True):
    c = I.compile_for(m1_kernel, I.M1_SIGNATURE, dict(
        N_BLOCKS=170, TAIL_COLS=16, ROWS=64, NW=4, BP=32, USE_ASM=True, ILP=2, MB=1, A16=a16),
        num_warps=4, maxnreg=96, aligned_ints=("d_out", "stride_x", "stride_y"))
    assert I.resource_usage(c).get("local", 0) == 0
    mix = I.hot_loop_mix(I.sass(c))["loop"]
    counts[("m1", a16)] = mix.get("IDP", 0)
    sig = {"rec_ptr": "*i32", "ex_ptr": "*fp32", "w_ptr": "*i32", "cent_ptr": "*fp32",
           "tab_ptr": "*i32", "part_ptr": "*fp32", "d_out": "i32", "K_PER": "i32"}
    c = I.compile_for(imma_kernel, sig, dict(N_BLOCKS=170, NPP=128, NW=4, RG=1, RPS=2, CH=1,
                                             CODE=0, USE_ASM=True, A16=a16),
                      num_warps=4, aligned_ints=("d_out",))
    assert I.resource_usage(c).get("local", 0) == 0
    counts[("imma", a16)] = I.loop_mix(I.sass(c))["loop"].get("IMMA", 0)
print(counts[("m1", False)], counts[("m1", True)], counts[("imma", False)],
      counts[("imma", True)])
"""


def test_a16_kernels_skip_limb_0() -> None:
    """Offline sm_90 compile: with ``A16`` the batch-1 kernel's hot loop (four blocks per warp
    trip, two rows) has 72 ``dp4a`` instead of 96 and the int8 kernel's step loop 24 MMAs
    instead of 36, with no local memory."""
    pytest.importorskip("triton")
    out = run_offline(_SASS, timeout=900).split()
    assert [int(v) for v in out[-4:]] == [96, 72, 36, 24], out


@pytest.mark.gpu
@pytest.mark.parametrize(("d_out", "d_in", "m_rows"), [
    (4096, 4096, 1), (1024, 12288, 2), (6144, 4096, 8), (4096, 12288, 16), (24, 4264, 3)])
def test_a16_full_shapes(monkeypatch: pytest.MonkeyPatch, d_out: int, d_in: int,
                         m_rows: int) -> None:
    """On the GPU with 16-bit activations (the default): the default kernel for the row count
    (``m1`` for 1..2 rows, the int8 kernel for 3..16) at real shapes is within 1e-5 of the f64
    product with the rounded activation (NaN-poisoned output; the first-use checks pass: no
    fallback warning), and the records the rotation writes give the same output as the records'
    own launch."""
    ops = _ops()
    ops_rotate = _ops_rotate()
    from leechq.kernels.triton import ops_common

    assert ops_common.A16  # the default; this test runs it as served
    w = _tetra(d_out, d_in, "cuda")
    x = torch.randn(m_rows, d_in, device="cuda") * 10
    order = ops.tetra_kernel_tables("cuda").order
    xp = ops.prepare_activation(x, w.n_blocks, order)
    y = torch.full((m_rows, d_out), float("nan"), device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ops.tetra48_matvec_prepared(xp, w, m_rows, out=y)
    dense = ref.tetra48_dequantize_rotated(w)
    assert ref.row_bound_error(y, ref.round_activation(x, w.n_blocks), dense) <= 1e-5
    if m_rows >= 3 and d_in & (d_in - 1) == 0:
        rot = ops_rotate.DeviceRotation.from_tables(generate_rotation(d_in, 1), "cuda")
        rec, ex = ops.imma_records(w.n_blocks, "cuda", m_rows)
        xr = ops_rotate.rotate(x, rot, prepared_order=order, records=(rec, ex))
        launched = ops.imma_activation(xr, m_rows, w.n_blocks)
        assert torch.equal(rec, launched[0])
        got = ops.tetra48_matvec_imma_prepared(xr, w, m_rows, acts=(rec, ex))
        assert torch.equal(got, ops.tetra48_matvec_imma_prepared(xr, w, m_rows, acts=launched))


@pytest.mark.gpu
@pytest.mark.parametrize(("d_out", "d_in", "m_rows"), [(4096, 4096, 1), (6144, 4096, 8)])
def test_a16_planes14_full_shapes(monkeypatch: pytest.MonkeyPatch, d_out: int, d_in: int,
                                  m_rows: int) -> None:
    """As :func:`test_a16_full_shapes` for Planes14 records (``m1`` with the Planes14 decode at
    one row, the int8 kernel at eight)."""
    ops = _ops()
    from leechq.formats.layouts.planes14 import random_planes14

    from leechq.kernels.triton import ops_common

    assert ops_common.A16
    w = random_planes14(d_out, d_in, seed=d_out + m_rows, device="cuda")
    x = torch.randn(m_rows, d_in, device="cuda") * 10
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = ops.planes14_matvec(x, w)
    dense = ref.planes14_dequantize_rotated(w)
    assert ref.row_bound_error(y, ref.round_activation(x, w.n_blocks), dense) <= 1e-5
