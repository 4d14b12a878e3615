"""Sampling controls: same masks as transformers' warpers, correct draw frequencies, validation."""

from __future__ import annotations

import pytest
import torch

from leechq.errors import InvalidInput
from leechq.serve.sampling import (
    LOW_BIT_SAMPLING,
    SamplerState,
    SamplingConfig,
    apply_repetition_penalty,
    filter_logits,
    select_tokens,
)


def _state(cfg: SamplingConfig) -> SamplerState:
    st = SamplerState("cpu")
    st.load(cfg)
    return st


def _hf_filter(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    lp = pytest.importorskip("transformers.generation.logits_process")
    out = logits / cfg.temperature
    if cfg.top_k:
        out = lp.TopKLogitsWarper(cfg.top_k)(None, out)
    if cfg.top_p < 1:
        out = lp.TopPLogitsWarper(cfg.top_p)(None, out)
    if cfg.min_p:
        out = lp.MinPLogitsWarper(cfg.min_p)(None, out)
    return out


@pytest.mark.parametrize(
    "cfg",
    [
        SamplingConfig(temperature=0.7, top_k=20),
        SamplingConfig(temperature=1.3, top_p=0.9),
        SamplingConfig(temperature=0.6, top_k=20, top_p=0.95),
        SamplingConfig(temperature=1.0, min_p=0.05),
        SamplingConfig(temperature=0.8, top_k=50, top_p=0.8, min_p=0.1),
        SamplingConfig(temperature=1.0, top_k=1),
    ],
)
def test_filters_match_transformers_warpers(cfg: SamplingConfig) -> None:
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(0)) * 3
    ours = filter_logits(logits, _state(cfg), cfg.key())
    ref = _hf_filter(logits, cfg)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    keep = ~torch.isinf(ref)
    assert torch.allclose(ours[keep], ref[keep])
    assert keep.any(dim=-1).all()  # every row keeps at least one token


def test_repetition_penalty_matches_transformers() -> None:
    lp = pytest.importorskip("transformers.generation.logits_process")
    logits = torch.randn(2, 40, generator=torch.Generator().manual_seed(1))
    ids = torch.tensor([[1, 5, 5, 30], [2, 3, 39, 0]])
    seen = torch.zeros(2, 40, dtype=torch.bool).scatter(1, ids, True)
    ref = lp.RepetitionPenaltyLogitsProcessor(1.7)(ids, logits.clone())
    ours = apply_repetition_penalty(logits, seen, torch.tensor([1.7]))
    assert torch.allclose(ours, ref)


def test_the_low_bit_preset_penalises_seen_tokens_exactly_and_keeps_the_rest() -> None:
    cfg = LOW_BIT_SAMPLING
    logits = torch.tensor([[2.3, -1.5, 0.7, -0.2, 0.0]])
    seen = torch.tensor([[True, True, False, False, True]])
    st = _state(cfg)
    out = apply_repetition_penalty(logits, seen, st.penalty)
    r = cfg.repetition_penalty
    want = torch.tensor([[2.3 / r, -1.5 * r, 0.7, -0.2, 0.0]])
    torch.testing.assert_close(out, want, rtol=1e-6, atol=0)
    # a seen token that led by less than the penalty's margin loses the lead
    close = torch.tensor([[1.0, 0.95]])
    assert int(select_tokens(close, st, SamplingConfig(repetition_penalty=r).key(),
                             torch.tensor([[True, False]]))) == 1
    assert cfg.key() == (False, False, True, True, True) and cfg.seed is not None


def test_greedy_and_top_k_1_pick_the_argmax() -> None:
    logits = torch.randn(8, 100, generator=torch.Generator().manual_seed(2))
    greedy = SamplingConfig()
    assert torch.equal(select_tokens(logits, _state(greedy), greedy.key()), logits.argmax(-1))
    top1 = SamplingConfig(temperature=5.0, top_k=1)
    torch.manual_seed(0)
    assert torch.equal(select_tokens(logits, _state(top1), top1.key()), logits.argmax(-1))


def test_draws_follow_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    cfg = SamplingConfig(temperature=1.0)
    logits = probs.log().expand(20000, 4).contiguous()
    torch.manual_seed(3)
    draws = select_tokens(logits, _state(cfg), cfg.key())
    freq = torch.bincount(draws, minlength=4).float() / draws.numel()
    assert (freq - probs).abs().max().item() < 0.015


def test_top_p_and_min_p_never_draw_dropped_tokens() -> None:
    probs = torch.tensor([0.6, 0.25, 0.1, 0.05])
    logits = probs.log().expand(4000, 4).contiguous()
    torch.manual_seed(4)
    top_p = SamplingConfig(temperature=1.0, top_p=0.8)  # keeps {0, 1}
    assert set(select_tokens(logits, _state(top_p), top_p.key()).tolist()) == {0, 1}
    min_p = SamplingConfig(temperature=1.0, min_p=0.3)  # keeps p >= 0.18: {0, 1}
    assert set(select_tokens(logits, _state(min_p), min_p.key()).tolist()) == {0, 1}


def test_seeds_reproduce() -> None:
    logits = torch.randn(4, 1000, generator=torch.Generator().manual_seed(5))
    cfg = SamplingConfig(temperature=1.0, top_p=0.99)
    torch.manual_seed(7)
    a = select_tokens(logits, _state(cfg), cfg.key())
    torch.manual_seed(7)
    b = select_tokens(logits, _state(cfg), cfg.key())
    assert torch.equal(a, b)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1.0},
        {"top_k": -2},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"min_p": 2.0},
        {"repetition_penalty": 0.0},
        {"temperature": float("nan")},
    ],
)
def test_invalid_settings_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidInput):
        SamplingConfig(**kwargs)  # type: ignore[arg-type]


def test_from_generation_config() -> None:
    qwen3 = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}
    cfg = SamplingConfig.from_generation_config(qwen3)
    assert (cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p) == (0.6, 20, 0.95, 0.0)
    assert SamplingConfig.from_generation_config({"do_sample": False}).greedy
    assert SamplingConfig.from_generation_config({}).greedy
    assert cfg.key() == (False, True, True, False, False)


def test_penalty_without_seen_is_an_error() -> None:
    cfg = SamplingConfig(repetition_penalty=1.2)
    with pytest.raises(InvalidInput, match="seen"):
        select_tokens(torch.randn(1, 5), _state(cfg), cfg.key())
