"""The ``m1`` and int8 kernels on words in kernel order (``CODE = TETRA_K``,
``formats.layouts.tetra48_korder``): under the interpreter bit for bit the standard-order kernels
(one, two and four activation rows in ``m1``, one and two rows per loop trip; 3 to 11 rows in
the int8 kernel; 16- and 24-bit activations) and within the f64 bound; the other Tetra paths
refuse such words; offline, the decode's instruction count; on the GPU, full shapes against
f64."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch
from offline_compile import run_offline

from leechq.errors import InvalidInput, UnsupportedShape
from leechq.formats.layouts.tetra48 import random_tetra48
from leechq.formats.layouts.tetra48_korder import to_kernel_order
from leechq.kernels import reference as ref

interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                            reason="the Triton interpreter (TRITON_INTERPRET=1) is off")


def _ops():  # imported lazily: TRITON_INTERPRET must be set before triton compiles anything
    pytest.importorskip("triton")
    from leechq.kernels.triton import ops

    return ops


def _both_orders(monkeypatch: pytest.MonkeyPatch, d_out: int, d_in: int, m_rows: int,
                 a16: str) -> tuple:
    """A random record in both orders, an activation and its prepared form (CPU), with the
    activation width ``LEECHQ_A16 = a16``."""
    ops = _ops()
    monkeypatch.setenv("LEECHQ_A16", a16)
    w = random_tetra48(d_out, d_in, seed=d_in + m_rows)
    x = torch.randn(m_rows, d_in, generator=torch.Generator().manual_seed(d_out + m_rows)) * 4
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables("cpu").order)
    return w, to_kernel_order(w), x, xp


@interp
@pytest.mark.parametrize(("d_out", "d_in", "m_rows", "ilp", "a16"), [
    (40, 24 * 9 + 5, 1, 2, "1"),   # odd block count: the last pair's odd block is absent
    (33, 24 * 6, 1, 1, "0"),
    (24, 256, 2, 2, "1"),          # two activation rows in one launch
    (17, 24 * 5 + 1, 3, 1, "0"),   # four rows per launch (three real)
])
def test_m1_kernel_order_matches_standard(monkeypatch: pytest.MonkeyPatch, d_out: int, d_in: int,
                                          m_rows: int, ilp: int, a16: str) -> None:
    ops = _ops()
    w, k, x, xp = _both_orders(monkeypatch, d_out, d_in, m_rows, a16)
    cfg = replace(ops.m1_config(d_out, w.n_blocks, torch.device("cpu"), w.tail_cols, m_rows),
                  ilp=ilp)
    want = ops.tetra48_matvec_prepared(xp, w, m_rows, cfg)
    got = torch.full((m_rows, d_out), float("nan"))
    ops.tetra48_matvec_prepared(xp, k, m_rows, cfg, out=got)
    assert torch.equal(got, want)
    xr = ref.round_activation(x, w.n_blocks) if a16 == "1" else x
    assert ref.row_bound_error(got, xr, ref.tetra48_dequantize_rotated(k)) <= 1e-5


@interp
def test_other_paths_refuse_kernel_order() -> None:
    """The tiled kernel and the batched float16 tensor-core kernel do not read kernel order:
    they name the problem instead of decoding the bits in the wrong order."""
    ops = _ops()
    k = to_kernel_order(random_tetra48(24, 24 * 4, seed=5))
    order = ops.tetra_kernel_tables("cpu").order
    xp = ops.prepare_activation(torch.randn(1, 96), k.n_blocks, order)
    with pytest.raises(UnsupportedShape, match="kernel-order"):
        ops.tetra48_matvec_prepared(xp, k, 1, ops.MatvecConfig(kernel="tile"))
    with pytest.raises(InvalidInput, match="kernel order"):
        ops.tetra48_matmul_mma(torch.randn(9, 96), k)


@interp
@pytest.mark.parametrize(("d_out", "d_in", "grouped"), [(7, 24 * 5 + 3, True),
                                                         (9, 24 * 6, False)])
def test_dequantize_kernel_order(d_out: int, d_in: int, grouped: bool) -> None:
    """The float16 copy (the many-row path) from kernel-order words equals the standard order's
    and its twin's, bit for bit (odd and even block counts, both column layouts)."""
    ops = _ops()
    w = random_tetra48(d_out, d_in, seed=d_in)
    k = to_kernel_order(w)
    cfg = replace(ops.dequant_config(), grouped=grouped)
    got = ops.tetra48_dequantize_f16(k, config=cfg)
    assert torch.equal(got, ops.tetra48_dequantize_f16(w, config=cfg))
    assert torch.equal(got, ref.tetra48_dequantize_f16(k, grouped=grouped))


@interp
@pytest.mark.parametrize(("d_out", "d_in", "m_rows", "a16"), [
    (40, 24 * 9 + 5, 3, "1"),    # odd block count
    (33, 24 * 8, 8, "0"),
    (20, 24 * 6 + 2, 11, "1"),   # two 8-row chunks
])
def test_imma_kernel_order_matches_standard(monkeypatch: pytest.MonkeyPatch, d_out: int,
                                            d_in: int, m_rows: int, a16: str) -> None:
    """The int8 tensor-core kernel on kernel-order words equals its standard-order launch bit
    for bit and is within the f64 bound."""
    ops = _ops()
    w, k, x, xp = _both_orders(monkeypatch, d_out, d_in, m_rows, a16)
    want = ops.tetra48_matvec_imma_prepared(xp, w, m_rows, k_per=4)
    got = ops.tetra48_matvec_imma_prepared(xp, k, m_rows, k_per=4)
    assert torch.equal(got, want)
    xr = ref.round_activation(x, w.n_blocks) if a16 == "1" else x
    assert ref.row_bound_error(got, xr, ref.tetra48_dequantize_rotated(k)) <= 1e-5


_SASS = r"""
from leechq.kernels.triton import introspect as I
from leechq.kernels.triton.tetra48_imma import imma_kernel
from leechq.kernels.triton.tetra48_m1 import m1_kernel

out = []
for code in (0, 2):
    c = I.compile_for(m1_kernel, I.M1_SIGNATURE, dict(
        N_BLOCKS=170, TAIL_COLS=16, ROWS=64, NW=4, BP=32, USE_ASM=True, ILP=2, MB=1, A16=True,
        CODE=code), num_warps=4, maxnreg=96,
        aligned_ints=("d_out", "stride_x", "stride_y", "stride_l"))
    res = I.resource_usage(c)
    mix = I.hot_loop_mix(I.sass(c))
    out += [mix["loop_total"], mix["loop"].get("IDP", 0), mix["loop"].get("LDS", 0),
            res.get("local", 0)]
sig = {"rec_ptr": "*i32", "ex_ptr": "*fp32", "w_ptr": "*i32", "cent_ptr": "*fp32",
       "tab_ptr": "*i32", "part_ptr": "*fp32", "d_out": "i32", "K_PER": "i32"}
for code in (0, 2):
    c = I.compile_for(imma_kernel, sig, dict(N_BLOCKS=170, NPP=128, NW=4, RG=1, RPS=2, CH=1,
                                             CODE=code, USE_ASM=True, A16=True),
                      num_warps=4, aligned_ints=("d_out",))
    mix = I.loop_mix(I.sass(c))
    out += [mix["loop_total"], mix["loop"].get("IMMA", 0), I.resource_usage(c).get("local", 0)]
print(*out)
"""


def test_kernel_order_decode_is_cheaper_offline() -> None:
    """Offline sm_90 compile of the batch-1 kernel (two rows per trip, four blocks per thread,
    16-bit activations): kernel order keeps the 72 ``dp4a`` and 20 shared loads per trip and
    needs at least 10 % fewer instructions in the hot loop (Triton 3.6: 381 against 450); the
    int8 kernel (two row groups per step) keeps its 24 MMAs with at least 3 % fewer (313
    against 334); no local memory."""
    pytest.importorskip("triton")
    (std, std_idp, std_lds, std_local, kor, k_idp, k_lds, k_local,
     istd, istd_mma, istd_local, ikor, ik_mma, ik_local) = (
        int(v) for v in run_offline(_SASS, timeout=900).split()[-14:])
    assert (std_idp, std_lds, std_local) == (72, 20, 0)
    assert (k_idp, k_lds, k_local) == (72, 20, 0)
    assert kor <= 0.9 * std, (kor, std)
    assert (istd_mma, istd_local, ik_mma, ik_local) == (24, 0, 24, 0)
    assert ikor <= 0.97 * istd, (ikor, istd)


@pytest.mark.gpu
@pytest.mark.parametrize(("d_out", "d_in", "m_rows", "a16"), [
    (4096, 4096, 1, "1"), (12288, 4096, 1, "0"), (1024, 12288, 2, "1"), (5120, 5120, 1, "1"),
    (24, 24 * 213 + 8, 1, "1")])
def test_m1_kernel_order_full_shapes(monkeypatch: pytest.MonkeyPatch, d_out: int, d_in: int,
                                     m_rows: int, a16: str) -> None:
    """On the GPU: the default ``m1`` plan on kernel-order words at real shapes (an odd block
    count among them) equals the standard-order launch bit for bit and is within 1e-5 of the
    f64 product (NaN-poisoned output)."""
    ops = _ops()
    monkeypatch.setenv("LEECHQ_A16", a16)
    w = random_tetra48(d_out, d_in, seed=d_out + d_in, device="cuda")
    k = to_kernel_order(w)
    x = torch.randn(m_rows, d_in, device="cuda") * 10
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables("cuda").order)
    cfg = ops.m1_config(d_out, w.n_blocks, xp.device, w.tail_cols, m_rows)
    want = ops.tetra48_matvec_prepared(xp, w, m_rows, cfg)
    got = torch.full((m_rows, d_out), float("nan"), device="cuda")
    ops.tetra48_matvec_prepared(xp, k, m_rows, cfg, out=got)
    assert torch.equal(got, want)
    xr = ref.round_activation(x, w.n_blocks) if a16 == "1" else x
    assert ref.row_bound_error(got, xr, ref.tetra48_dequantize_rotated(k)) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize(("d_out", "d_in", "m_rows"), [(6144, 4096, 8), (4096, 12288, 16),
                                                       (5120, 5120, 4)])
def test_default_path_kernel_order_full_shapes(d_out: int, d_in: int, m_rows: int) -> None:
    """On the GPU with no configuration (the int8 kernel for 3..16 rows): kernel-order words
    give the standard order's output bit for bit, within 1e-5 of the f64 product."""
    ops = _ops()
    w = random_tetra48(d_out, d_in, seed=d_out + m_rows, device="cuda")
    k = to_kernel_order(w)
    x = torch.randn(m_rows, d_in, device="cuda") * 10
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables("cuda").order)
    want = ops.tetra48_matvec_prepared(xp, w, m_rows)
    got = torch.full((m_rows, d_out), float("nan"), device="cuda")
    ops.tetra48_matvec_prepared(xp, k, m_rows, out=got)
    assert torch.equal(got, want)
    xr = ref.round_activation(x, w.n_blocks) if ops.act16() else x
    assert ref.row_bound_error(got, xr, ref.tetra48_dequantize_rotated(k)) <= 1e-5
