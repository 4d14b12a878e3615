"""Triton kernels under the CPU interpreter (``TRITON_INTERPRET=1``): small shapes, every kernel
against its f64 reference built from the same packed bytes, outputs poisoned first.

The byte-permute and dp4a helpers run as shift/mask emulations here (inline PTX cannot run on the
CPU); ``test_triton_gpu.py`` checks the PTX forms against these emulations on the device.
"""

from __future__ import annotations

import pytest
import torch

from leechq.errors import InvalidInput, UnsupportedShape
from leechq.formats.int8_weight import Int8Weight
from leechq.formats.layouts.planes14 import random_planes14
from leechq.formats.layouts.tetra48 import concat_rows, random_tetra48
from leechq.formats.quantized_weight import Int4Weight
from leechq.formats.rotation import generate_rotation
from leechq.kernels import reference as ref

pytestmark = pytest.mark.interp

SMALL = {"rows": 8, "bp": 4}


def _ops():  # imported lazily: the module imports triton
    from leechq.kernels.triton import ops

    return ops


def _ops_rotate():  # imported lazily, as :func:`_ops`
    from leechq.kernels.triton import ops_rotate

    return ops_rotate


def _as_on_a_gpu(monkeypatch: pytest.MonkeyPatch, disable: str = "") -> None:
    """The dispatch table decides as on a GPU (no interpreter cost rules: several rows on the
    many-row ``m1``, 3..16 on the int8 kernel), with ``disable`` as ``LEECHQ_DISABLE_KERNELS``."""
    from leechq.kernels import select

    monkeypatch.setattr(select, "_interpreter_costs", lambda: False)
    monkeypatch.setenv("LEECHQ_DISABLE_KERNELS", disable)
    select.clear_memo()


def _bounded(y: torch.Tensor, x: torch.Tensor, dense: torch.Tensor, tol: float = 1e-5) -> None:
    """|y − y_ref| ≤ tol · Σ_j |w_j x_j| for every output (docs/kernels.md, Tolerances)."""
    assert torch.isfinite(y).all(), "an output was not written (NaN poison survived)"
    want = x.double() @ dense.T
    bound = x.double().abs() @ dense.abs().T
    err = (y.double() - want).abs()
    assert bool((err <= tol * bound + 1e-30).all()), float((err / bound.clamp_min(1e-30)).max())


@pytest.mark.parametrize(("m_rows", "d_out", "d_in", "smem"), [
    (1, 8, 5 * 24 + 7, False),   # odd block count, tail
    (3, 10, 4 * 24, True),       # rows not a multiple of the tile, no tail, shared-memory table
    (8, 8, 3 * 24 + 1, False),
])
def test_tetra48_matvec(m_rows: int, d_out: int, d_in: int, smem: bool) -> None:
    ops = _ops()
    w = random_tetra48(d_out, d_in, seed=m_rows)
    x = torch.randn(m_rows, d_in)
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables("cpu").order)
    assert torch.equal(xp, ref.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables("cpu").order))
    y = torch.full((m_rows, d_out), float("nan"))
    ops.tetra48_matvec_prepared(xp, w, m_rows, ops.MatvecConfig(smem_rows=smem, **SMALL), out=y)
    _bounded(y, x, ref.tetra48_dequantize_rotated(w))


M1_SMALL = {"rows": 8, "bp": 8, "num_warps": 1, "kernel": "m1", "ctas_per_sm": 1}


@pytest.mark.parametrize(("d_out", "d_in", "cfg"), [
    # 18 blocks = 9 pairs → 2 K-slices of 8 pairs; 3 chunks of 8 rows walked by 1 program per slice
    (19, 18 * 24 + 5, M1_SMALL),
    # odd block count, no tail, 2 rows per warp iteration, one program per (chunk, slice)
    (8, 7 * 24, {**M1_SMALL, "bp": 16, "num_warps": 1, "rows": 8, "ctas_per_sm": 0}),
    # two rows per warp and loop trip (ILP 2): chunk walking, a short last chunk, a tail
    (19, 18 * 24 + 5, {**M1_SMALL, "ilp": 2}),
    (13, 7 * 24, {**M1_SMALL, "bp": 16, "ilp": 2, "ctas_per_sm": 0}),
])
def test_tetra48_m1(d_out: int, d_in: int, cfg: dict) -> None:
    ops = _ops()
    w = random_tetra48(d_out, d_in, seed=d_out)
    x = torch.randn(1, d_in)
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables("cpu").order)
    dense = ref.tetra48_dequantize_rotated(w)
    for _ in range(2):  # the second launch checks that the tickets were reset
        y = torch.full((1, d_out), float("nan"))
        ops.tetra48_matvec_prepared(xp, w, 1, ops.MatvecConfig(**cfg), out=y)
        _bounded(y, x, dense)
    assert int(ops._tickets(torch.device("cpu")).abs().sum()) == 0


@pytest.mark.parametrize(("m_rows", "mb", "d_out", "d_in", "ilp", "repeats"), [
    (2, 2, 11, 18 * 24 + 5, 2, 2),  # two rows in one launch: chunks, slices, a tail; launched
                                    # twice (the tickets must reset)
    (3, 4, 13, 7 * 24, 1, 1),       # three real rows of four (the fourth is the zero pad row)
    (5, 4, 8, 3 * 24, 1, 1),        # two launches: four rows, then one (the one-row kernel)
])
def test_tetra48_m1_many_rows(m_rows: int, mb: int, d_out: int, d_in: int, ilp: int,
                              repeats: int) -> None:
    """Several activation rows per launch (``MatvecConfig.mb``): one decode per block, every output
    row written (poisoned first), other rows of ``out`` untouched, tickets reset. (Each case costs
    15–35 s in the interpreter; the GPU tests cover the full shapes and 6-row calls.)"""
    ops = _ops()
    w = random_tetra48(d_out, d_in, seed=d_out + m_rows)
    x = torch.randn(m_rows, d_in)
    x[1] = 0.0  # a zero activation row between others
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables("cpu").order)
    dense = ref.tetra48_dequantize_rotated(w)
    cfg = ops.MatvecConfig(**{**M1_SMALL, "bp": 8, "ilp": ilp, "mb": mb, "ctas_per_sm": 0})
    for _ in range(repeats):
        y = torch.full((m_rows + 1, d_out), float("nan"))
        ops.tetra48_matvec_prepared(xp, w, m_rows, cfg, out=y[:m_rows])
        _bounded(y[:m_rows], x, dense)
        assert torch.isnan(y[m_rows]).all()
    assert int(ops._tickets(torch.device("cpu")).abs().sum()) == 0


@pytest.mark.parametrize(("d_out", "d_in", "bp", "rows"), [
    (11, 18 * 24 + 3, 8, 4),  # two K-slices (the second short), chunks walked, a tail
    (7, 5 * 24, 8, 8),        # an odd block count, no tail, one chunk
])
def test_planes14_m1(d_out: int, d_in: int, bp: int, rows: int) -> None:
    """The batch-1 Planes14 kernel (``kernel="m1"``) against the f64 reference, with
    activations spanning seven decades; every output written, tickets reset."""
    ops = _ops()
    w = random_planes14(d_out, d_in, seed=d_out)
    dense = ref.planes14_dequantize_rotated(w)
    cfg = ops.MatvecConfig(rows=rows, bp=bp, num_warps=1, kernel="m1")
    for _ in range(2):
        x = torch.randn(1, d_in) * (10.0 ** torch.randint(-3, 4, (1, d_in)))
        xp = ops.prepare_activation(x, w.n_blocks, ops.planes14_m1_order("cpu"))
        y = torch.full((1, d_out), float("nan"))
        ops.planes14_matvec_m1_prepared(xp, w, cfg, out=y)
        _bounded(y, x, dense)
    _bounded(ops.planes14_matvec(x, w, cfg), x, dense)  # the entry point picks the kernel
    assert int(ops._tickets(torch.device("cpu")).abs().sum()) == 0
    # the order it reads: prepared coordinate 8k + 2j + h holds quad 2k + h, element j
    assert ops.planes14_m1_order("cpu").tolist() == [
        8 * k + 4 * h + j for k in range(3) for j in range(4) for h in range(2)]


@pytest.mark.parametrize(("mb", "m_rows"), [(2, 3), (4, 3)])
def test_planes14_m1_many_rows(mb: int, m_rows: int) -> None:
    """Several activation rows through the ``m1`` kernel with the Planes14 decode (opt-in
    ``mb``): 3 rows = a two-row launch and a one-row launch, or one four-row launch with a zero pad
    row; a zero activation row among them; every output written, the row past them untouched."""
    ops = _ops()
    w = random_planes14(11, 18 * 24 + 3, seed=mb)
    dense = ref.planes14_dequantize_rotated(w)
    x = torch.randn(m_rows, w.d_in)
    x[1] = 0.0
    xp = ops.prepare_activation(x, w.n_blocks, ops.planes14_m1_order("cpu"))
    cfg = ops.MatvecConfig(rows=4, bp=8, num_warps=1, kernel="m1", mb=mb)
    y = torch.full((m_rows + 1, w.d_out), float("nan"))
    ops.planes14_matvec_m1_prepared(xp, w, cfg, out=y[:m_rows], m_rows=m_rows)
    _bounded(y[:m_rows], x, dense)
    assert torch.isnan(y[m_rows]).all()
    assert int(ops._tickets(torch.device("cpu")).abs().sum()) == 0
    with pytest.raises(InvalidInput, match="mb 2 or 4"):
        ops.planes14_matvec_m1_prepared(xp, w, ops.MatvecConfig(rows=4, bp=8, num_warps=1,
                                                                kernel="m1"), m_rows=m_rows)


def test_planes14_matvec_default_is_m1(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no configuration, one activation row runs the ``m1`` Planes14 kernel in the per-shape
    geometry (and agrees with the f64 reference); several rows keep the tiled kernel under the
    interpreter."""
    ops = _ops()
    w = random_planes14(13, 6 * 24 + 7, seed=5)
    dense = ref.planes14_dequantize_rotated(w)
    calls = []
    m1 = ops.planes14_matvec_m1_prepared
    monkeypatch.setattr(ops, "planes14_matvec_m1_prepared",
                        lambda xp, w, cfg, **kw: calls.append(cfg) or m1(xp, w, cfg, **kw))
    x = torch.randn(1, w.d_in)
    _bounded(ops.planes14_matvec(x, w), x, dense)
    assert calls == [ops.m1_config(w.d_out, w.n_blocks, torch.device("cpu"), w.tail_cols)]
    x3 = torch.randn(3, w.d_in)
    _bounded(ops.planes14_matvec(x3, w), x3, dense)
    assert len(calls) == 1


def test_planes14_matvec_default_row_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU (forced here) several rows with no configuration run the ``m1`` Planes14 kernel in
    Tetra's row groups, each in its own geometry and at its own offset: 6 rows = a four-row launch,
    then a two-row one; every output row is written and agrees with the f64 reference."""
    ops = _ops()
    _as_on_a_gpu(monkeypatch, "imma")
    launches = []
    launch = ops._launch_m1
    monkeypatch.setattr(ops, "_launch_m1", lambda k, xp, w, y, cfg, m_rows=1, **kw: (
        launches.append((k, cfg.mb, m_rows, xp.shape[0], y.shape[0])),
        launch(k, xp, w, y, cfg, m_rows, **kw))[1])
    w = random_planes14(7, 4 * 24 + 3, seed=3)
    x = torch.randn(6, w.d_in)
    y = ops.planes14_matvec(x, w)
    assert launches == [("planes14", 4, 4, 4, 4), ("planes14", 2, 2, 2, 2)]
    _bounded(y, x, ref.planes14_dequantize_rotated(w))


def test_m1_row_groups() -> None:
    ops = _ops()
    assert [ops.m1_row_groups(m) for m in range(1, 10)] == [
        [1], [2], [3], [4], [4, 1], [4, 2], [4, 3], [4, 4], [4, 4, 1]]
    plan = ops.m1_plan(4096, 512, torch.device("cpu"), m_rows=6)
    assert [(g, c.mb) for g, c in plan] == [(4, 4), (2, 2)]
    assert plan[1][1] == ops.m1_config(4096, 512, torch.device("cpu"), m_rows=2)


def test_tetra48_default_row_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default many-row path (GPU only; forced here) launches each row group in its own
    geometry at its own offset: 6 rows = a four-row launch, then a two-row one."""
    ops = _ops()
    _as_on_a_gpu(monkeypatch, "imma")  # the many-row m1, not the int8 kernel
    launches = []
    launch = ops._launch_m1
    monkeypatch.setattr(ops, "_launch_m1", lambda k, xp, w, y, cfg, m_rows=1, **kw: (
        launches.append((cfg.mb, m_rows, xp.shape[0], y.shape[0])),
        launch(k, xp, w, y, cfg, m_rows, **kw))[1])
    w = random_tetra48(7, 4 * 24 + 3, seed=3)
    x = torch.randn(6, w.d_in)
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables("cpu").order)
    y = torch.full((7, w.d_out), float("nan"))
    ops.tetra48_matvec_prepared(xp, w, 6, out=y[:6])
    assert launches == [(4, 4, 8, 6), (2, 2, 4, 2)]
    _bounded(y[:6], x, ref.tetra48_dequantize_rotated(w))
    assert torch.isnan(y[6]).all()


def test_m1_first_use_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first-use check passes on a sound kernel and rejects (with a warning) a broken one; the
    environment switch turns the kernel off."""
    ops = _ops()
    cfg = ops.MatvecConfig(**{**M1_SMALL, "rows": 4})
    assert ops._check_m1(torch.device("cpu"), cfg)
    good = ops.tetra_m1_table("cpu")
    bad = good.clone()
    bad[:4096] ^= 0x1  # corrupt the low nibble bit of every rank row
    monkeypatch.setattr(ops, "tetra_m1_table", lambda device: bad)
    with pytest.warns(UserWarning, match="first-use check"):
        assert not ops._check_m1(torch.device("cpu"), cfg)
    # the Planes14 decode's check: the same cases through its own entry point
    p14 = ops.MatvecConfig(rows=4, bp=8, num_warps=1, kernel="m1")
    assert ops._check_planes14_m1(torch.device("cpu"), p14)
    bad14 = ops.planes14_m1_table("cpu").clone()
    bad14[0:2048:4] ^= 0x01010101  # every class's level 0..3 magnitudes off by one
    monkeypatch.setattr(ops, "planes14_m1_table", lambda device: bad14)
    with pytest.warns(UserWarning, match="first-use check"):
        assert not ops._check_planes14_m1(torch.device("cpu"), p14)


def test_tetra48_fused_rows_equal_separate() -> None:
    ops = _ops()
    a, b = random_tetra48(8, 50, seed=1), random_tetra48(8, 50, seed=2)
    ab = concat_rows([a, b])
    x = torch.randn(1, 50)
    y = ops.tetra48_matvec(x, ab, ops.MatvecConfig(**SMALL))
    _bounded(y, x, torch.cat([ref.tetra48_dequantize_rotated(a), ref.tetra48_dequantize_rotated(b)]))


@pytest.mark.parametrize(("m_rows", "d_in"), [(1, 3 * 24 + 5), (5, 4 * 24)])
def test_planes14_matvec(m_rows: int, d_in: int) -> None:
    ops = _ops()
    w = random_planes14(9, d_in, seed=m_rows)
    x = torch.randn(m_rows, d_in)
    xp = ops.prepare_activation(x, w.n_blocks, ops.natural_order("cpu"))
    y = torch.full((m_rows, 9), float("nan"))
    ops.planes14_matvec_prepared(xp, w, m_rows, ops.MatvecConfig(**SMALL), out=y)
    _bounded(y, x, ref.planes14_dequantize_rotated(w))


@pytest.mark.parametrize(("n", "prepared"), [(96, False), (72, True), (64, True), (320, False)])
def test_rotate(n: int, prepared: bool) -> None:
    ops = _ops()
    ops_rotate = _ops_rotate()
    rot = generate_rotation(n, 3)
    x = torch.randn(2, n)
    want = ref.rotate(x, rot)
    if prepared:
        order = ops.tetra_kernel_tables("cpu").order
        got = ops_rotate.rotate(x, rot, prepared_order=order, one_launch=False)
        want = ref.prepare_activation(want, n // 24, order)
    else:
        got = ops_rotate.rotate(x, rot, out=torch.full((2, n), float("nan")))
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("n", "m_rows"), [
    (72, 3),    # k = 9, m = 8: every block spans three groups; 3 rows → 4 prepared rows
    (40, 1),    # k = 5, m = 8: one block and a 16-column tail over two groups
    (64, 2),    # k = 1: two blocks and a 16-column tail
    (312, 1),   # k = 39, m = 8: 13 blocks (an odd count: an empty odd slot)
    (1152, 5),  # k = 9, m = 128: 48 blocks; pairs shared by neighbouring groups
    (1536, 2),  # k = 3, m = 512
    (1200, 1),  # k = 75 > 64: refused
])
def test_rotate_into_prepared_layout(n: int, m_rows: int) -> None:
    """The one-launch rotation writes every slot of the prepared layout (poisoned first), equal to
    the reference rotation laid out by the reference preparation, zeros included."""
    ops = _ops()
    ops_rotate = _ops_rotate()
    rot = generate_rotation(n, 11)
    if rot.odd > 64:
        with pytest.raises(UnsupportedShape):
            ops_rotate.rotate(torch.randn(1, n), rot,
                              prepared_order=ops.tetra_kernel_tables("cpu").order)
        return
    order = ops.tetra_kernel_tables("cpu").order
    x = torch.randn(m_rows, n)
    want = ref.prepare_activation(ref.rotate(x, rot), n // 24, order)
    out = torch.full(want.shape, float("nan"))
    got = ops_rotate.rotate(x, rot, prepared_order=order, out=out)
    assert got is out and not torch.isnan(got).any()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("n", "prepared"), [
    (256, False),   # k = 1, m = 256: one 16×16 tile
    (768, False),   # k = 3, m = 256
    (512, False),   # m = 512: a 16×32 tile
    (1536, True),   # k = 3, m = 512, straight into the prepared layout (Tetra order)
    (4096, True),   # m = 4096: a 64×64 tile
])
def test_rotate_tensor_cores(n: int, prepared: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tensor-core transform (m ≥ 256) against f64 on rows of different scales and a zero row,
    with every dot checked exact: float16 operands, a zero accumulator, and an f32 result equal to
    the f64 product (so no tensor-core rounding mode can change it)."""
    import numpy as np
    from triton.runtime import interpreter

    ops = _ops()
    ops_rotate = _ops_rotate()
    create_dot = interpreter.InterpreterBuilder.create_dot
    dots = []

    def checked_dot(self, a, b, d, *args):  # the interpreter's InterpreterBuilder.create_dot
        out = create_dot(self, a, b, d, *args)
        exact = a.data.astype(np.float64) @ b.data.astype(np.float64)
        dots.append(a.data.dtype == b.data.dtype == np.float16 and not d.data.any()
                    and np.array_equal(out.data.astype(np.float64), exact))
        return out

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", checked_dot)
    rot = generate_rotation(n, 5)
    scale = torch.tensor([[1.0], [2.0**10], [1.0]])  # compared in units of each row's scale
    x = torch.randn(3, n) * scale
    x[2] = 0.0
    want = ref.rotate(x, rot)
    if prepared:
        order = ops.tetra_kernel_tables("cpu").order
        got = ops_rotate.rotate(x, rot, prepared_order=order, tensor_cores=True)
        want = ref.prepare_activation(want, n // 24, order)
        scale = torch.cat([scale, torch.ones(got.shape[0] - 3, 1)])
    else:
        got = ops_rotate.rotate(x, rot, out=torch.full((3, n), float("nan")), tensor_cores=True)
    assert torch.allclose(got / scale, want / scale, rtol=1e-5, atol=1e-6)
    rows = got.shape[0] if prepared else 3  # the one-launch form also runs the zero pad row
    assert len(dots) == 6 * rows * rot.small.shape[0] and all(dots)


def test_int4_int8_matvec_and_embeddings() -> None:
    ops = _ops()
    torch.manual_seed(0)
    dense = torch.randn(9, 256)
    x = torch.randn(2, 256)
    q4 = Int4Weight.quantize(dense, group=128)
    _bounded(ops.int4_matvec(x, q4), x, q4.dequantize().double())
    q8 = Int8Weight.quantize(dense, group=64)
    _bounded(ops.int8_matvec(x, q8), x, q8.dequantize().double())
    ids = torch.tensor([4, 0, 8, 4])
    t4 = Int4Weight.quantize(dense, group=64)
    assert torch.equal(ops.int4_embedding(ids, t4), ref.int4_embedding(ids, t4))
    assert torch.equal(ops.int8_embedding(ids, q8), ref.int8_embedding(ids, q8))
    assert ops.int8_embedding(ids, q8, torch.float16).dtype == torch.float16


def test_bad_inputs_are_named() -> None:
    ops = _ops()
    w = random_tetra48(8, 48, seed=0)
    with pytest.raises(InvalidInput, match=r"x must be \[M, 48\]"):
        ops.tetra48_matvec(torch.randn(1, 47), w)
    with pytest.raises(InvalidInput, match="x must be"):
        ops.tetra48_matvec(torch.zeros(1, 48, dtype=torch.int32), w)
    with pytest.raises(InvalidInput, match="contiguous"):
        ops.tetra48_matvec(torch.randn(48, 2).T[:1], w)
    with pytest.raises(UnsupportedShape, match="1..8"):
        ops.tetra48_matvec(torch.randn(9, 48), w)
    from dataclasses import replace

    with pytest.raises(InvalidInput, match="words"):
        ops.tetra48_matvec(torch.randn(1, 48), replace(w, words=w.words[:, :2].contiguous()))
    with pytest.raises(InvalidInput, match="row_scales"):
        ops.tetra48_matvec(torch.randn(1, 48), replace(w, row_scales=w.row_scales.double()))
    with pytest.raises(InvalidInput, match="xp"):
        ops.tetra48_matvec_prepared(torch.zeros(1, 10), w, 1)
    order = ops.tetra_kernel_tables("cpu").order
    xp = ops.prepare_activation(torch.randn(1, 48), w.n_blocks, order)
    with pytest.raises(InvalidInput, match=r"out must be \[1, 8\]"):  # too few columns for y
        ops.tetra48_matvec_prepared(xp, w, 1, out=torch.empty(1, 7))
    # the many-row path names its problems too
    with pytest.raises(InvalidInput, match=r"x must be \[M, 48\]"):
        ops.tetra48_matmul_dense(torch.randn(20, 47), w)
    with pytest.raises(InvalidInput, match="x"):
        ops.tetra48_matmul_dense(torch.zeros(20, 48, dtype=torch.int64), w)
    with pytest.raises(InvalidInput, match="out"):
        ops.tetra48_dequantize_f16(w, out=torch.empty(8, 48, dtype=torch.float32))
    with pytest.raises(InvalidInput, match="words"):
        ops.tetra48_dequantize_f16(replace(w, words=w.words[:, :2].contiguous()))
    with pytest.raises(InvalidInput, match="num_warps"):
        ops.tetra48_dequantize_f16(w, config=ops.DequantConfig(num_warps=3))
    with pytest.raises(InvalidInput, match="programs_per_sm"):
        ops.tetra48_dequantize_f16(w, config=ops.DequantConfig(programs_per_sm=0))


def test_m1_config_rule() -> None:
    """Batch-1 geometry per shape (the CPU counts 2 SMs): 64-row chunks only while ≥ 3 programs
    per SM remain, larger chunks when one wave of five programs per SM needs them (capped), always
    one program per (chunk, slice), two rows per loop trip and the 96-register cap; the result
    runs and matches the reference (config None takes the rule)."""
    ops = _ops()
    cpu = torch.device("cpu")
    big = ops.m1_config(24576, 170, cpu)
    assert (big.rows, big.ilp, big.ctas_per_sm, big.kernel, big.maxnreg) == (
        ops.M1_MAX_ROWS, 2, 0, "m1", 96)
    assert ops.m1_config(64, 64, cpu).rows == 32  # one 64-row chunk × one slice < 6 programs
    assert ops.m1_config(6 * 64, 64, cpu).rows == 64
    assert ops.m1_config(12 * 64, 64, cpu).rows == 80  # 768 rows / 10 programs → 77 → trip of 8
    # the H200 (132 SMs) choices of the 2026-11-30 sweep, Qwen3-8B groups
    assert ops.m1_wave_rows(24576, 170, 5 * 132) == 112
    assert ops.m1_wave_rows(6144, 170, 5 * 132) == 32
    assert ops.m1_wave_rows(4096, 512, 5 * 132) == 56
    assert ops.m1_wave_rows(4096, 512, 5 * 132, ilp=1) == 52
    assert ops.m1_wave_rows(10, 4, 1000) == 8  # at least one trip
    with pytest.raises(InvalidInput, match="maxnreg"):
        ops.m1_grid(64, 64, ops.MatvecConfig(rows=32, kernel="m1", ilp=2, maxnreg=16), cpu)
    with pytest.raises(InvalidInput, match="mb"):
        ops.m1_grid(64, 64, ops.MatvecConfig(rows=32, kernel="m1", ilp=2, mb=3), cpu)
    # several activation rows: two share a launch, three or more go four at a time, one loop row
    # per trip for four (their limbs take the registers), no register cap
    two, many = ops.m1_config(24576, 170, cpu, m_rows=2), ops.m1_config(24576, 170, cpu, m_rows=5)
    assert (two.mb, two.ilp, two.maxnreg, many.mb, many.ilp, many.maxnreg) == (2, 2, 0, 4, 1, 0)
    w = random_tetra48(40, 9 * 24 + 3, seed=40)
    x = torch.randn(1, w.d_in)
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables("cpu").order)
    y = torch.full((1, 40), float("nan"))
    ops.tetra48_matvec_prepared(xp, w, 1, out=y)
    _bounded(y, x, ref.tetra48_dequantize_rotated(w))


def test_tetra48_dequantize_f16_and_dense_matmul() -> None:
    """The many-row path: the dequantization kernel equals its reference twin bit for bit (values
    rounded to float16 exactly as the kernel does), its column order maps back to the rotated basis,
    and the float16 GEMM (σ_row folded into the copy, the tail in place) stays within fp16
    accuracy of the f64 product."""
    ops = _ops()
    w = random_tetra48(7, 9 * 24 + 5, seed=9)
    got = ops.tetra48_dequantize_f16(w)  # the default form: grouped, 16-byte stores
    assert got.dtype == torch.float16 and got.shape == (7, 9 * 24)
    assert torch.equal(got, ref.tetra48_dequantize_f16(w, grouped=ops.dequant_config().grouped))
    blocks = ops.DequantConfig(num_warps=1, programs_per_sm=1)
    assert torch.equal(ops.tetra48_dequantize_f16(w, config=blocks), ref.tetra48_dequantize_f16(w))
    dense = ref.tetra48_dequantize_rotated(w)  # f64, σ_row included
    x = torch.randn(13, w.d_in)
    for grouped in (False, True):
        cfg = ops.DequantConfig(grouped=grouped, vector_stores=True)
        got = ops.tetra48_dequantize_f16(w, config=cfg)
        assert torch.equal(got, ref.tetra48_dequantize_f16(w, grouped=grouped)), grouped
        idx = ops.dequant_natural_index(w.n_blocks, "cpu", grouped)
        assert sorted(idx.tolist()) == list(range(9 * 24))
        back = got.double() * w.row_scales.double()[:, None]
        assert torch.allclose(back, dense[:, idx], rtol=2**-10, atol=0.0)
        with pytest.MonkeyPatch.context() as mp:
            from leechq.kernels.triton import ops_dense

            mp.setattr(ops_dense, "DEQUANT_DEFAULT", cfg)
            y = ops.tetra48_matmul_dense(x, w)
        assert ref.row_bound_error(y, x, dense) <= 2e-3


@pytest.mark.parametrize("layout", ["tetra48", "planes14"])
def test_dense_products_from_the_rotation_order(layout: str) -> None:
    """The many-row product from an activation the rotation already wrote in the copy's column
    order (``ops.dense_input_order``, ``ops.matmul_dense_ordered``: no gather, no conversion)
    equals the product from the natural-order activation (whose tail it takes in float16, like
    the blocks); the order is a permutation that keeps the tail in place; the copy (σ_row folded
    into the values, the tail columns in place) equals its twin bit for bit, for one record and
    for a group's parts stacked by rows, whose product is their products side by side."""
    ops = _ops()
    make = random_tetra48 if layout == "tetra48" else random_planes14
    matmul = ops.tetra48_matmul_dense if layout == "tetra48" else ops.planes14_matmul_dense
    rotated = (ref.tetra48_dequantize_rotated if layout == "tetra48"
               else ref.planes14_dequantize_rotated)
    w = make(40, 5 * 24 + 7, seed=5)
    w2 = make(9, 5 * 24 + 7, seed=6)
    order = ops.dense_input_order(w, "cpu")
    assert order.dtype == torch.int32 and sorted(order.tolist()) == list(range(w.d_in))
    assert order[5 * 24:].tolist() == list(range(5 * 24, w.d_in))
    cols = ops.dense_input_columns(w, "cpu")
    assert torch.equal(order.long()[cols], torch.arange(w.d_in))
    grouped = ops.dequant_config().grouped
    copy = ops.dense_copy([w, w2])
    assert copy.dtype == torch.float16 and copy.shape == (49, w.d_in)
    assert copy.stride(0) == ops.aligned_width(w.d_in)
    want = torch.cat([ref.folded_dense_f16(w, grouped), ref.folded_dense_f16(w2, grouped)])
    assert torch.equal(copy, want)
    dense = rotated(w)  # f64, natural order, σ_row included
    assert torch.allclose(copy[:40].double(), dense[:, cols], rtol=2**-10, atol=0.0)
    x = torch.randn(6, w.d_in)
    x16 = torch.empty(6, w.d_in, dtype=torch.float16)
    x16[:, order.long()] = x.half()
    got = ops.matmul_dense_ordered(x16, w)
    assert got.dtype == torch.float32 and got.shape == (6, 40)
    x_tail16 = x.clone()  # the tail activation too arrives in float16 here
    x_tail16[:, 5 * 24:] = x[:, 5 * 24:].half().float()
    assert torch.allclose(got, matmul(x_tail16, w), rtol=1e-5, atol=1e-5)
    assert ref.row_bound_error(got, x, dense) <= 2e-3
    both = ops.matmul_dense_ordered(x16, [w, w2])
    assert torch.allclose(both, torch.cat([got, ops.matmul_dense_ordered(x16, w2)], dim=1),
                          rtol=1e-6, atol=1e-6)
    with pytest.raises(InvalidInput, match="x16"):
        ops.matmul_dense_ordered(x.half()[:, :-1].contiguous(), w)
    with pytest.raises(InvalidInput, match="x16"):
        ops.matmul_dense_ordered(x, w)
    with pytest.raises(InvalidInput, match="d_in"):
        ops.dense_copy([w, make(9, 4 * 24, seed=7)])
    with pytest.raises(InvalidInput, match="at least one"):
        ops.dense_copy([])


def test_planes14_dequantize_f16_and_dense_matmul() -> None:
    """The ball codebook's many-row path: the Planes14 dequantization kernel equals its reference
    twin bit for bit (an odd block count: the last pair's odd record absent); the twin is within float16 rounding of the f64 blocks;
    the float16 GEMM with σ_row and the tail stays within fp16 accuracy of the f64 product."""
    ops = _ops()
    w = random_planes14(7, 9 * 24 + 5, seed=9)
    blocks = ops.DequantConfig()  # block-major: natural column order
    got = ops.planes14_dequantize_f16(w, config=blocks)
    assert got.dtype == torch.float16 and got.shape == (7, 9 * 24)
    assert torch.equal(got, ref.planes14_dequantize_f16(w))
    dense = ref.planes14_dequantize_rotated(w)  # f64, σ_row included, natural order
    back = got.double() * w.row_scales.double()[:, None]
    assert torch.allclose(back, dense[:, : 9 * 24], rtol=2**-10, atol=0.0)
    x = torch.randn(13, w.d_in)
    with pytest.MonkeyPatch.context() as mp:
        from leechq.kernels.triton import ops_dense

        mp.setattr(ops_dense, "DEQUANT_DEFAULT", blocks)
        assert ref.row_bound_error(ops.planes14_matmul_dense(x, w), x, dense) <= 2e-3
    # the grouped layout with vector stores: the twin's columns, mapped back by the index
    cfg = ops.DequantConfig(grouped=True, vector_stores=True)
    got = ops.planes14_dequantize_f16(w, config=cfg)
    assert torch.equal(got, ref.planes14_dequantize_f16(w, grouped=True))
    idx = ops.planes14_dequant_natural_index(w.n_blocks, "cpu", grouped=True)
    assert torch.allclose(got.double() * w.row_scales.double()[:, None], dense[:, idx],
                          rtol=2**-10, atol=0.0)
    with pytest.MonkeyPatch.context() as mp:
        from leechq.kernels.triton import ops_dense

        mp.setattr(ops_dense, "DEQUANT_DEFAULT", cfg)
        assert ref.row_bound_error(ops.planes14_matmul_dense(x, w), x, dense) <= 2e-3
    out = torch.empty(7, 9 * 24, dtype=torch.float32)
    with pytest.raises(InvalidInput, match="out"):
        ops.planes14_dequantize_f16(w, out=out)


@pytest.mark.parametrize(("d_out", "d_in", "m_rows", "kw"), [
    # 8 rows, one 8-row group per warp step, 2 programs of K (4-block slices), a tail
    (16, 8 * 24 + 5, 8, {"k_per": 4, "num_warps": 1, "rows_per_step": 1}),
    # 3 rows, two row groups per step, two row sets per program, a short last row group,
    # an odd block count past the last 4-block step
    (19, 9 * 24, 3, {"num_warps": 1, "row_groups": 2, "rows_per_step": 2}),
    # 13 rows (two 8-row chunks of activation records), 2 slices, one row group per step, a tail
    (8, 5 * 24 + 3, 13, {"num_warps": 1, "k_per": 4, "rows_per_step": 1}),
    # no coded block at all: the tail only, with the default geometry
    (9, 20, 4, {}),
    # 11 rows: two 8-row chunks of activation records, each decoded block meeting both
    (16, 8 * 24 + 5, 11, {"k_per": 4, "num_warps": 1, "rows_per_step": 2}),
    # four row groups per step (two pairs on the same fragments): 40 rows = a full 32-row set
    # and a partial one, three slices, a tail
    (40, 9 * 24 + 5, 5, {"k_per": 4, "num_warps": 1, "rows_per_step": 4}),
    (33, 5 * 24, 8, {"k_per": 8, "num_warps": 1, "rows_per_step": 4}),
])
def test_tetra48_imma(d_out: int, d_in: int, m_rows: int, kw: dict) -> None:
    """The int8 tensor-core kernel (MMA, shuffles and loads emulated) against the f64 product:
    the batch-1 bound (1e-5 of Σ|w·x|), every output written (NaN poison)."""
    ops = _ops()
    w = random_tetra48(d_out, d_in, seed=d_out + m_rows)
    x = torch.randn(m_rows, d_in)
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables("cpu").order)
    y = torch.full((m_rows, d_out), float("nan"))
    ops.tetra48_matvec_imma_prepared(xp, w, m_rows, out=y, **kw)
    _bounded(y, x, ref.tetra48_dequantize_rotated(w))


def test_planes14_imma() -> None:
    """Planes14 records through the int8 tensor-core kernel (the batch-1 Planes14 decode, the
    activation in ``planes14_m1_order``): 3 rows, two row sets per program, an odd block count
    and a tail, within the batch-1 bound of the f64 product."""
    ops = _ops()
    w = random_planes14(19, 9 * 24 + 5, seed=5)
    x = torch.randn(3, w.d_in)
    xp = ops.prepare_activation(x, w.n_blocks, ops.planes14_m1_order("cpu"))
    y = torch.full((3, w.d_out), float("nan"))
    ops.planes14_matvec_imma_prepared(xp, w, 3, out=y, num_warps=1, row_groups=2)
    _bounded(y, x, ref.planes14_dequantize_rotated(w))


def test_tetra48_imma_rejects_bad_input() -> None:
    ops = _ops()
    w = random_tetra48(8, 4 * 24, seed=1)
    order = ops.tetra_kernel_tables("cpu").order
    with pytest.raises(UnsupportedShape, match=r"1\.\.16"):
        ops.imma_activation(ops.prepare_activation(torch.randn(17, 96), 4, order), 17, 4)
    xp = ops.prepare_activation(torch.randn(2, 96), 4, order)
    with pytest.raises(InvalidInput, match="multiple of 4"):
        ops.tetra48_matvec_imma_prepared(xp, w, 2, k_per=6)
    with pytest.raises(InvalidInput, match="rows_per_step"):
        ops.tetra48_matvec_imma_prepared(xp, w, 2, rows_per_step=3)
    x11 = ops.prepare_activation(torch.randn(11, 96), 4, order)
    with pytest.raises(InvalidInput, match="rows_per_step"):  # four groups: one 8-row chunk
        ops.tetra48_matvec_imma_prepared(x11, w, 11, rows_per_step=4)
    with pytest.raises(InvalidInput, match="records"):
        rec, ex = ops.imma_activation(xp, 2, 4)
        ops.tetra48_matvec_imma_prepared(xp, w, 2, acts=(rec[:-1], ex))


def test_small_batches_route_to_the_int8_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the dispatch table picks ``imma`` (3..16 rows on a GPU; its choice here), an
    unconfigured Tetra matvec and a planned Planes14 one go through the int8 tensor-core
    launcher (calls counted, Tetra's code then Planes14's) and stay within the batch-1 bound; a
    configured call does not."""
    ops = _ops()
    _as_on_a_gpu(monkeypatch)
    from leechq.kernels.triton import ops_imma

    codes = []
    launch = ops_imma._matvec_imma

    def counted(code, *args, **kwargs):
        codes.append(code)
        return launch(code, *args, **kwargs)

    monkeypatch.setattr(ops_imma, "_matvec_imma", counted)
    x = torch.randn(3, 5 * 24 + 5)
    wt = random_tetra48(9, x.shape[1], seed=7)
    xt = ops.prepare_activation(x, wt.n_blocks, ops.tetra_kernel_tables("cpu").order)
    _bounded(ops.tetra48_matvec_prepared(xt, wt, 3), x, ref.tetra48_dequantize_rotated(wt))
    wp = random_planes14(9, x.shape[1], seed=8)
    xq = ops.prepare_activation(x, wp.n_blocks, ops.planes14_m1_order("cpu"))
    plan = [(3, ops.default_config(3))]  # any m1 plan: the activation is in the m1 order
    _bounded(ops.planes14_matvec_planned(xq, wp, 3, plan), x, ref.planes14_dequantize_rotated(wp))
    assert codes == [0, 1]
    ops.tetra48_matvec_prepared(xt, wt, 3, config=ops.default_config(3))
    assert codes == [0, 1]
