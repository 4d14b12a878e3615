"""The batch-1 kernel's pattern-bits table for ``tetra64`` records (``tables.tetra_m1_bits_table``,
``tetra48_decode.decode_block64_bits_split``): the table gives every pattern entry's nibble masks
back; offline, the default decode's instruction, load and register counts. (Bit-exactness of the
``tetra64`` decode against the standard layout: ``test_tetra64.py``.)"""

from __future__ import annotations

import numpy as np
import pytest
from offline_compile import run_offline

from leechq.kernels import tables

@pytest.mark.parametrize("copies", [8, 16, 32])
def test_bits_table_layout(copies: int) -> None:
    """Rank rows as in the 16-byte table; entry ``a`` copy ``c`` of ``PA`` / ``PB`` at the
    documented words; every copy of an entry equal; the masks of each entry back from its bits,
    and the XOR of a ``PA`` and a ``PB`` word spreads to the XOR of their masks."""
    bits = tables.tetra_m1_bits_table_numpy(copies)
    std = tables.tetra_m1_table_numpy()
    assert bits.dtype == np.uint32 and bits.size == 4096 + 2 * 64 * copies
    assert np.array_equal(bits[:4096], std[:4096])
    pa = bits[4096:4096 + 64 * copies].reshape(64, copies)
    pb = bits[4096 + 64 * copies:].reshape(64, copies)
    assert (pa == pa[:, :1]).all() and (pb == pb[:, :1]).all()
    masks_a = std[tables.M1_PA_WORD:tables.M1_PB_WORD].reshape(64, tables.M1_COPIES, 4)[:, 0]
    masks_b = std[tables.M1_PB_WORD:].reshape(64, tables.M1_COPIES, 4)[:, 0]
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 64, 500), rng.integers(0, 64, 500)
    pp = pa[a, 0] ^ pb[b, 0]
    for k in range(3):
        spread = ((pp >> np.uint32(k)) & np.uint32(0x11111111)) * np.uint32(15)
        assert np.array_equal(spread, masks_a[a, k] ^ masks_b[b, k])
    with pytest.raises(ValueError, match="copies"):
        tables.tetra_m1_bits_table_numpy(4)


_SASS = """
from leechq.kernels.triton import introspect as I
from leechq.kernels.triton.tetra48_m1 import m1_kernel
ce = dict(N_BLOCKS=170, TAIL_COLS=16, ROWS=112, NW=4, BP=32, USE_ASM=True, ILP=2, MB=1,
          A16=True, CODE=3, PDL=True)
c = I.compile_for(m1_kernel, I.M1_SIGNATURE, ce, num_warps=4,
                  aligned_ints=("d_out", "stride_x", "stride_y"))
text = I.sass(c)
mix = I.hot_loop_mix(text)
print(mix["loop_total"], mix["loop"].get("LDS", 0), mix["loop"].get("IDP", 0),
      I.resource_usage(c).get("registers", 0), I.resource_usage(c).get("local", 0))
"""


def test_bits_offline() -> None:
    """Offline sm_90 compile of the tetra64 kernel as launched by default (two rows per trip,
    one activation row, gate|up width, PDL): 20 shared loads and 48 ``dp4a`` per loop trip, no
    local memory, at most 96 registers (five programs per SM)."""
    pytest.importorskip("triton")
    total, lds, idp, regs, local = (int(v) for v in run_offline(_SASS, timeout=900).split()[-5:])
    assert lds == 20 and idp == 48 and local == 0, (total, lds, idp, regs, local)
    assert regs <= 96, regs
