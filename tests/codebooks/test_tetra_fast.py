"""The fast exact Tetra search (leechq.codebooks.tetra_fast) against the reference search.

docs/codebooks.md §3.3 (row lists), docs/codebooks.md §3.7 (encoder); docs/codebooks.md §3.4 (valid
words).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from leechq.codebooks import tetra_encoder as te
from leechq.codebooks import tetra_fast as tf
from leechq.codebooks.tetra import decode
from leechq.errors import InvalidInput


@pytest.fixture(autouse=True)
def _one_thread():
    """The reference DP is many small operations: intra-op threads only add barriers."""
    with te._intra_op_threads(torch.device("cpu"), 1):
        yield


def _targets(n: int, seed: int, norm: float) -> torch.Tensor:
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((n, 24)))
    return (x / x.norm(dim=-1, keepdim=True) * norm).to(torch.float32)


def _trio(z: torch.Tensor) -> torch.Tensor:
    return z.t().index_select(0, tf._constants("cpu")["order"]).contiguous()


@pytest.mark.parametrize("norm", [6.0, 13.5, 21.0])
def test_section_tables_equal_the_reference_dynamic_program(norm):
    """Every (parity, class, pattern byte) entry of all three sections equals the reference DP
    (tetra_encoder._section_scores, itself checked against brute force over all 2048 rows)."""
    z = _targets(64, seed=int(norm * 4), norm=norm)
    zt = _trio(z)
    tabs = tf._section_tables(zt, tf._constants("cpu"))
    k = te._constants("cpu")
    ref_end = te._section_scores(torch.cat((zt[0:8], zt[16:24]), dim=1), (0, 1), k)
    ref_mid = te._section_scores(zt[8:16].contiguous(), (2, 3), k)
    n = z.shape[0]
    ends = tabs.ends  # [2p, 2cls, 128, 2s, M]
    torch.testing.assert_close(ends[..., 0, :], ref_end[..., :n], rtol=0, atol=2e-4)
    torch.testing.assert_close(ends[..., 1, :], ref_end[..., n:], rtol=0, atol=2e-4)
    torch.testing.assert_close(tabs.mid, ref_mid, rtol=0, atol=2e-4)


@pytest.mark.parametrize("norm", [4.0, 12.75, 15.25, 26.0])
def test_search_equals_the_exact_dp(norm):
    z = _targets(300, seed=int(norm * 10), norm=norm)
    labels, points = tf.search(_trio(z))
    ref, _ = te.nearest(z)
    # Same optimum; labels agree except at float32 near-ties (none occur on these blocks).
    torch.testing.assert_close(te.score_of(z, labels), te.score_of(z, ref), rtol=0, atol=1e-4)
    assert float((labels == ref).double().mean()) >= 0.995
    # The returned points are the decoded labels (trio order).
    assert torch.equal(points.long(), _trio(decode(labels).double()).long())


def test_search_equals_brute_force_reference():
    z = _targets(3, seed=5, norm=14.0)
    labels, _ = tf.search(_trio(z))
    ref, ref_score = te.nearest_reference(z)
    torch.testing.assert_close(te.score_of(z, labels), ref_score, rtol=0, atol=1e-4)
    assert torch.equal(labels, ref)


def test_search_handles_extreme_targets():
    """One huge coordinate, all-equal coordinates, the zero target, negative spikes."""
    z = torch.zeros(6, 24)
    z[0, 3] = 40.0
    z[1] = 3.0
    z[3, 17] = -25.0
    z[4, :8] = -6.0
    z[5] = torch.linspace(-9, 9, 24)
    labels, points = tf.search(_trio(z))
    ref, _ = te.nearest(z)
    torch.testing.assert_close(te.score_of(z, labels), te.score_of(z, ref), rtol=0, atol=1e-4)
    assert int(labels[2]) == 0  # the origin is the nearest point to the zero target


def test_encode_equals_exact_method_and_is_valid():
    x = torch.from_numpy(np.random.default_rng(11).standard_normal((600, 24)))
    x[5] = 0.0
    fast = te.encode(x, method="fast")
    exact = te.encode(x, method="exact")
    assert float((fast == exact).double().mean()) >= 0.995
    torch.testing.assert_close(te.cosine_of(x, fast), te.cosine_of(x, exact), rtol=0, atol=1e-6)
    assert int(fast[5]) == 0
    assert ((fast >= 0) & (fast < (1 << 47))).all()
    assert torch.equal(te.encode(x), fast)  # "auto" is the fast search on CPU


def test_encode_threads_chunks_and_shapes_agree():
    x = torch.randn(3, 230, 24, generator=torch.Generator().manual_seed(3))
    one = tf.encode(x, threads=1)
    assert one.shape == (3, 230)
    assert torch.equal(tf.encode(x, threads=2, chunk=128), one)
    assert torch.equal(tf.encode(x, threads=3, chunk=100), one)
    assert torch.equal(tf.encode(x.transpose(0, 1).contiguous().transpose(0, 1)), one)
    assert torch.equal(tf.encode(x.to(torch.float64)), tf.encode(x.to(torch.float64), chunk=77))


def test_encode_refine_matches_exact_method():
    x = torch.from_numpy(np.random.default_rng(12).standard_normal((64, 24)))
    fast = te.encode(x, method="fast", refine=1, norms=(14.0,))
    exact = te.encode(x, method="exact", refine=1, norms=(14.0,))
    torch.testing.assert_close(te.cosine_of(x, fast), te.cosine_of(x, exact), rtol=0, atol=1e-6)


def test_encode_rejects_bad_input():
    with pytest.raises(InvalidInput, match="method"):
        te.encode(torch.zeros(2, 24), method="quick")
    with pytest.raises(InvalidInput, match="last dimension 24"):
        tf.encode(torch.zeros(4, 23))
    with pytest.raises(InvalidInput, match="NaN or infinite"):
        tf.encode(torch.full((1, 24), float("nan")))


@pytest.mark.gpu
def test_cuda_fast_search_matches_cpu():
    x = torch.from_numpy(np.random.default_rng(13).standard_normal((4096, 24)))
    cpu = tf.encode(x)
    gpu = tf.encode(x.cuda())
    assert gpu.is_cuda
    torch.testing.assert_close(
        te.cosine_of(x, cpu), te.cosine_of(x, gpu.cpu()), rtol=0, atol=1e-6
    )
    assert float((cpu == gpu.cpu()).double().mean()) >= 0.99
    exact_gpu = te.encode(x.cuda(), method="exact")
    assert float((exact_gpu == gpu).double().mean()) >= 0.99
