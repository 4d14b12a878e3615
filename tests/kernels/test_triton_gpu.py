"""Triton kernels on the GPU at full model shapes, against f64 references from the same bytes.

Every output is poisoned with NaN before the launch; a kernel passes when every row satisfies
``|y − y_ref| ≤ 1e-5 · Σ_j |w_j x_j|`` (docs/kernels.md, Tolerances and checks). The PTX forms of the
bit helpers are checked against the shift/mask emulations the interpreter tests run.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from leechq.errors import InvalidInput
from leechq.formats.int8_weight import Int8Weight
from leechq.formats.layouts.planes14 import random_planes14
from leechq.formats.layouts.tetra48 import random_tetra48
from leechq.formats.quantized_weight import Int4Weight
from leechq.formats.rotation import generate_rotation
from leechq.kernels import reference as ref

pytestmark = pytest.mark.gpu

DEV = "cuda"


def _ops():
    from leechq.kernels.triton import ops

    return ops


def _ops_rotate():  # imported lazily, as :func:`_ops`
    from leechq.kernels.triton import ops_rotate

    return ops_rotate


def _worst(y: torch.Tensor, x: torch.Tensor, dense: torch.Tensor) -> float:
    assert torch.isfinite(y).all(), "unwritten (NaN) outputs"
    return ref.row_bound_error(y, x, dense)


def test_bit_helpers_ptx_equal_emulation() -> None:
    import triton
    import triton.language as tl

    from leechq.kernels.triton._bits import (
        byte_to_f32,
        bytes_times_f16x2,
        dp4a,
        dp4a_self,
        half2,
        prmt,
        spread4_bytes,
    )

    @triton.jit
    def k(a_ptr, b_ptr, s_ptr, out_ptr, n, ASM: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = i < n
        a = tl.load(a_ptr + i, mask=ok).to(tl.uint32)
        b = tl.load(b_ptr + i, mask=ok).to(tl.uint32)
        s = tl.load(s_ptr + i, mask=ok).to(tl.uint32) & 0x7777  # selector nibbles < 8
        tl.store(out_ptr + 10 * i, prmt(a, b, s, ASM).to(tl.int32), mask=ok)
        tl.store(out_ptr + 10 * i + 1, spread4_bytes(a & 15, ASM).to(tl.int32), mask=ok)
        tl.store(out_ptr + 10 * i + 2, dp4a_self(a, b.to(tl.int32) & 0xFFFF, ASM), mask=ok)
        tl.store(out_ptr + 10 * i + 3, byte_to_f32(a, 2, ASM).to(tl.int32, bitcast=True), mask=ok)
        tl.store(out_ptr + 10 * i + 4, byte_to_f32(b, 0, ASM).to(tl.int32, bitcast=True), mask=ok)
        tl.store(out_ptr + 10 * i + 5, dp4a(a, b, s.to(tl.int32), False, ASM), mask=ok)
        tl.store(out_ptr + 10 * i + 6, dp4a(a, b, s.to(tl.int32), True, ASM), mask=ok)
        # a positive f32 scale from 2^-15 to 2^16 (float16 subnormals, normals and overflow)
        scale = (((b >> 9) & 0x7FFFFF) | ((112 + (b & 31)) << 23)).to(tl.int32).to(
            tl.float32, bitcast=True)
        s2 = half2(scale, ASM)
        tl.store(out_ptr + 10 * i + 7, s2, mask=ok)
        off = ((b & 0x3FF).to(tl.int32) - 1536).to(tl.float16)  # an integer in [-1536, -513]
        c2 = off.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        c2 = c2 | (c2 << 16)
        tl.store(out_ptr + 10 * i + 8, bytes_times_f16x2(a, 0, c2, s2, ASM), mask=ok)
        tl.store(out_ptr + 10 * i + 9, bytes_times_f16x2(a, 2, c2, s2, ASM), mask=ok)

    n = 1 << 16
    g = torch.Generator(device=DEV).manual_seed(0)
    a, b, s = (torch.randint(-(2**31), 2**31, (n,), generator=g, device=DEV, dtype=torch.int64)
               .to(torch.int32) for _ in range(3))
    outs = []
    for asm in (True, False):
        o = torch.empty(10 * n, dtype=torch.int32, device=DEV)
        k[(n // 1024,)](a, b, s, o, n, ASM=asm, BLOCK=1024)
        outs.append(o)
    assert torch.equal(outs[0], outs[1])


SHAPES = [(6144, 4096), (4096, 12288), (1024, 4096), (5120, 17408)]


@pytest.mark.parametrize(("d_out", "d_in"), SHAPES)
@pytest.mark.parametrize("m_rows", [1, 3, 8])
def test_tetra48_full_shapes(d_out: int, d_in: int, m_rows: int) -> None:
    if m_rows == 3 and d_in != 4096:
        pytest.skip("M=3 checked at one width")
    ops = _ops()
    w = random_tetra48(d_out, d_in, seed=d_out + m_rows, device=DEV)
    x = torch.randn(m_rows, d_in, device=DEV)
    dense = ref.tetra48_dequantize_rotated(w)
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables(DEV).order)
    assert torch.equal(xp, ref.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables(DEV).order))
    configs = [None] if m_rows != 1 else [None, ops.MatvecConfig(32, 32, 8, True)]
    for cfg in configs:
        y = torch.full((m_rows, d_out), float("nan"), device=DEV)
        ops.tetra48_matvec_prepared(xp, w, m_rows, cfg, out=y)
        assert _worst(y, x, dense) <= 1e-5, cfg


M1_CONFIGS = [
    dict(rows=32, bp=32, num_warps=4, kernel="m1", ctas_per_sm=4),
    dict(rows=16, bp=16, num_warps=4, kernel="m1", ctas_per_sm=0),
    dict(rows=64, bp=8, num_warps=8, kernel="m1", ctas_per_sm=2),
    dict(rows=32, bp=32, num_warps=4, kernel="m1", ctas_per_sm=0, ilp=2),
    dict(rows=64, bp=32, num_warps=4, kernel="m1", ctas_per_sm=0, ilp=2),
    dict(rows=32, bp=16, num_warps=4, kernel="m1", ctas_per_sm=4, ilp=2),
    dict(rows=112, bp=32, num_warps=4, kernel="m1", ctas_per_sm=0, ilp=2, maxnreg=96),
]


@pytest.mark.parametrize(("d_out", "d_in"), [*SHAPES, (3000, 2560), (24, 4096 + 24 * 7)])
def test_tetra48_m1_full_shapes(d_out: int, d_in: int) -> None:
    """The batch-1 kernel (several geometries and the per-shape rule, repeated launches: the tickets
    must reset) against the f64 reference."""
    ops = _ops()
    w = random_tetra48(d_out, d_in, seed=d_out ^ d_in, device=DEV)
    dense = ref.tetra48_dequantize_rotated(w)
    rule = ops.m1_config(d_out, w.n_blocks, torch.device(DEV), w.tail_cols)
    for cfg in [ops.MatvecConfig(**c) for c in M1_CONFIGS] + [rule]:
        for _ in range(2):
            x = torch.randn(1, d_in, device=DEV) * (10.0 ** torch.randint(-3, 4, (1, d_in),
                                                                         device=DEV))
            xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables(DEV).order)
            y = torch.full((1, d_out), float("nan"), device=DEV)
            ops.tetra48_matvec_prepared(xp, w, 1, cfg, out=y)
            assert _worst(y, x, dense) <= 1e-5, cfg
    torch.cuda.synchronize()
    assert int(ops._tickets(torch.device(DEV)).abs().sum()) == 0


@pytest.mark.parametrize(("d_out", "d_in", "m_rows"), [(24576, 4096, 2), (4096, 12288, 3),
                                                       (6144, 4096, 8), (5120, 17408, 6)])
def test_tetra48_m1_many_rows_full_shapes(d_out: int, d_in: int, m_rows: int) -> None:
    """Several activation rows per launch (``ops.m1_config(m_rows=…)``: two rows in one launch, or
    four at a time) against the f64 reference, every output written, rows past M untouched."""
    ops = _ops()
    w = random_tetra48(d_out, d_in, seed=d_out ^ d_in ^ m_rows, device=DEV)
    dense = ref.tetra48_dequantize_rotated(w)
    cfg = ops.m1_config(d_out, w.n_blocks, torch.device(DEV), w.tail_cols, m_rows=m_rows)
    assert cfg.mb > 1 and ops.m1_enabled(torch.device(DEV), cfg)
    for _ in range(2):
        x = torch.randn(m_rows, d_in, device=DEV)
        xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables(DEV).order)
        y = torch.full((m_rows + 1, d_out), float("nan"), device=DEV)
        ops.tetra48_matvec_prepared(xp, w, m_rows, cfg, out=y[:m_rows])
        assert _worst(y[:m_rows], x, dense) <= 1e-5
        assert torch.isnan(y[m_rows]).all()
    torch.cuda.synchronize()
    assert int(ops._tickets(torch.device(DEV)).abs().sum()) == 0


@pytest.mark.parametrize(("d_out", "d_in", "m_rows"), [(4096, 4096, 1), (4096, 12288, 8),
                                                       (1024, 5120, 1)])
def test_planes14_full_shapes(d_out: int, d_in: int, m_rows: int) -> None:
    ops = _ops()
    w = random_planes14(d_out, d_in, seed=d_out, device=DEV)
    x = torch.randn(m_rows, d_in, device=DEV)
    xp = ops.prepare_activation(x, w.n_blocks, ops.natural_order(DEV))
    y = torch.full((m_rows, d_out), float("nan"), device=DEV)
    ops.planes14_matvec_prepared(xp, w, m_rows, out=y)
    assert _worst(y, x, ref.planes14_dequantize_rotated(w)) <= 1e-5


@pytest.mark.parametrize(("d_out", "d_in"), [(4096, 4096), (4096, 12288), (5120, 17408),
                                         (24, 4264)])
def test_planes14_m1_full_shapes(d_out: int, d_in: int) -> None:
    """The batch-1 Planes14 kernel (``kernel="m1"``, the default at one row) against the f64
    reference in the per-shape ``m1`` geometry, launched twice (the tickets must reset)."""
    ops = _ops()
    w = random_planes14(d_out, d_in, seed=d_out ^ d_in, device=DEV)
    dense = ref.planes14_dequantize_rotated(w)
    cfg = ops.m1_config(d_out, w.n_blocks, torch.device(DEV), w.tail_cols)
    for _ in range(2):
        x = torch.randn(1, d_in, device=DEV) * (10.0 ** torch.randint(-3, 4, (1, d_in),
                                                                     device=DEV))
        xp = ops.prepare_activation(x, w.n_blocks, ops.planes14_m1_order(DEV))
        y = torch.full((1, d_out), float("nan"), device=DEV)
        ops.planes14_matvec_m1_prepared(xp, w, cfg, out=y)
        assert _worst(y, x, dense) <= 1e-5
    assert ops._m1_runs(cfg, 1, torch.device(DEV), ops._check_planes14_m1)  # check passes
    torch.cuda.synchronize()
    assert int(ops._tickets(torch.device(DEV)).abs().sum()) == 0


@pytest.mark.parametrize(("d_out", "d_in", "m_rows"), [(4096, 4096, 2), (4096, 12288, 3),
                                                       (6144, 4096, 8)])
def test_planes14_m1_many_rows_full_shapes(d_out: int, d_in: int, m_rows: int) -> None:
    """Several activation rows per launch through the Planes14 decode (the ``mb`` of
    ``ops.m1_config(m_rows=…)``) against the f64 reference, rows past M untouched."""
    ops = _ops()
    w = random_planes14(d_out, d_in, seed=d_out ^ d_in ^ m_rows, device=DEV)
    dense = ref.planes14_dequantize_rotated(w)
    cfg = ops.m1_config(d_out, w.n_blocks, torch.device(DEV), w.tail_cols, m_rows=m_rows)
    assert cfg.mb > 1 and ops._m1_runs(cfg, m_rows, torch.device(DEV), ops._check_planes14_m1)
    for _ in range(2):
        x = torch.randn(m_rows, d_in, device=DEV)
        xp = ops.prepare_activation(x, w.n_blocks, ops.planes14_m1_order(DEV))
        y = torch.full((m_rows + 1, d_out), float("nan"), device=DEV)
        ops.planes14_matvec_m1_prepared(xp, w, cfg, out=y[:m_rows], m_rows=m_rows)
        assert _worst(y[:m_rows], x, dense) <= 1e-5
        assert torch.isnan(y[m_rows]).all()
    torch.cuda.synchronize()
    assert int(ops._tickets(torch.device(DEV)).abs().sum()) == 0


@pytest.mark.parametrize("n", [2560, 4096, 5120, 9728, 12288, 17408])
def test_rotation_widths(n: int) -> None:
    ops = _ops()
    ops_rotate = _ops_rotate()
    rot = generate_rotation(n, 0x110FEED ^ n)
    x = torch.randn(4, n, device=DEV)
    want = ref.rotate(x.cpu(), rot).to(DEV)
    got = ops_rotate.rotate(x, rot, out=torch.full((4, n), float("nan"), device=DEV))
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-5
    order = ops.tetra_kernel_tables(DEV).order
    prep = ref.prepare_activation(want, n // 24, order)
    for one_launch, splits in ((True, 1), (True, 4), (False, 1)):
        xp = ops_rotate.rotate(x, rot, prepared_order=order, one_launch=one_launch, splits=splits,
                               out=torch.full(prep.shape, float("nan"), device=DEV))
        assert torch.allclose(xp, prep, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("m_rows", [1, 8])
def test_int4_int8_full_shapes(m_rows: int) -> None:
    ops = _ops()
    g = torch.Generator(device=DEV).manual_seed(m_rows)
    d_out, d_in = 4096, 12288
    q4 = Int4Weight(d_out, d_in,
                    torch.randint(0, 256, (d_out, d_in // 2), generator=g, device=DEV,
                                  dtype=torch.uint8),
                    (torch.rand(d_out, d_in // 128, generator=g, device=DEV) * 0.01).half(),
                    (torch.randn(d_out, d_in // 128, generator=g, device=DEV) * 0.01).half())
    x = torch.randn(m_rows, d_in, device=DEV)
    assert _worst(ops.int4_matvec(x, q4), x, q4.dequantize().double()) <= 1e-5
    q8 = Int8Weight.quantize(torch.randn(1024, 4096, generator=g, device=DEV), group=64)
    x8 = torch.randn(m_rows, 4096, device=DEV)
    assert _worst(ops.int8_matvec(x8, q8), x8, q8.dequantize().double()) <= 1e-5


def test_embeddings_exact() -> None:
    ops = _ops()
    g = torch.Generator(device=DEV).manual_seed(0)
    table = torch.randn(32768, 4096, generator=g, device=DEV)
    ids = torch.randint(0, 32768, (17,), generator=g, device=DEV)
    q8 = Int8Weight.quantize(table, group=64)
    assert torch.equal(ops.int8_embedding(ids, q8), ref.int8_embedding(ids, q8))
    q4 = Int4Weight.quantize(table.cpu(), group=64)
    q4 = Int4Weight(q4.d_out, q4.d_in, q4.qweight.to(DEV), q4.scales.to(DEV), q4.biases.to(DEV), 64)
    assert torch.equal(ops.int4_embedding(ids, q4), ref.int4_embedding(ids, q4))


def test_cpu_tensors_are_refused() -> None:
    ops = _ops()
    w = random_tetra48(64, 96, device=DEV)
    with pytest.raises(InvalidInput, match="CUDA"):
        ops.tetra48_matvec(torch.randn(1, 96), w)
    with pytest.raises(InvalidInput, match="(?i)cuda"):
        ops.tetra48_matvec(torch.randn(1, 96, device=DEV), w.to("cpu"))  # weights on the CPU


@pytest.mark.parametrize("m_rows", [1, 8])
def test_matvec_kernel_uses_no_local_memory(m_rows: int) -> None:
    from leechq.kernels.triton import introspect as I
    from leechq.kernels.triton.tetra48 import tetra48_matvec_kernel

    sig = {"xp_ptr": "*fp32", "w_ptr": "*i32", "scale_ptr": "*fp32", "cent_ptr": "*fp32",
           "tail_ptr": "*fp32", "rows_ptr": "*i32", "cw_ptr": "*i32", "y_ptr": "*fp32",
           "stride_ym": "i32", "d_out": "i32"}
    c = I.compile_for(tetra48_matvec_kernel, sig, dict(
        N_BLOCKS=512, TAIL_COLS=0, M=m_rows, ROWS=16 if m_rows == 1 else 8, BP=32,
        USE_ASM=True, SMEM_ROWS=False), num_warps=4)
    res = I.resource_usage(c)
    assert res.get("local", 0) == 0 and res.get("stack", 0) == 0, res


@pytest.mark.parametrize("ilp", [1, 2])
def test_m1_kernel_uses_no_local_memory(ilp: int) -> None:
    from leechq.kernels.triton import introspect as I
    from leechq.kernels.triton.tetra48_m1 import m1_kernel

    c = I.compile_for(m1_kernel, I.M1_SIGNATURE, dict(N_BLOCKS=512, TAIL_COLS=0, ROWS=64, NW=4,
                                                      BP=32, USE_ASM=True, ILP=ilp, MB=1),
                      num_warps=4)
    res = I.resource_usage(c)
    assert res.get("local", 0) == 0 and res.get("stack", 0) == 0, (ilp, res)


def test_m1_register_cap_applies_only_to_wide_rows() -> None:
    from leechq.kernels.triton import ops

    assert ops.m1_maxnreg(448, 23) == 0 and ops.m1_maxnreg(513, 0) == 0


# Qwen3 4B/8B/14B and Llama-3-8B row widths, the widest chunks of the rule
@pytest.mark.parametrize(("n_blocks", "tail", "rows"), [
    (106, 5, 32), (170, 16, 112), (213, 8, 216), (405, 8, 64), (448, 16, 64), (512, 0, 256),
    (512, 0, 64)])
def test_m1_register_cap_spills_nothing(n_blocks: int, tail: int, rows: int) -> None:
    """The register cap of ``ops.m1_config`` spills nothing where it is applied, and the hot loop
    touches no Triton shared memory (the staged table lives at the start of the reserved 32 KiB;
    a store there would overwrite it)."""
    from leechq.kernels.triton import introspect as I
    from leechq.kernels.triton import ops
    from leechq.kernels.triton.tetra48_m1 import m1_kernel

    aligned = ("d_out", "stride_x", "stride_y")  # as a launch marks them (multiples of 16)
    assert ops.m1_maxnreg(n_blocks, tail) == ops.M1_MAXNREG
    c = I.compile_for(m1_kernel, I.M1_SIGNATURE, dict(
        N_BLOCKS=n_blocks, TAIL_COLS=tail, ROWS=rows, NW=4, BP=32, USE_ASM=True, ILP=2, MB=1),
        num_warps=4, maxnreg=ops.M1_MAXNREG, aligned_ints=aligned)
    res = I.resource_usage(c)
    assert res.get("registers") == ops.M1_MAXNREG, (n_blocks, res)
    assert res.get("local", 0) == 0 and res.get("stack", 0) == 0, (n_blocks, rows, res)
    mix = I.hot_loop_mix(I.sass(c))["loop"]
    assert "STS" not in mix and "BAR" not in mix and "STSM" not in mix, mix


def _assert_clean_loop(c, what) -> dict:
    """No spills, and no Triton shared memory or barrier inside the hot loop (it would overwrite
    a staged table); returns the loop's instruction mix."""
    from leechq.kernels.triton import introspect as I

    res = I.resource_usage(c)
    assert res.get("local", 0) == 0 and res.get("stack", 0) == 0, (what, res)
    mix = I.hot_loop_mix(I.sass(c))["loop"]
    assert "STS" not in mix and "BAR" not in mix and "STSM" not in mix, (what, mix)
    return mix


@pytest.mark.parametrize(("mb", "ilp", "rows"), [(2, 2, 112), (4, 1, 64), (4, 1, 256)])
def test_m1_many_rows_loop_is_clean(mb: int, ilp: int, rows: int) -> None:
    """Several activation rows (``ops.m1_config``'s mb 2 and 4 geometries): no spills and no layout
    conversion through shared memory in the loop. Compiled with the hints a launch gives (aligned
    pointers, d_out and strides multiples of 16): without them an earlier 2-D [rows, tile] form
    compiled clean here, while the launched kernel spread the rows over warps and converted
    layouts through shared memory, over the staged table."""
    from leechq.kernels.triton import introspect as I
    from leechq.kernels.triton.tetra48_m1 import m1_kernel

    c = I.compile_for(m1_kernel, I.M1_SIGNATURE, dict(
        N_BLOCKS=170, TAIL_COLS=16, ROWS=rows, NW=4, BP=32, USE_ASM=True, ILP=ilp, MB=mb),
        num_warps=4, aligned_ints=("d_out", "stride_x", "stride_y"))
    _assert_clean_loop(c, mb)


@pytest.mark.parametrize(("n_blocks", "tail", "capped", "sel", "mb"), [
    *[(n, t, True, sel, mb) for n, t in ((170, 16), (512, 0))
      for sel, mb in ((True, 1), (False, 1), (True, 2), (True, 4))],
    *[(725, 8, False, sel, mb) for sel, mb in ((True, 1), (False, 1), (True, 2))]])
def test_m1_planes14_loop_is_clean(n_blocks: int, tail: int, capped: bool, sel: bool,
                                   mb: int) -> None:
    """The Planes14 decode stages its class table the same way: same rule, and the register cap of
    ``ops.m1_config`` spills nothing at Qwen3-8B's widths (one row, both selector forms; two rows
    per launch at every width, four rows per launch up to 512 blocks)."""
    from leechq.kernels.triton import introspect as I
    from leechq.kernels.triton import ops
    from leechq.kernels.triton.tetra48_m1 import PLANES14, m1_kernel

    c = I.compile_for(m1_kernel, I.M1_SIGNATURE, dict(
        N_BLOCKS=n_blocks, TAIL_COLS=tail, ROWS=64, NW=4, BP=32, USE_ASM=True, ILP=1,
        MB=mb, CODE=PLANES14.value, SEL_TABLE=sel), num_warps=4,
        maxnreg=ops.M1_MAXNREG if capped and mb == 1 else 0,
        aligned_ints=("d_out", "stride_x", "stride_y"))
    _assert_clean_loop(c, (n_blocks, sel, mb))


@pytest.mark.parametrize(("vec", "grouped", "scaled"), [
    (False, False, False), (True, False, False), (True, True, False), (True, True, True)])
def test_dequant_loop_is_clean(vec: bool, grouped: bool, scaled: bool) -> None:
    """The dequantization kernel stages the same table: same rule for its loop; its stores are
    vectorised and values become floats by the magic-number bit pattern (no I2F)."""
    from leechq.kernels.triton import introspect as I
    from leechq.kernels.triton.tetra48_dequant import tetra48_dequant_kernel

    dq = {"w_ptr": "*i32", "cent_ptr": "*fp32", "scale_ptr": "*fp32", "tab_ptr": "*i32",
          "out_ptr": "*i32", "d_out": "i32"}
    c = I.compile_for(tetra48_dequant_kernel, dq, dict(
        N_BLOCKS=171, OUT_STRIDE=2056 if scaled else 12 * 171, NW=4, USE_ASM=True, VEC=vec,
        GROUPED=grouped, SCALED=scaled), num_warps=4)
    mix = _assert_clean_loop(c, vec)
    assert mix.get("STG", 0) == (6 if vec else 24), (vec, mix)  # per block pair
    assert "I2F" not in mix, mix


def _dequant_forms() -> list:
    """The dequantization forms the GPU tests compare with the default one."""
    from leechq.kernels.triton.ops import DequantConfig

    return [DequantConfig(vector_stores=True), DequantConfig(grouped=True),
            _ops().DEQUANT_DEFAULT,
            DequantConfig(grouped=True, vector_stores=True, num_warps=8, programs_per_sm=2),
            DequantConfig(grouped=True, vector_stores=True, num_warps=16, programs_per_sm=1)]


def _check_dequant_forms(dequantize, matmul, w, blocks: torch.Tensor, grouped: torch.Tensor,
                         x: torch.Tensor, dense: torch.Tensor) -> None:
    """Each form of :func:`_dequant_forms` writes every value (NaN poison) of the twin's
    block-major (``blocks``) or grouped copy bit for bit, and the dense product on it stays within
    fp16 accuracy of the f64 one."""
    _ops()  # triton present
    for cfg in _dequant_forms():
        out = torch.full_like(blocks, float("nan"))
        dequantize(w, out=out, config=cfg)
        assert torch.equal(out, grouped if cfg.grouped else blocks), cfg
        with pytest.MonkeyPatch.context() as mp:
            from leechq.kernels.triton import ops_dense

            mp.setattr(ops_dense, "DEQUANT_DEFAULT", cfg)
            assert _worst(matmul(x, w), x, dense) <= 2e-3, cfg


@pytest.mark.parametrize(("d_out", "d_in", "m_rows"),
                         [(3000, 2560, 16), (1024, 12288 + 24 * 7 + 5, 512)])
def test_tetra48_dense_path_full_shapes(d_out: int, d_in: int, m_rows: int) -> None:
    """The many-row path on the GPU: dequantization bit-exact against its twin (the table staged in
    shared memory), the float16 GEMM within fp16 accuracy of the f64 product."""
    ops = _ops()
    w = random_tetra48(d_out, d_in, seed=d_out + m_rows, device=DEV)
    got = ops.tetra48_dequantize_f16(w, out=torch.full((d_out, 24 * w.n_blocks), float("nan"),
                                                       dtype=torch.float16, device=DEV),
                                     config=ops.DequantConfig())
    assert torch.equal(got, ref.tetra48_dequantize_f16(w))
    x = torch.randn(m_rows, d_in, device=DEV)
    _check_dequant_forms(ops.tetra48_dequantize_f16, ops.tetra48_matmul_dense, w, got,
                         ref.tetra48_dequantize_f16(w, grouped=True), x,
                         ref.tetra48_dequantize_rotated(w))
    _check_dense_copy(w)


def _check_dense_copy(w) -> None:
    """The served copy (σ_row folded in, the tail in place, rows padded to 16 bytes) of a record
    stacked under a second one equals its twin bit for bit."""
    ops = _ops()
    w2 = replace(w, d_out=5, **{k: getattr(w, k)[-5:] for k in _record_rows(w)})
    grouped = ops.dequant_config().grouped
    got = ops.dense_copy([w, w2])
    want = torch.cat([ref.folded_dense_f16(w, grouped), ref.folded_dense_f16(w2, grouped)])
    assert torch.equal(got.cpu(), want.cpu())


def _record_rows(w) -> tuple[str, ...]:
    """The per-output-row tensor fields of a lattice record."""
    return tuple(k for k in ("words", "records", "row_scales", "row_centroids", "tail",
                             "row_scales_f64", "row_centroids_f64")
                 if isinstance(getattr(w, k, None), torch.Tensor))


def test_planes14_dequant_compiles_clean() -> None:
    """Offline sm_90 compile of the Planes14 dequantization kernel (both selector forms): no local
    memory, and no Triton shared memory in its loop (it would overwrite the staged table);
    2026-11-30 offline: 414 instructions per record pair with the selector table, 42 registers."""
    from leechq.kernels.triton import introspect as I
    from leechq.kernels.triton.planes14_dequant import planes14_dequant_kernel

    sig = {"r_ptr": "*i32", "cent_ptr": "*fp32", "scale_ptr": "*fp32", "tab_ptr": "*i32",
           "out_ptr": "*i32", "d_out": "i32"}
    for sel, vec, scaled in ((True, False, False), (False, False, False), (True, True, False),
                             (True, True, True)):
        c = I.compile_for(planes14_dequant_kernel, sig, dict(
            N_BLOCKS=171, OUT_STRIDE=2056 if scaled else 12 * 171, NW=4, SEL_TABLE=sel,
            USE_ASM=True, VEC=vec, GROUPED=vec, SCALED=scaled),
                          num_warps=4, aligned_ints=("d_out",))
        res = I.resource_usage(c)
        assert res.get("local", 0) == 0 and res.get("stack", 0) == 0, (sel, res)
        mix = I.hot_loop_mix(I.sass(c))["loop"]
        assert "STS" not in mix and "BAR" not in mix, (sel, mix)
        assert mix.get("STG", 0) == (6 if vec else 24), (sel, mix)  # per record pair


@pytest.mark.parametrize(("d_out", "d_in", "m_rows"),
                         [(3000, 2560, 17), (1024, 12288 + 24 * 7 + 5, 512)])
def test_planes14_dense_path_full_shapes(d_out: int, d_in: int, m_rows: int) -> None:
    """The ball codebook's many-row path on the GPU: the Planes14 dequantization bit-exact against
    its twin (an odd block count and a tail in the second shape), every
    value written (NaN poison), the float16 GEMM within fp16 accuracy of the f64 product, and the
    first-use check passes."""
    ops = _ops()
    w = random_planes14(d_out, d_in, seed=d_out + m_rows, device=DEV)
    want = ref.planes14_dequantize_f16(w)
    got = ops.planes14_dequantize_f16(
        w, out=torch.full((d_out, 24 * w.n_blocks), float("nan"), dtype=torch.float16,
                          device=DEV), config=ops.DequantConfig())
    assert torch.equal(got, want)
    x = torch.randn(m_rows, d_in, device=DEV)
    y = ops.planes14_matmul_dense(x, w)
    dense = ref.planes14_dequantize_rotated(w)
    assert _worst(y, x, dense) <= 2e-3
    _check_dequant_forms(ops.planes14_dequantize_f16, ops.planes14_matmul_dense, w, want,
                         ref.planes14_dequantize_f16(w, grouped=True), x, dense)
    assert ops._check_planes14_dense(torch.device(DEV))
    _check_dense_copy(w)


def test_imma_helpers_ptx_equal_emulation() -> None:
    """The warp-level helpers of the int8 tensor-core kernel — ``mma.sync.m16n8k32`` (both ``A``
    signednesses) and the index shuffle — in PTX and in their interpreter emulations, on random
    fragments of four warps."""
    import triton
    import triton.language as tl

    from leechq.kernels.triton._bits import mma_i8, shfl_idx

    @triton.jit
    def k(src_ptr, out_ptr, ASM: tl.constexpr, NW: tl.constexpr):
        e = tl.arange(0, NW * 32)
        v0 = tl.load(src_ptr + e)
        v1 = tl.load(src_ptr + NW * 32 + e)
        v2 = tl.load(src_ptr + 2 * NW * 32 + e)
        v3 = tl.load(src_ptr + 3 * NW * 32 + e)
        v4 = tl.load(src_ptr + 4 * NW * 32 + e)
        v5 = tl.load(src_ptr + 5 * NW * 32 + e)
        v6 = tl.load(src_ptr + 6 * NW * 32 + e)
        v7 = tl.load(src_ptr + 7 * NW * 32 + e)
        v8 = tl.load(src_ptr + 8 * NW * 32 + e)
        v9 = tl.load(src_ptr + 9 * NW * 32 + e)
        for sgn in tl.static_range(2):
            d0, d1, d2, d3 = mma_i8(v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, sgn == 1, NW, ASM)
            tl.store(out_ptr + (4 * sgn + 0) * NW * 32 + e, d0)
            tl.store(out_ptr + (4 * sgn + 1) * NW * 32 + e, d1)
            tl.store(out_ptr + (4 * sgn + 2) * NW * 32 + e, d2)
            tl.store(out_ptr + (4 * sgn + 3) * NW * 32 + e, d3)
        tl.store(out_ptr + 8 * NW * 32 + e, shfl_idx(v1, v0 & 31, NW, ASM))

    nw = 4
    g = torch.Generator(device=DEV).manual_seed(1)
    src = torch.randint(-(2**31), 2**31, (10 * nw * 32,), generator=g, device=DEV,
                        dtype=torch.int64).to(torch.int32)
    src[6 * nw * 32:] %= 1 << 20  # accumulators: no wrap in the emulation's int32 sums
    outs = []
    for asm in (True, False):
        o = torch.empty(9 * nw * 32, dtype=torch.int32, device=DEV)
        k[(1,)](src, o, ASM=asm, NW=nw, num_warps=nw)
        outs.append(o)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize(("d_out", "d_in"), [(6144, 4096), (4096, 12288), (5120, 17408),
                                             (1000, 2560 + 7)])
@pytest.mark.parametrize("m_rows", [2, 5, 8, 11, 16])
def test_tetra48_imma_full_shapes(d_out: int, d_in: int, m_rows: int) -> None:
    """The int8 tensor-core kernel at real shapes (and a short one with a tail), one and two
    8-row chunks of activation rows, both row-group forms: within the batch-1 bound (1e-5 of
    Σ|w·x|) of the f64 product, every output written."""
    ops = _ops()
    w = random_tetra48(d_out, d_in, seed=d_out + m_rows, device=DEV)
    x = torch.randn(m_rows, d_in, device=DEV)
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables(DEV).order)
    dense = ref.tetra48_dequantize_rotated(w)
    acts = ops.imma_activation(xp, m_rows, w.n_blocks)
    for rps in (1, 2):
        y = torch.full((m_rows, d_out), float("nan"), device=DEV)
        ops.tetra48_matvec_imma_prepared(xp, w, m_rows, out=y, acts=acts, rows_per_step=rps)
        assert _worst(y, x, dense) <= 1e-5, rps


@pytest.mark.parametrize(("d_out", "d_in"), [(6144, 4096), (4096, 12288), (1000, 2560 + 7)])
@pytest.mark.parametrize("m_rows", [3, 8, 13])
def test_planes14_imma_full_shapes(d_out: int, d_in: int, m_rows: int) -> None:
    """Planes14 records through the int8 tensor-core kernel at real shapes: within 1e-5 of
    Σ|w·x| of the f64 product."""
    ops = _ops()
    w = random_planes14(d_out, d_in, seed=d_out + m_rows, device=DEV)
    x = torch.randn(m_rows, d_in, device=DEV)
    xp = ops.prepare_activation(x, w.n_blocks, ops.planes14_m1_order(DEV))
    dense = ref.planes14_dequantize_rotated(w)
    y = torch.full((m_rows, d_out), float("nan"), device=DEV)
    ops.planes14_matvec_imma_prepared(xp, w, m_rows, out=y)
    assert _worst(y, x, dense) <= 1e-5


def test_tetra48_imma_compiles_clean() -> None:
    """Offline sm_90 compile of the int8 tensor-core kernel (Tetra; Planes14 once): no local
    memory, the staged table never overwritten (no Triton shared-memory traffic in its loops),
    the MMA in the step loop."""
    from leechq.kernels.triton import introspect as I
    from leechq.kernels.triton.tetra48_imma import imma_kernel

    sig = {"rec_ptr": "*i32", "ex_ptr": "*fp32", "w_ptr": "*i32", "cent_ptr": "*fp32",
           "tab_ptr": "*i32", "part_ptr": "*fp32", "d_out": "i32", "K_PER": "i32"}
    for rps, code, ch in ((1, 0, 1), (2, 0, 1), (2, 1, 1), (2, 0, 2), (2, 1, 2)):
        c = I.compile_for(imma_kernel, sig, dict(N_BLOCKS=170, NPP=128, NW=4, RG=2, RPS=rps,
                                                 CH=ch, CODE=code, USE_ASM=True),
                          num_warps=4, aligned_ints=("d_out",))
        res = I.resource_usage(c)
        assert res.get("local", 0) == 0 and res.get("stack", 0) == 0, (rps, ch, res)
        mix = I.loop_mix(I.sass(c))["loop"]
        assert mix.get("IMMA", 0) == 18 * rps * ch, (rps, ch, mix)
        assert "STS" not in mix and "BAR" not in mix and "STSM" not in mix, (rps, mix)
