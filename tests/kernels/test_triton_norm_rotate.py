"""The rotation kernels with a fused pre-op (``ops_rotate.norm_rotate``,
``ops_rotate.silu_mul_rotate``) against their reference twins, under the Triton interpreter.

The kernels sum a row's squares in their own order, so the narrowed norm ``rms_norm(r)`` may round
differently from the reference in a coordinate whose value sits on a rounding boundary. The test
therefore undoes the rotation (float64, ``apply_rotation_transpose``) and holds every recovered
coordinate to the reference's within two units in the last place of the narrowed dtype (the norm
rounds twice: a normalised value one unit off moves the weight product by up to one unit more;
plus the rotation's f32 error), and requires most of them to be equal; the residual output must be
exact.
"""

from __future__ import annotations

import os

import pytest
import torch

from leechq.errors import InvalidInput, UnsupportedShape
from leechq.formats.rotation import apply_rotation_transpose, generate_rotation
from leechq.kernels import reference as ref

pytest.importorskip("triton")
interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                            reason="the Triton interpreter (TRITON_INTERPRET=1) is off")

_EPS_BITS = {torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}


def _ops():  # imported lazily: TRITON_INTERPRET must be set before triton compiles anything
    from leechq.kernels.triton import ops

    return ops


def _ops_rotate():  # imported lazily, as :func:`_ops`
    from leechq.kernels.triton import ops_rotate

    return ops_rotate


def _recover(y: torch.Tensor, rot) -> torch.Tensor:
    return apply_rotation_transpose(y.cpu().to(torch.float64), rot)


def _assert_close_inputs(got: torch.Tensor, want_h: torch.Tensor, rot, dtype: torch.dtype,
                         units: int = 2) -> None:
    """``Qᵀ got`` within ``units`` ulps of ``dtype`` (plus 1e-5 of the row's largest value for the
    f32 rotation) of the reference input ``want_h``, and equal to it in at least 95 % of
    coordinates."""
    h = _recover(got, rot)
    want = want_h.cpu().to(torch.float64)
    scale = want.abs().amax(dim=-1, keepdim=True)
    ulp = units * want.abs() * 2.0 ** (1 - _EPS_BITS[dtype])
    err = (h - want).abs()
    assert (err <= ulp + 1e-5 * scale).all(), float((err - ulp).max())
    assert (err <= 1e-5 * scale).double().mean() >= 0.95


@interp
@pytest.mark.parametrize(("n", "m_rows", "dtype", "delta_dtype", "weight_dtype", "prepared"), [
    (96, 1, torch.float16, torch.float32, torch.float16, True),      # k = 3, m = 32
    (64, 3, torch.bfloat16, torch.bfloat16, torch.bfloat16, True),   # k = 1, 3 → 4 prepared rows
    (72, 2, torch.float16, None, torch.float16, False),              # no residual add, k = 9
    (96, 2, torch.float16, torch.float32, torch.float32, False),     # f32 weight: f32 product
    (48, 1, torch.float32, torch.float32, torch.float32, True),
])
def test_norm_rotate(n: int, m_rows: int, dtype: torch.dtype, delta_dtype: torch.dtype | None,
                     weight_dtype: torch.dtype, prepared: bool) -> None:
    ops = _ops()
    ops_rotate = _ops_rotate()
    rot = generate_rotation(n, 5)
    gen = torch.Generator().manual_seed(n + m_rows)
    x = (torch.randn(m_rows, n, generator=gen) * 3).to(dtype)
    delta = None if delta_dtype is None else torch.randn(m_rows, n, generator=gen).to(delta_dtype)
    weight = (1 + 0.3 * torch.randn(n, generator=gen)).to(weight_dtype)
    eps = 1e-6
    want_r, _ = ref.norm_rotate(x, weight, eps, rot, delta=delta)
    want_h = ref.rms_norm(want_r, weight, eps)
    order = ops.tetra_kernel_tables("cpu").order
    if prepared:
        width = ref.prepared_width(n // 24)
        out = torch.full((ref.prepared_rows(m_rows), width), float("nan"))
        r, got = ops_rotate.norm_rotate(x, weight, eps, rot, delta=delta, prepared_order=order,
                                        out=out)
        assert got is out and not torch.isnan(got).any()
        # the prepared layout of the kernel's own natural-order output: every slot, zeros included
        _, nat = ops_rotate.norm_rotate(x, weight, eps, rot, delta=delta)
        assert torch.equal(got, ref.prepare_activation(nat, n // 24, order))
        assert torch.equal(_natural(got, m_rows, n, order), nat)
        got = nat
    else:
        r, got = ops_rotate.norm_rotate(x, weight, eps, rot, delta=delta)
    assert r.dtype == dtype and torch.equal(r, want_r)
    if delta is None:
        assert r is x
    _assert_close_inputs(got, want_h, rot, want_h.dtype)


@interp
@pytest.mark.parametrize(("n", "m_rows", "gu_dtype", "dtype"), [
    (96, 2, torch.float32, torch.float16),    # k = 3: the fused group's float32 output
    (64, 1, torch.float32, torch.bfloat16),
    (72, 3, torch.float16, torch.float16),    # k = 9, SwiGLU in float16
])
def test_silu_mul_rotate(n: int, m_rows: int, gu_dtype: torch.dtype, dtype: torch.dtype) -> None:
    ops = _ops()
    ops_rotate = _ops_rotate()
    rot = generate_rotation(n, 7)
    gate_up = (torch.randn(m_rows, 2 * n, generator=torch.Generator().manual_seed(n)) * 4)
    gate_up = gate_up.to(gu_dtype)
    want_h = ref.silu_mul(gate_up, dtype)
    got = ops_rotate.silu_mul_rotate(gate_up, dtype, rot)
    _assert_close_inputs(got, want_h, rot, dtype)
    order = ops.tetra_kernel_tables("cpu").order
    prep = ops_rotate.silu_mul_rotate(gate_up, dtype, rot, prepared_order=order)
    assert torch.equal(prep, ref.prepare_activation(got, n // 24, order))


@interp
def test_pre_op_inputs_are_checked() -> None:
    ops_rotate = _ops_rotate()
    rot = generate_rotation(48, 1)
    x = torch.randn(2, 48, dtype=torch.float16)
    w = torch.ones(48, dtype=torch.float16)
    with pytest.raises(InvalidInput, match="weight"):
        ops_rotate.norm_rotate(x, torch.ones(47, dtype=torch.float16), 1e-6, rot)
    with pytest.raises(InvalidInput, match="weight"):
        ops_rotate.norm_rotate(x, torch.ones(48, dtype=torch.bfloat16), 1e-6, rot)
    with pytest.raises(InvalidInput, match="delta"):
        ops_rotate.norm_rotate(x, w, 1e-6, rot, delta=torch.randn(1, 48))
    with pytest.raises(InvalidInput, match="eps"):
        ops_rotate.norm_rotate(x, w, float("nan"), rot)
    with pytest.raises(InvalidInput, match="x must be"):
        ops_rotate.norm_rotate(torch.randn(2, 24, dtype=torch.float16), w, 1e-6, rot)
    with pytest.raises(InvalidInput, match="gate_up"):
        ops_rotate.silu_mul_rotate(torch.randn(2, 48), torch.float16, rot)
    with pytest.raises(InvalidInput, match="dtype"):
        ops_rotate.silu_mul_rotate(torch.randn(2, 96), torch.int8, rot)


def _natural(prepared: torch.Tensor, m_rows: int, n: int, order: torch.Tensor) -> torch.Tensor:
    """The natural-order rows of a prepared activation; every other slot must hold 0 (preparing
    them again gives back the whole buffer)."""
    nat = ref.unprepare_activation(prepared, m_rows, n, order)
    assert torch.equal(ref.prepare_activation(nat, n // 24, order), prepared)
    return nat


@pytest.mark.gpu
@pytest.mark.parametrize("n", [4096, 12288, 9728, 17408, 2560, 5120])  # k = 1, 3, 19, 17, 5, 5
@pytest.mark.parametrize("m_rows", [1, 8])
@pytest.mark.parametrize("splits", [1, 4, 8])
def test_pre_ops_full_widths_on_gpu(n: int, m_rows: int, splits: int) -> None:
    """The Qwen3 widths, into the prepared layout (poisoned first) as the serving groups call it:
    the norm with a float32 residual delta, and the SwiGLU from a float32 gate|up; one or four
    programs per group writing the layout."""
    ops = _ops()
    ops_rotate = _ops_rotate()
    dev = "cuda"
    rot = generate_rotation(n, 0x5EED ^ n)
    gen = torch.Generator(device=dev).manual_seed(n + m_rows)
    x = (torch.randn(m_rows, n, generator=gen, device=dev) * 2).half()
    delta = torch.randn(m_rows, n, generator=gen, device=dev)
    weight = (1 + 0.2 * torch.randn(n, generator=gen, device=dev)).half()
    order = ops.tetra_kernel_tables(dev).order
    shape = (ref.prepared_rows(m_rows), ref.prepared_width(n // 24))
    want_r, _ = ref.norm_rotate(x, weight, 1e-6, rot, delta=delta)
    out = torch.full(shape, float("nan"), device=dev)
    r, got = ops_rotate.norm_rotate(x, weight, 1e-6, rot, delta=delta, prepared_order=order,
                                    out=out, splits=splits)
    assert got is out and torch.isfinite(got).all() and torch.equal(r, want_r)
    _, nat = ops_rotate.norm_rotate(x, weight, 1e-6, rot, delta=delta)
    # two kernels (natural order, prepared layout), each within the norm's rounding of the twin
    # (the two may sum the squares differently, so they need not agree bit for bit)
    h = ref.rms_norm(want_r, weight, 1e-6)
    _assert_close_inputs(nat, h, rot, torch.float16)
    _assert_close_inputs(_natural(got, m_rows, n, order), h, rot, torch.float16)
    gate_up = torch.randn(m_rows, 2 * n, generator=gen, device=dev) * 3
    out = torch.full(shape, float("nan"), device=dev)
    ops_rotate.silu_mul_rotate(gate_up, torch.float16, rot, prepared_order=order, out=out,
                               splits=splits)
    assert torch.isfinite(out).all()
    nat = ops_rotate.silu_mul_rotate(gate_up, torch.float16, rot)
    h = ref.silu_mul(gate_up, torch.float16)
    _assert_close_inputs(nat, h, rot, torch.float16)
    _assert_close_inputs(_natural(out, m_rows, n, order), h, rot, torch.float16)


@interp
@pytest.mark.parametrize(("n", "m_rows", "splits"), [
    (n, m, s) for n, m in ((96, 3), (40, 1), (64, 2)) for s in (2, 4, 8)
] + [(1152, 2, 8)])  # the widest (k = 9) at the default split only: the slowest case here
def test_split_prepared_write_equals_one_program(n: int, m_rows: int, splits: int) -> None:
    """Several programs per (row, group) writing shares of the prepared layout (``splits``): every
    slot written (poisoned first), bit for bit what one program per group writes, for the plain
    rotation and both pre-ops (the residual too). Groups of 8..128 columns (k = 1, 3, 5, 9), a
    16-column tail, 3 rows in 4 prepared rows."""
    ops = _ops()
    ops_rotate = _ops_rotate()
    rot = generate_rotation(n, 11)
    order = ops.tetra_kernel_tables("cpu").order
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(m_rows, n, generator=gen)
    shape = (ref.prepared_rows(m_rows), ref.prepared_width(n // 24))

    def poisoned() -> torch.Tensor:
        return torch.full(shape, float("nan"))

    one = ops_rotate.rotate(x, rot, prepared_order=order, splits=1)
    got = ops_rotate.rotate(x, rot, prepared_order=order, out=poisoned(), splits=splits)
    assert torch.equal(got, one)
    xh, delta, w = x.half(), torch.randn(m_rows, n, generator=gen), torch.ones(n).half()
    r1, one = ops_rotate.norm_rotate(xh, w, 1e-6, rot, delta=delta, prepared_order=order, splits=1)
    r2, got = ops_rotate.norm_rotate(xh, w, 1e-6, rot, delta=delta, prepared_order=order,
                                     out=poisoned(), splits=splits)
    assert torch.equal(got, one) and torch.equal(r2, r1)
    gu = torch.randn(m_rows, 2 * n, generator=gen)
    one = ops_rotate.silu_mul_rotate(gu, torch.float16, rot, prepared_order=order, splits=1)
    got = ops_rotate.silu_mul_rotate(gu, torch.float16, rot, prepared_order=order, out=poisoned(),
                                     splits=splits)
    assert torch.equal(got, one)
    with pytest.raises(InvalidInput, match="power of two"):
        ops_rotate.rotate(x, rot, prepared_order=order, splits=3)


def _rotation_records_case(n: int, m_rows: int, splits: int, planes14: bool, dev: str,
                           forms: str = "rns") -> None:
    """One case of the rotation-written activation records (see the tests below): ``forms``
    ``r`` the plain rotation, ``n`` the norm, ``s`` the SwiGLU (the matvec check after it)."""
    ops = _ops()
    ops_rotate = _ops_rotate()
    from leechq.formats.layouts.tetra48 import random_tetra48

    rot = ops_rotate.DeviceRotation.from_tables(generate_rotation(n, 1), dev)
    order = ops.planes14_m1_order(dev) if planes14 else ops.tetra_kernel_tables(dev).order
    gen = torch.Generator().manual_seed(n + m_rows)
    x = torch.randn(m_rows, n, generator=gen).to(dev)
    nb = n // 24
    npp = ref.prepared_pairs(nb)
    ex_live = torch.tensor([(t // 8) * 16 * npp + (b * 2 + t % 2) * 4 + (t // 2) % 2
                            + 2 * ((t % 8) // 4) for b in range(2 * npp) for t in range(m_rows)])

    def check(xp: torch.Tensor, records: tuple[torch.Tensor, torch.Tensor]) -> None:
        rec, ex = ops.imma_activation(xp, m_rows, nb)
        assert torch.equal(records[0], rec)
        assert torch.equal(records[1][ex_live.to(dev)], ex[ex_live.to(dev)])

    if "r" in forms:
        recs = ops.imma_records(nb, dev, m_rows)
        check(ops_rotate.rotate(x, rot, prepared_order=order, splits=splits, records=recs), recs)
    if "n" in forms:
        recs = ops.imma_records(nb, dev, m_rows)
        _, xp = ops_rotate.norm_rotate(x.half(), torch.ones(n, device=dev).half(), 1e-6, rot,
                                       delta=x, prepared_order=order, splits=splits,
                                       records=recs)
        check(xp, recs)
    if "s" not in forms:
        return
    recs = ops.imma_records(nb, dev, m_rows)
    xp = ops_rotate.silu_mul_rotate(torch.randn(m_rows, 2 * n, generator=gen).to(dev),
                                    torch.float16, rot, prepared_order=order, splits=splits,
                                    records=recs)
    check(xp, recs)
    if not planes14:
        w = random_tetra48(24, n, seed=n, device=dev)
        want = ops.tetra48_matvec_imma_prepared(xp, w, m_rows)
        assert torch.equal(ops.tetra48_matvec_imma_prepared(xp, w, m_rows, acts=recs), want)


@interp
@pytest.mark.parametrize(("n", "m_rows", "splits", "planes14", "forms"), [
    (256, 3, 1, False, "rns"),  # 10 blocks + 16 tail columns, 3 rows in 4 prepared rows
    (512, 8, 4, False, "r"),    # 21 blocks + 8, eight rows, four programs per row
    (256, 5, 2, True, "n"),     # the Planes14 m1 order, 5 rows in 8
    (256, 11, 2, False, "r"),   # 11 rows in 16: two 8-row chunks of records
])
def test_rotation_writes_the_int8_activation_records(n: int, m_rows: int, splits: int,
                                                     planes14: bool, forms: str) -> None:
    """A one-group rotation into the prepared layout that also writes the int8 tensor-core
    kernel's activation records (``records=``) writes exactly the words ``ops.imma_activation``
    computes from that prepared layout, and the exponents of every live row — for the plain
    rotation and both pre-ops; a matvec on those records equals one on the launch's records."""
    _rotation_records_case(n, m_rows, splits, planes14, "cpu", forms)


@pytest.mark.gpu
@pytest.mark.parametrize(("m_rows", "planes14"), [(3, False), (8, False), (5, True), (12, False),
                                                 (16, True)])
def test_rotation_records_on_gpu(m_rows: int, planes14: bool) -> None:
    """The rotation-written records at the Qwen3 width with one rotation group (4096), eight
    programs per row, on the GPU: as in the interpreter test, bit for bit."""
    _rotation_records_case(4096, m_rows, 8, planes14, "cuda")


@interp
def test_rotation_records_reject_what_they_cannot_serve() -> None:
    ops = _ops()
    ops_rotate = _ops_rotate()
    order = ops.tetra_kernel_tables("cpu").order
    x = torch.randn(3, 96)
    with pytest.raises(UnsupportedShape, match="one group"):
        ops_rotate.rotate(x, generate_rotation(96, 3), prepared_order=order,
                          records=ops.imma_records(4, "cpu"))
    rot = generate_rotation(128, 1)
    with pytest.raises(InvalidInput, match="one-launch prepared"):
        ops_rotate.rotate(torch.randn(3, 128), rot, records=ops.imma_records(5, "cpu"))
    with pytest.raises(UnsupportedShape, match=r"1\.\.16"):
        ops_rotate.rotate(torch.randn(17, 128), rot, prepared_order=order,
                          records=ops.imma_records(5, "cpu"))
    with pytest.raises(InvalidInput, match="records"):  # 9 rows need two chunks of records
        ops_rotate.rotate(torch.randn(9, 128), rot, prepared_order=order,
                          records=ops.imma_records(5, "cpu", 8))
    with pytest.raises(InvalidInput, match="records"):
        rec, ex = ops.imma_records(5, "cpu")
        ops_rotate.rotate(torch.randn(3, 128), rot, prepared_order=order, records=(rec[:-1], ex))


@interp
@pytest.mark.parametrize("n", [96, 80])  # k = 3 groups of 32; k = 5 groups of 16
def test_rotation_writes_the_dense_order(n: int) -> None:
    """With ``dense_order`` the rotation (plain, after the norm, after the SwiGLU) writes float16
    with natural coordinate ``c`` at column ``dense_order[c]``: bit for bit its natural-order
    float32 output rounded to float16 and permuted; a prepared order with it, a map of the wrong
    dtype or length, are refused by name."""
    ops = _ops()
    ops_rotate = _ops_rotate()
    rot = generate_rotation(n, 3)
    g = torch.Generator().manual_seed(n)
    x = torch.randn(3, n, generator=g).half()
    dest = torch.randperm(n, generator=g).to(torch.int32)
    got = ops_rotate.rotate(x, rot, dense_order=dest)
    want = torch.empty(3, n, dtype=torch.float16)
    want[:, dest.long()] = ops_rotate.rotate(x, rot).half()
    assert got.dtype == torch.float16 and torch.equal(got, want)
    w = (1 + 0.1 * torch.randn(n, generator=g)).half()
    delta = torch.randn(3, n, generator=g)
    r, y16 = ops_rotate.norm_rotate(x, w, 1e-6, rot, delta=delta, dense_order=dest)
    r32, y32 = ops_rotate.norm_rotate(x, w, 1e-6, rot, delta=delta)
    assert torch.equal(r, r32) and torch.equal(y16[:, dest.long()], y32.half())
    gu = torch.randn(2, 2 * n, generator=g)
    s16 = ops_rotate.silu_mul_rotate(gu, torch.float16, rot, dense_order=dest)
    assert torch.equal(s16[:, dest.long()],
                       ops_rotate.silu_mul_rotate(gu, torch.float16, rot).half())
    order = ops.tetra_kernel_tables("cpu").order
    with pytest.raises(InvalidInput, match="two output layouts"):
        ops_rotate.rotate(x, rot, dense_order=dest, prepared_order=order)
    with pytest.raises(InvalidInput, match="dense_order"):
        ops_rotate.rotate(x, rot, dense_order=dest.long())
    with pytest.raises(InvalidInput, match="dense_order"):
        ops_rotate.rotate(x, rot, dense_order=dest[:-1])
    # a map that is not a permutation never writes outside the row (the row after it is intact)
    bad = dest.clone()
    bad[0], bad[1] = n, -1
    guard = torch.full((4, n), 7.0, dtype=torch.float16)
    ops_rotate.rotate(x[:1], rot, dense_order=bad, out=guard[1:2])
    assert torch.equal(guard[2:], torch.full((2, n), 7.0, dtype=torch.float16))
    assert torch.equal(guard[0], torch.full((n,), 7.0, dtype=torch.float16))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [4096, 12288, 9728, 17408])  # k = 1, 3, 19, 17
@pytest.mark.parametrize("m_rows", [17, 64])
def test_rotation_dense_order_on_gpu(n: int, m_rows: int) -> None:
    """The Qwen3 widths on the many-row path: the rotation (plain, after the norm, after the
    SwiGLU) writing float16 in a Tetra copy's column order (``ops.dense_input_order``) equals its
    natural-order float32 output rounded and permuted, bit for bit (the same transform in both
    launches); every column written (NaN poison)."""
    from leechq.formats.layouts.tetra48 import random_tetra48

    ops = _ops()
    ops_rotate = _ops_rotate()
    dev = "cuda"
    rot = generate_rotation(n, 0x5EED ^ n)
    order = ops.dense_input_order(random_tetra48(8, n, seed=1, device=dev), dev)
    perm = order.long()
    gen = torch.Generator(device=dev).manual_seed(n + m_rows)
    x = (torch.randn(m_rows, n, generator=gen, device=dev) * 2).half()
    delta = torch.randn(m_rows, n, generator=gen, device=dev)
    weight = (1 + 0.2 * torch.randn(n, generator=gen, device=dev)).half()
    out = torch.full((m_rows, n), float("nan"), dtype=torch.float16, device=dev)
    assert ops_rotate.rotate(x, rot, dense_order=order, out=out) is out
    assert torch.equal(out[:, perm], ops_rotate.rotate(x, rot).half())
    _, y16 = ops_rotate.norm_rotate(x, weight, 1e-6, rot, delta=delta, dense_order=order)
    _, y32 = ops_rotate.norm_rotate(x, weight, 1e-6, rot, delta=delta)
    assert torch.equal(y16[:, perm], y32.half())
    gate_up = torch.randn(m_rows, 2 * n, generator=gen, device=dev) * 3
    s16 = ops_rotate.silu_mul_rotate(gate_up, torch.float16, rot, dense_order=order)
    assert torch.equal(s16[:, perm], ops_rotate.silu_mul_rotate(gate_up, torch.float16, rot).half())
