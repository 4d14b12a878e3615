"""The dispatch table (``select.KERNELS``, ``select.choose``): every reason listed when nothing
fits, ``LEECHQ_DISABLE_KERNELS`` and ``prefer=``, the memo and what drops it, a shape the ``m1``
geometry cannot take going to the next entry, and a refused entry (a failed first-use check)
falling through the table."""

from __future__ import annotations

import pytest
import torch

from leechq.errors import InvalidInput, KernelUnavailable
from leechq.kernels import select
from leechq.kernels.select import Request, choose

pytest.importorskip("triton")
# imported under the interpreter (the test command's TRITON_INTERPRET=1), before any test unsets it
from leechq.kernels.triton import ops

CUDA = torch.device("cuda")
CPU = torch.device("cpu")


def _gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decide as on a GPU (no interpreter; the tensors are never touched)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("LEECHQ_DISABLE_KERNELS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_one_table_best_first() -> None:
    names = [k.name for k in select.KERNELS]
    assert names[:5] == ["gemm-f16", "dense-f16", "imma", "m1", "tiled"]
    assert names.index("triton-rotate") < names.index("reference-rotate")
    first_ref = names.index("reference-tetra48-matvec")
    assert all(k.backend == "reference" for k in select.KERNELS[first_ref:])


def test_nothing_fits_lists_every_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpu(monkeypatch)
    with pytest.raises(KernelUnavailable) as err:
        choose(Request("tetra64", 17, CUDA, n_blocks=4, a16=False), "triton")
    msg = str(err.value)
    for why in ("dense-f16: the caller holds no dequantized copy", "imma: 17 rows > 16",
                "m1: decodes tetra64 with 16-bit activations only"):
        assert why in msg
    assert "tiled" not in msg  # it serves no tetra64: not a candidate
    with pytest.raises(KernelUnavailable) as err:  # CPU tensors, no interpreter
        choose(Request("tetra64", 1, CPU, n_blocks=4), "triton")
    for name in ("gemm-f16", "dense-f16", "imma", "m1"):
        assert f"{name}: tensors on cpu (needs CUDA, or TRITON_INTERPRET=1)" in str(err.value)
    # the reference reads both Tetra layouts
    assert choose(Request("tetra64", 1, CPU, n_blocks=4)).name == "reference-tetra48-matvec"
    with pytest.raises(KernelUnavailable, match="no entry serves op 'gemm'"):
        choose(Request("tetra48", 1, CUDA, op="gemm"))


def test_disable_env_var_falls_to_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpu(monkeypatch)
    req = Request("tetra48", 8, CUDA, n_blocks=4)
    assert choose(req).name == "imma"
    monkeypatch.setenv("LEECHQ_DISABLE_KERNELS", "imma")
    assert choose(req).name == "m1"
    monkeypatch.setenv("LEECHQ_DISABLE_KERNELS", "imma, m1")
    assert choose(Request("tetra48", 1, CUDA, n_blocks=4)).name == "tiled"
    monkeypatch.setenv("LEECHQ_DISABLE_KERNELS", "triton-tetra48-matvec")  # a family
    assert choose(req).name == "reference-tetra48-matvec"
    assert choose(Request("planes14", 8, CUDA, n_blocks=4)).name == "imma"
    monkeypatch.setenv("LEECHQ_DISABLE_KERNELS", "triton-tetra48-matvec,reference-tetra48-matvec")
    with pytest.raises(KernelUnavailable) as err:
        choose(req)
    assert "imma: disabled by LEECHQ_DISABLE_KERNELS" in str(err.value)
    assert "reference-tetra48-matvec: disabled by LEECHQ_DISABLE_KERNELS" in str(err.value)


def test_memo_and_its_invalidation(monkeypatch: pytest.MonkeyPatch) -> None:
    """A choice is made once per request; a new ``LEECHQ_DISABLE_KERNELS`` or ``TRITON_INTERPRET``
    drops the memo, and so does ``clear_memo`` (what a test that patches a rule calls)."""
    _gpu(monkeypatch)
    calls = []
    real = select.Int8.can_implement.__func__

    def counted(cls, req):
        calls.append(req.rows)
        return real(cls, req)

    monkeypatch.setattr(select.Int8, "can_implement", classmethod(counted))
    req = Request("tetra48", 4, CUDA, n_blocks=4)
    assert choose(req).name == "imma" and choose(req).name == "imma"
    assert calls == [4]  # the second call came from the memo
    monkeypatch.setenv("LEECHQ_DISABLE_KERNELS", "m1")
    assert choose(req).name == "imma" and calls == [4, 4]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert choose(req).name == "tiled" and calls == [4, 4, 4]
    monkeypatch.delenv("TRITON_INTERPRET")
    assert choose(req).name == "imma" and calls == [4, 4, 4, 4]
    monkeypatch.setattr(select, "IMMA_MIN_ROWS", 5)  # a patched rule: stale until cleared
    assert choose(req).name == "imma" and calls == [4, 4, 4, 4]
    select.clear_memo()
    assert choose(req).name == "tiled" and calls == [4, 4, 4, 4, 4]


def test_prefer(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpu(monkeypatch)
    req = Request("tetra48", 4, CUDA, n_blocks=4)
    assert choose(req, "triton").name == "imma"
    assert choose(req, "auto").name == "imma"
    assert choose(req, "m1").name == "m1"
    assert choose(req, "reference").name == "reference-tetra48-matvec"
    with pytest.raises(KernelUnavailable, match="imma: 20 rows > 16"):
        choose(Request("tetra48", 20, CUDA, n_blocks=4), "imma")
    with pytest.raises(InvalidInput, match="prefer"):
        choose(req, "fastest")


def test_geometry_refused_shape_goes_to_the_next_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """More output rows than the ``m1`` kernel's tickets track at its largest chunk: ``m1``
    refuses with the count, the tiled kernel takes the call; a matrix with no coded block
    likewise."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    huge = ops.TICKET_SLOTS * 256 + 1
    req = Request("tetra48", 1, CPU, n_blocks=4, d_out=huge)
    ok, why = select.M1.can_implement(req)
    assert not ok and f"{huge} rows make" in why
    assert choose(req).name == "tiled"
    assert choose(Request("tetra48", 1, CPU, n_blocks=4, d_out=ops.TICKET_SLOTS * 32)).name == "m1"
    assert choose(Request("planes14", 1, CPU, n_blocks=0)).name == "tiled"


def test_refused_entry_falls_through_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpu(monkeypatch)
    req = Request("planes14", 2, CUDA, n_blocks=4)
    assert choose(req).name == "m1"
    select.refuse("m1", req, "the kernel failed its first-use check on cuda")
    assert choose(req).name == "tiled"
    four = Request("planes14", 4, CUDA, n_blocks=4)
    select.refuse("m1", four, "failed")
    with pytest.raises(KernelUnavailable, match="reads Planes14 from the m1 activation order"):
        choose(four, "imma")
    assert choose(four).name == "tiled"
    assert choose(Request("planes14", 2, CUDA, n_blocks=5)).name == "m1"  # another request
    assert choose(req, skip=frozenset({"tiled"})).name == "reference-planes14-matvec"


@pytest.mark.interp
def test_failed_first_use_check_warns_and_chooses_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``m1`` kernel's first-use check failing (forced here) warns, naming the kernel, marks
    ``m1`` unusable for the request, and the call runs the next entry (the tiled kernel) — the
    right product all the same."""
    from leechq.formats.layouts.tetra48 import random_tetra48
    from leechq.kernels import reference as ref
    from leechq.kernels.triton import ops_path

    monkeypatch.setattr(ops_path, "_m1_verdict", lambda device, cfg, check: check(device, cfg))
    monkeypatch.setattr(ops, "_launch_m1", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("broken m1")))
    w = random_tetra48(8, 2 * 24 + 5, seed=1)
    x = torch.randn(1, w.d_in, generator=torch.Generator().manual_seed(1))
    with pytest.warns(UserWarning, match=r"batch-1 Tetra kernel \(m1\).*broken m1.*chooses again"):
        y = ops.tetra48_matvec(x, w)
    assert ops.matvec_path(w, 1) == ("tiled", None)
    want = (x.double() @ ref.tetra48_dequantize_rotated(w).T).float()
    assert torch.allclose(y, want, rtol=1e-5, atol=1e-5)


def test_a_layers_path_is_computed_once_per_row_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ops.matvec_path`` keeps its answer (entry and ``m1`` launch groups) per request: the
    second call of a row count neither chooses nor plans again; a new ``LEECHQ_DISABLE_KERNELS``
    does both again."""
    from leechq.formats.layouts.tetra48 import random_tetra48

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("LEECHQ_DISABLE_KERNELS", raising=False)
    plans, chosen = [], []
    m1_plan, real_choose = ops.m1_plan, select.choose
    monkeypatch.setattr(ops, "m1_plan", lambda *a, **k: plans.append(1) or m1_plan(*a, **k))
    monkeypatch.setattr(select, "choose", lambda *a, **k: chosen.append(1) or real_choose(*a, **k))
    w = random_tetra48(8, 2 * 24 + 5, seed=1)
    first = ops.matvec_path(w, 1)
    assert first[0] == "m1" and ops.matvec_path(w, 1) == first
    assert (len(plans), len(chosen)) == (1, 1)
    assert ops.matvec_path(w, 2) == ("tiled", None) and (len(plans), len(chosen)) == (1, 2)
    monkeypatch.setenv("LEECHQ_DISABLE_KERNELS", "m1")
    assert ops.matvec_path(w, 1) == ("tiled", None) and (len(plans), len(chosen)) == (1, 3)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["tetra48", "planes14"])
def test_on_a_gpu_each_call_runs_the_chosen_entry(layout: str) -> None:
    """On the GPU: 1..2 rows take ``m1`` (its launch groups passed their first-use checks),
    3..8 the int8 kernel, a matrix with no coded block the tiled kernel, with no warning (a
    first-use fallback would warn), and every product within 1e-5 of Σ|w·x| of the f64 one."""
    import warnings

    from leechq.formats.layouts.planes14 import random_planes14
    from leechq.formats.layouts.tetra48 import random_tetra48
    from leechq.kernels import reference as ref

    dev = torch.device("cuda")
    make, matvec, dequantize = (
        (random_tetra48, ops.tetra48_matvec, ref.tetra48_dequantize_rotated)
        if layout == "tetra48" else
        (random_planes14, ops.planes14_matvec, ref.planes14_dequantize_rotated))
    w = make(1024, 40 * 24 + 5, seed=3, device=dev)
    dense = dequantize(w)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for m, want in ((1, "m1"), (2, "m1"), (3, "imma"), (8, "imma")):
            name, plan = ops.matvec_path(w, m)
            assert name == want, (m, name)
            assert (plan is not None) == (want == "m1" or layout == "planes14")
            x = torch.randn(m, w.d_in, device=dev, generator=torch.Generator(dev).manual_seed(m))
            assert ref.row_bound_error(matvec(x, w), x, dense) <= 1e-5, m
        if layout == "tetra48":
            tail = make(64, 11, seed=4, device=dev)
            assert ops.matvec_path(tail, 1) == ("tiled", None)
            x = torch.randn(1, 11, device=dev)
            assert ref.row_bound_error(matvec(x, tail), x, dequantize(tail)) <= 1e-5
