"""Hessians: accumulation, rotation by fast transforms, relative damping, inverse-Cholesky
factor."""

from __future__ import annotations

import pytest
import torch

from leechq.formats.rotation import generate_rotation
from leechq.quant.hessian import (
    HessianAccumulator,
    NotPositiveDefinite,
    capture_inputs,
    damp,
    inverse_cholesky_factor,
    prepare_factor,
    rotate_hessian,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_accumulator_is_the_mean_outer_product(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    xs = [torch.randn(3, 7, 40), torch.randn(5, 40)]
    acc = HessianAccumulator(40, dtype=dtype)
    for x in xs:
        acc.add(x)
    rows = torch.cat([x.reshape(-1, 40) for x in xs]).double()
    want = rows.T @ rows / rows.shape[0]
    assert acc.rows == 26
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert torch.allclose(acc.finalize(), want, atol=tol)
    with pytest.raises(ValueError, match="width 40"):
        acc.add(torch.randn(2, 41))


@pytest.mark.parametrize("n", [24, 40, 96])
def test_rotation_equals_dense_q_h_qt(n: int) -> None:
    torch.manual_seed(1)
    a = torch.randn(n, n, dtype=torch.float64)
    h = a @ a.T
    rot = generate_rotation(n, 0x110FEED + n)
    q = torch.from_numpy(rot.to_matrix())
    assert torch.allclose(rotate_hessian(h, rot), q @ h @ q.T, atol=1e-10)


def test_damping_is_relative_and_factor_inverts() -> None:
    torch.manual_seed(2)
    a = torch.randn(50, 30, dtype=torch.float64)
    h = a.T @ a / 50
    d = damp(h, 0.01)
    assert torch.allclose(
        d - h, 0.01 * torch.diagonal(h).mean() * torch.eye(30, dtype=torch.float64)
    )
    u = inverse_cholesky_factor(d)
    assert torch.equal(u, torch.triu(u))
    assert torch.allclose(u.T @ u, torch.linalg.inv(d), rtol=1e-9, atol=1e-9)
    rot = generate_rotation(30, 5)
    u2 = prepare_factor(h, rot, 0.01)
    q = torch.from_numpy(rot.to_matrix())
    assert torch.allclose(
        u2.T @ u2, torch.linalg.inv(damp(q @ h @ q.T, 0.01)), rtol=1e-8, atol=1e-8
    )


def test_non_positive_definite_names_the_matrix() -> None:
    h = torch.diag(torch.tensor([1.0, 1.0, -5.0], dtype=torch.float64))
    with pytest.raises(NotPositiveDefinite, match="block 3 act 1"):
        prepare_factor(h, None, 0.01, "Hessian of block 3 act 1 (o_proj)")
    with pytest.raises(NotPositiveDefinite, match="dead"):
        prepare_factor(torch.zeros(4, 4, dtype=torch.float64), None, 0.01)
    with pytest.raises(ValueError):
        damp(h, 0.0)  # an absolute or zero ridge is refused (P6, P10)


def test_capture_inputs_hooks_and_unhooks() -> None:
    lin = torch.nn.Linear(8, 3)
    acc = HessianAccumulator(8)
    x = torch.randn(4, 8)
    with capture_inputs({0: lin}, {0: acc}):
        lin(x)
    lin(x)  # after the context: not captured
    assert acc.rows == 4
    assert torch.allclose(acc.finalize(), (x.T @ x / 4).double(), atol=1e-6)
