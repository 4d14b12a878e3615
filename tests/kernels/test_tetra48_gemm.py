"""The float16 tensor-core GEMM (``ops_gemm``, ``tetra48_gemm``): its decoded fragments equal the
float16 twins ``reference.tetra48_dequantize_f16`` / ``planes14_dequantize_f16`` bit for bit, its
product the twin's product within float32 accumulation and the f64 product within float16
accuracy (tails, odd block counts, several K-slices, both Tetra layouts and the ball codebook's
``planes14``, both column orders); bad input is refused. Interpreter tests
on tiny shapes; GPU tests at a Qwen3-8B shape; an offline sm_90 compile checks that Triton moves
nothing through shared memory (which holds the staged decode table)."""

from __future__ import annotations

import os

import pytest
import torch
from offline_compile import run_offline
from tolerance import assert_matmul_close

from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput, UnsupportedShape
from leechq.formats.layouts.planes14 import random_planes14
from leechq.formats.layouts.tetra48 import random_tetra48
from leechq.formats.layouts.tetra64 import to_tetra64
from leechq.kernels import reference as ref

interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                            reason="the Triton interpreter (TRITON_INTERPRET=1) is off")


def _gemm():  # imported lazily: TRITON_INTERPRET must be set before triton compiles anything
    pytest.importorskip("triton")
    from leechq.kernels.triton import ops_gemm

    return ops_gemm


LAYOUTS = ("tetra48", "tetra64", "planes14")


def _records(layout: str, d_out: int, d_in: int, seed: int):
    """``(served, twin)``: a random record in ``layout`` and the record the twins read (the
    ``tetra48`` one a ``tetra64`` record was converted from; else the record itself)."""
    if layout == "planes14":
        w = random_planes14(d_out, d_in, seed=seed)
        return w, w
    w = random_tetra48(d_out, d_in, seed=seed)
    return (to_tetra64(w) if layout == "tetra64" else w), w


def _f16(w) -> torch.Tensor:
    """The float16 twin values, block-major (``reference.*_dequantize_f16``)."""
    if w.layout == "planes14":
        return ref.planes14_dequantize_f16(w)
    return ref.tetra48_dequantize_f16(w)


def _rotated(w) -> torch.Tensor:
    """The f64 matrix of the record (``reference.*_dequantize_rotated``)."""
    if w.layout == "planes14":
        return ref.planes14_dequantize_rotated(w)
    return ref.tetra48_dequantize_rotated(w)


def _exact(x: torch.Tensor, w) -> torch.Tensor:
    """The f64 product of the record (``reference.*_matvec``)."""
    return (ref.planes14_matvec if w.layout == "planes14" else ref.tetra48_matvec)(x, w).double()


def _twin(x: torch.Tensor, w) -> torch.Tensor:
    """The product from the float16 twin values and the float16 activation, in f64: blocks
    ``x16 · W16ᵀ`` (natural order), then σ_row and the tail of ``x``
    (``reference.scale_and_tail``)."""
    w16 = _f16(w).double()  # block-major, the copy's column order
    idx = _natural(w)
    n = BLOCK * w.n_blocks
    x16 = x[:, :n].to(torch.float16).double()[:, idx]
    y = x16 @ w16.T
    return (y * w.row_scales.double() + x[:, n:].double() @ w.tail.double().T)


def _natural(w) -> torch.Tensor:
    if w.layout == "planes14":
        return torch.arange(BLOCK * w.n_blocks)
    from leechq.kernels.triton.ops_dense import dequant_natural_index

    return dequant_natural_index(w.n_blocks, "cpu", grouped=False)


try:  # the decode kernel of the bit-exact tests (module level: the interpreter reads globals)
    import triton
    import triton.language as tl

    from leechq.kernels.triton._bits import global_load32, global_store32
    from leechq.kernels.triton.tetra48_decode import sb_copy
    from leechq.kernels.triton.tetra48_gemm import (
        P14_TABLE_PART,
        P14_TABLE_PARTS,
        pair_fragments,
        pair_words,
    )
    from leechq.kernels.triton.tetra48_m1 import stage_table
except ImportError:  # no Triton: the tests that need it skip
    triton = None

if triton is not None:
    @triton.jit
    def _fragments_kernel(w_ptr, cent_ptr, tab_ptr, out_ptr, d_out, N_BLOCKS: tl.constexpr,
                          T64: tl.constexpr, P14: tl.constexpr, USE_ASM: tl.constexpr):
        """``tetra48_gemm.pair_fragments`` of every (row, pair) item, 128 per program (4 warps),
        from the staged table as the GEMM reads it: its 24 float16x2 words at
        ``out[item, (h·3 + s)·4 + k]``."""
        NP: tl.constexpr = (N_BLOCKS + 1) // 2
        if P14:
            STRIDE_W: tl.constexpr = 7 * NP
            base = stage_table(tab_ptr, d_out, USE_ASM, P14_TABLE_PARTS, P14_TABLE_PART)
        elif T64:
            STRIDE_W: tl.constexpr = 4 * NP
            base = stage_table(tab_ptr, d_out, USE_ASM)
        else:
            STRIDE_W: tl.constexpr = ((6 * N_BLOCKS + 7) // 8) * 2
            base = stage_table(tab_ptr, d_out, USE_ASM)
        e = tl.arange(0, 128)
        item = tl.program_id(0) * 128 + e
        ok = item < d_out * NP
        row = tl.where(ok, item // NP, 0)
        pair = item % NP
        ok_e = ok & (2 * pair < N_BLOCKS)
        ok_o = ok & (2 * pair + 1 < N_BLOCKS)
        words = pair_words(w_ptr, row, pair, ok_e, ok_o, STRIDE_W, T64, USE_ASM, P14)
        c0 = global_load32(cent_ptr + 2 * row, ok, USE_ASM).to(tl.float32, bitcast=True)
        c1 = global_load32(cent_ptr + 2 * row + 1, ok, USE_ASM).to(tl.float32, bitcast=True)
        f = pair_fragments(words, c0, c1, tab_ptr, base, sb_copy(e), T64, USE_ASM, P14)
        for h in tl.static_range(2):
            for s in tl.static_range(3):
                for k in tl.static_range(4):
                    global_store32(out_ptr + item * 24 + (h * 3 + s) * 4 + k, f[h][s][k], ok,
                                   USE_ASM)


def _fragments(w) -> torch.Tensor:
    """float16 [d_out, pairs, 2, 24]: what ``tetra48_gemm.pair_fragments`` decodes for every
    (row, pair) (:func:`_fragments_kernel`; on the GPU from the table in shared memory)."""
    from leechq.kernels.tables import planes14_m1_table, tetra_m1_table
    from leechq.kernels.triton.ops_common import _use_asm

    npairs = (w.n_blocks + 1) // 2
    p14 = w.layout == "planes14"
    codes = w.records if p14 else w.words
    dev = codes.device
    out = torch.zeros(w.d_out, npairs, 24, dtype=torch.int32, device=dev)
    _fragments_kernel[(triton.cdiv(w.d_out * npairs, 128),)](
        codes, w.row_centroids, planes14_m1_table(dev) if p14 else tetra_m1_table(dev), out,
        w.d_out, N_BLOCKS=w.n_blocks, T64=w.layout == "tetra64", P14=p14, USE_ASM=_use_asm(),
        num_warps=4)
    return out.view(torch.float16).reshape(w.d_out, npairs, 2, BLOCK).cpu()


@interp
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fragments_equal_the_twin_bit_for_bit(layout: str) -> None:
    """Every (row, block pair)'s decoded float16 values — the GEMM's ``A`` fragments, section by
    section — equal ``reference.tetra48_dequantize_f16`` / ``planes14_dequantize_f16`` (odd
    block count: the last pair has no odd block)."""
    _gemm()
    served, w = _records(layout, 9, 7 * BLOCK + 5, seed=11)
    got = _fragments(served)
    want = _f16(w).reshape(w.d_out, w.n_blocks, BLOCK)
    flat = got.reshape(w.d_out, -1, BLOCK)[:, : w.n_blocks]
    if layout == "planes14":  # the twin's zero coordinates may be −0 (sign × magnitude): + 0
        flat, want = flat + 0.0, want + 0.0
    assert torch.equal(flat.view(torch.int16), want.view(torch.int16))


@interp
@pytest.mark.parametrize(("d_out", "d_in", "m_rows", "layout"), [
    (32, 4 * BLOCK, 2, "tetra48"),  # no tail, one step
    (37, 7 * BLOCK + 5, 5, "tetra64"),  # odd block count, tail, rows past a 16-row group
    (32, 17 * BLOCK + 5, 16, "tetra48"),  # three K-slices (the last one short)
    (20, 8 * BLOCK + 23, 33, "tetra64"),  # five 8-row tiles (MT = 8), a 23-column tail
    (37, 7 * BLOCK + 5, 5, "planes14"),
    (32, 17 * BLOCK + 5, 16, "planes14"),
])
def test_product_within_tolerance(d_out: int, d_in: int, m_rows: int, layout: str) -> None:
    """The GEMM against the twin's product (float16 values and activation, f64 sums: only the
    float32 accumulation differs) and against the f64 product of the record (float16
    accuracy)."""
    g = _gemm()
    served, w = _records(layout, d_out, d_in, seed=d_out + m_rows)
    x = torch.randn(m_rows, d_in)
    y = g.matmul_gemm(x, served)
    assert y.dtype == torch.float32 and y.shape == (m_rows, d_out)
    dense = _rotated(w)
    assert_matmul_close(y, _twin(x, w), x, dense, torch.float32, what="against the f16 twin")
    assert_matmul_close(y, _exact(x, w), x, dense, torch.float16, what="against the f64 product")


@interp
@pytest.mark.parametrize("layout", ["tetra48", "planes14"])
def test_slices_and_geometries_agree(layout: str) -> None:
    """Other geometries (two row groups per step; two warps and many slices) give the same sums
    up to float32 reassociation."""
    g = _gemm()
    w, _ = _records(layout, 40, 17 * BLOCK + 5, seed=4)
    x = torch.randn(9, w.d_in)
    dense = _rotated(w)
    want = _twin(x, w)
    for cfg in (g.GemmConfig(4, 2, 2), g.GemmConfig(2, 1, 7)):
        assert_matmul_close(g.matmul_gemm(x, w, config=cfg), want, x, dense,
                            torch.float32, what=str(cfg))


@interp
def test_many_rows_cover_every_output_row() -> None:
    """From 65 activation rows one row group per step is used whatever the geometry says; the
    grid follows (a two-group geometry once left half of each program's output rows unwritten:
    the GPU test at 128 rows found it)."""
    g = _gemm()
    w = random_tetra48(130, 2 * BLOCK + 3, seed=6)
    x = torch.randn(66, w.d_in)
    dense = ref.tetra48_dequantize_rotated(w)
    y = g.matmul_gemm(x, w, config=g.GemmConfig(4, 2, 3))
    assert_matmul_close(y, _twin(x, w), x, dense, torch.float32, what="4x2x3 at 66 rows")


@interp
@pytest.mark.parametrize("layout", ["tetra48", "planes14"])
@pytest.mark.parametrize("grouped", [True, False])
def test_ordered_input_equals_natural(grouped: bool, layout: str) -> None:
    """From the activation already in ``dense_input_order`` (what the rotation writes for the
    dense path; a width not a multiple of 8 is copied to aligned rows) the GEMM gives the same
    numbers as from the natural order, in both column orders of the copy; ``out_dtype`` rounds
    the same result."""
    from dataclasses import replace

    from leechq.kernels.triton import ops_dense

    g = _gemm()
    w, _ = _records(layout, 24, 6 * BLOCK + 7, seed=2)
    x = torch.randn(6, w.d_in).half().float()  # float16 values: the tail is the same either way
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ops_dense, "DEQUANT_DEFAULT", replace(ops_dense.DEQUANT_DEFAULT,
                                                         grouped=grouped))
        order = ops_dense.dense_input_order(w, "cpu").long()
        x16 = torch.empty(6, w.d_in, dtype=torch.float16)
        x16[:, order] = x.half()
        got = g.matmul_gemm_ordered(x16, w)
        want = g.matmul_gemm(x, w)
        assert torch.equal(got, want)
        half = g.matmul_gemm_ordered(x16, w, out_dtype=torch.float16)
        wide = torch.full((6, w.d_out + 5), float("nan"))  # a part's columns of a group's output
        g.matmul_gemm_ordered(x16, w, out=wide[:, 3 : 3 + w.d_out])
    assert half.dtype == torch.float16 and torch.equal(half, want.half())
    assert torch.equal(wide[:, 3 : 3 + w.d_out], want)
    assert wide[:, :3].isnan().all() and wide[:, 3 + w.d_out :].isnan().all()
    assert_matmul_close(want, _twin(x, w), x, _rotated(w), torch.float32)


def test_launch_geometry() -> None:
    """The default geometry takes two row groups per step, except for a Planes14 record at 9..16
    rows (measured faster with one) and anything from 65 rows (forced); an explicit geometry is
    kept below 65 rows."""
    g = _gemm()
    two = g.GemmConfig(4, 2, 4)
    got = {(layout, rows): g.launch_config(None, layout, rows).rows_per_step
           for layout in ("tetra64", "planes14") for rows in (3, 8, 9, 16, 17, 64, 65)}
    assert got == {("tetra64", 3): 2, ("tetra64", 8): 2, ("tetra64", 9): 2, ("tetra64", 16): 2,
                   ("tetra64", 17): 2, ("tetra64", 64): 2, ("tetra64", 65): 1,
                   ("planes14", 3): 2, ("planes14", 8): 2, ("planes14", 9): 1,
                   ("planes14", 16): 1, ("planes14", 17): 2, ("planes14", 64): 2,
                   ("planes14", 65): 1}
    assert g.GEMM_DEFAULT == two
    assert g.launch_config(two, "planes14", 16) == two
    assert g.launch_config(two, "planes14", 65).rows_per_step == 1


@interp
def test_bad_input_is_refused() -> None:
    g = _gemm()
    w = random_tetra48(16, 4 * BLOCK, seed=1)
    with pytest.raises(UnsupportedShape, match=r"1\.\.128"):
        g.matmul_gemm(torch.randn(129, w.d_in), w)
    with pytest.raises(InvalidInput, match="x must be"):
        g.matmul_gemm(torch.randn(3, w.d_in + 1), w)
    with pytest.raises(InvalidInput, match=r"x16 must be torch\.float16"):
        g.matmul_gemm_ordered(torch.randn(3, w.d_in), w)
    with pytest.raises(InvalidInput, match="x16 must be"):
        g.matmul_gemm_ordered(torch.randn(3, w.d_in + 8).half(), w)
    for bad in (g.GemmConfig(1, 1, 4), g.GemmConfig(4, 3, 4), g.GemmConfig(4, 1, 8)):
        with pytest.raises(InvalidInput, match="GEMM geometry"):
            g.matmul_gemm(torch.randn(3, w.d_in), w, config=bad)
    with pytest.raises(InvalidInput, match="out_dtype"):
        g.matmul_gemm(torch.randn(3, w.d_in), w, out_dtype=torch.int32)
    x16 = torch.randn(3, w.d_in).half()
    for out in (torch.empty(3, w.d_out + 1), torch.empty(3, w.d_out, dtype=torch.float16),
                torch.empty(w.d_out, 3).T):
        with pytest.raises(InvalidInput, match="out must be"):
            g.matmul_gemm_ordered(x16, w, out=out)


def test_gemm_entry_serves_a_groups_middle_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decided as on a GPU: ``select.GemmF16`` takes a serving group's 3..64 rows of every
    lattice layout; 2 rows stay on ``m1`` and 65 take the float16 copy; it refuses
    natural-order callers, other row counts and the interpreter with a reason."""
    from leechq.kernels import select
    from leechq.kernels.triton import ops

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ops, "planes14_dense_enabled", lambda device: True)  # its check: GPU
    cuda = torch.device("cuda")
    for layout in ("tetra48", "tetra64", "planes14"):
        got = {r: select.choose(select.Request(layout, r, cuda, n_blocks=40, dense_copy=True)).name
               for r in (2, 3, 64, 65)}
        assert got == {2: "m1", 3: "gemm-f16", 64: "gemm-f16", 65: "dense-f16"}, layout
    for req, why in ((select.Request("tetra48", 8, cuda, n_blocks=4), "copy's activation order"),
                     (select.Request("tetra48", 65, cuda, n_blocks=4, dense_copy=True),
                      "outside 3..64")):
        ok, reason = select.GemmF16.can_implement(req)
        assert not ok and why in reason, reason
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ok, reason = select.GemmF16.can_implement(
        select.Request("tetra48", 8, torch.device("cpu"), n_blocks=4, dense_copy=True))
    assert not ok and "interpreter" in reason


_SASS = r"""
from leechq.kernels.triton import introspect as I
from leechq.kernels.triton.tetra48_gemm import gemm_kernel
SIG = {"x_ptr": "*i32", "stride_x": "i32", "w_ptr": "*i32", "cent_ptr": "*fp32",
       "tab_ptr": "*i32", "part_ptr": "*fp32", "d_out": "i32", "m_rows": "i32", "K_PAIRS": "i32"}
for mt, rps, t64, p14 in ((1, 1, False, False), (16, 1, True, False), (2, 2, False, True)):
    c = I.compile_for(gemm_kernel, SIG, dict(N_BLOCKS=170, MT=mt, NW=4, RPS=rps, GROUPED=True,
                      T64=t64, USE_ASM=True, P14=p14), num_warps=4,
                      aligned_ints=("stride_x", "d_out", "K_PAIRS"))
    loop = I.hot_loop_mix(I.sass(c))["loop"]
    print(mt, loop.get("HMMA", 0), loop.get("STS", 0), loop.get("BAR", 0), c.metadata.shared)
"""


def test_gemm_compiles_without_triton_shared_memory() -> None:
    """Compiled offline for sm_90: the hot loop holds the 12·MT·RPS MMAs per step and no shared
    store or barrier (the staged decode table is the only shared memory; Triton moving anything
    through it would corrupt the table), and the kernel reserves just the table's 32 KiB."""
    pytest.importorskip("triton")
    lines = run_offline(_SASS, timeout=600).strip().splitlines()[-3:]
    assert lines == ["1 12 0 0 32768", "16 192 0 0 32768", "2 48 0 0 32768"], lines


# ------------------------------------------------------------------------------------------- GPU


_QWEN: dict[str, object] = {}


def _qwen_record(layout: str):
    """A 4096×4096 record in ``layout`` on the CPU, the record the twins read and its f64 matrix
    (built once per session and codebook)."""
    key = "ball" if layout == "planes14" else "tetra"
    if key not in _QWEN:
        w = _records(layout, 4096, 4096, seed=8)[1]
        _QWEN[key] = (w, _rotated(w))
    w, dense = _QWEN[key]
    return (to_tetra64(w) if layout == "tetra64" else w), w, dense


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fragments_bit_exact_on_gpu(layout: str) -> None:
    """On the GPU (the table staged in shared memory, the PTX helpers): the decoded fragments of
    a 300×(50 blocks + 7) record equal the float16 twin bit for bit (a zero's sign aside for
    ``planes14``, as under the interpreter)."""
    _gemm()
    served, w = _records(layout, 300, 50 * BLOCK + 7, seed=7)
    got = _fragments(served.to("cuda"))
    want = _f16(w).reshape(w.d_out, w.n_blocks, BLOCK)
    flat = got.reshape(w.d_out, -1, BLOCK)[:, : w.n_blocks]
    if layout == "planes14":
        flat, want = flat + 0.0, want + 0.0
    assert torch.equal(flat.view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m_rows", [8, 32, 128])
def test_qwen3_8b_shape_on_gpu(m_rows: int, layout: str) -> None:
    """4096×4096 (a 16-column tail) on the GPU: the product against the twin's (f64 sums of the
    float16 values: only the float32 accumulation differs) and against the f64 product, for the
    default geometry and every candidate of the sweep."""
    g = _gemm()
    sc, wc, dense = _qwen_record(layout)
    served = sc.to("cuda")
    xc = torch.randn(m_rows, wc.d_in)
    twin = _twin(xc, wc)
    exact = xc.double() @ dense.T
    for cfg in (g.GEMM_DEFAULT, *g.GEMM_CONFIGS):
        y = g.matmul_gemm(xc.cuda(), served, config=cfg).cpu()
        assert_matmul_close(y, twin, xc, dense, torch.float32, what=f"twin {cfg}")
        assert_matmul_close(y, exact, xc, dense, torch.float16, what=f"f64 {cfg}")
