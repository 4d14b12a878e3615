"""Rotation generation and application: spec test vectors, orthogonality, exact inverse order."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from leechq.errors import InvalidInput
from leechq.formats.rotation import (
    RotationTables,
    apply_rotation,
    apply_rotation_transpose,
    generate_rotation,
    rotation_seed,
    split_width,
)
from leechq.utils.splitmix import SplitMix64


def test_splitmix_vectors() -> None:
    rng = SplitMix64(0x64A42026)
    assert [rng.next_u64() for _ in range(3)] == [
        0xF766D8CFE4F93372,
        0x6CF2C7C65DE3D518,
        0xA925591E9F758351,
    ]
    rng = SplitMix64(0x64A42026)
    got = [rng.gaussian() for _ in range(3)]
    assert got == pytest.approx([-0.2333360949, -0.8558603622, -0.0976483554], abs=1e-10)
    vec = SplitMix64(0x64A42026).gaussians(3)
    assert np.allclose(vec, got, rtol=0, atol=1e-15)


def test_seed_examples() -> None:
    assert rotation_seed(0, 0) == 0x110FEED
    assert rotation_seed(1, 2) == 0x10112FEED
    assert rotation_seed(35, 3) == 0x230113FEED


def test_split_width() -> None:
    assert split_width(2560) == (512, 5)
    assert split_width(4096) == (4096, 1)
    assert split_width(9728) == (512, 19)
    assert split_width(24) == (8, 3)


def test_vector_n24() -> None:
    t = generate_rotation(24, 0x110FEED)
    signs = "+-++-+-+--+++--------+-+"
    assert "".join("+" if s > 0 else "-" for s in t.signs) == signs
    assert t.small[0] == pytest.approx([0.335159954711, -0.539751013520, 0.772228365292], abs=1e-12)
    v = apply_rotation(torch.arange(1, 25, dtype=torch.float64), t)
    assert v[:4].tolist() == pytest.approx(
        [-13.366486961617, -32.213297150279, 2.434089931286, -3.303191090893], abs=1e-11
    )
    assert float(v[-1]) == pytest.approx(-7.506410159704, abs=1e-11)


def test_k1_is_plain_hadamard_no_sign_flip() -> None:
    t = generate_rotation(4096, 0x110FEED)
    assert t.small.tolist() == [[1.0]]
    e0 = torch.zeros(4096, dtype=torch.float64)
    e0[0] = 1.0
    q_e0 = apply_rotation(e0, t)
    # H_4096 · D · e_0 = D_0 · (column 0 of H) = D_0 / 64 everywhere.
    assert torch.all(q_e0 == t.signs[0] / 64.0)


@pytest.mark.parametrize("n", [24, 48, 72, 96, 120, 2560 // 16])
def test_orthogonal_and_inverse(n: int) -> None:
    t = generate_rotation(n, 12345 + n)
    q = t.to_matrix()
    assert np.abs(q @ q.T - np.eye(n)).max() < 1e-12
    x = torch.randn(7, n, dtype=torch.float64)
    back = apply_rotation_transpose(apply_rotation(x, t), t)
    assert torch.allclose(back, x, atol=1e-12)
    # The operator form matches the dense matrix.
    assert np.allclose(apply_rotation(x, t).numpy(), x.numpy() @ q.T, atol=1e-12)


def _scalar_mix(vals: list[float], small: np.ndarray, k: int, m: int,
                transpose: bool) -> list[float]:
    out = []
    for g in range(k):
        for j in range(m):
            acc = 0.0
            for tt in range(k):
                acc = acc + (small[tt][g] if transpose else small[g][tt]) * vals[tt * m + j]
            out.append(acc)
    return out


def _scalar_wht(vals: list[float], k: int, m: int) -> list[float]:
    flat = list(vals)
    length = 1
    while length < m:
        for g in range(k):
            for start in range(0, m, 2 * length):
                for j in range(start, start + length):
                    a, b = flat[g * m + j], flat[g * m + j + length]
                    flat[g * m + j], flat[g * m + j + length] = a + b, a - b
        length *= 2
    return flat


@pytest.mark.parametrize("n", [24, 40, 64, 576, 1536])
def test_both_directions_match_the_scalar_loop_bit_for_bit(n: int) -> None:
    """docs/format.md §2 step 3 as a scalar loop (mix with t ascending from 0.0, butterflies,
    × 1/√m, signs) against the whole-tensor code, batched over leading dims, bit for bit."""
    t = generate_rotation(n, 0x110FEED + n)
    m, k = t.pow2, t.odd
    rows = np.random.default_rng(n).standard_normal((2, 3, n))
    rows[0, 0, :5] = 0.0  # zeros (and their signs) take the same path
    r = 1.0 / math.sqrt(m)
    got_t = apply_rotation_transpose(torch.tensor(rows), t).numpy()
    got_f = apply_rotation(torch.tensor(rows), t).numpy()
    for a in range(2):
        for b in range(1 if n > 64 else 3):  # the wide rows: one scalar reference each
            row = rows[a, b].tolist()
            flat = _scalar_wht(_scalar_mix(row, t.small, k, m, True) if k > 1 else row, k, m)
            expect_t = [flat[i] * r * t.signs[i] for i in range(n)]
            assert got_t[a, b].tolist() == expect_t
            signed = [row[i] * t.signs[i] for i in range(n)]
            scaled = [x * r for x in _scalar_wht(signed, k, m)]
            expect_f = _scalar_mix(scaled, t.small, k, m, False) if k > 1 else scaled
            assert got_f[a, b].tolist() == expect_f


def test_sign_bits_round_trip() -> None:
    t = generate_rotation(72, 99)
    bits = t.sign_bits()
    assert bits.dtype == np.uint8 and bits.shape == (9,)
    assert np.array_equal(RotationTables.signs_from_bits(bits, 72), t.signs)


def test_bad_input() -> None:
    t = generate_rotation(24, 1)
    with pytest.raises(InvalidInput, match="last dim"):
        apply_rotation(torch.zeros(3, 25), t)
    with pytest.raises(InvalidInput, match="floating"):
        apply_rotation(torch.zeros(3, 24, dtype=torch.int32), t)
    with pytest.raises(InvalidInput):
        RotationTables(n=24, seed=0, signs=np.ones(24), small=np.ones((2, 2)))
