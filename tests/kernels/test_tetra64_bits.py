"""The batch-1 kernel's pattern-bits table for ``tetra64`` records (``PBITS``,
``tables.tetra_m1_bits_table``, ``tetra48_m1.decode_block64_bits``) and the warps' shared
activation conversion (``XS``, ``tetra48_m1._x_limbs64_shared``): the table gives every pattern
entry's nibble masks back; under the interpreter both forms equal the 16-byte-entry decode bit
for bit (one, two and four rows, odd blocks, tails, short K-slices); the switches' errors;
offline, the instruction and load counts; on the GPU, full shapes bit for bit."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest
import torch
from offline_compile import run_offline

from leechq.errors import InvalidInput
from leechq.formats.layouts.tetra48 import random_tetra48
from leechq.formats.layouts.tetra64 import to_tetra64
from leechq.kernels import reference as ref
from leechq.kernels import tables

interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                            reason="the Triton interpreter (TRITON_INTERPRET=1) is off")


def _ops():  # imported lazily: TRITON_INTERPRET must be set before triton compiles anything
    pytest.importorskip("triton")
    from leechq.kernels.triton import ops

    return ops


@pytest.mark.parametrize("copies", [8, 16, 32])
def test_bits_table_layout(copies: int) -> None:
    """Rank rows as in the 16-byte table; entry ``a`` copy ``c`` of ``PA`` / ``PB`` at the
    documented words; every copy of an entry equal; the masks of each entry back from its bits,
    and the XOR of a ``PA`` and a ``PB`` word spreads to the XOR of their masks."""
    bits = tables.tetra_m1_bits_table_numpy(copies)
    std = tables.tetra_m1_table_numpy()
    assert bits.dtype == np.uint32 and bits.size == 4096 + 2 * 64 * copies
    assert np.array_equal(bits[:4096], std[:4096])
    pa = bits[4096:4096 + 64 * copies].reshape(64, copies)
    pb = bits[4096 + 64 * copies:].reshape(64, copies)
    assert (pa == pa[:, :1]).all() and (pb == pb[:, :1]).all()
    masks_a = std[tables.M1_PA_WORD:tables.M1_PB_WORD].reshape(64, tables.M1_COPIES, 4)[:, 0]
    masks_b = std[tables.M1_PB_WORD:].reshape(64, tables.M1_COPIES, 4)[:, 0]
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 64, 500), rng.integers(0, 64, 500)
    pp = pa[a, 0] ^ pb[b, 0]
    for k in range(3):
        spread = ((pp >> np.uint32(k)) & np.uint32(0x11111111)) * np.uint32(15)
        assert np.array_equal(spread, masks_a[a, k] ^ masks_b[b, k])
    with pytest.raises(ValueError, match="copies"):
        tables.tetra_m1_bits_table_numpy(4)


def _case(monkeypatch: pytest.MonkeyPatch, d_out: int, d_in: int, m_rows: int):
    """A random record in both layouts, its prepared activation, 16-bit activations."""
    ops = _ops()
    monkeypatch.setenv("LEECHQ_A16", "1")
    device = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" \
        else "cpu"
    w = random_tetra48(d_out, d_in, seed=3 * d_in + m_rows, device=device)
    g = torch.Generator(device=device).manual_seed(d_out + 7 * m_rows)
    x = torch.randn(m_rows, d_in, generator=g, device=device) * 3
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables(device).order)
    return ops, w, to_tetra64(w), x, xp


def _run(ops, monkeypatch, t, xp, m_rows, cfg, pbits: str, xs: str) -> torch.Tensor:
    monkeypatch.setenv("LEECHQ_T64_PBITS", pbits)
    monkeypatch.setenv("LEECHQ_T64_XS", xs)
    got = torch.full((m_rows, t.d_out), float("nan"), device=xp.device)
    ops.tetra48_matvec_prepared(xp, t, m_rows, cfg, out=got)
    return got


@interp
@pytest.mark.parametrize(("d_out", "d_in", "m_rows", "ilp", "forms"), [
    (40, 24 * 9 + 5, 1, 2, [("16", "0"), ("32", "0"), ("16", "1")]),  # odd blocks, a tail
    (33, 24 * 70, 1, 1, [("16", "1"), ("32", "0")]),  # three K-slices, the last one short
    (24, 256, 2, 2, [("16", "1"), ("32", "0")]),      # two rows: XS does not apply, PBITS does
    (17, 24 * 5 + 1, 3, 1, [("16", "0"), ("8", "0")]),  # four rows per launch (three real)
])
def test_bits_and_shared_conversion_match(monkeypatch: pytest.MonkeyPatch, d_out: int,
                                          d_in: int, m_rows: int, ilp: int,
                                          forms: list[tuple[str, str]]) -> None:
    ops, w, t, x, xp = _case(monkeypatch, d_out, d_in, m_rows)
    cfg = replace(ops.m1_config(d_out, w.n_blocks, xp.device, w.tail_cols, m_rows), ilp=ilp)
    want = _run(ops, monkeypatch, t, xp, m_rows, cfg, "0", "0")
    assert ref.row_bound_error(want, ref.round_activation(x, w.n_blocks),
                               ref.tetra48_dequantize_rotated(t)) <= 1e-5
    for pbits, xs in forms:
        assert torch.equal(_run(ops, monkeypatch, t, xp, m_rows, cfg, pbits, xs), want), \
            (pbits, xs)


@interp
@pytest.mark.parametrize(("d_out", "d_in", "m_rows"), [(17, 24 * 9 + 5, 2)])
def test_split_xor_matches(monkeypatch: pytest.MonkeyPatch, d_out: int, d_in: int,
                           m_rows: int) -> None:
    """The pattern XOR merged into the nibble masks (``SPLIT``, the default) and kept apart
    (``LEECHQ_T64_SPLIT=0``) give the same output bit for bit (8-copy table)."""
    ops, w, t, _x, xp = _case(monkeypatch, d_out, d_in, m_rows)
    cfg = ops.m1_config(d_out, w.n_blocks, xp.device, w.tail_cols, m_rows)
    monkeypatch.setenv("LEECHQ_T64_SPLIT", "0")
    apart = _run(ops, monkeypatch, t, xp, m_rows, cfg, "8", "0")
    monkeypatch.delenv("LEECHQ_T64_SPLIT")
    assert ops.t64_split()
    assert torch.equal(_run(ops, monkeypatch, t, xp, m_rows, cfg, "8", "0"), apart)


def test_pbits_switch_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad ``LEECHQ_T64_PBITS`` / ``LEECHQ_T64_NW`` / ``LEECHQ_T64_RESIDENT`` values are named;
    unset, the library's defaults apply (the 8-copy table, four warps, five programs per SM)."""
    ops = _ops()
    for var in ("LEECHQ_T64_PBITS", "LEECHQ_T64_NW", "LEECHQ_T64_RESIDENT"):
        monkeypatch.delenv(var, raising=False)
    assert ops.t64_pbits() == ops.T64_PBITS == 8
    assert ops.t64_geometry() == (4, 5)
    for var, bad in (("LEECHQ_T64_PBITS", "4"), ("LEECHQ_T64_PBITS", "x"),
                     ("LEECHQ_T64_PBITS", "-16"), ("LEECHQ_T64_NW", "2"),
                     ("LEECHQ_T64_NW", "eight"), ("LEECHQ_T64_RESIDENT", "0"),
                     ("LEECHQ_T64_RESIDENT", "9")):
        monkeypatch.setenv(var, bad)
        with pytest.raises(InvalidInput, match=var):
            ops.t64_pbits()
            ops.t64_geometry()
        monkeypatch.delenv(var)
    monkeypatch.setenv("LEECHQ_T64_NW", "8")
    assert ops.t64_geometry() == (8, 2)


_SASS = """
from leechq.kernels.triton import introspect as I
from leechq.kernels.triton.tetra48_m1 import m1_kernel
out = []
for pbits, xs, split in ((0, False, True), (16, False, True), (32, False, True),
                        (16, True, True), (8, False, True), (8, False, False)):
    ce = dict(N_BLOCKS=170, TAIL_COLS=16, ROWS=112, NW=4, BP=32, USE_ASM=True, ILP=2, MB=1,
              A16=True, CODE=3, PDL=True, PBITS=pbits, XS=xs, SPLIT=split)
    c = I.compile_for(m1_kernel, I.M1_SIGNATURE, ce, num_warps=4,
                      aligned_ints=("d_out", "stride_x", "stride_y", "stride_l"))
    text = I.sass(c)
    ins = I.instructions(text)
    lo, _hi = I.widest_loop(ins)
    mix = I.hot_loop_mix(text)
    ldg = sum(1 for a, op, _ in ins if a < lo and op.startswith("LDG") and ".128" not in op)
    out += [mix["loop_total"], mix["loop"].get("LDS", 0), mix["loop"].get("IDP", 0), ldg,
            I.resource_usage(c).get("registers", 0), I.resource_usage(c).get("local", 0)]
print(*out)
"""


def test_bits_offline() -> None:
    """Offline sm_90 compile of the tetra64 kernel (two rows per trip, one row, gate|up width):
    the bits forms keep the 20 shared loads and 48 ``dp4a`` per trip at no more than 40
    instructions over the 16-byte form (the pattern spread: 33 under Triton 3.9, 21 with the
    XOR merged into the masks); merging saves at least 12 per trip (one ``lop3`` per section
    and block); the shared conversion loads at most 16 scalar activation words per thread
    before the loop (48 when every warp converts its slice) and needs fewer registers; no
    local memory, at most 96 registers for the 8-copy default."""
    pytest.importorskip("triton")
    v = [int(s) for s in run_offline(_SASS, timeout=900).split()[-36:]]
    std, pb16, pb32, xs, pb8, pb8_apart = (v[6 * i:6 * i + 6] for i in range(6))
    for form in (std, pb16, pb32, xs, pb8, pb8_apart):
        assert form[1] == 20 and form[2] == 48 and form[5] == 0, form
    assert pb16[0] - std[0] <= 40 and pb32[0] - std[0] <= 40, (std, pb16, pb32)
    assert pb8_apart[0] - pb8[0] >= 12 and pb8[4] <= 96, (pb8, pb8_apart)
    assert std[3] >= 48 and xs[3] <= 16, (std, xs)
    assert xs[4] < pb16[4], (xs, pb16)


@pytest.mark.gpu
@pytest.mark.parametrize(("d_out", "d_in"), [(6144, 4096), (4096, 4096), (24576, 4096),
                                             (4096, 12288), (5120, 17408), (24, 24 * 213 + 8)])
def test_bits_full_shapes(monkeypatch: pytest.MonkeyPatch, d_out: int, d_in: int) -> None:
    """On the GPU, the library's tetra64 geometry at real shapes: the bits tables (8, 16, 32
    copies) and the shared conversion give the 16-byte decode's output bit for bit
    (NaN-poisoned outputs); at 4096 × 4096 also with 8 and 16 warps per program."""
    ops, w, t, x, xp = _case(monkeypatch, d_out, d_in, 1)
    cfg = ops.m1_config(d_out, w.n_blocks, xp.device, w.tail_cols, 1, t64=True)
    want = _run(ops, monkeypatch, t, xp, 1, cfg, "0", "0")
    assert ref.row_bound_error(want, ref.round_activation(x, w.n_blocks),
                               ref.tetra48_dequantize_rotated(t)) <= 1e-5
    for pbits, xs in (("16", "0"), ("32", "0"), ("8", "0"), ("16", "1")):
        assert torch.equal(_run(ops, monkeypatch, t, xp, 1, cfg, pbits, xs), want), (pbits, xs)
    monkeypatch.setenv("LEECHQ_T64_SPLIT", "0")  # the pattern XOR apart
    assert torch.equal(_run(ops, monkeypatch, t, xp, 1, cfg, "8", "0"), want)
    monkeypatch.delenv("LEECHQ_T64_SPLIT")
    for nw in ("8", "16") if (d_out, d_in) == (4096, 4096) else ():  # wider programs, sized
        monkeypatch.setenv("LEECHQ_T64_NW", nw)                       # for 2 or 1 per SM
        cfg = ops.m1_config(d_out, w.n_blocks, xp.device, w.tail_cols, 1, t64=True)
        for pbits in ("0", "8", "16"):
            assert torch.equal(_run(ops, monkeypatch, t, xp, 1, cfg, pbits, "0"), want), \
                (nw, pbits)
