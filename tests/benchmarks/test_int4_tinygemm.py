"""The int4 tinygemm baseline of the benchmarks (``benchmarks/int4_tinygemm.py``): its coding,
its packing (through the op's CPU twin) and the module swap."""

from __future__ import annotations

import pytest
import torch
from bench_scripts import load_script


@pytest.fixture(scope="module")
def tg():
    return load_script("int4_tinygemm")


def test_codes_round_each_group_to_its_nearest_level(tg) -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 2 * tg.GROUP, generator=g)
    q, table = tg.quantize(w)
    assert q.dtype == torch.int32 and int(q.min()) >= 0 and int(q.max()) <= 15
    assert table.shape == (2, 16, 2)
    err = (tg.dequantize(q, table) - w).abs()
    # each value within half a step of its group's scale; the group's ends are levels 0 and 15
    step = table[..., 0].T.repeat_interleave(tg.GROUP, dim=1)
    assert bool((err <= step / 2 + 1e-6).all())
    assert bool((q.reshape(16, 2, -1).amin(-1) == 0).all())
    assert bool((q.reshape(16, 2, -1).amax(-1) == 15).all())


def test_packed_product_matches_the_dequantized_weight(tg) -> None:
    g = torch.Generator().manual_seed(1)
    lin = torch.nn.Linear(256, 48)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 256, generator=g))
        lin.bias.copy_(torch.randn(48, generator=g))
    m = tg.Int4Linear.from_linear(lin)
    x = torch.randn(3, 5, 256, generator=g)
    q, table = tg.quantize(lin.weight.detach())
    want = x.double() @ tg.dequantize(q, table).double().T + lin.bias.detach().double()
    got = m(x)
    assert got.shape == (3, 5, 48)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-4)


def test_bad_shapes_are_refused(tg) -> None:
    with pytest.raises(ValueError, match="groups of 128"):
        tg.quantize(torch.randn(8, 100))
    with pytest.raises(ValueError, match="n % 16"):
        tg.pack(torch.zeros(12, 128, dtype=torch.int32))


def test_swap_replaces_every_linear(tg) -> None:
    net = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(),
                              torch.nn.Sequential(torch.nn.Linear(128, 16)))
    assert tg.swap_linears(net) == 2
    assert all(not isinstance(m, torch.nn.Linear) for m in net.modules())
    assert net(torch.randn(2, 128)).shape == (2, 16)
