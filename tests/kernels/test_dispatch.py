"""The per-call path table (``select.PATHS``): its choice per (layout, rows, device), the
``LEECHQ_DISABLE_KERNELS`` fall-through with reasons, the preference, and the error that lists
every path's reason."""

from __future__ import annotations

import pytest
import torch

from leechq.errors import InvalidInput, KernelUnavailable
from leechq.kernels import select
from leechq.kernels.select import Request, choose_path

pytest.importorskip("triton")

CUDA = torch.device("cuda")


def _gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decide as on a GPU (no interpreter; the tensors are never touched)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("LEECHQ_DISABLE_KERNELS", raising=False)


@pytest.mark.parametrize("layout", ["tetra48", "planes14"])
def test_choice_per_rows_on_a_gpu(monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    from leechq.kernels.triton import ops

    _gpu(monkeypatch)
    monkeypatch.setattr(ops, "planes14_dense_enabled", lambda device: True)
    names = [choose_path(Request(layout, m, CUDA, n_blocks=40)).name for m in range(1, 41)]
    assert names == ["m1"] * 2 + ["imma"] * 14 + ["m1"] * 24  # a single matvec: no copy
    group = [choose_path(Request(layout, m, CUDA, n_blocks=40, dense_copy=True)).name
             for m in (1, 2, 3, 16, 17, 128)]
    assert group == ["m1", "m1", "imma", "imma", "dense-f16", "dense-f16"]
    assert choose_path(Request(layout, 8, CUDA, n_blocks=0)).name == "m1"  # tail only


def test_choice_under_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("LEECHQ_DISABLE_KERNELS", raising=False)
    cpu = torch.device("cpu")
    assert choose_path(Request("tetra48", 1, cpu, n_blocks=4)).name == "m1"
    assert choose_path(Request("tetra48", 5, cpu, n_blocks=4)).name == "tiled"
    assert choose_path(Request("tetra48", 17, cpu, n_blocks=4, dense_copy=True)).name == "dense-f16"


def test_disabled_path_falls_to_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpu(monkeypatch)
    monkeypatch.setenv("LEECHQ_DISABLE_KERNELS", "imma")
    assert choose_path(Request("tetra48", 8, CUDA, n_blocks=4)).name == "m1"
    assert not select.path_allowed("imma", Request("tetra48", 8, CUDA, n_blocks=4))
    monkeypatch.setenv("LEECHQ_DISABLE_KERNELS", "imma,m1")
    assert choose_path(Request("tetra48", 1, CUDA, n_blocks=4)).name == "tiled"
    monkeypatch.setenv("LEECHQ_DISABLE_KERNELS", "imma,m1,tiled")
    with pytest.raises(KernelUnavailable) as err:
        choose_path(Request("tetra48", 8, CUDA, n_blocks=4))
    msg = str(err.value)
    assert "imma: disabled by LEECHQ_DISABLE_KERNELS" in msg
    assert "dense-f16: the caller holds no dequantized copy" in msg


def test_preference(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpu(monkeypatch)
    assert choose_path(Request("tetra48", 4, CUDA, n_blocks=4), "triton").name == "imma"
    with pytest.raises(KernelUnavailable, match="preference reference"):
        choose_path(Request("tetra48", 4, CUDA, n_blocks=4), "reference")
    with pytest.raises(InvalidInput, match="preference"):
        choose_path(Request("tetra48", 4, CUDA), "fastest")


def test_impossible_request_lists_every_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpu(monkeypatch)
    with pytest.raises(KernelUnavailable) as err:
        choose_path(Request("tetra48", 4, torch.device("cpu"), n_blocks=4))
    msg = str(err.value)
    for p in select.PATHS:
        assert f"{p.name}: tensors on cpu (needs CUDA, or TRITON_INTERPRET=1)" in msg
    with pytest.raises(KernelUnavailable, match="layout 'int4' is not"):
        choose_path(Request("int4", 4, CUDA))


def test_tetra64_under_24_bit_activations_takes_the_int8_kernel_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The int8 kernel is the only reader: 1..16 rows with a coded block, under the interpreter
    too; nothing else takes the request."""
    for interp in (False, True):
        if interp:
            monkeypatch.setenv("TRITON_INTERPRET", "1")
        else:
            _gpu(monkeypatch)
        for m in range(1, 17):
            req = Request("tetra48", m, CUDA, n_blocks=4, imma_only=True)
            assert choose_path(req).name == "imma"
        for m, n in ((17, 4), (1, 0)):
            with pytest.raises(KernelUnavailable, match="decodes tetra64 with 16-bit"):
                choose_path(Request("tetra48", m, CUDA, n_blocks=n, imma_only=True))
