"""Token selection: greedy and sampled (temperature, top-k, top-p, min-p, repetition penalty).

The semantics and the order follow transformers' ``generate`` (repetition penalty, then temperature,
top-k, top-p, min-p; each filter keeps at least one token), so the same settings mean the same thing
here and there. Everything runs as tensor operations with no host synchronisation, so it can sit
inside a CUDA graph: the numeric values live in device tensors (:class:`SamplerState`) and can
change between replays; which filters run is a static choice (:meth:`SamplingConfig.key`).

Sampling uses the exponential-race form of the categorical draw: ``argmax(p / E)`` with ``E ~
Exp(1)`` i.i.d. picks token ``i`` with probability ``p_i``; it needs one random tensor and no host
round trip. The random numbers come from torch's default generator of the logits' device, so
``seed`` makes runs reproducible (the same contract as transformers' ``set_seed``), graphs included.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from leechq.errors import InvalidInput


@dataclass(frozen=True)
class SamplingConfig:
    """How to pick the next token.

    Attributes:
        temperature: 0 means greedy (argmax); otherwise logits are divided by it before sampling.
        top_k: keep the k most likely tokens (0: off).
        top_p: keep the smallest most-likely set whose probability reaches top_p (1.0: off).
        min_p: drop tokens less likely than ``min_p`` times the most likely one (0: off).
        repetition_penalty: divide positive / multiply negative logits of tokens already present in
            the row (prompt and generated so far) by this (1.0: off); applies to greedy decoding
            too.
        seed: seed of torch's default generator, set at the start of generation (None: leave it).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise InvalidInput(f"temperature must be finite and >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise InvalidInput(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise InvalidInput(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise InvalidInput(f"min_p must be in [0, 1], got {self.min_p}")
        if not (self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty)):
            raise InvalidInput(
                f"repetition_penalty must be finite and > 0, got {self.repetition_penalty}"
            )

    @property
    def greedy(self) -> bool:
        """Whether the choice is the argmax (temperature 0)."""
        return self.temperature == 0

    def key(self) -> tuple[bool, bool, bool, bool, bool]:
        """The static structure of the computation: (greedy, top-k on, top-p on, min-p on, penalty
        on).

        Two configs with the same key share a captured graph; only their values differ.
        """
        sampled = not self.greedy
        return (
            self.greedy,
            sampled and self.top_k > 0,
            sampled and self.top_p < 1.0,
            sampled and self.min_p > 0.0,
            self.repetition_penalty != 1.0,
        )

    @classmethod
    def from_generation_config(
        cls, gen: Mapping[str, Any] | Any, seed: int | None = None
    ) -> SamplingConfig:
        """A model's recommended settings from its ``generation_config.json`` (dict or object).

        ``do_sample`` false (or absent) gives greedy decoding; missing values keep the defaults
        above (transformers' own defaults are temperature 1.0, top-k 50, top-p 1.0 when sampling).
        """
        g = gen if isinstance(gen, Mapping) else getattr(gen, "to_dict", lambda: vars(gen))()
        penalty = float(g.get("repetition_penalty") or 1.0)
        if not g.get("do_sample", False):
            return cls(repetition_penalty=penalty, seed=seed)
        return cls(
            temperature=float(g.get("temperature") if g.get("temperature") is not None else 1.0),
            top_k=int(g.get("top_k") if g.get("top_k") is not None else 50),
            top_p=float(g.get("top_p") if g.get("top_p") is not None else 1.0),
            min_p=float(g.get("min_p") or 0.0),
            repetition_penalty=penalty,
            seed=seed,
        )


class SamplerState:
    """Device-side values of a :class:`SamplingConfig` (stable addresses for graph replays).

    Attributes:
        temperature, top_p, min_p, penalty: float32 [1]; top_k: int64 [1].
    """

    def __init__(self, device: torch.device | str) -> None:
        self.temperature = torch.ones(1, device=device)
        self.top_p = torch.ones(1, device=device)
        self.min_p = torch.zeros(1, device=device)
        self.penalty = torch.ones(1, device=device)
        self.top_k = torch.ones(1, dtype=torch.int64, device=device)

    def load(self, cfg: SamplingConfig) -> None:
        """Copy ``cfg``'s values in place (host → device, no reallocation)."""
        self.temperature.fill_(cfg.temperature if cfg.temperature > 0 else 1.0)
        self.top_p.fill_(cfg.top_p)
        self.min_p.fill_(cfg.min_p)
        self.penalty.fill_(cfg.repetition_penalty)
        self.top_k.fill_(max(cfg.top_k, 1))


def apply_repetition_penalty(
    logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor
) -> torch.Tensor:
    """Penalise tokens present in ``seen`` (bool [B, V]): positive logits ÷ penalty, negative ×
    penalty."""
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def filter_logits(
    logits: torch.Tensor, state: SamplerState, key: tuple[bool, bool, bool, bool, bool]
) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p filters: float32 [B, V] → [B, V] with −inf for
    dropped."""
    _, use_k, use_p, use_min_p, _ = key
    logits = logits / state.temperature
    neg_inf = float("-inf")  # a scalar fill: no host-to-device copy inside a captured graph
    if use_k or use_p:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        if use_k:
            k = state.top_k.clamp(max=logits.shape[-1]) - 1
            kth = sorted_logits.gather(-1, k.expand(logits.shape[0], 1))
            drop = logits < kth
            logits = logits.masked_fill(drop, neg_inf)
            sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, neg_inf)
        if use_p:
            probs = sorted_logits.softmax(dim=-1)
            before = probs.cumsum(dim=-1) - probs  # mass strictly above each sorted token
            drop_sorted = before >= state.top_p
            drop_sorted[..., 0] = False
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            logits = logits.masked_fill(drop, neg_inf)
    if use_min_p:
        probs = logits.softmax(dim=-1)
        drop = probs < state.min_p * probs.amax(dim=-1, keepdim=True)
        logits = logits.masked_fill(drop, neg_inf)
    return logits


def select_tokens(
    logits: torch.Tensor,
    state: SamplerState,
    key: tuple[bool, bool, bool, bool, bool],
    seen: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pick the next token of every row.

    Args:
        logits: float32 [B, V].
        state: the device-side values.
        key: :meth:`SamplingConfig.key` of the config whose values are in ``state``.
        seen: bool [B, V] of tokens already present per row (needed iff the penalty is on).

    Returns:
        int64 [B].
    """
    greedy, *_, use_penalty = key
    if use_penalty:
        if seen is None:
            raise InvalidInput("repetition penalty needs the per-row `seen` token mask")
        logits = apply_repetition_penalty(logits, seen, state.penalty)
    if greedy:
        return logits.argmax(dim=-1)
    probs = filter_logits(logits, state, key).softmax(dim=-1)
    race = torch.empty_like(probs).exponential_(1.0).clamp_min_(1e-30)
    return (probs / race).argmax(dim=-1)
