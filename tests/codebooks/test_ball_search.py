"""The batched torch search (codebooks.ball_search) against its numpy reference (lattice.nearest).

The tie rule of docs/lattice.md §6.3 lets an implementation differ from the reference only by a few
ulp on near-ties; this one re-scores every near-tie with the reference's formula and rule, so the
tests ask for identical points and bit-identical scores on random and adversarial inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from leechq.codebooks import ball_search as bs
from leechq.errors import InvalidInput
from leechq.lattice import nearest as nr
from leechq.lattice.classes import class_table
from leechq.lattice.leech import members


def _adversarial(rng: np.random.Generator, count: int) -> np.ndarray:
    rows = []
    for k in range(count):
        kind = k % 9
        if kind == 0:
            x = rng.integers(-2, 3, 24).astype(np.float64)
        elif kind == 1:
            x = np.zeros(24)
            x[rng.choice(24, int(rng.integers(1, 5)), replace=False)] = rng.choice([-1.0, 1.0])
        elif kind == 2:
            x = rng.choice([-1.0, 0.0, 1.0, 2.0, 0.5], 24)
        elif kind == 3:
            x = rng.standard_normal(24) * 10.0 ** float(rng.integers(-35, 35))
        elif kind == 4:
            x = np.round(rng.standard_normal(24) * 2) / 2
        elif kind == 5:
            x = np.zeros(24)
            x[rng.integers(24)] = rng.standard_normal()
        elif kind == 6:  # a scaled lattice point: ties with its multiples
            p, _ = nr.search(rng.standard_normal(24))
            x = p.astype(np.float64) * rng.choice([0.5, 1.0, 3.0])
        elif kind == 7:  # repeated magnitudes with mixed signs
            x = np.abs(rng.standard_normal(24)).astype(np.float32).astype(np.float64)
            x[:12] = x[12:] * rng.choice([-1.0, 1.0], 12)
        else:  # all equal magnitudes
            x = rng.choice([-1.0, 1.0], 24) * 0.75
        rows.append(x)
    rows += [np.zeros(24), np.ones(24), -np.ones(24), np.r_[1e300, np.full(23, 1e-300)]]
    rows.append(np.r_[5e-324, np.zeros(23)])
    return np.array(rows)


def _reference(x: np.ndarray, max_shell: int) -> tuple[np.ndarray, np.ndarray]:
    results = [nr.search(row, max_shell) for row in x]
    return np.array([p for p, _ in results]), np.array([s for _, s in results])


def _assert_same(x: np.ndarray, max_shell: int, **kwargs: object) -> None:
    points, scores = bs.search_batch(
        torch.from_numpy(x), max_shell, **kwargs  # type: ignore[arg-type]
    )
    ref_points, ref_scores = _reference(x, max_shell)
    bad = np.flatnonzero(~np.all(points.numpy() == ref_points, axis=1))
    assert bad.size == 0, f"rows {bad.tolist()} differ, e.g. x={x[bad[0]].tolist()}"
    np.testing.assert_array_equal(scores.numpy(), ref_scores)  # bit-identical


@pytest.mark.parametrize("work_dtype", [torch.float32, torch.float64])
def test_random_matches_reference(work_dtype: torch.dtype) -> None:
    x = np.random.default_rng(0).standard_normal((40, 24))
    _assert_same(x, 12, work_dtype=work_dtype, chunk_size=16)


def test_random_matches_reference_ball13() -> None:
    x = np.random.default_rng(1).standard_normal((24, 24))
    _assert_same(x, 13)


@pytest.mark.parametrize("work_dtype", [torch.float32, torch.float64])
def test_adversarial_matches_reference(work_dtype: torch.dtype) -> None:
    x = _adversarial(np.random.default_rng(2), 63)
    _assert_same(x, 12, work_dtype=work_dtype)


def test_adversarial_small_balls() -> None:
    rng = np.random.default_rng(3)
    x = _adversarial(rng, 27)
    for max_shell in (2, 3, 5, 8):
        _assert_same(x, max_shell)


def test_input_dtypes_are_widened_exactly() -> None:
    x = torch.randn(16, 24)
    p32, s32 = bs.search_batch(x)
    p64, s64 = bs.search_batch(x.double())
    assert torch.equal(p32, p64) and torch.equal(s32, s64)
    half = x.to(torch.float16)
    p16, _ = bs.search_batch(half)
    ref, _ = _reference(half.double().numpy(), 12)
    assert np.array_equal(p16.numpy(), ref)
    pb, _ = bs.search_batch(x.to(torch.bfloat16))
    assert members(pb.numpy()).all()


def test_zero_rows_and_output_layout() -> None:
    x = torch.randn(7, 24, dtype=torch.float64)
    x[[0, 3, 6]] = 0.0
    points, scores = bs.search_batch(x)
    assert points.dtype == torch.int32 and points.shape == (7, 24)
    assert scores.dtype == torch.float64 and scores.shape == (7,)
    assert not points[[0, 3, 6]].any() and not scores[[0, 3, 6]].any()
    assert (scores[[1, 2, 4, 5]] > 0).all()
    empty_p, empty_s = bs.search_batch(torch.zeros(0, 24))
    assert empty_p.shape == (0, 24) and empty_s.shape == (0,)


def test_materialize_matches_reference_maximizer() -> None:
    rng = np.random.default_rng(4)
    table = class_table(13)
    x = _adversarial(rng, 36)[:36]
    classes = rng.integers(0, len(table), x.shape[0])
    codewords = np.array(
        [rng.choice(nr.search_data(13)[int(k)].codewords) for k in classes], dtype=np.int64
    )
    got = bs.materialize(
        torch.from_numpy(x), torch.from_numpy(classes), torch.from_numpy(codewords)
    )
    for row, k, c, p in zip(x, classes, codewords, got.numpy(), strict=True):
        assert p.tolist() == nr.class_maximizer(row, table[int(k)], int(c)).tolist()


def test_tie_rule_scores_match_reference_formula() -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((20, 24)) * 10.0 ** rng.integers(-5, 5, (20, 1))
    points = bs.search_batch(torch.from_numpy(rng.standard_normal((20, 24))))[0]
    got = bs.tie_rule_scores(torch.from_numpy(x), points).numpy()
    expected = [nr.reference_score(r, p) for r, p in zip(x, points.numpy(), strict=True)]
    np.testing.assert_array_equal(got, expected)


def test_approx_mode_is_valid_and_never_better() -> None:
    x = torch.from_numpy(np.random.default_rng(6).standard_normal((24, 24)))
    exact_p, exact_s = bs.search_batch(x)
    approx_p, approx_s = bs.search_batch(x, mode="approx", top_classes=4)
    assert members(approx_p.numpy()).all()
    assert (approx_s <= exact_s).all()
    assert torch.equal(approx_s, bs.tie_rule_scores(x, approx_p))
    wide_p, _ = bs.search_batch(x, mode="approx", top_classes=301)
    assert torch.equal(wide_p, exact_p)


def test_bad_inputs() -> None:
    with pytest.raises(InvalidInput, match=r"shape \[N, 24\]"):
        bs.search_batch(torch.zeros(3, 23))
    with pytest.raises(InvalidInput, match="floating"):
        bs.search_batch(torch.zeros(3, 24, dtype=torch.int64))
    with pytest.raises(InvalidInput, match="non-finite"):
        bs.search_batch(torch.tensor([[float("nan")] + [0.0] * 23]))
    with pytest.raises(InvalidInput, match="max_shell"):
        bs.search_batch(torch.zeros(1, 24), 1)
    with pytest.raises(InvalidInput, match="mode"):
        bs.search_batch(torch.zeros(1, 24), mode="fast")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="work_dtype"):
        bs.search_batch(torch.zeros(1, 24), work_dtype=torch.float16)
    with pytest.raises(InvalidInput, match="torch.Tensor"):
        bs.search_batch(np.zeros((1, 24)))  # type: ignore[arg-type]


@pytest.mark.gpu
def test_cuda_matches_cpu() -> None:
    x = torch.from_numpy(np.concatenate([
        np.random.default_rng(7).standard_normal((3000, 24)),
        _adversarial(np.random.default_rng(8), 90),
    ]))
    cpu_p, cpu_s = bs.search_batch(x)
    for dtype in (torch.float32, torch.float64):
        gpu_p, gpu_s = bs.search_batch(x.cuda(), work_dtype=dtype)
        assert torch.equal(gpu_p.cpu(), cpu_p)
        assert torch.equal(gpu_s.cpu(), cpu_s)
