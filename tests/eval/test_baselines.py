"""Scalar baselines: RTN int2 g64 error bounds, GPTQ beats RTN on its proxy loss, model drivers."""

from __future__ import annotations

import pytest
import torch

from leechq.errors import InvalidInput, UnsupportedShape
from leechq.eval import baselines as bl


def test_rtn_grid_and_error_bound() -> None:
    torch.manual_seed(0)
    w = torch.randn(96, 256)
    w_hat, scale, offset = bl.rtn_quantize(w, bits=2, group=64)
    assert w_hat.shape == w.shape and w_hat.dtype == w.dtype
    assert scale.dtype == offset.dtype == torch.float16 and scale.shape == (96, 4)
    s = scale.float().unsqueeze(-1)
    m = offset.float().unsqueeze(-1)
    wg, hg = w.reshape(96, 4, 64), w_hat.reshape(96, 4, 64)
    codes = (hg - m) / s
    assert torch.allclose(codes, codes.round(), atol=1e-4)  # every value is on the 4-level grid
    assert codes.round().min() >= 0 and codes.round().max() <= 3
    # rounding error: half a step, plus the f16 rounding of scale and offset at the clamped ends
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    slack = (lo - m).abs() + 3 * ((hi - lo) / 3 - s).abs() + 1e-6
    assert ((wg - hg).abs() <= 0.5 * s + slack).all()
    # Gaussian weights, 4 levels over each group's range: relative MSE ≈ step²/12 / σ² ≈ 0.2
    rel = float(((w - w_hat) ** 2).mean() / (w**2).mean())
    assert 0.14 < rel < 0.26, rel


def test_rtn_exact_on_grid_values_and_rejects_bad_width() -> None:
    grid = torch.tensor([-1.0, -0.5, 0.0, 0.5])  # exactly representable in f16: lossless
    w = grid[torch.randint(0, 4, (8, 128), generator=torch.Generator().manual_seed(1))]
    w[:, ::64] = -1.0
    w[:, 1::64] = 0.5
    assert torch.equal(bl.rtn_quantize(w)[0], w)
    with pytest.raises(UnsupportedShape, match="not a multiple of the group size 64"):
        bl.rtn_quantize(torch.zeros(4, 100))


def _correlated_hessian(d: int, n: int = 4096, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(d, d, generator=g, dtype=torch.float64) / d**0.5
    x = torch.randn(n, d, generator=g, dtype=torch.float64) @ (
        torch.eye(d, dtype=torch.float64) + 2 * mix
    )
    return x.T @ x / n


def test_gptq_beats_rtn_on_proxy_loss() -> None:
    torch.manual_seed(2)
    w = torch.randn(64, 256)
    h = _correlated_hessian(256)
    g = bl.gptq_quantize(w, h, bits=2, group=64)
    r, _, _ = bl.rtn_quantize(w.double())
    ratio = bl.proxy_loss(w, g, h) / bl.proxy_loss(w, r, h)
    assert ratio < 0.85, ratio
    # GPTQ's output stays on a 4-level grid per group
    for row in g.reshape(64, 4, 64)[:8]:
        for grp in row:
            assert grp.unique().numel() <= 4


def test_gptq_equals_rtn_for_identity_hessian() -> None:
    """With H ∝ I there is no error to feed forward: GPTQ reduces to RTN exactly."""
    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    g = bl.gptq_quantize(w, torch.eye(128, dtype=torch.float64))
    assert torch.equal(g, bl.rtn_quantize(w)[0])


def test_gptq_validates() -> None:
    with pytest.raises(UnsupportedShape, match="Hessian shape"):
        bl.gptq_quantize(torch.zeros(4, 64), torch.eye(32))
    h = -torch.eye(64, dtype=torch.float64)
    with pytest.raises(InvalidInput, match="not positive definite"):
        bl.gptq_quantize(torch.randn(4, 64), h)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_model_drivers(kind: str, make_tiny_model) -> None:
    model = make_tiny_model(kind, hidden=64, layers=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rtn = bl.rtn_model(model)
    gptq = bl.gptq_model(
        model, torch.randint(0, 96, (4, 32), generator=torch.Generator().manual_seed(6))
    )
    for k, v in model.state_dict().items():  # the original is untouched
        assert torch.equal(v, before[k]), k
    for res in (rtn, gptq):
        assert len(res.layers) == 14
        acc = res.accounting
        assert acc.bits_per_weight == 2.5 and acc.n_quantized == 2 * (
            2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 128
        )  # q,o + k,v (GQA) + MLP
        assert 2.5 < acc.bits_per_param < 16
        sd = res.model.state_dict()
        for k, v in sd.items():
            changed = not torch.equal(v, before[k])
            is_proj = k.endswith("_proj.weight")
            assert changed == is_proj, k
        q = sd["model.layers.1.mlp.down_proj.weight"].reshape(64, 2, 64)
        assert max(g.unique().numel() for row in q for g in row) <= 4
    assert all(v["proxy_vs_rtn"] <= 1.0 + 1e-9 for v in gptq.layers.values())
    assert sum(v["proxy_vs_rtn"] for v in gptq.layers.values()) / 14 < 0.95
    assert rtn.summary()["method"] == "rtn-int2-g64" and gptq.method == "gptq-int2-g64"


def test_run_baseline_names(make_tiny_model) -> None:
    model = make_tiny_model("llama")
    with pytest.raises(InvalidInput, match="choices"):
        bl.run_baseline("awq", model)
    with pytest.raises(InvalidInput, match="calibration"):
        bl.run_baseline("gptq-int2-g64", model)


def test_hqq_baseline(make_tiny_model) -> None:
    """The hqq package (a test dependency) quantizes every projection at 2.5 b/w."""
    assert bl.hqq_available()
    model = make_tiny_model("llama")
    res = bl.hqq_model(model)
    rtn = bl.rtn_model(model)
    assert res.accounting.bits_per_weight == 2.5
    mean = lambda r: sum(v["rel_err"] for v in r.layers.values()) / len(r.layers)  # noqa: E731
    assert mean(res) < 0.5 and mean(res) < 1.5 * mean(rtn)
