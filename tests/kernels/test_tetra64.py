"""The ``m1`` kernel on the ``tetra64`` layout (``CODE = TETRA_64``, ``formats.layouts.tetra64``):
under the interpreter bit for bit the standard-order kernel (one, two and four activation rows,
one and two rows per loop trip, an odd block count, a tail, a row count that is not a multiple
of the chunk) and within the f64 bound; the int8 kernel and the float16 dequantization on the
layout, bit for bit their standard-order outputs; the refusals (24-bit activations in ``m1``,
the tiled kernel); offline, the hot loop's instruction count; on the GPU, full shapes."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch
from offline_compile import run_offline

from leechq.errors import InvalidInput, UnsupportedShape
from leechq.formats.layouts.tetra48 import random_tetra48
from leechq.formats.layouts.tetra64 import to_tetra64
from leechq.kernels import reference as ref

interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                            reason="the Triton interpreter (TRITON_INTERPRET=1) is off")


def _ops():  # imported lazily: TRITON_INTERPRET must be set before triton compiles anything
    pytest.importorskip("triton")
    from leechq.kernels.triton import ops

    return ops


def _both(monkeypatch: pytest.MonkeyPatch, d_out: int, d_in: int, m_rows: int,
          device: str = "cpu") -> tuple:
    """A random record in the standard and the tetra64 layout, an activation and its prepared
    form, with 16-bit activations (the layout's only width)."""
    ops = _ops()
    from leechq.kernels.triton import ops_common

    monkeypatch.setattr(ops_common, "A16", True)
    w = random_tetra48(d_out, d_in, seed=d_in + m_rows, device=device)
    g = torch.Generator(device=device).manual_seed(d_out + m_rows)
    x = torch.randn(m_rows, d_in, generator=g, device=device) * 4
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables(device).order)
    return w, to_tetra64(w), x, xp


@interp
@pytest.mark.parametrize(("d_out", "d_in", "m_rows", "ilp"), [
    (40, 24 * 9 + 5, 1, 2),    # odd block count: the last pair's odd block is absent; a tail
    (33, 24 * 70, 1, 1),       # three K-slices, the last one short (its lanes read pair NP - 1)
    (24, 256, 2, 2),           # two activation rows in one launch
    (17, 24 * 5 + 1, 3, 1),    # four rows per launch (three real)
])
def test_m1_tetra64_matches_standard(monkeypatch: pytest.MonkeyPatch, d_out: int, d_in: int,
                                     m_rows: int, ilp: int) -> None:
    ops = _ops()
    w, t, x, xp = _both(monkeypatch, d_out, d_in, m_rows)
    cfg = replace(ops.m1_config(d_out, w.n_blocks, torch.device("cpu"), w.tail_cols, m_rows),
                  ilp=ilp)
    want = ops.tetra48_matvec_prepared(xp, w, m_rows, cfg)
    got = torch.full((m_rows, d_out), float("nan"))
    ops.tetra48_matvec_prepared(xp, t, m_rows, cfg, out=got)
    assert torch.equal(got, want)
    xr = ref.round_activation(x, w.n_blocks)
    assert ref.row_bound_error(got, xr, ref.tetra48_dequantize_rotated(t)) <= 1e-5


@interp
def test_default_plan_takes_several_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no configuration, five rows go to the ``m1`` row groups (the only kernel that reads
    the layout), within the bound."""
    ops = _ops()
    w, t, x, xp = _both(monkeypatch, 9, 24 * 3, 5)
    got = ops.tetra48_matvec_prepared(xp, t, 5)
    assert ref.row_bound_error(got, ref.round_activation(x, w.n_blocks),
                               ref.tetra48_dequantize_rotated(t)) <= 1e-5


def test_tetra64_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch-1 kernel with a configuration refuses the layout under 24-bit activations, and
    the tiled kernel refuses it, with errors that say so."""
    ops = _ops()
    _w, t, _x, xp = _both(monkeypatch, 8, 48, 1)
    from leechq.kernels.triton import ops_common

    monkeypatch.setattr(ops_common, "A16", False)
    cfg = ops.m1_config(8, 2, torch.device("cpu"))
    with pytest.raises(UnsupportedShape, match="16-bit activations"):
        ops.tetra48_matvec_prepared(xp, t, 1, cfg)
    from leechq.kernels.triton import ops_common

    monkeypatch.setattr(ops_common, "A16", True)
    with pytest.raises(UnsupportedShape, match="tetra64"):
        ops.tetra48_matvec_prepared(xp, t, 1, ops.MatvecConfig(8, 4, 4, False))
    with pytest.raises(InvalidInput, match="tetra64"):
        ops.tetra48_matvec(torch.randn(1, 48), t, ops.MatvecConfig(8, 4, 4, False))


@interp
@pytest.mark.parametrize(("d_out", "d_in", "m_rows", "a16"), [(19, 24 * 7 + 5, 3, "1"),
                                                              (16, 24 * 4, 1, "0")])
def test_imma_tetra64_matches_standard(monkeypatch: pytest.MonkeyPatch, d_out: int, d_in: int,
                                       m_rows: int, a16: str) -> None:
    """The int8 kernel on tetra64 records (the stored shells for ``1/‖y‖``) equals its
    standard-order output bit for bit; with 24-bit activations and no configuration the layout
    takes it at one row too."""
    ops = _ops()
    w, t, _x, xp = _both(monkeypatch, d_out, d_in, m_rows)
    from leechq.kernels.triton import ops_common

    monkeypatch.setattr(ops_common, "A16", a16 == "1")
    want = ops.tetra48_matvec_imma_prepared(xp, w, m_rows)
    got = torch.full((m_rows, d_out), float("nan"))
    ops.tetra48_matvec_imma_prepared(xp, t, m_rows, out=got)
    assert torch.equal(got, want)
    if a16 == "0":
        assert torch.equal(ops.tetra48_matvec_prepared(xp, t, m_rows), want)


@interp
@pytest.mark.parametrize("grouped", [True, False])
def test_dequantize_tetra64(grouped: bool) -> None:
    """The float16 copy of a tetra64 record equals the standard order's bit for bit (odd block
    count: the padding block is not written)."""
    ops = _ops()
    w = random_tetra48(7, 24 * 5 + 3, seed=5)
    cfg = replace(ops.DEQUANT_DEFAULT, grouped=grouped)
    assert torch.equal(ops.tetra48_dequantize_f16(to_tetra64(w), config=cfg),
                       ops.tetra48_dequantize_f16(w, config=cfg))


_SASS = """
from leechq.kernels.triton import introspect as I
from leechq.kernels.triton.tetra48_m1 import m1_kernel
out = []
for code in (0, 3):
    ce = dict(N_BLOCKS=170, TAIL_COLS=16, ROWS=32, NW=4, BP=32, USE_ASM=True, ILP=2, MB=1,
              A16=True, CODE=code)
    c = I.compile_for(m1_kernel, I.M1_SIGNATURE, ce, num_warps=4, maxnreg=96,
                      aligned_ints=("d_out", "stride_x", "stride_y"))
    mix = I.hot_loop_mix(I.sass(c))
    out += [mix["loop_total"], mix["loop"].get("IDP", 0), mix["loop"].get("LDS", 0),
            I.resource_usage(c).get("local", 0)]
print(*out)
"""


def test_tetra64_decode_is_cheaper_offline() -> None:
    """Offline sm_90 compile of the batch-1 kernel (two rows per trip, four blocks per thread,
    16-bit activations, cap 96): the tetra64 decode keeps the 20 shared loads, needs 48 instead
    of 72 ``dp4a`` (the norm is stored) and at most 75 % of the standard layout's hot-loop
    instructions; no local memory."""
    pytest.importorskip("triton")
    (std, std_idp, std_lds, std_local,
     t64, t_idp, t_lds, t_local) = (int(v) for v in run_offline(_SASS, timeout=900).split()[-8:])
    assert (std_idp, std_lds, std_local) == (72, 20, 0)
    assert (t_idp, t_lds, t_local) == (48, 20, 0)
    assert t64 <= 0.75 * std, (t64, std)


@pytest.mark.gpu
@pytest.mark.parametrize(("d_out", "d_in", "m_rows"), [
    (6144, 4096, 1), (24576, 4096, 1), (4096, 12288, 1), (5120, 17408, 1), (1024, 4264, 1),
    (4096, 4096, 2), (24, 24 * 213 + 8, 1)])
def test_m1_tetra64_full_shapes(monkeypatch: pytest.MonkeyPatch, d_out: int, d_in: int,
                                m_rows: int) -> None:
    """On the GPU: the default ``m1`` plan on tetra64 records at real shapes (odd block counts,
    tails among them) equals the standard-order launch bit for bit and is within 1e-5 of the
    f64 product (NaN-poisoned output)."""
    ops = _ops()
    w, t, x, xp = _both(monkeypatch, d_out, d_in, m_rows, "cuda")
    cfg = ops.m1_config(d_out, w.n_blocks, xp.device, w.tail_cols, m_rows)
    want = ops.tetra48_matvec_prepared(xp, w, m_rows, cfg)
    got = torch.full((m_rows, d_out), float("nan"), device="cuda")
    ops.tetra48_matvec_prepared(xp, t, m_rows, cfg, out=got)
    assert torch.equal(got, want)
    xr = ref.round_activation(x, w.n_blocks)
    assert ref.row_bound_error(got, xr, ref.tetra48_dequantize_rotated(t)) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize(("d_out", "d_in", "m_rows"), [(6144, 4096, 3), (4096, 12288, 8),
                                                       (5120, 5120, 16), (4096, 4096, 20)])
def test_default_path_tetra64_full_shapes(monkeypatch: pytest.MonkeyPatch, d_out: int, d_in: int,
                                          m_rows: int) -> None:
    """On the GPU with no configuration (the int8 kernel for 3..16 rows, the float16 copy
    beyond): tetra64 records give the standard order's output bit for bit, within 1e-5 of the
    f64 product for the integer kernels (the copy's GEMM is float16)."""
    ops = _ops()
    w, t, x, xp = _both(monkeypatch, d_out, d_in, m_rows, "cuda")
    if m_rows <= ops.IMMA_ROWS:
        want = ops.tetra48_matvec_prepared(xp, w, m_rows)
        got = torch.full((m_rows, d_out), float("nan"), device="cuda")
        ops.tetra48_matvec_prepared(xp, t, m_rows, out=got)
        assert torch.equal(got, want)
        xr = ref.round_activation(x, w.n_blocks)
        assert ref.row_bound_error(got, xr, ref.tetra48_dequantize_rotated(t)) <= 1e-5
    else:
        assert torch.equal(ops.tetra48_matmul_dense(x, t), ops.tetra48_matmul_dense(x, w))
