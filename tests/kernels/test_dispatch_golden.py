"""Which entry of the dispatch table runs a lattice matvec call, by row count: rows 1..128 of
``tetra48``, ``planes14`` and ``tetra64`` matrices, on a GPU (``TRITON_INTERPRET`` unset, CUDA
reported available: what the table sees on CUDA) and under the interpreter. The expected values
are written out, not computed by the code under test: the int8 tensor-core kernel for 3..16 rows
of a matrix with a coded block (GPU only), several rows on the many-row ``m1`` on a GPU only, the
tiled kernel for a matrix with no coded block, a serving group's float16 dequantized copy from 17
rows (Planes14: where its dequantization kernel is enabled); ``tetra64`` is read by ``m1`` and
the int8 kernel only (by the int8 kernel alone under 24-bit activations)."""

from __future__ import annotations

import pytest
import torch

from leechq.errors import KernelUnavailable
from leechq.kernels.select import Request, choose

pytest.importorskip("triton")
# imported under the interpreter (the test command's TRITON_INTERPRET=1), before any test unsets it
from leechq.kernels.triton import ops

ROWS = range(1, 129)
CUDA = torch.device("cuda")


def _where(monkeypatch: pytest.MonkeyPatch, interp: bool) -> None:
    monkeypatch.delenv("LEECHQ_DISABLE_KERNELS", raising=False)
    if interp:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def _names(layout: str, n_blocks: int, **kw) -> list[str]:
    out = []
    for m in ROWS:
        try:
            out.append(choose(Request(layout, m, CUDA, n_blocks=n_blocks, **kw)).name)
        except KernelUnavailable:
            out.append("-")
    return out


@pytest.mark.parametrize("interp", [False, True])
@pytest.mark.parametrize("n_blocks", [0, 1, 40])
@pytest.mark.parametrize("layout", ["tetra48", "planes14"])
def test_matvec_rows(monkeypatch: pytest.MonkeyPatch, interp: bool, n_blocks: int,
                     layout: str) -> None:
    _where(monkeypatch, interp)
    got = _names(layout, n_blocks)
    if n_blocks == 0:
        want = ["tiled"] * 128
    elif interp:
        want = ["m1"] + ["tiled"] * 127
    else:
        want = ["m1"] * 2 + ["imma"] * 14 + ["m1"] * 112
    assert got == want


@pytest.mark.parametrize("interp", [False, True])
@pytest.mark.parametrize("p14_dense", [False, True])
@pytest.mark.parametrize("layout", ["tetra48", "planes14"])
def test_group_rows(monkeypatch: pytest.MonkeyPatch, interp: bool, p14_dense: bool,
                    layout: str) -> None:
    """A serving group's rows (it can multiply a dequantized copy): on a GPU both codebooks take
    the float16 tensor-core GEMM for 3..64 rows and the copy above (Planes14 where its
    dequantization kernel is enabled, else the matvec); under the interpreter the lattice
    matvec's entries, then the copy from 17 rows."""
    _where(monkeypatch, interp)
    monkeypatch.setattr(ops, "planes14_dense_enabled", lambda device: p14_dense)
    got = _names(layout, 40, dense_copy=True)
    no_copy = layout == "planes14" and not p14_dense
    if interp:
        want = ["m1"] + ["tiled"] * 15 + (["tiled"] if no_copy else ["dense-f16"]) * 112
    else:
        want = ["m1"] * 2 + ["gemm-f16"] * 62 + (["m1"] if no_copy else ["dense-f16"]) * 64
    assert got == want


@pytest.mark.parametrize("interp", [False, True])
@pytest.mark.parametrize("a16", [True, False])
def test_tetra64_rows(monkeypatch: pytest.MonkeyPatch, interp: bool, a16: bool) -> None:
    _where(monkeypatch, interp)
    got = _names("tetra64", 40, a16=a16)
    ref = "reference-tetra48-matvec"  # reads both Tetra layouts: where no kernel does
    if not a16:
        want = ["imma"] * 16 + [ref] * 112
    elif interp:
        want = ["m1"] * 128
    else:
        want = ["m1"] * 2 + ["imma"] * 14 + ["m1"] * 112
    assert got == want
    assert _names("tetra64", 0, a16=a16) == [ref] * 128  # no coded block: no kernel reads it
