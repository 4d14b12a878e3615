"""``LeechqGroup``: the fused lattice run (one rotation, one launch per part) against the dense
reference through the Triton interpreter on the CPU (``TRITON_INTERPRET=1``), member segments,
groups of finalized modules sharing one copy, and the ``tetra64`` type in a group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from leechq_tiny import int4_record, lattice_record
from torch import nn

from leechq.errors import InvalidInput
from leechq.formats.rotation import generate_rotation
from leechq.kernels.tuning import DENSE_MIN_ROWS
from leechq.nn.group import LeechqGroup
from leechq.nn.linear import LeechqLinear
from leechq.serve.build import execution_paths
from leechq.serve.random_codes import random_int4, random_tetra

pytestmark = pytest.mark.interp


def _members() -> list[LeechqLinear]:
    q = lattice_record("tetra", 32, 56, seed=1, rotation_seed_value=9)
    k = lattice_record("tetra", 16, 56, seed=2, rotation_seed_value=9)
    v = int4_record(16, 56, seed=3)
    mods = [LeechqLinear.from_record(r, bias=torch.randn(r.d_out)) for r in (q, k, v)]
    for m in mods:
        m.finalize("cpu")
    return mods


def test_group_rows_are_member_rows() -> None:
    """Members on the dense path (the CPU): no fused run, the rows of the group are the rows of
    its members in order; q and k (one rotation) share a slot."""
    members = _members()
    group = LeechqGroup.from_modules(members)
    assert isinstance(group, LeechqGroup) and group.out_features == 64 and group.in_features == 56
    assert group.segments == [0, 1, 2] and group.execution is None and not group.parts
    assert not group.fuses_pre_ops(1)
    with pytest.raises(InvalidInput, match="one rotated fused run"):
        group.forward_silu_mul(torch.randn(1, 112), torch.float32)
    x = torch.randn(2, 3, 56)
    ref = torch.cat([m(x) for m in members], dim=-1)
    torch.testing.assert_close(group(x), ref, rtol=0, atol=0)


def test_single_member_and_errors() -> None:
    members = _members()
    assert LeechqGroup.from_modules(members[:1]) is members[0]
    with pytest.raises(InvalidInput, match="d_in"):
        LeechqGroup([members[0], torch.nn.Linear(48, 8)])
    with pytest.raises(InvalidInput, match="at least one"):
        LeechqGroup.from_modules([])


@pytest.mark.interp
def test_group_rotates_once_under_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """q and k on the fused path (one rotation) become one fused run: one rotation launch per
    call of the group, the members' numbers (each member now reads its rows of the run)."""
    from leechq.kernels.triton import ops_rotate

    members = _members()[:2]
    for m in members:
        m.finalize("cpu", torch.float32, prefer="fused")
    x = torch.randn(2, 56)
    before = torch.cat([m(x) for m in members], dim=-1)
    calls = []
    rotate = ops_rotate.rotate
    monkeypatch.setattr(ops_rotate, "rotate", lambda *a, **k: calls.append(1) or rotate(*a, **k))
    group = LeechqGroup.from_modules(members)
    assert isinstance(group, LeechqGroup) and group.segments == [-1]  # one fused run
    assert group.execution.members == 2 and len(group.parts) == 1
    y = group(x)
    assert len(calls) == 1
    assert (y - before).abs().max().item() <= 1e-5 * before.abs().max().item()


def _records(rotated: bool, d_in: int = 72) -> list[Any]:
    g = torch.Generator().manual_seed(0)
    rot = generate_rotation(d_in, 5) if rotated else None  # 72 = 8·9: a Hadamard and Q_odd part
    return [random_tetra(16, d_in, g, rot), random_tetra(8, d_in, g, rot)]


def _fused(records: list[Any], biases: list[Any]) -> LeechqGroup:
    """The records as one fused run (``prefer="fused"``: the interpreter's Triton kernels)."""
    group = LeechqGroup.from_records(records, "cpu", torch.float32, prefer="fused", biases=biases)
    assert isinstance(group, LeechqGroup) and group.segments == [-1]
    return group


def _reference(x: torch.Tensor, records: list[Any], biases: list[Any]) -> torch.Tensor:
    return torch.cat(
        [F.linear(x, r.dequantize(torch.float32), b) for r, b in zip(records, biases, strict=True)],
        dim=-1,
    )


def _a16_slack(xr: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """How far 16-bit activations (``ops_common.A16``, the integer kernels' default) may move each output
    of ``xr [M, d_in] @ dense [d_out, d_in]ᵀ`` (both in the rotated basis): each coordinate of a
    block by at most 2^-14 of the block's largest |value| (``reference.round_activation``), i.e.
    ``Σ_b 2^-14·max_b|x|·Σ_{j∈b}|w_j|``; float64 [M, d_out]."""
    nb = xr.shape[1] // 24
    mx = xr.double()[:, : 24 * nb].reshape(xr.shape[0], nb, 24).abs().amax(dim=2)
    wsum = dense.double().abs()[:, : 24 * nb].reshape(dense.shape[0], nb, 24).sum(dim=2)
    return 2.0 ** -14 * mx @ wsum.T


def _records_slack(x: torch.Tensor, records: list[Any]) -> torch.Tensor:
    """:func:`_a16_slack` of each record (its input rotated as the kernels see it), side by side
    as :func:`_reference` puts the outputs."""
    from leechq.formats.rotation import apply_rotation

    return torch.cat([_a16_slack(apply_rotation(x.double(), r.rotation) if r.rotation is not None
                                 else x, r.dequantize_rotated()) for r in records], dim=-1)


def _within(y: torch.Tensor, ref: torch.Tensor, tol: float, slack: torch.Tensor) -> bool:
    """``|y − ref| ≤ tol·max|ref| + slack`` for every output (``slack``: :func:`_records_slack`,
    for the rows the integer kernels serve on 16-bit activations)."""
    return bool(((y - ref).abs().double() <= tol * ref.abs().max().item() + slack).all())


@pytest.mark.parametrize("rotated", [True, False])
@pytest.mark.parametrize("rows", [3, 11, 20])
def test_group_from_records_matches_reference(monkeypatch: pytest.MonkeyPatch, rotated: bool,
                                              rows: int) -> None:

    recs = _records(rotated)
    biases = [torch.randn(16), None]
    group = _fused(recs, biases)
    assert group._many_rows(DENSE_MIN_ROWS - 1) is None  # the interpreter: no GEMM
    assert group._many_rows(DENSE_MIN_ROWS) == "dense-f16"
    assert execution_paths(group) == {"fused": 2}
    x = torch.randn(rows, 72, generator=torch.Generator().manual_seed(rows))
    y = group(x)
    ref = _reference(x, recs, biases)
    assert y.dtype == torch.float32 and y.shape == (rows, 24)
    # 3 and 11 rows run the lattice kernel (f32 accuracy; its one-row calls the integer m1 kernel
    # on 16-bit activations), 20 rows the float16 dequantized copy, as accurate as an fp16 model
    tol = 1e-5 if rows < 17 else 2e-3
    assert _within(y, ref, tol, _records_slack(x, recs))


@pytest.mark.parametrize(("rows", "path"), [(9, "matvec"), (8, "matvec"), (12, "matvec"),
                                           (17, "dense")])
def test_group_row_paths(monkeypatch: pytest.MonkeyPatch, rows: int, path: str) -> None:
    """Up to ``DENSE_MIN_ROWS - 1`` rows (16) take the lattice matvec (12 rows: an 8-row and a
    4-row call, the interpreter having no int8 kernel) and more the dequantized copy. Every path
    stays within its accuracy (f32 for the lattice kernel, fp16 otherwise)."""
    from leechq.kernels.triton import ops

    calls: list[str] = []
    for name, tag in (("tetra48_matmul_dense", "dense"), ("matmul_dense_ordered", "dense"),
                      ("tetra48_matvec_prepared", "matvec")):
        real = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, _r=real, _t=tag, **k: calls.append(_t)
                            or _r(*a, **k))
    recs = _records(True)
    biases = [torch.randn(16), None]
    group = _fused(recs, biases)
    x = torch.randn(rows, 72, generator=torch.Generator().manual_seed(rows))
    y = group(x)
    ref = _reference(x, recs, biases)
    assert set(calls) == {path}, calls
    tol = 1e-5 if path == "matvec" else 2e-3
    assert _within(y, ref, tol, _records_slack(x, recs))


@dataclass
class _Exec:
    path: str
    kernel: str


class _FinalizedStandIn(nn.Module):
    """What ``LeechqGroup.from_modules`` reads of a finalized fused ``LeechqLinear``: record,
    execution, plan."""

    def __init__(self, record: Any, bias: torch.Tensor | None) -> None:
        super().__init__()
        from leechq.kernels.select import plan_linear

        self.record = record
        self.bias = bias
        self._fused = plan_linear(record, torch.device("cpu"), torch.float32)
        self.execution = _Exec("fused", self._fused.kernel_name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._fused(x)
        return y if self.bias is None else y + self.bias


def test_group_from_finalized_modules_shares_one_concatenated_copy() -> None:

    recs = _records(True)
    g = torch.Generator().manual_seed(1)
    v = random_int4(8, 72, g, group=24)
    biases = [torch.randn(16), torch.randn(8)]
    mods = [_FinalizedStandIn(r, b) for r, b in zip(recs, biases, strict=True)]
    x = torch.randn(5, 72)
    before = [m(x) for m in mods]
    v_mod = nn.Linear(72, 8)  # a member without a fused kernel stays itself
    v_mod.weight.data = v.dequantize(torch.float32)
    fused = LeechqGroup.from_modules([*mods, v_mod])
    assert isinstance(fused, LeechqGroup) and fused.segments == [-1, 0]  # q|k fused, then v
    assert fused.members[0] is v_mod
    group = fused
    assert len(group.parts) == 1 and group.execution.members == 2  # one launch for q|k
    # the members now read row slices of the group's tensors: one copy in memory
    words = group.parts[0].words
    for m, off in zip(mods, (0, recs[0].d_out), strict=True):
        view = m._fused.tensors["words"]
        assert view.data_ptr() == words[off:].data_ptr()
        assert m._fused.packed["w"].words.data_ptr() == view.data_ptr()
    assert all(torch.equal(m(x), b) for m, b in zip(mods, before, strict=True))
    ref = torch.cat([_reference(x, recs, biases), v_mod(x)], dim=-1)
    y = fused(x)
    assert (y - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()
    assert not fused.fuses_pre_ops(1)  # a member beside the run: the pre-ops run on their own
    concat = _fused(recs, biases)(x)
    assert torch.equal(y[:, :24], concat)  # same bits as the group built from the records


def test_group_from_records_reference_path_on_cpu() -> None:

    recs = _records(True)
    v = random_int4(8, 72, torch.Generator().manual_seed(2), group=24)
    module = LeechqGroup.from_records([*recs, v], "cpu", torch.float32, prefer="auto")
    assert execution_paths(module) == {"dense": 3}
    x = torch.randn(2, 72)
    ref = torch.cat([_reference(x, recs, [None, None]), F.linear(x, v.dequantize())], dim=-1)
    assert (module(x) - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()


def test_group_rotation_equals_ops_rotate() -> None:
    from leechq.kernels.triton import ops_rotate
    from leechq.nn.group import _prepared_buffer

    group = _fused(_records(True), [None, None])
    x = torch.randn(3, 72, dtype=torch.float16)
    ours = _prepared_buffer(torch.device("cpu"), group.n_blocks, 3)
    group._fill(x, ours, group.order)
    theirs = torch.zeros_like(ours)
    ops_rotate.rotate(x, group.rot, prepared_order=group.order, out=theirs)
    assert torch.equal(ours, theirs)


def test_group_pre_ops_match_separate_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The residual add + RMSNorm and the SwiGLU computed inside the rotation launch give what the
    separate pieces followed by the group give: the same residual, outputs within the norm's one
    rounding of the narrowed input (the kernel sums the squares in its own order)."""
    from leechq.kernels.reference import rms_norm, silu_mul

    group = _fused(_records(True), [torch.randn(16), None])
    g = torch.Generator().manual_seed(4)
    x = torch.randn(1, 3, 72, generator=g).half()
    delta = torch.randn(1, 3, 72, generator=g)  # a fused group's float32 output
    weight = (1 + 0.2 * torch.randn(72, generator=g)).half()
    assert group.fuses_pre_ops(3)
    r, y = group.forward_add_norm(x, delta, weight, 1e-6)
    r_want = x + delta.half()
    y_want = group(rms_norm(r_want, weight, 1e-6))
    assert torch.equal(r, r_want) and y.shape == (1, 3, 24)
    assert (y - y_want).abs().max().item() <= 2e-3 * y_want.abs().max().item()
    r0, y0 = group.forward_add_norm(x, None, weight, 1e-6)
    assert r0.data_ptr() == x.data_ptr() and torch.equal(r0, x)  # no copy without delta
    y0_want = group(rms_norm(x, weight, 1e-6))
    assert (y0 - y0_want).abs().max().item() <= 2e-3 * y0_want.abs().max().item()
    gate_up = torch.randn(2, 144, generator=g) * 3
    ys = group.forward_silu_mul(gate_up, torch.float16)
    ys_want = group(silu_mul(gate_up, torch.float16))
    assert (ys - ys_want).abs().max().item() <= 2e-3 * ys_want.abs().max().item()
    # the many-row path (the dequantized copy from DENSE_MIN_ROWS rows) takes them too: the
    # rotation then writes natural order
    m = DENSE_MIN_ROWS
    assert group.fuses_pre_ops(m)
    xm = torch.randn(m, 72, generator=g).half()
    dm = torch.randn(m, 72, generator=g)
    rm, ym = group.forward_add_norm(xm, dm, weight, 1e-6)
    assert torch.equal(rm, xm + dm.half())
    ym_want = group(rms_norm(rm, weight, 1e-6))
    assert (ym - ym_want).abs().max().item() <= 2e-3 * ym_want.abs().max().item()
    gm = torch.randn(m, 144, generator=g) * 3
    ysm = group.forward_silu_mul(gm, torch.float16)
    ysm_want = group(silu_mul(gm, torch.float16))
    assert (ysm - ysm_want).abs().max().item() <= 2e-3 * ysm_want.abs().max().item()
    # where the group does not take a pre-op: no rotation
    plain = _fused(_records(False), [None, None])
    assert not plain.fuses_pre_ops(1)


@pytest.mark.parametrize(("rotated", "codebook"), [(True, "tetra"), (False, "tetra"),
                                                   (True, "ball")])
def test_group_rows_take_the_gemm(monkeypatch: pytest.MonkeyPatch, rotated: bool,
                                  codebook: str) -> None:
    """Where the table puts a Tetra or ball group's rows on ``gemm-f16`` (decided as on a GPU
    here): one GEMM call per part with all the rows (a rotated group from the rotation's float16
    output in the copy's column order, an unrotated one from natural order), within float16
    accuracy of the f64 reference; with the entry disabled the rows go back to the matvec."""
    from leechq.kernels import select
    from leechq.kernels.triton import ops

    monkeypatch.setattr(select, "_interpreter_costs", lambda: False)
    calls = []
    name = "matmul_gemm_ordered" if rotated else "matmul_gemm"
    gemm = getattr(ops, name)

    def counted(x, w, *a, **k):
        calls.append((int(x.shape[0]), x.dtype))
        return gemm(x, w, *a, **k)

    monkeypatch.setattr(ops, name, counted)
    recs = _records(rotated) if codebook == "tetra" else _ball_records(rotated)
    biases = [torch.randn(16), None]
    group = _fused(recs, biases)
    x = torch.randn(5, 72, generator=torch.Generator().manual_seed(5))
    ref = _reference(x, recs, biases)
    assert group._many_rows(5) == "gemm-f16"
    y = group(x)
    assert calls == [(5, torch.float16 if rotated else torch.float32)] * len(group.parts)
    assert y.shape == (5, 24) and (y - ref).abs().max().item() <= 2e-3 * ref.abs().max().item()
    monkeypatch.setenv("LEECHQ_DISABLE_KERNELS", "gemm-f16")
    assert group._many_rows(5) is None


def _ball_records(rotated: bool, d_in: int = 72) -> list[Any]:
    from leechq.serve.random_codes import random_ball

    g = torch.Generator().manual_seed(1)
    rot = generate_rotation(d_in, 5) if rotated else None
    return [random_ball(16, d_in, g, rot), random_ball(8, d_in, g, rot)]


@pytest.mark.parametrize(("rotated", "rows"), [(True, 1), (True, 3), (False, 2), (True, 11)])
def test_ball_group_matches_reference(rotated: bool, rows: int) -> None:
    """Ball records group as Tetra ones do: one concatenated Planes14 part, one rotation into the
    prepared layout of the kernel that serves the rows (the batch-1 ``m1`` kernel for one row
    here, the tiled one for several under the interpreter; 11 rows = 8 + 3), f32 accuracy."""

    recs = _ball_records(rotated)
    biases = [None, torch.randn(8)]
    group = _fused(recs, biases)
    assert group.layout == "planes14" and len(group.parts) == 1
    assert group.execution.kernel == "triton-planes14-matvec"
    x = torch.randn(rows, 72, generator=torch.Generator().manual_seed(rows))
    y = group(x)
    ref = _reference(x, recs, biases)
    assert y.dtype == torch.float32 and y.shape == (rows, 24)
    assert _within(y, ref, 1e-5, _records_slack(x, recs))


def test_ball_group_many_rows_take_the_dense_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """From ``DENSE_MIN_ROWS`` rows (here lowered to 20) a ball group multiplies a float16
    dequantized copy of its part on the BLAS (``ops.matmul_dense_ordered`` after the rotation
    wrote the copy's column order, calls counted): within fp16 accuracy of the f64 reference;
    where the copy's first-use check failed (``ops.planes14_dense_enabled`` False) the matvec
    keeps the rows (f32 accuracy, no dense call)."""
    from leechq.kernels import select
    from leechq.kernels.triton import ops

    calls = []
    dense = ops.matmul_dense_ordered

    def counted(x, w):
        calls.append(int(x.shape[0]))
        return dense(x, w)

    monkeypatch.setattr(ops, "matmul_dense_ordered", counted)
    recs = _ball_records(True)
    biases = [None, torch.randn(8)]
    group = _fused(recs, biases)
    monkeypatch.setattr(select, "DENSE_MIN_ROWS", 20)
    x = torch.randn(20, 72, generator=torch.Generator().manual_seed(4))
    ref = _reference(x, recs, biases)
    y = group(x)
    assert calls == [20] and y.shape == (20, 24)
    assert (y - ref).abs().max().item() <= 2e-3 * ref.abs().max().item()
    monkeypatch.setattr(ops, "planes14_dense_enabled", lambda device: False)
    select.clear_memo()  # the table read the check's verdict: choose again
    y = group(x)
    assert calls == [20]
    assert (y - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()
    assert group.fuses_pre_ops(19) and group.fuses_pre_ops(20)


def test_ball_group_pre_ops_and_mixed_codebooks() -> None:
    """A rotated ball group takes the norm and the SwiGLU into its rotation launch at any row
    count (the prepared layout for its matvec, natural order for its dequantized copy); Tetra and
    ball records never share a group."""
    from leechq.kernels.reference import rms_norm, silu_mul
    from leechq.nn.group import pack_records

    group = _fused(_ball_records(True), [None, None])
    assert group.fuses_pre_ops(1) and group.fuses_pre_ops(DENSE_MIN_ROWS)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1, 72, generator=g).half()
    delta = torch.randn(1, 72, generator=g)
    weight = (1 + 0.2 * torch.randn(72, generator=g)).half()
    r, y = group.forward_add_norm(x, delta, weight, 1e-6)
    y_want = group(rms_norm(r, weight, 1e-6))
    assert torch.equal(r, x + delta.half())
    assert (y - y_want).abs().max().item() <= 2e-3 * y_want.abs().max().item()
    gate_up = torch.randn(1, 144, generator=g) * 3
    ys = group.forward_silu_mul(gate_up, torch.float16)
    ys_want = group(silu_mul(gate_up, torch.float16))
    assert (ys - ys_want).abs().max().item() <= 2e-3 * ys_want.abs().max().item()
    with pytest.raises(InvalidInput, match="mix codebooks"):
        LeechqGroup(fused=pack_records([_records(True)[0], _ball_records(True)[0]],
                                       [None, None], "cpu"))
    # on the CPU (no fused kernels) the records stay separate reference modules
    mixed = LeechqGroup.from_records([_records(True)[0], _ball_records(True)[0]], "cpu",
                                     torch.float32)
    assert isinstance(mixed, LeechqGroup) and mixed.segments == [0, 1]
    assert execution_paths(mixed) == {"dense": 2}


def test_ball_group_from_finalized_modules_shares_one_copy() -> None:
    """``LeechqGroup.from_modules`` over fused ball ``LeechqLinear`` modules: one Planes14 run
    whose members read row views of its concatenated records, computing what they did (2 rows:
    tiled)."""

    recs = _ball_records(True)
    mods = [_FinalizedStandIn(r, None) for r in recs]
    assert all("planes14" in m.execution.kernel for m in mods)
    x = torch.randn(2, 72)
    before = [m(x) for m in mods]
    group = LeechqGroup.from_modules(mods)
    assert isinstance(group, LeechqGroup) and group.layout == "planes14"
    assert len(group.parts) == 1 and group.execution.members == 2
    records = group.parts[0].records
    assert mods[1]._fused.tensors["records"].data_ptr() == records[recs[0].d_out:].data_ptr()
    assert all(torch.equal(m(x), b) for m, b in zip(mods, before, strict=True))
    y = group(x)
    ref = _reference(x, recs, [None, None])
    assert (y - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()


def test_group_from_modules_serves_tetra64(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where ``ops.t64_serving`` says so, a group of finalized members holds one ``tetra64``
    copy, the members' plans read row views of it, and the outputs are the standard layout's
    bit for bit."""
    from leechq.formats.layouts.tetra64 import Tetra64Weight
    from leechq.kernels.triton import ops

    recs = _records(True)
    biases = [torch.randn(16), torch.randn(8)]
    x = torch.randn(1, 72, generator=torch.Generator().manual_seed(3))
    want = _fused(recs, biases)(x)
    monkeypatch.setattr(ops, "t64_serving", lambda device: True)
    mods = [_FinalizedStandIn(r, b) for r, b in zip(recs, biases, strict=True)]
    before = [m(x) for m in mods]
    group = LeechqGroup.from_modules(mods)
    assert isinstance(group, LeechqGroup) and type(group.parts[0]) is Tetra64Weight
    assert group.layout == "tetra64" and group.execution.kernel == "triton-tetra64-matvec"
    words = group.parts[0].words
    for m, off in zip(mods, (0, recs[0].d_out), strict=True):
        assert type(m._fused.packed["w"]) is Tetra64Weight
        assert m._fused.packed["w"].words.data_ptr() == words[off:].data_ptr()
    assert torch.equal(group(x), want)
    assert all(torch.equal(m(x), b) for m, b in zip(mods, before, strict=True))
    assert type(_fused(recs, biases).parts[0]) is Tetra64Weight


@pytest.mark.parametrize(("ball", "rows"), [(False, 3), (True, 11)])
def test_rotation_written_records_feed_the_int8_kernel(monkeypatch: pytest.MonkeyPatch,
                                                       ball: bool, rows: int) -> None:
    """Where the int8 kernel serves the rows (forced here: 3..16 rows; Tetra groups take the
    GEMM there unless it is disabled): the group's rotation (Planes14: the plain one; Tetra: its norm
    form) writes the activation records, no records launch runs, and the outputs equal the
    launch's (``_rotation_records`` patched to None) bit for bit; 11 rows go to the kernel in one call (two 8-row chunks of
    records); a 72-wide group (a rotation of several groups) keeps the launch."""
    from leechq.kernels import select
    from leechq.kernels.reference import rms_norm

    monkeypatch.setattr(select, "_interpreter_costs", lambda: False)  # the table as on a GPU
    monkeypatch.setenv("LEECHQ_DISABLE_KERNELS", "gemm-f16")  # Tetra's 3..16 rows: int8 then
    launches, calls = [], []
    from leechq.kernels.triton import ops_imma

    activation, matvec = ops_imma.imma_activation, ops_imma._matvec_imma

    def counted(*args, **kwargs):
        launches.append(1)
        return activation(*args, **kwargs)

    def called(*args, **kwargs):
        calls.append(args[5])  # the rows
        return matvec(*args, **kwargs)

    monkeypatch.setattr(ops_imma, "imma_activation", counted)
    monkeypatch.setattr(ops_imma, "_matvec_imma", called)
    recs = _ball_records(True, d_in=128) if ball else _records(True, d_in=128)
    biases = [None, torch.randn(8)]
    group = _fused(recs, biases)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(rows, 128, generator=g)
    weight = (1 + 0.2 * torch.randn(128, generator=g)).half()
    records = LeechqGroup._rotation_records
    monkeypatch.setattr(LeechqGroup, "_rotation_records", lambda self, *a: None)
    if ball:  # the plain rotation (the norm form is the Tetra case's)
        want = group(x)
        assert calls == [rows]  # one call (the parts concatenated by rows)
        monkeypatch.setattr(LeechqGroup, "_rotation_records", records)  # the default
        assert torch.equal(group(x), want) and len(launches) == 1  # the rotation wrote them
        return
    want_norm = group.forward_add_norm(x.half(), None, weight, 1e-6)[1]
    assert len(launches) == 1 and calls == [rows]
    monkeypatch.setattr(LeechqGroup, "_rotation_records", records)  # the default
    assert torch.equal(group.forward_add_norm(x.half(), None, weight, 1e-6)[1], want_norm)
    assert len(launches) == 1  # the rotation wrote them
    ref = _reference(rms_norm(x.half(), weight, 1e-6).float(), recs, biases)
    assert (want_norm - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()
    wide = _fused(_records(True), [None, None])
    wide(torch.randn(3, 72, generator=g))
    assert len(launches) == 2




def test_second_fused_run_becomes_a_nested_group() -> None:
    """Tetra q|k then a ball v (another layout): the first run is the group's fused run, the
    second a nested group of the same class; the rows are the members' rows in order."""
    tetra, ball = _records(True), _ball_records(True)
    recs, biases = [*tetra, ball[1]], [torch.randn(16), None, torch.randn(8)]
    group = LeechqGroup.from_records(recs, "cpu", torch.float32, prefer="fused", biases=biases)
    assert isinstance(group, LeechqGroup) and group.segments == [-1, 0]
    inner = group.members[0]
    assert isinstance(inner, LeechqGroup) and inner.layout == "planes14"
    assert group.layout == "tetra48" and group.out_features == 32
    assert execution_paths(group) == {"fused": 3} and not group.fuses_pre_ops(1)
    x = torch.randn(2, 72, generator=torch.Generator().manual_seed(9))
    y = group(x)
    ref = _reference(x, recs, biases)
    assert y.shape == (2, 32) and _within(y, ref, 1e-5, _records_slack(x, recs))
    assert torch.equal(y[:, 24:], inner(x))
