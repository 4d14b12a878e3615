"""The batch-1 ``m1`` kernel on words in kernel order (``CODE = TETRA_K``,
``formats.layouts.tetra48_korder``): under the interpreter bit for bit the standard-order kernel
(one, two and four activation rows; one and two rows per loop trip; 16- and 24-bit activations)
and within the f64 bound; the other Tetra paths refuse such words; offline, the decode's
instruction count; on the GPU, full shapes against f64."""

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
    monkeypatch.setenv("LEECHQ_A16", a16)
    w = random_tetra48(d_out, d_in, seed=d_in + m_rows)
    k = to_kernel_order(w)
    x = torch.randn(m_rows, d_in, generator=torch.Generator().manual_seed(d_out)) * 4
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables("cpu").order)
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
    """Kernel-order words reach only the ``m1`` launches: the tiled kernel, the int8 kernel and
    the dequantization name the problem instead of decoding the bits in the wrong order."""
    ops = _ops()
    k = to_kernel_order(random_tetra48(24, 24 * 4, seed=5))
    order = ops.tetra_kernel_tables("cpu").order
    xp = ops.prepare_activation(torch.randn(1, 96), k.n_blocks, order)
    with pytest.raises(UnsupportedShape, match="kernel-order"):
        ops.tetra48_matvec_prepared(xp, k, 1, ops.MatvecConfig(kernel="tile"))
    with pytest.raises(InvalidInput, match="kernel order"):
        ops.tetra48_dequantize_f16(k)
    with pytest.raises(InvalidInput, match="kernel order"):
        ops.tetra48_matvec_imma_prepared(xp, k, 1)


_SASS = r"""
from leechq.kernels.triton import introspect as I
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
print(*out)
"""


def test_kernel_order_decode_is_cheaper_offline() -> None:
    """Offline sm_90 compile of the batch-1 kernel (two rows per trip, four blocks per thread,
    16-bit activations): kernel order keeps the 72 ``dp4a`` and 20 shared loads per trip and
    needs at least 10 % fewer instructions in the hot loop (Triton 3.6: 393 against 458), with
    no local memory."""
    pytest.importorskip("triton")
    std, std_idp, std_lds, std_local, kor, k_idp, k_lds, k_local = (
        int(v) for v in run_offline(_SASS, timeout=900).split()[-8:])
    assert (std_idp, std_lds, std_local) == (72, 20, 0)
    assert (k_idp, k_lds, k_local) == (72, 20, 0)
    assert kor <= 0.9 * std, (kor, std)


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
