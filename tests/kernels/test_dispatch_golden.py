"""Today's per-call kernel choice by row count, recorded before the choice moved into one table:
for rows 1..128, Tetra and Planes14, on a GPU (``TRITON_INTERPRET`` unset: what the decisions see
on CUDA) and under the interpreter. The expected values are written out, not computed by the code
under test: int8 tensor-core kernel for 3..16 rows of a matrix with a coded block (GPU only),
several rows on the many-row ``m1`` on a GPU only, a serving group's float16 dequantized copy from
17 rows (Planes14: where its dequantization kernel is enabled)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

ROWS = range(1, 129)


@pytest.mark.parametrize("interp", [False, True])
@pytest.mark.parametrize("n_blocks", [0, 1, 40])
def test_int8_kernel_rows(monkeypatch: pytest.MonkeyPatch, interp: bool, n_blocks: int) -> None:
    from leechq.kernels.triton import ops

    if interp:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for layout in ("tetra48", "tetra64", "planes14"):
        data = SimpleNamespace(device=torch.device("cuda"))  # what the decision reads of it
        w = SimpleNamespace(n_blocks=n_blocks, layout=layout,
                            **{"records" if layout == "planes14" else "words": data})
        got = [m for m in ROWS if ops.imma_default(w, m)]
        want = [] if interp or n_blocks == 0 else list(range(3, 17))
        assert got == want, (layout, interp, n_blocks)


@pytest.mark.parametrize("interp", [False, True])
def test_many_row_m1(monkeypatch: pytest.MonkeyPatch, interp: bool) -> None:
    from leechq.kernels.triton import ops

    if interp:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert ops._many_row_m1_default() is (not interp)


@pytest.mark.parametrize("interp", [False, True])
@pytest.mark.parametrize("p14_dense", [False, True])
def test_group_dense_rows(monkeypatch: pytest.MonkeyPatch, interp: bool, p14_dense: bool) -> None:
    """A serving group's rows: the float16 copy from 17 (Planes14: where its dequantization kernel
    is enabled), the lattice matvec below (the call itself then picks int8 / m1 / tiled)."""
    from leechq.kernels.triton import ops
    from leechq.nn.group import LeechqGroup

    if interp:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(ops, "planes14_dense_enabled", lambda device: p14_dense)
    for layout in ("tetra48", "tetra64", "planes14"):
        part = SimpleNamespace(device=torch.device("cuda"))
        group = SimpleNamespace(layout=layout, parts=[part], n_blocks=40)
        dense = [m for m in ROWS if not LeechqGroup._matvec_path(group, m)]
        want = [] if layout == "planes14" and not p14_dense else list(range(17, 129))
        assert dense == want, (layout, interp, p14_dense)
