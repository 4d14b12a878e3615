"""The batch-1 kernel's L2 prefetch (``m1_kernel`` ``PF``, ``tetra48_m1.prefetch_program``,
``_bits.prefetch_l2``, the switch ``ops.m1_prefetch``).

* In the interpreter, ``prefetch_span``: the ``NS`` programs of a row chunk ask for consecutive,
  disjoint shares of its rows that together are exactly the chunk's rows inside the matrix.
* The switch: off under the interpreter and on a CPU tensor; ``LEECHQ_M1_PREFETCH`` read per call.
* Offline for sm_90 (Triton's own ptxas): with ``PF`` the PTX has two bulk L2 prefetches, both
  before ``griddepcontrol.wait``; the ``tetra64`` launch keeps its 96 registers, its hot loop's
  instruction count and no local memory; without ``PF`` there is no prefetch.
* On the GPU: full shapes give the same output bit for bit with and without the prefetch.
"""

from __future__ import annotations

import os

import pytest
import torch
from offline_compile import run_offline

from leechq.formats.layouts.tetra48 import random_tetra48
from leechq.formats.layouts.tetra64 import to_tetra64
from leechq.kernels import reference as ref

triton = pytest.importorskip("triton")
tl = triton.language

from leechq.kernels.triton.tetra48_m1 import prefetch_span  # noqa: E402

interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                            reason="the Triton interpreter (TRITON_INTERPRET=1) is off")


def _ops():  # imported lazily: TRITON_INTERPRET must be set before triton compiles anything
    from leechq.kernels.triton import ops

    return ops


@triton.jit
def _spans(out_ptr, d_out, NS: tl.constexpr, ROWS: tl.constexpr):
    c = tl.program_id(0)
    sl = tl.program_id(1)
    a, b = prefetch_span(c, sl, d_out, NS, ROWS)
    tl.store(out_ptr + (c * NS + sl) * 2, a)
    tl.store(out_ptr + (c * NS + sl) * 2 + 1, b)


@interp
@pytest.mark.parametrize(("d_out", "rows", "ns"), [(112, 112, 3), (100, 32, 3), (4096, 56, 8),
                                                    (24, 8, 8), (5, 64, 1), (1000, 24, 7)])
def test_prefetch_spans_cover_each_chunk_once(d_out: int, rows: int, ns: int) -> None:
    chunks = -(-d_out // rows)
    out = torch.full((chunks, ns, 2), -1, dtype=torch.int32)
    _spans[(chunks, ns)](out, d_out, NS=ns, ROWS=rows)
    for c in range(chunks):
        covered = []
        for s in range(ns):
            a, b = out[c, s].tolist()
            assert c * rows <= a <= b <= min(d_out, c * rows + rows), (c, s, a, b)
            covered += range(a, b)
        assert covered == list(range(c * rows, min(d_out, c * rows + rows))), c


def test_prefetch_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never on a CPU tensor or under the interpreter; the variable is read on every call."""
    ops = _ops()
    for value in (None, "1", "0"):
        if value is None:
            monkeypatch.delenv("LEECHQ_M1_PREFETCH", raising=False)
        else:
            monkeypatch.setenv("LEECHQ_M1_PREFETCH", value)
        assert not ops.m1_prefetch(torch.device("cpu"))
    if torch.cuda.is_available() and not ops.interpreting():
        major = torch.cuda.get_device_capability()[0]
        monkeypatch.setenv("LEECHQ_M1_PREFETCH", "1")
        assert ops.m1_prefetch(torch.device("cuda")) == (major >= 9)
        monkeypatch.setenv("LEECHQ_M1_PREFETCH", "0")
        assert not ops.m1_prefetch(torch.device("cuda"))


_OFFLINE = r"""
from leechq.kernels.triton import introspect as I
from leechq.kernels.triton.tetra48_m1 import m1_kernel
out = []
for code, pbits in ((3, 8), (1, 0), (0, 0)):
    for pf in (False, True):
        ce = dict(N_BLOCKS=170, TAIL_COLS=16, ROWS=112, NW=4, BP=32, USE_ASM=True, ILP=2, MB=1,
                  A16=True, CODE=code, PDL=True, PBITS=pbits, PF=pf)
        c = I.compile_for(m1_kernel, I.M1_SIGNATURE, ce, num_warps=4,
                          aligned_ints=("d_out", "stride_x", "stride_y", "stride_l"))
        body = [ln.split("//")[0].strip().replace(" ;", ";") for ln in c.asm["ptx"].splitlines()]
        wait = body.index("griddepcontrol.wait;")
        pref = [i for i, ln in enumerate(body) if "cp.async.bulk.prefetch.L2.global" in ln]
        late = sum(1 for i in pref if i > wait)
        use = I.resource_usage(c)
        out += [len(pref), late, I.hot_loop_mix(I.sass(c))["loop_total"],
                use.get("registers", 0), use.get("local", 0)]
print(*out)
"""


def test_prefetch_offline() -> None:
    v = [int(s) for s in run_offline(_OFFLINE, timeout=900).split()[-30:]]
    for k in range(3):
        off, on = v[10 * k:10 * k + 5], v[10 * k + 5:10 * k + 10]
        assert off[0] == 0 and on[0] == 2 and on[1] == 0, (k, off, on)  # both before the wait
        assert off[4] == 0 and on[4] == 0, (k, off, on)
    t64_off, t64_on = v[0:5], v[5:10]
    assert t64_on[3] <= 96 and t64_on[2] == t64_off[2], (t64_off, t64_on)


@pytest.mark.gpu
@pytest.mark.parametrize(("d_out", "d_in"), [(6144, 4096), (24576, 4096), (4096, 12288),
                                             (5120, 17408), (24, 24 * 213 + 8)])
def test_prefetch_full_shapes(monkeypatch: pytest.MonkeyPatch, d_out: int, d_in: int) -> None:
    """On the GPU, tetra64 (the served default) and Planes14 at batch 1: the same output bit for
    bit with and without the prefetch (NaN-poisoned outputs), within the f64 bound."""
    ops = _ops()
    monkeypatch.setenv("LEECHQ_A16", "1")
    w = random_tetra48(d_out, d_in, seed=d_in + 1, device="cuda")
    t = to_tetra64(w)
    x = torch.randn(1, d_in, device="cuda") * 3
    xp = ops.prepare_activation(x, w.n_blocks, ops.tetra_kernel_tables("cuda").order)
    cfg = ops.m1_config(d_out, w.n_blocks, xp.device, w.tail_cols, 1, t64=True)
    got = {}
    for pf in ("0", "1"):
        monkeypatch.setenv("LEECHQ_M1_PREFETCH", pf)
        got[pf] = torch.full((1, d_out), float("nan"), device="cuda")
        ops.tetra48_matvec_prepared(xp, t, 1, cfg, out=got[pf])
    assert torch.equal(got["0"], got["1"])
    assert ref.row_bound_error(got["1"], ref.round_activation(x, w.n_blocks),
                               ref.tetra48_dequantize_rotated(t)) <= 1e-5
    from leechq.formats.layouts.planes14 import random_planes14

    p = random_planes14(d_out, d_in, seed=d_in + 2, device="cuda")
    out = {}
    for pf in ("0", "1"):
        monkeypatch.setenv("LEECHQ_M1_PREFETCH", pf)
        out[pf] = ops.planes14_matvec(x, p)
    assert torch.equal(out["0"], out["1"]) and not out["1"].isnan().any()
