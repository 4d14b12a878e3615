"""The pure-torch reference twins: exact against the canonical dequantization and the layouts."""

from __future__ import annotations

import numpy as np
import torch

from leechq.formats.layouts import planes14, tetra48
from leechq.formats.quantized_weight import QuantizedWeight
from leechq.formats.rotation import generate_rotation
from leechq.kernels import reference as ref
from leechq.kernels.tables import tetra_kernel_tables, tetra_pattern_split
from leechq.lattice.classes import ball_size


def _f32_exact(t: torch.Tensor) -> torch.Tensor:
    """A float64 tensor whose values are f32-representable (so f32 device copies are exact)."""
    return t.to(torch.float32).to(torch.float64)


def test_tetra48_reference_matches_canonical_dequantization() -> None:
    g = torch.Generator().manual_seed(0)
    d_out, d_in = 6, 5 * 24 + 9
    qw = QuantizedWeight(
        "tetra", d_out, d_in, torch.randint(0, 2**47, (d_out, 5), generator=g),
        torch.randint(0, 2, (d_out, 5), generator=g, dtype=torch.uint8),
        _f32_exact(torch.rand(d_out, generator=g, dtype=torch.float64) + 0.5),
        _f32_exact(torch.tensor([0.75, 1.25], dtype=torch.float64)),
        torch.randn(d_out, 9, generator=g),
    )
    w = tetra48.pack(qw)
    assert torch.equal(ref.tetra48_dequantize_rotated(w), qw.dequantize_rotated())
    x = torch.randn(3, d_in, generator=g)
    want = (x.double() @ qw.dequantize_rotated().T).float()
    assert torch.equal(ref.tetra48_matvec(x, w), want)


def test_planes14_reference_matches_canonical_dequantization() -> None:
    rng = np.random.default_rng(1)
    d_out, d_in = 4, 3 * 24 + 1
    labels = torch.from_numpy(rng.integers(0, ball_size(12) + 1, size=(d_out, 3)).astype(np.int64))
    qw = QuantizedWeight(
        "ball", d_out, d_in, labels, torch.from_numpy(rng.integers(0, 2, (d_out, 3)).astype(np.uint8)),
        _f32_exact(torch.from_numpy(rng.random(d_out) + 0.5)),
        _f32_exact(torch.tensor([0.75, 1.25], dtype=torch.float64)),
        torch.from_numpy(rng.standard_normal((d_out, 1)).astype(np.float32)),
    )
    w = planes14.pack(qw)
    got = ref.planes14_dequantize_rotated(w)
    want = qw.dequantize_rotated()
    # 1/sqrt(16 m) (class shell) and 1/sqrt(‖y‖²) are the same number for lattice points.
    assert torch.equal(got, want)


def test_planes14_f16_twin_is_the_rotated_blocks_rounded() -> None:
    """``planes14_dequantize_f16`` is the f64 block matrix without σ_row in natural order, as the
    kernels round it: the block scale to float16 (half a unit), then each exact product once
    (half a unit): within one fp16 unit."""
    w = planes14.random_planes14(6, 7 * 24 + 4, seed=3)
    got = ref.planes14_dequantize_f16(w)
    assert got.dtype == torch.float16 and got.shape == (6, 7 * 24)
    blocks = ref.planes14_dequantize_rotated(w)[:, : 7 * 24] / w.row_scales.double()[:, None]
    assert torch.allclose(got.double(), blocks, rtol=2**-10 + 2**-21, atol=0.0)


def test_dequant_group_columns_layout() -> None:
    """The grouped dequantized layout is a permutation of whole 8-column sections; within a group
    the even blocks' sections come section-major, pair-minor (lane ``j`` of a warp stores unit
    ``j`` of each run), then the odd blocks' — also for a short last group with an odd block
    count; a width of whole groups is groups of 6 × 32 units."""
    for n_blocks in (1, 2, 9, 64, 65, 170, 171, 512):
        cols = ref.dequant_group_columns(n_blocks)
        assert sorted(cols.tolist()) == list(range(24 * n_blocks)), n_blocks
        unit = cols.view(-1, 8)
        assert torch.equal(unit - unit[:, :1], torch.arange(8).expand_as(unit))
        assert bool((unit[:, 0] % 8 == 0).all())
    units = ref.dequant_group_columns(9)[::8] // 8  # 5 pairs, the last without its odd block
    block, section = units // 3, units % 3
    assert block.tolist() == [0, 2, 4, 6, 8] * 3 + [1, 3, 5, 7] * 3
    assert section.tolist() == [0] * 5 + [1] * 5 + [2] * 5 + [0] * 4 + [1] * 4 + [2] * 4
    units = ref.dequant_group_columns(130)[::8] // 8  # 65 pairs: groups of 32, 32, 1
    assert (units[:192] // 3).tolist()[:33] == [*range(0, 64, 2), 0]
    assert (units[192 * 2:] // 3).tolist() == [128] * 3 + [129] * 3


def test_prepare_activation_index_map() -> None:
    torch.manual_seed(2)
    nb, d_in = 5, 5 * 24 + 3
    x = torch.randn(3, d_in)
    order = tetra_kernel_tables("cpu").order
    xp = ref.prepare_activation(x, nb, order)
    npp = ref.prepared_pairs(nb)
    assert xp.shape == (4, 48 * npp + 32) and npp == 64
    for b in range(nb):
        for t in (0, 7, 23):
            pos = ((b & 1) * 24 + t) * npp + (b >> 1)
            assert torch.equal(xp[:3, pos], x[:, 24 * b + int(order[t])])
    assert torch.equal(xp[:3, 48 * npp : 48 * npp + 3], x[:, 120:])
    assert not xp[3].any()  # padded activation row
    # every slot that holds no activation is 0: total mass is conserved
    assert torch.allclose(xp.abs().sum(), x.abs().sum())


def test_unprepare_activation_inverts_prepare() -> None:
    """Natural order back from the prepared layout, exactly, for Tetra's trio order and the
    natural one; odd and even block counts, with and without a tail."""
    torch.manual_seed(4)
    for order in (tetra_kernel_tables("cpu").order, torch.arange(24, dtype=torch.int32)):
        for m_rows, d_in in ((3, 5 * 24 + 3), (1, 4 * 24), (2, 24 + 31)):
            x = torch.randn(m_rows, d_in)
            xp = ref.prepare_activation(x, d_in // 24, order)
            assert torch.equal(ref.unprepare_activation(xp, m_rows, d_in, order), x)


def test_rotate_reference_is_orthogonal() -> None:
    rot = generate_rotation(72, 11)
    x = torch.randn(2, 72, dtype=torch.float64)
    y = ref.rotate(x, rot)
    assert torch.allclose(y.double().norm(dim=1), x.norm(dim=1), rtol=1e-6)


def test_pattern_split_is_linear() -> None:
    cw = tetra_pattern_split()  # asserts the split against the trellis on all 4096 inputs
    assert cw[0] == 0 and cw.dtype == np.uint32 and not cw[160:].any()


def test_row_bound_error() -> None:
    """The kernels' measure: exact outputs score 0, an error is divided by Σ|w·x| of its row, and
    a non-finite (unwritten) output scores infinity rather than vanishing in a max."""
    w = torch.tensor([[1.0, -2.0], [0.5, 0.0]], dtype=torch.float64)
    x = torch.tensor([[3.0, 1.0]])
    y = (x.double() @ w.T).float()
    assert ref.row_bound_error(y, x, w) == 0.0
    assert ref.row_bound_error(y + torch.tensor([[0.5, 0.0]]), x, w) == 0.5 / 5.0
    assert ref.row_bound_error(torch.full_like(y, float("nan")), x, w) == float("inf")
    assert ref.row_bound_error(y, x, w.half()) == 0.0  # any float matrix, compared in f64


def test_reference_matvec_dispatches_on_each_registered_layout() -> None:
    """Every registered layout has a reference matvec in the dispatch table (``choose`` keyed on
    the record's ``layout``), and it computes the canonical product exactly from that layout's
    bytes: the ``tetra64`` record (a ``Tetra64Weight``) gives the ``tetra48`` one's numbers."""
    from leechq.formats import layouts
    from leechq.kernels.select import Request, choose

    g = torch.Generator().manual_seed(5)
    d_out, d_in = 5, 4 * 24 + 3
    for name in layouts.names():
        lay = layouts.get(name)
        high = 2**47 if lay.codebook == "tetra" else ball_size(12) + 1
        qw = QuantizedWeight(
            lay.codebook, d_out, d_in, torch.randint(0, high, (d_out, 4), generator=g),
            torch.randint(0, 2, (d_out, 4), generator=g, dtype=torch.uint8),
            _f32_exact(torch.rand(d_out, generator=g, dtype=torch.float64) + 0.5),
            _f32_exact(torch.tensor([0.75, 1.25], dtype=torch.float64)),
            torch.randn(d_out, 3, generator=g),
        )
        w = lay.pack(qw)
        assert type(w) is lay.record and w.layout == name
        k = choose(Request(w.layout, 3, d_out=d_out, d_in=d_in, tail_cols=d_in % 24), "reference")
        x = torch.randn(3, d_in, generator=g)
        want = (x.double() @ qw.dequantize_rotated().T).float()
        assert torch.equal(k.function(w.layout)(x, w), want), name
