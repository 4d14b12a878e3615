"""Today's per-call kernel choice by row count, recorded before the choice moved into one table:
for rows 1..128, Tetra and Planes14, on a GPU (``TRITON_INTERPRET`` unset: what the decisions see
on CUDA) and under the interpreter. The expected values are written out, not computed by the code
under test: int8 tensor-core kernel for 3..16 rows of a matrix with a coded block (GPU only),
several rows on the many-row ``m1`` on a GPU only, a serving group's float16 dequantized copy from
17 rows (Planes14: where its dequantization kernel is enabled)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

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
    for layout in ("tetra48", "planes14"):
        w = SimpleNamespace(n_blocks=n_blocks, d_out=64, layout=layout)
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


def test_group_dense_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    from leechq.serve.fused import _matvec_rows

    assert [m for m in ROWS if not _matvec_rows(m)] == list(range(17, 129))
