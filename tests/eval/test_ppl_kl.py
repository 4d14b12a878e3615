"""Perplexity, KL(ref ‖ model) and greedy agreement on tiny models (no download)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from leechq.data.corpus import TokenWindows, token_fingerprint
from leechq.errors import InvalidInput
from leechq.eval.agreement import agreement_counts, greedy_agreement
from leechq.eval.kl import kl_of_logits, kl_to_reference
from leechq.eval.ppl import logits_fn, perplexity


class Bigram(torch.nn.Module):
    """logits[b, t] = table[ids[b, t]]: a model whose predictions are known in closed form."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(table)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[ids]


def hand_ppl(table: list[list[float]], windows: list[list[int]]) -> float:
    """exp(mean NLL) with plain Python floats and math.log/exp."""
    nll, n = 0.0, 0
    for w in windows:
        for prev, nxt in itertools.pairwise(w):
            row = table[prev]
            m = max(row)
            log_z = m + math.log(sum(math.exp(v - m) for v in row))
            nll += log_z - row[nxt]
            n += 1
    return math.exp(nll / n)


def test_ppl_equals_hand_computation() -> None:
    torch.manual_seed(1)
    table = torch.randn(7, 7, dtype=torch.float64) * 2
    windows = torch.randint(0, 7, (3, 9))
    res = perplexity(Bigram(table), windows, batch_size=2)
    expected = hand_ppl(table.tolist(), windows.tolist())
    assert res.ppl == pytest.approx(expected, rel=1e-12)
    assert (res.n_predicted, res.n_windows, res.window) == (24, 3, 9)
    assert res.tokens_fingerprint == token_fingerprint(windows)
    assert math.exp(sum(res.window_nll) / 3) == pytest.approx(expected, rel=1e-12)
    # uniform model: ppl is exactly the vocabulary size
    assert perplexity(Bigram(torch.zeros(7, 7, dtype=torch.float64)), windows).ppl == pytest.approx(
        7.0, rel=1e-12
    )


def test_ppl_of_tiny_llama_matches_direct_computation(make_tiny_model) -> None:
    model = make_tiny_model("llama", dtype=torch.float64)
    ids = torch.randint(0, 96, (4, 16), generator=torch.Generator().manual_seed(3))
    win = TokenWindows(ids, token_fingerprint(ids), "test")
    res = perplexity(model, win)
    with torch.no_grad():
        logits = model(ids).logits
    lp = torch.log_softmax(logits, -1)
    nll = -sum(float(lp[b, t, ids[b, t + 1]]) for b in range(4) for t in range(15))
    assert res.ppl == pytest.approx(math.exp(nll / 60), rel=1e-10)
    assert perplexity(model, win, batch_size=3).ppl == pytest.approx(res.ppl, rel=1e-12)
    assert res.tokens_fingerprint == win.fingerprint


def test_logits_fn_validates() -> None:
    with pytest.raises(InvalidInput, match="expected logits"):
        logits_fn(lambda ids: {"x": 1})(torch.zeros(1, 3, dtype=torch.int64))
    with pytest.raises(InvalidInput, match="shape"):
        logits_fn(lambda ids: torch.zeros(1, 2, 5))(torch.zeros(1, 3, dtype=torch.int64))
    assert logits_fn(lambda ids: (torch.zeros(1, 3, 5),))(
        torch.zeros(1, 3, dtype=torch.int64)
    ).shape == (1, 3, 5)
    with pytest.raises(InvalidInput, match="int64"):
        perplexity(lambda ids: ids, torch.zeros(2, 3, dtype=torch.int32))


def test_kl_zero_with_itself_positive_after_perturbation(make_tiny_model) -> None:
    model = make_tiny_model("qwen2")
    ids = torch.randint(0, 96, (3, 24), generator=torch.Generator().manual_seed(4))
    same = kl_to_reference(model, model, ids)
    assert same.kl == 0.0 and same.kl_max == 0.0 and same.agreement == 1.0
    assert same.ref_ppl == same.model_ppl == pytest.approx(perplexity(model, ids).ppl, rel=1e-12)
    other = make_tiny_model("qwen2")
    with torch.no_grad():
        other.model.layers[0].mlp.down_proj.weight.add_(
            0.3 * torch.randn_like(other.model.layers[0].mlp.down_proj.weight)
        )
    res = kl_to_reference(model, other, ids, batch_size=2, chunk=5)
    assert res.kl > 1e-4 and res.kl_max >= res.kl and res.n_tokens == 3 * 23
    # dense f64 check of the definition
    with torch.no_grad():
        lr = torch.log_softmax(model(ids).logits[:, :-1].double(), -1)
        lq = torch.log_softmax(other(ids).logits[:, :-1].double(), -1)
    dense = float((lr.exp() * (lr - lq)).sum(-1).mean())
    assert res.kl == pytest.approx(dense, rel=1e-9)
    assert res.model_ppl == pytest.approx(perplexity(other, ids).ppl, rel=1e-9)
    assert kl_to_reference(model, other, ids, chunk=64).kl == pytest.approx(res.kl, rel=1e-12)


def test_kl_of_logits_hand_example() -> None:
    ref = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]], dtype=torch.float64)  # p = (1/4, 3/4)
    q = torch.tensor([[[0.0, 0.0], [5.0, 1.0]]], dtype=torch.float64)  # q = (1/2, 1/2); last unused
    kl, m = kl_of_logits(ref, q)
    expected = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    assert (
        kl.shape == (1, 1)
        and float(kl[0, 0]) == pytest.approx(expected, rel=1e-12)
        and m == float(kl[0, 0])
    )
    with pytest.raises(InvalidInput, match="differ in shape"):
        kl_of_logits(ref, q[:, :1])


def test_agreement(make_tiny_model) -> None:
    ref = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 3.0], [9.0, 0.0, 0.0]]])
    q = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 0.0, 2.5], [0.0, 0.0, 1.0], [0.0, 9.0, 0.0]]])
    assert agreement_counts(ref, q) == (2, 3)  # the last position is not a prediction
    model = make_tiny_model("llama")
    ids = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(5))
    assert greedy_agreement(model, model, ids).rate == 1.0
    noisy = make_tiny_model("llama", seed=99)
    res = greedy_agreement(model, noisy, ids)
    assert 0.0 <= res.rate < 0.5 and res.n_tokens == 38
