"""Programmatic dependent launch (``ops.pdl_enabled``, ``_bits.await_previous_grid``).

On a GPU the PDL-launched kernels are checked by the GPU tests (``-m gpu``: the ``m1`` and
rotation kernels at full shapes, the served model graph == eager); here, without one:

* the host rule — never under the interpreter, on a CPU tensor or while ``torch.compile``
  traces — and the launch keywords;
* the compiled kernels, offline for sm_90 with Triton's own ptxas (in a subprocess without
  ``TRITON_INTERPRET``, so that the kernels are real ``JITFunction`` s): with ``PDL`` the PTX has
  one ``griddepcontrol.wait`` followed by ``griddepcontrol.launch_dependents``; in the ``m1``
  kernel the wait comes after the table is staged into shared memory and after the first weight
  words are loaded (that is what the early launch buys) and before any global store but those of
  the never-taken branch that reserves the shared memory; the rotation waits before its first
  load; without ``PDL`` there is no ``griddepcontrol`` at all.
"""

from __future__ import annotations

import pytest
import torch
from offline_compile import run_offline

pytest.importorskip("triton")

from leechq.kernels.triton import ops, ops_rotate


def test_pdl_never_off_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not ops.pdl_enabled(torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not ops.pdl_enabled(torch.device("cuda", 0))


def test_pdl_rule_on_a_hopper_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule with the device query answered (no GPU needed): capability 9 and later only, the
    off while Dynamo traces."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(ops, "PDL_AVAILABLE", True)
    monkeypatch.setattr(ops, "_PDL_DEVICES", {0: True, 1: False})
    dev = torch.device("cuda", 0)
    assert ops.pdl_enabled(dev)
    assert not ops.pdl_enabled(torch.device("cuda", 1))  # an Ampere card
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not ops.pdl_enabled(dev)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    monkeypatch.setattr(torch.version, "hip", "6.2")  # a ROCm build: no PTX grid control
    assert not ops.pdl_enabled(dev)
    monkeypatch.setattr(torch.version, "hip", None)
    assert ops.pdl_enabled(dev)
    monkeypatch.setattr(ops, "PDL_AVAILABLE", False)  # a Triton without grid dependency control
    assert not ops.pdl_enabled(dev)


def test_pdl_launch_keywords() -> None:
    """The constexpr always goes (Inductor rejects a call that leaves one to its default); the
    launch attribute only with it."""
    assert ops._pdl_launch(False) == {"PDL": False}
    assert ops._pdl_launch(True) == {"PDL": True, "launch_pdl": True}


_SCRIPT = r"""
import re
from leechq.kernels.triton import introspect as I
from leechq.kernels.triton.activation import rotate_prepared_kernel
from leechq.kernels.triton.tetra48_m1 import m1_kernel

M1 = I.M1_SIGNATURE
ROT = I.ROTATE_PREPARED_SIGNATURE


def ptx(kernel, sig, consts, warps=4):
    return I.compile_for(kernel, sig, consts, num_warps=warps).asm["ptx"]


def lines(text):
    return [ln.split("//")[0].strip().replace(" ;", ";") for ln in text.splitlines()]


def address(ln):
    return re.search(r"\[\s*(%rd\d+)", ln).group(1)


for pdl in (False, True):
    m1 = ptx(m1_kernel, M1, dict(N_BLOCKS=12, TAIL_COLS=5, ROWS=64, NW=4, BP=32, USE_ASM=True,
                                 ILP=2, MB=1, PDL=pdl))
    rot = ptx(rotate_prepared_kernel, ROT, dict(N=256, N_BLOCKS=10, NPP=64, PR=8, K=1, MW=256,
                                                LOG2M=8, TC=False, PDL=pdl))
    for name, text in (("m1", m1), ("rotation", rot)):
        seq = [ln for ln in lines(text) if ln.startswith("griddepcontrol")]
        if not pdl:
            assert not seq, (name, seq)
            continue
        assert seq == ["griddepcontrol.wait;", "griddepcontrol.launch_dependents;"], (name, seq)
    if pdl:
        body = lines(m1)
        wait = body.index("griddepcontrol.wait;")
        before = body[:wait]
        staged = max(i for i, ln in enumerate(before) if ln.startswith("st.shared"))
        table_loads = {address(ln) for ln in before if "ld.global.v4" in ln}
        word_loads = [ln for ln in before if "ld.global.b32" in ln]
        assert staged > 0 and len(table_loads) >= 16, "the table is staged before the wait"
        assert len(word_loads) >= 6, ("the first rows' words are loaded before the wait",
                                      word_loads)
        # the only global stores before the wait are those of the never-taken branch that
        # reserves the shared memory (stage_table's reserve_smem: back to the table's addresses)
        stores = [ln for ln in before if "st.global" in ln or "atom." in ln]
        assert all("st.global" in ln and address(ln) in table_loads for ln in stores), stores
        # the rotation waits before it reads anything
        rb = lines(rot)
        assert rb.index("griddepcontrol.wait;") < min(
            i for i, ln in enumerate(rb) if "ld.global" in ln)
print("ok")
"""


def test_pdl_kernels_compile_with_the_wait_in_place() -> None:
    out = run_offline(_SCRIPT)
    assert out.strip().endswith("ok"), out[-2000:]


class _Recorder:
    """Stands in for a Triton kernel: ``kernel[grid](*args, **kwargs)`` records the keywords."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append(kwargs)


def test_pdl_only_for_one_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ops.PDL_MAX_ROWS``: the prepared rotation and the ``m1`` launches of one activation row
    take PDL, those of two rows (and more) do not. The device rule answered yes, the kernels recorded instead of launched."""
    from leechq.formats.layouts.tetra48 import random_tetra48
    from leechq.formats.rotation import generate_rotation
    from leechq.kernels import reference as ref

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors pass the argument checks
    monkeypatch.setattr(ops, "pdl_enabled", lambda device: True)
    monkeypatch.setattr(ops_rotate, "pdl_enabled", lambda device: True)
    rot, m1 = _Recorder(), _Recorder()
    monkeypatch.setattr(ops_rotate, "rotate_prepared_kernel", rot)
    monkeypatch.setattr(ops, "m1_kernel", m1)
    order = ops.tetra_kernel_tables("cpu").order
    for rows in (1, 2):
        ops_rotate.rotate(torch.randn(rows, 128), generate_rotation(128, 1), prepared_order=order)
    assert [c.get("launch_pdl", False) for c in rot.calls] == [True, False]
    assert [c["PDL"] for c in rot.calls] == [True, False]
    w = random_tetra48(48, 128, seed=2)
    cfg = ops.m1_config(w.d_out, w.n_blocks, torch.device("cpu"), m_rows=2)
    for rows in (1, 2):
        xp = ref.prepare_activation(torch.randn(rows, 128), w.n_blocks, order)
        y = torch.empty(rows, w.d_out)
        ops._launch_m1("tetra48", xp, w, y, cfg, rows)
    assert [c["PDL"] for c in m1.calls] == [True, False]
