"""The batch-1 kernel's first trip decoded before the grid wait (``m1_kernel`` ``PEEL``,
``tetra48_m1._pair_decode64`` / ``_pair_dot_decoded64``, the switch ``ops.t64_peel``).

* Under the interpreter: the output equals the unpeeled launch bit for bit — one trip per chunk
  (the peeled trip is also the chunk's last, so it takes the ticket), several trips, programs
  that walk several chunks, one and two rows per trip, one, two and four activation rows, odd
  block counts, tails and short K-slices — and stays within the f64 bound.
* Offline for sm_90: the first trip's shared-memory lookups come before ``griddepcontrol.wait``
  and no ``dp4a`` does; no local memory and at most the unpeeled kernel's registers.
* On the GPU: full shapes bit for bit against the unpeeled launch.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch
from offline_compile import run_offline

from leechq.formats.layouts.tetra48 import random_tetra48
from leechq.formats.layouts.tetra64 import to_tetra64
from leechq.kernels import reference as ref

interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                            reason="the Triton interpreter (TRITON_INTERPRET=1) is off")


def _ops():  # imported lazily: TRITON_INTERPRET must be set before triton compiles anything
    pytest.importorskip("triton")
    from leechq.kernels.triton import ops

    return ops


def _case(monkeypatch: pytest.MonkeyPatch, d_out: int, d_in: int, m_rows: int, device: str):
    ops = _ops()
    monkeypatch.setenv("LEECHQ_A16", "1")
    w = random_tetra48(d_out, d_in, seed=5 * d_in + m_rows, device=device)
    g = torch.Generator(device=device).manual_seed(d_out + 11 * m_rows)
    x = torch.randn(m_rows, d_in, generator=g, device=device) * 3
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables(device).order)
    return ops, to_tetra64(w), x, xp


def _run(ops, monkeypatch, t, xp, m_rows, cfg, peel: str) -> torch.Tensor:
    monkeypatch.setenv("LEECHQ_T64_PEEL", peel)
    got = torch.full((m_rows, t.d_out), float("nan"), device=xp.device)
    ops.tetra48_matvec_prepared(xp, t, m_rows, cfg, out=got)
    return got


@interp
@pytest.mark.parametrize(("d_out", "d_in", "m_rows", "rows", "ilp", "ctas"), [
    (40, 24 * 9 + 5, 1, 8, 2, 0),     # one trip per chunk: the peeled trip takes the ticket
    (40, 24 * 70, 1, 16, 1, 1),       # three K-slices (the last short), several trips of one
                                      # row, programs walk chunks
    (33, 24 * 5 + 1, 3, 8, 2, 1),     # four rows per launch (three real), several one-trip
                                      # chunks per program
])
def test_peel_matches(monkeypatch: pytest.MonkeyPatch, d_out: int, d_in: int, m_rows: int,
                      rows: int, ilp: int, ctas: int) -> None:
    ops, t, x, xp = _case(monkeypatch, d_out, d_in, m_rows, "cpu")
    cfg = replace(ops.m1_config(d_out, t.n_blocks, xp.device, t.tail_cols, m_rows), rows=rows,
                  ilp=ilp, ctas_per_sm=ctas)
    want = _run(ops, monkeypatch, t, xp, m_rows, cfg, "0")
    assert ref.row_bound_error(want, ref.round_activation(x, t.n_blocks),
                               ref.tetra48_dequantize_rotated(t)) <= 1e-5
    assert torch.equal(_run(ops, monkeypatch, t, xp, m_rows, cfg, "1"), want)
    if not ctas:  # the 16-byte pattern entries too
        monkeypatch.setenv("LEECHQ_T64_PBITS", "0")
        assert torch.equal(_run(ops, monkeypatch, t, xp, m_rows, cfg, "1"), want)


def test_peel_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = _ops()
    monkeypatch.delenv("LEECHQ_T64_PEEL", raising=False)
    assert ops.t64_peel() is ops.T64_PEEL
    monkeypatch.setenv("LEECHQ_T64_PEEL", "1")
    assert ops.t64_peel()
    monkeypatch.setenv("LEECHQ_T64_PEEL", "0")
    assert not ops.t64_peel()


_OFFLINE = r"""
from leechq.kernels.triton import introspect as I
from leechq.kernels.triton.tetra48_m1 import m1_kernel
out = []
for peel in (False, True):
    ce = dict(N_BLOCKS=170, TAIL_COLS=16, ROWS=112, NW=4, BP=32, USE_ASM=True, ILP=2, MB=1,
              A16=True, CODE=3, PDL=True, PBITS=8, PEEL=peel)
    c = I.compile_for(m1_kernel, I.M1_SIGNATURE, ce, num_warps=4,
                      aligned_ints=("d_out", "stride_x", "stride_y", "stride_l"))
    body = [ln.split("//")[0].strip().replace(" ;", ";") for ln in c.asm["ptx"].splitlines()]
    pre = body[:body.index("griddepcontrol.wait;")]
    use = I.resource_usage(c)
    out += [sum("ld.shared" in ln for ln in pre), sum("dp4a" in ln for ln in pre),
            use.get("registers", 0), use.get("local", 0)]
print(*out)
"""


def test_peel_offline() -> None:
    """Two rows per trip of a 170-block row, the 8-copy bits table: 5 lookups per block, so 20
    more shared loads before the wait (the four blocks of the first trip)."""
    pytest.importorskip("triton")
    off, on = (lambda v: (v[:4], v[4:]))([int(s) for s in run_offline(_OFFLINE).split()[-8:]])
    assert on[0] - off[0] == 20 and off[1] == on[1] == 0, (off, on)
    assert on[3] == off[3] == 0 and on[2] <= off[2], (off, on)


@pytest.mark.gpu
@pytest.mark.parametrize(("d_out", "d_in"), [(6144, 4096), (4096, 4096), (24576, 4096),
                                             (4096, 12288), (5120, 17408), (24, 24 * 213 + 8)])
def test_peel_full_shapes(monkeypatch: pytest.MonkeyPatch, d_out: int, d_in: int) -> None:
    """On the GPU, the library's tetra64 geometry at real shapes: peeled and unpeeled launches
    give the same output bit for bit (NaN-poisoned), within the f64 bound."""
    ops, t, x, xp = _case(monkeypatch, d_out, d_in, 1, "cuda")
    cfg = ops.m1_config(d_out, t.n_blocks, xp.device, t.tail_cols, 1, t64=True)
    want = _run(ops, monkeypatch, t, xp, 1, cfg, "0")
    got = _run(ops, monkeypatch, t, xp, 1, cfg, "1")
    assert torch.equal(got, want)
    assert ref.row_bound_error(got, ref.round_activation(x, t.n_blocks),
                               ref.tetra48_dequantize_rotated(t)) <= 1e-5
