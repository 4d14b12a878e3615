"""The per-output tolerance helper accepts rounding noise and rejects a real error."""

from __future__ import annotations

import pytest
import torch

from tolerance import assert_matmul_close, matmul_scale, unit_roundoff


def test_unit_roundoff() -> None:
    assert unit_roundoff(torch.float32) == 2.0**-24
    assert unit_roundoff(torch.float16) == 2.0**-11


def test_accepts_half_rounding_rejects_one_bad_output() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 512, generator=g)
    w = torch.randn(64, 512, generator=g)
    ref = x.double() @ w.double().T
    y = (x.half().float() @ w.half().float().T)
    assert_matmul_close(y, ref, x, w, torch.float16)
    bad = y.clone()
    bad[1, 7] += 0.01 * matmul_scale(x, w)[1, 7].item()  # 1 % of |x||w|: a real error
    with pytest.raises(AssertionError, match="output 71"):
        assert_matmul_close(bad, ref, x, w, torch.float16)
