"""The fast GPTQ paths against their reference twins (docs/quantizer.md §5).

* the concurrent loop (several matrices, one coder call per global step) equals coding each
  matrix alone, bit for bit on the CPU with exact propagation — also when a matrix ends early;
* the schedule spreads the short matrices over the long one and every group is stepped once;
* the lazy (matrix-product) propagation agrees with the exact element-wise one to rounding, with
  equal codes on a seeded example, and is an exact identity under the identity coder;
* the shape–gain coder with per-row centroids equals ``shape_gain.shape_gain_encode`` +
  ``reconstruct`` bit for bit (zero blocks and zero scales included);
* the device Lloyd–Max fit agrees with the CPU reference fit;
* on CUDA (gpu tier): the lazy path agrees with the CPU reference, the record decodes to the
  evaluated weights bit for bit, and the device norms are correctly rounded.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from standin_codebook import register, registered

from leechq.codebooks import shape_gain
from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput
from leechq.formats.rotation import generate_rotation, rotation_seed
from leechq.quant.coders import (
    IdentityCoder,
    ScalarRoundCoder,
    ShapeGainCoder,
    block_norms,
    fit_gain_levels,
    lloyd_max_device,
)
from leechq.quant.gptq import (
    GPTQJob,
    gptq_quantize,
    gptq_quantize_many,
    proxy_loss,
    schedule,
)
from leechq.quant.hessian import prepare_factor, rotate_hessian


@pytest.fixture(autouse=True)
def _standin() -> Iterator[str]:
    with registered() as name:
        yield name


def _hessian(d_in: int, g: torch.Generator) -> torch.Tensor:
    mix = torch.randn(d_in, d_in, generator=g, dtype=torch.float64) / d_in**0.5
    x = torch.randn(3 * d_in, d_in, generator=g, dtype=torch.float64) @ (
        torch.eye(d_in, dtype=torch.float64) + 2 * mix
    )
    x[:, 1] *= 10.0
    return x.T @ x / x.shape[0]


def _jobs(seed: int = 0, device: str = "cpu") -> list[GPTQJob]:
    """Three shapes sharing nothing: 4 groups + tail, 2 groups, 9 groups (no tail)."""
    g = torch.Generator().manual_seed(seed)
    jobs = []
    for t, (d_out, d_in) in enumerate([(7, 100), (5, 48), (3, 216)]):
        h = _hessian(d_in, g)
        rot = generate_rotation(d_in, rotation_seed(t, 0))
        w = torch.randn(d_out, d_in, generator=g) * 0.05
        w[0, :24] = 0.0  # a zero block
        jobs.append(
            GPTQJob(w.to(device), prepare_factor(h, rot, 0.01).to(device), rot, name=f"m{t}")
        )
    return jobs


def _same(a, b) -> bool:  # type: ignore[no-untyped-def]
    return (
        torch.equal(a.weight_rot, b.weight_rot)
        and torch.equal(a.labels, b.labels)
        and torch.equal(a.gains, b.gains)
        and torch.equal(a.row_scales, b.row_scales)
        and torch.equal(a.centroids, b.centroids)
    )


def _real() -> list[str]:
    """The registered shipped codebooks (9 small coder calls each: ~2-3 s on the CPU)."""
    from leechq.codebooks import names

    return [c for c in ("ball", "tetra") if c in names()]


@pytest.mark.parametrize("coder_kind", ["scalar", "standin", *_real()])
def test_concurrent_equals_one_matrix_at_a_time(coder_kind: str) -> None:
    if coder_kind == "scalar":
        coder = ScalarRoundCoder(0.7)
    else:
        coder = ShapeGainCoder(register() if coder_kind == "standin" else coder_kind, gain_bits=1)
    jobs = _jobs()
    together = gptq_quantize_many(jobs, coder)
    for job, res in zip(jobs, together, strict=True):
        alone = gptq_quantize(job.weight, job.u, coder, job.rotation, name=job.name)
        assert _same(res, alone), job.name


def test_concurrent_coder_calls_are_gathered() -> None:
    """One coder call per global step (the longest matrix's group count), with every due row."""

    class Counting(ShapeGainCoder):
        def __init__(self) -> None:
            super().__init__(register(), 1)
            self.rows: list[int] = []

        def code(self, v, row_scales, centroids):  # type: ignore[no-untyped-def]
            self.rows.append(int(v.shape[0]))
            return super().code(v, row_scales, centroids)

    coder = Counting()
    gptq_quantize_many(_jobs(), coder)
    plan = schedule([4, 2, 9], [7, 5, 3])
    assert len(coder.rows) == 9
    assert coder.rows == [sum((7, 5, 3)[j] for j in step) for step in plan]


def test_loop_values_are_the_decoded_codes() -> None:
    """The values the loop continued with are exactly the blocks rebuilt from the stored codes
    (the end-of-matrix reconstruction changes nothing on the CPU)."""
    seen: list[torch.Tensor] = []

    class Recording(ShapeGainCoder):
        def code(self, v, row_scales, centroids):  # type: ignore[no-untyped-def]
            codes = super().code(v, row_scales, centroids)
            seen.append(codes.values.clone())
            return codes

    job = _jobs(seed=2)[0]
    res = gptq_quantize(job.weight, job.u, Recording(register(), 1), job.rotation)
    assert len(seen) == 4
    assert torch.equal(torch.cat(seen, dim=1), res.weight_rot[:, : 4 * BLOCK])


def test_schedule_spreads_balances_and_covers() -> None:
    n = [170, 170, 170, 170, 170, 170, 512]  # Qwen3-8B: q k v o gate up down
    rows = [4096, 1024, 1024, 4096, 12288, 12288, 4096]
    plan = schedule(n, rows)
    assert len(plan) == 512
    for j, nj in enumerate(n):
        steps = [s for s, due in enumerate(plan) if j in due]
        assert len(steps) == nj  # every group once, in order (steps are distinct)
        # step b lies in its window [⌊b·S/n⌋, ⌊(b+1)·S/n⌋)
        assert all((b * 512) // nj <= s < ((b + 1) * 512) // nj for b, s in enumerate(steps))
    loads = [sum(rows[j] for j in due) for due in plan]
    assert max(loads) <= 16384  # the mean is 15 656; unbalanced it would be 38 912
    assert schedule([]) == [] and schedule([1]) == [[0]] and schedule([2, 1]) == [[0, 1], [0]]
    with pytest.raises(InvalidInput, match="row counts"):
        schedule([1, 2], [3])


@pytest.mark.parametrize("coder_kind", ["scalar", "standin"])
def test_lazy_propagation_agrees_with_exact(coder_kind: str) -> None:
    """Same correction summed in another order: weights agree to rounding, codes are equal."""
    coder = (
        ScalarRoundCoder(0.7) if coder_kind == "scalar" else ShapeGainCoder(register(), gain_bits=1)
    )
    jobs = _jobs(seed=3)
    exact = gptq_quantize_many(jobs, coder, propagation="exact")
    # window 48 = 2 groups: several windows close inside every matrix, and on the tail
    for window in (48, 384):
        lazy = gptq_quantize_many(jobs, coder, propagation="lazy", window=window)
        for a, b in zip(exact, lazy, strict=True):
            assert torch.equal(a.labels, b.labels) and torch.equal(a.gains, b.gains)
            scale = float(a.weight_rot.abs().max())
            assert torch.allclose(a.weight_rot, b.weight_rot, rtol=0, atol=1e-12 * scale)


def test_lazy_feedback_beats_plain_rounding_and_identity_is_exact() -> None:
    g = torch.Generator().manual_seed(4)
    d_in = 120
    h = _hessian(d_in, g)
    rot = generate_rotation(d_in, 5)
    w = torch.randn(16, d_in, generator=g) * 0.05
    u = prepare_factor(h, rot, 0.01)
    coder = ShapeGainCoder(register(), 1)
    fed = gptq_quantize(w, u, coder, rot, propagation="lazy", window=48)
    plain = gptq_quantize(w, None, coder, rot)
    w_rot = torch.from_numpy(rot.to_matrix())
    w_rot = w.double() @ w_rot.T
    h_rot = rotate_hessian(h, rot)
    assert proxy_loss(fed.weight_rot - w_rot, h_rot) < 0.9 * proxy_loss(
        plain.weight_rot - w_rot, h_rot
    )
    ident = gptq_quantize(w, u, IdentityCoder(), None, propagation="lazy", window=48)
    assert torch.equal(ident.dequantize(), w)


def test_bad_propagation_is_refused() -> None:
    with pytest.raises(InvalidInput, match="propagation"):
        gptq_quantize(torch.ones(2, 48), None, IdentityCoder(), propagation="fast")


def _blocks(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, BLOCK, generator=g, dtype=torch.float64)
    v[3] = 0.0  # zero block
    scales = torch.rand(n, generator=g, dtype=torch.float64) + 0.5
    scales[5] = 0.0  # zero row scale
    return v, scales


def test_shape_gain_coder_matches_shape_gain_module() -> None:
    cb = register()
    coder = ShapeGainCoder(cb, 2)
    v, scales = _blocks(40, 6)
    levels = torch.tensor([0.6, 0.9, 1.1, 1.5], dtype=torch.float64)
    from leechq.codebooks import get

    labels, gains, points = shape_gain.shape_gain_encode(v, scales, levels, get(cb))
    values = shape_gain.reconstruct(points, gains, scales, levels)
    codes = coder.code(v, scales, levels)
    assert torch.equal(codes.labels, labels) and torch.equal(codes.gains.long(), gains)
    assert torch.equal(codes.points, points) and torch.equal(codes.values, values)
    # per-row levels: rows 0..19 with one set, 20..39 with another, equal to two separate calls
    other = torch.tensor([0.5, 0.8, 1.0, 1.7], dtype=torch.float64)
    rows = torch.cat([levels.expand(20, 4), other.expand(20, 4)])
    both = coder.code(v, scales, rows)
    second = coder.code(v[20:], scales[20:], other)
    assert torch.equal(both.values[:20], codes.values[:20])
    assert torch.equal(both.values[20:], second.values)
    assert torch.equal(both.gains[20:], second.gains)
    with pytest.raises(InvalidInput, match="centroids"):
        coder.code(v, scales, rows[:7])


def test_device_lloyd_agrees_with_the_reference_fit() -> None:
    g = torch.Generator().manual_seed(7)
    samples = torch.randn(20_000, generator=g, dtype=torch.float64).abs() + 0.1
    for bits in (0, 1, 2):
        ref = shape_gain.fit_centroids(samples, bits, iterations=40)
        dev = lloyd_max_device(samples, bits, iterations=40)
        assert dev.shape == ref.shape
        assert torch.allclose(dev, ref, rtol=1e-12, atol=0)
    assert torch.equal(fit_gain_levels(samples, 1), shape_gain.fit_centroids(samples, 1))


def test_block_norms_are_correctly_rounded_on_the_cpu() -> None:
    pts = torch.zeros(3, BLOCK, dtype=torch.int32)
    pts[0, :2] = 4  # ‖p‖² = 32, where the vectorized CPU sqrt is one ulp low
    pts[1, :8] = 2
    assert torch.equal(block_norms(pts), shape_gain.exact_norms(pts))


# --------------------------------------------------------------------------------------------------
# CUDA (gpu tier)


@pytest.mark.gpu
def test_cuda_lazy_loop_agrees_with_cpu_reference_and_p13_holds() -> None:
    coder = ShapeGainCoder(register(), 1)
    cpu = gptq_quantize_many(_jobs(seed=8), coder)
    gpu = gptq_quantize_many(_jobs(seed=8, device="cuda"), coder)
    for a, b in zip(cpu, gpu, strict=True):
        assert torch.equal(a.labels, b.labels.cpu()) and torch.equal(a.gains, b.gains.cpu())
        assert torch.allclose(a.weight_rot, b.weight_rot.cpu(), rtol=0, atol=1e-10)
        qw = b.to_quantized_weight()
        assert torch.equal(qw.dequantize_rotated(), b.weight_rot.cpu())
        assert torch.equal(qw.dequantize(), b.dequantize().cpu())


@pytest.mark.gpu
def test_cuda_norms_are_correctly_rounded() -> None:
    g = torch.Generator().manual_seed(9)
    pts = torch.randint(-12, 13, (4096, BLOCK), generator=g, dtype=torch.int32)
    assert torch.equal(block_norms(pts.cuda()).cpu(), shape_gain.exact_norms(pts))


@pytest.mark.gpu
@pytest.mark.parametrize("codebook", ["ball", "tetra"])
def test_cuda_real_codebook_record_decodes_to_the_evaluated_weights(codebook: str) -> None:
    jobs = _jobs(seed=10, device="cuda")
    res = gptq_quantize_many(jobs, ShapeGainCoder(codebook, 1))
    for r in res:
        qw = r.to_quantized_weight()
        assert torch.equal(qw.dequantize_rotated(), r.weight_rot.cpu())
        assert torch.equal(qw.dequantize(), r.dequantize().cpu())
