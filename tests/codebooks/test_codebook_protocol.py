"""Conformance of every registered codebook to the Codebook protocol (codebooks/base.py).

Parametrized over ``leechq.codebooks.names()``, so a codebook joins these tests by registering.
Block counts stay small: encoders may be slow on the CPU.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from leechq import codebooks
from leechq.codebooks.base import Codebook
from leechq.errors import InvalidInput
from leechq.lattice.leech import members

NAMES = codebooks.names()


@pytest.fixture(params=NAMES)
def named(request: pytest.FixtureRequest) -> tuple[str, Codebook]:
    return request.param, codebooks.get(request.param)


def _gaussian(n: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((n, 24))).to(torch.float32)


def test_registry_has_the_ball() -> None:
    assert "ball" in NAMES


def test_static_attributes(named: tuple[str, Codebook]) -> None:
    name, cb = named
    assert isinstance(cb, Codebook)
    assert cb.name == name
    assert cb.dim == 24
    assert isinstance(cb.label_bits, int) and 1 <= cb.label_bits <= 63
    fp = cb.fingerprint()
    assert re.fullmatch(r"[0-9a-f]{16}", fp) and cb.fingerprint() == fp


def test_encode_decode_shapes_and_members(named: tuple[str, Codebook]) -> None:
    _, cb = named
    x = _gaussian(6, 0).reshape(2, 3, 24)
    labels = cb.encode(x)
    assert labels.dtype == torch.int64 and labels.shape == (2, 3)
    assert labels.device == x.device
    assert int(labels.min()) >= 0 and int(labels.max()) < 2**cb.label_bits
    points = cb.decode(labels)
    assert points.dtype == torch.int32 and points.shape == (2, 3, 24)
    assert members(points.reshape(-1, 24).numpy()).all()
    assert (points.reshape(-1, 24) != 0).any(dim=1).all()  # a direction is never the origin


def test_directions_are_good_and_scale_invariant(named: tuple[str, Codebook]) -> None:
    _, cb = named
    x = _gaussian(8, 1)
    labels = cb.encode(x)
    p = cb.decode(labels).to(torch.float64)
    xd = x.to(torch.float64)
    cos = (p * xd).sum(dim=1) / p.norm(dim=1) / xd.norm(dim=1)
    assert float(cos.mean()) > 0.93  # Gaussian blocks: the ball gives ≈ 0.964
    assert torch.equal(cb.encode(x * 8.0), labels)  # exact power-of-two scaling
    assert torch.equal(cb.encode(x.to(torch.float64)), labels)  # float32 widened exactly


def test_codebook_points_are_fixed_points(named: tuple[str, Codebook]) -> None:
    _, cb = named
    p = cb.decode(cb.encode(_gaussian(4, 2)))
    again = cb.decode(cb.encode(p.to(torch.float32))).to(torch.float64)
    pd = p.to(torch.float64)
    cos = (again * pd).sum(dim=1) / again.norm(dim=1) / pd.norm(dim=1)
    assert torch.allclose(cos, torch.ones_like(cos), rtol=0, atol=1e-12)


def test_zero_block_gets_label_zero(named: tuple[str, Codebook]) -> None:
    _, cb = named
    x = _gaussian(3, 3)
    x[1] = 0.0
    labels = cb.encode(x)
    assert int(labels[1]) == 0 and int(labels[0]) != 0


def test_bad_inputs_raise_invalid_input(named: tuple[str, Codebook]) -> None:
    _, cb = named
    with pytest.raises(InvalidInput):
        cb.encode(torch.zeros(2, 23))
    bad = _gaussian(2, 4)
    bad[0, 5] = float("nan")
    with pytest.raises(InvalidInput):
        cb.encode(bad)
    bad[0, 5] = float("inf")
    with pytest.raises(InvalidInput):
        cb.encode(bad)
    with pytest.raises(InvalidInput):
        cb.decode(torch.tensor([-1], dtype=torch.int64))
    with pytest.raises(InvalidInput):
        cb.decode(torch.tensor([2**cb.label_bits], dtype=torch.int64))
    with pytest.raises(InvalidInput):
        cb.decode(torch.tensor([1.0]))
