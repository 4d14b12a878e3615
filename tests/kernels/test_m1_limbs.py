"""The batch-1 kernel's stored limb records: ``reference.m1_limb_records`` (exact, against an
independent per-coordinate computation), the rotation that writes them (``ops.rotate(limbs=)`` and
both pre-ops; bit for bit the reference of its own prepared output) and the ``m1`` launches that
load them (bit for bit the launches that convert the prepared rows) — under the Triton
interpreter, and at the Qwen3 widths on the GPU."""

from __future__ import annotations

import math
import os

import pytest
import torch
from offline_compile import run_offline

from leechq.errors import InvalidInput, UnsupportedShape
from leechq.formats.rotation import generate_rotation
from leechq.kernels import reference as ref

interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                            reason="the Triton interpreter (TRITON_INTERPRET=1) is off")


def _ops():  # imported lazily: TRITON_INTERPRET must be set before triton compiles anything
    pytest.importorskip("triton")
    from leechq.kernels.triton import ops

    return ops


def _word(rec: torch.Tensor, row: int, par: int, w: int, pair: int, npp: int) -> int:
    return int(rec[row, (par * ref.LIMB_WORDS + w) * npp + pair]) & 0xFFFFFFFF


def test_limb_records_hold_each_blocks_rounded_integers() -> None:
    """Word 0 is the block exponent ``2^(eb − 148)`` of its largest |value| (``eb`` ≥ 22), and
    byte ``j`` of word ``1 + 6·limb + 2·section + half`` is byte ``limb`` of
    ``rint(x / E)`` at position ``8·section + 2j + half``; zero blocks and pad pairs give the
    words of zeros. Checked per coordinate with Python integers on mixed magnitudes, exact
    halves (round to even) and an all-zero row."""
    n_blocks = 5
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, n_blocks * 24 + 7, generator=g) * torch.tensor([1.0, 1e-30, 3e4])[:, None]
    x[0, 24:48] = torch.arange(24) * 0.25 - 3.0  # block 1: max 3.0, E = 2^-20
    x[0, 30] = 2.5 * 2.0 ** -20  # x/E = 2.5 and 3.5: exact halves, rounded to even (2 and 4)
    x[0, 31] = 3.5 * 2.0 ** -20
    x[2] = 0.0
    order = torch.arange(24)
    xp = ref.prepare_activation(x, n_blocks, order)
    rec = ref.m1_limb_records(xp, n_blocks)
    npp = ref.prepared_pairs(n_blocks)
    assert rec.dtype == torch.int32 and rec.shape == (4, ref.limb_records_width(n_blocks))
    for row in range(4):
        for blk in range(2 * npp):
            pair, par = blk // 2, blk % 2
            live = row < 3 and blk < n_blocks
            vals = [float(x[row, 24 * blk + t]) if live else 0.0 for t in range(24)]
            mx = max(abs(v) for v in vals)
            eb = max(((torch.tensor(mx).view(torch.int32).item() >> 23) & 0xFF), 22)
            e = 2.0 ** (eb - 148)
            assert _word(rec, row, par, 0, pair, npp) == (eb - 21) << 23
            for t, v in enumerate(vals):
                q = round(v / e)  # Python's round: half to even, exact on these doubles
                assert abs(q) <= 2 ** 22 and (not live or math.isclose(q * e, v, abs_tol=e))
                sec, j, half = t // 8, (t % 8) // 2, t % 2
                for limb in range(3):
                    word = _word(rec, row, par, 1 + 6 * limb + 2 * sec + half, pair, npp)
                    assert (word >> (8 * j)) & 0xFF == (q >> (8 * limb)) & 0xFF, (row, blk, t)


def test_limb_records_reject_a_wrong_width() -> None:
    with pytest.raises(InvalidInput, match="width"):
        ref.m1_limb_records(torch.zeros(1, 100), 3)


def _rotation_case(n: int, m_rows: int, splits: int, planes14: bool, dev: str,
                   forms: str = "rns") -> None:
    ops = _ops()
    rot = ops.DeviceRotation.from_tables(generate_rotation(n, 1), dev)
    order = ops.planes14_m1_order(dev) if planes14 else ops.tetra_kernel_tables(dev).order
    g = torch.Generator().manual_seed(n + m_rows)
    x = (torch.randn(m_rows, n, generator=g) * 3).to(dev)
    nb = n // 24
    outs = []
    if "r" in forms:
        lb = ops.m1_limbs(nb, dev, m_rows)
        outs.append((ops.rotate(x, rot, prepared_order=order, splits=splits, limbs=lb), lb))
    if "n" in forms:
        lb = ops.m1_limbs(nb, dev, m_rows)
        _, xp = ops.norm_rotate(x.half(), torch.ones(n, device=dev).half(), 1e-6, rot, delta=x,
                                prepared_order=order, splits=splits, limbs=lb)
        outs.append((xp, lb))
    if "s" in forms:
        lb = ops.m1_limbs(nb, dev, m_rows)
        xp = ops.silu_mul_rotate(torch.randn(m_rows, 2 * n, generator=g).to(dev), torch.float16,
                                 rot, prepared_order=order, splits=splits, limbs=lb)
        outs.append((xp, lb))
    for xp, lb in outs:
        assert torch.equal(lb, ref.m1_limb_records(xp, nb))


@interp
@pytest.mark.parametrize(("n", "m_rows", "splits", "planes14", "forms"), [
    (256, 1, 1, False, "rns"),  # 10 blocks + 16 tail columns
    (512, 2, 4, False, "r"),    # 21 blocks + 8, two rows, four programs per row
    (256, 1, 2, True, "n"),     # the Planes14 m1 order
])
def test_rotation_writes_the_limb_records(n: int, m_rows: int, splits: int, planes14: bool,
                                          forms: str) -> None:
    """A one-group rotation into the prepared layout that also writes the limb records
    (``limbs=``) writes exactly ``reference.m1_limb_records`` of its prepared output, for the
    plain rotation and both pre-ops (rows past the live ones included)."""
    _rotation_case(n, m_rows, splits, planes14, "cpu", forms)


@pytest.mark.gpu
@pytest.mark.parametrize(("m_rows", "planes14"), [(1, False), (2, False), (1, True)])
def test_rotation_limbs_on_gpu(m_rows: int, planes14: bool) -> None:
    """As the interpreter test, at Qwen3-8B's one-group width (4096), eight programs per row."""
    _rotation_case(4096, m_rows, 8, planes14, "cuda")


def _matvec_case(d_out: int, d_in: int, m_rows: int, planes14: bool, dev: str,
                 config=None) -> None:
    ops = _ops()
    from leechq.formats.layouts.planes14 import random_planes14
    from leechq.formats.layouts.tetra48 import random_tetra48

    make = random_planes14 if planes14 else random_tetra48
    w = make(d_out, d_in, seed=d_in + m_rows, device=dev)
    order = ops.planes14_m1_order(dev) if planes14 else ops.tetra_kernel_tables(dev).order
    g = torch.Generator().manual_seed(m_rows)
    x = torch.randn(m_rows, d_in, generator=g).to(dev)
    xp = ops.prepare_activation(x, w.n_blocks, order)
    lb = ref.m1_limb_records(xp, w.n_blocks)
    if planes14:
        plan = ops.planes14_m1_groups(w, m_rows, torch.device(dev), config)
        assert plan is not None
        want = ops.planes14_matvec_planned(xp, w, m_rows, plan)
        got = ops.planes14_matvec_planned(xp, w, m_rows, plan, limbs=lb)
        dense = ref.planes14_dequantize_rotated(w)
    else:
        want = ops.tetra48_matvec_prepared(xp, w, m_rows, config)
        got = ops.tetra48_matvec_prepared(xp, w, m_rows, config, limbs=lb)
        dense = ref.tetra48_dequantize_rotated(w)
    assert torch.equal(got, want)
    assert ref.row_bound_error(got, x, dense) <= 1e-5


def _two_rows(d_out: int, n_blocks: int, dev: str):
    ops = _ops()
    return ops.m1_config(d_out, n_blocks, torch.device(dev), m_rows=2)


@interp
@pytest.mark.parametrize(("d_out", "d_in", "m_rows", "planes14"), [
    (40, 256, 1, False),  # one K-slice, a 16-column tail
    (24, 1560, 2, False),  # two K-slices (33 pairs), two rows in one launch
    (40, 256, 1, True),
])
def test_m1_loads_the_limb_records(d_out: int, d_in: int, m_rows: int, planes14: bool) -> None:
    """The ``m1`` kernel that loads the limb records (``LIMBS``) gives bit for bit the output of
    the one that converts the prepared rows (Tetra and Planes14; one and two activation rows)."""
    config = _two_rows(d_out, d_in // 24, "cpu") if m_rows > 1 else None
    _matvec_case(d_out, d_in, m_rows, planes14, "cpu", config)


@pytest.mark.gpu
@pytest.mark.parametrize(("d_out", "d_in", "m_rows", "planes14"), [
    (6144, 4096, 1, False), (4096, 12288, 1, False), (6144, 4096, 2, False),
    (4096, 4096, 1, True), (24576, 4096, 2, True),
])
def test_m1_limbs_on_gpu(d_out: int, d_in: int, m_rows: int, planes14: bool) -> None:
    """As the interpreter test, at Qwen3-8B shapes in the serving geometry."""
    _matvec_case(d_out, d_in, m_rows, planes14, "cuda")


@interp
def test_limb_records_reject_what_they_cannot_serve() -> None:
    ops = _ops()
    order = ops.tetra_kernel_tables("cpu").order
    with pytest.raises(UnsupportedShape, match="one group"):
        ops.rotate(torch.randn(1, 96), generate_rotation(96, 3), prepared_order=order,
                   limbs=ops.m1_limbs(4, "cpu"))
    rot = generate_rotation(128, 1)
    with pytest.raises(InvalidInput, match="one-launch prepared"):
        ops.rotate(torch.randn(1, 128), rot, limbs=ops.m1_limbs(5, "cpu"))
    with pytest.raises(InvalidInput, match="limbs"):  # two rows need two record rows
        ops.rotate(torch.randn(2, 128), rot, prepared_order=order, limbs=ops.m1_limbs(5, "cpu"))
    with pytest.raises(InvalidInput, match="limbs"):
        ops.rotate(torch.randn(1, 128), rot, prepared_order=order,
                   limbs=ops.m1_limbs(5, "cpu").float())
    from leechq.formats.layouts.tetra48 import random_tetra48

    w = random_tetra48(24, 128, seed=1)
    xp = ops.prepare_activation(torch.randn(1, 128), w.n_blocks, order)
    with pytest.raises(InvalidInput, match="limbs"):
        ops.tetra48_matvec_prepared(xp, w, 1, limbs=ops.m1_limbs(200, "cpu"))


_COMPILE_SCRIPT = r"""
from leechq.kernels.triton import introspect as I
from leechq.kernels.triton import ops
from leechq.kernels.triton.activation import rotate_prepared_kernel
from leechq.kernels.triton.tetra48_m1 import m1_kernel

M1 = I.M1_SIGNATURE
ROT = I.ROTATE_PREPARED_SIGNATURE
aligned = ("d_out", "stride_x", "stride_y", "stride_l")
sizes = {}
for limbs in (False, True):
    for mb, ilp, cap in ((1, 2, ops.M1_MAXNREG), (2, 2, 0)):
        c = I.compile_for(m1_kernel, M1, dict(
            N_BLOCKS=170, TAIL_COLS=16, ROWS=32, NW=4, BP=32, USE_ASM=True, ILP=ilp, MB=mb,
            PDL=True, LIMBS=limbs), num_warps=4, maxnreg=cap, aligned_ints=aligned)
        res = I.resource_usage(c)
        assert res.get("local", 0) == 0 and res.get("stack", 0) == 0, (limbs, mb, res)
        mix = I.hot_loop_mix(I.sass(c))
        assert not {"STS", "BAR", "STSM"} & set(mix["loop"]), (limbs, mb, mix["loop"])
        sizes[(limbs, mb)] = mix["kernel_total"]
assert sizes[(True, 1)] < sizes[(False, 1)] and sizes[(True, 2)] < sizes[(False, 2)], sizes
c = I.compile_for(rotate_prepared_kernel, ROT, dict(
    N=4096, N_BLOCKS=170, NPP=128, PR=128, K=1, MW=4096, LOG2M=12, TC=False, PRE=1, HDT=1,
    SPLITS=8, PDL=True, LIMBS=True), num_warps=8)
res = I.resource_usage(c)
assert res.get("local", 0) == 0 and res.get("stack", 0) == 0, res
print("ok", sizes)
"""


def test_limb_kernels_compile_without_local_memory() -> None:
    """Offline for sm_90 (Triton's own ptxas, in a subprocess without ``TRITON_INTERPRET``): the
    ``m1`` kernel that loads limb records and the rotation that writes them (Qwen3-8B's 4096
    width, the serving geometry: one row under the register cap, two rows) use no local memory,
    keep Triton's shared memory out of the hot loop (it holds the staged table), and the loading
    kernel is shorter than the converting one."""
    pytest.importorskip("triton")
    out = run_offline(_COMPILE_SCRIPT, timeout=900)
    assert out.strip().startswith("ok"), out[-2000:]


@interp
def test_a_failed_limb_check_converts_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the first-use check of the kernel on limb records fails (simulated), the matvec
    drops the records and its launches convert the prepared rows: the same output."""
    ops = _ops()
    from leechq.formats.layouts.tetra48 import random_tetra48

    w = random_tetra48(40, 256, seed=5)
    order = ops.tetra_kernel_tables("cpu").order
    xp = ops.prepare_activation(torch.randn(1, 256), w.n_blocks, order)
    lb = ref.m1_limb_records(xp, w.n_blocks)
    want = ops.tetra48_matvec_prepared(xp, w, 1)
    enabled = ops.m1_enabled
    monkeypatch.setattr(ops, "m1_enabled", lambda device, cfg, check=None: (
        check is not ops._check_m1_limbs and enabled(device, cfg, check)))
    seen = []
    launch = ops._launch_m1

    def recorded(*args, **kwargs):
        seen.append(kwargs.get("limbs"))
        return launch(*args, **kwargs)

    monkeypatch.setattr(ops, "_launch_m1", recorded)
    assert torch.equal(ops.tetra48_matvec_prepared(xp, w, 1, limbs=lb), want)
    assert seen == [None]
