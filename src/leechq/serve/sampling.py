"""Token selection: greedy and sampled (temperature, top-k, top-p, min-p, repetition penalty), for
a whole batch (:func:`select_tokens`) or per row (:class:`RowSampler`, presence and frequency
penalties and per-row seeds too).

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
        presence_penalty: subtracted from the logit of every id generated at least once (0: off;
            OpenAI semantics; the slot pool only).
        frequency_penalty: times the number of times an id was generated, subtracted from its
            logit (0: off; the slot pool only).
        seed: seed of torch's default generator, set at the start of generation (None: leave it);
            in the slot pool, the seed of the row's own counter-based stream.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
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

        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not (math.isfinite(v) and -2.0 <= v <= 2.0):
                raise InvalidInput(f"{name} must be in [-2, 2], got {v}")

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


LOW_BIT_SAMPLING = SamplingConfig(
    temperature=0.7, top_p=0.9, min_p=0.05, repetition_penalty=1.15, seed=0
)
"""Sampling for a 2-bit model's answers (the demo's preset). Greedy decoding of a 2-bit model
falls into loops: its noise flattens the distribution's head, and the argmax keeps returning to
the same phrase. This preset samples at a moderate temperature, cuts the low-probability tail
(nucleus and min-p: the tail is where 2-bit noise lives) and divides the logits of tokens already
present (prompt and answer) by the repetition penalty. Seeded: the same prompt gives the same
answer on a machine."""


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


# --------------------------------------------------------------------------------------------------
# Per-row sampling (the continuous-batching slot pool, :mod:`leechq.serve.pool`)

_MASK32 = 0xFFFFFFFF


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser on int64 tensors holding values in [0, 2**32): a bijection
    whose output bits all depend on every input bit. Products wrap modulo 2**64, whose low 32 bits
    are those of the exact product, so the masked result is exact on every device."""
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _MASK32
    return x ^ (x >> 16)


def row_uniforms(seed: torch.Tensor, counter: torch.Tensor, vocab: int) -> torch.Tensor:
    """Counter-based uniforms: float32 [B, vocab] in (0, 1), a pure function of each row's ``seed``
    and ``counter`` (int64 [B], values in [0, 2**32)) and the column. A row's draws therefore do
    not depend on which other rows share the batch, and need no generator state (graph-safe)."""
    cols = torch.arange(vocab, device=seed.device, dtype=torch.int64)
    key = _fmix32((seed[:, None] ^ _fmix32(counter[:, None] & _MASK32)) & _MASK32)
    h = _fmix32((key + cols[None, :] * 0x9E3779B9) & _MASK32)
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


class RowSampler:
    """Per-row sampling values of a pool of ``rows`` rows (stable device buffers for graph replays).

    One row's settings never affect another row's tokens: greedy rows take the argmax of their
    penalised logits, sampled rows the exponential race of :func:`row_uniforms`.

    Attributes:
        temperature, top_p, min_p, presence, frequency, repetition: float32 [rows] (temperature 0 =
            greedy, top_p 1 / min_p 0 / penalties 0 or 1 = off).
        top_k: int64 [rows] (0 = off).
        seed, counter: int64 [rows]; the counter advances by one per drawn token.
        counts: int32 [rows, vocab], generated tokens per id (presence and frequency penalties).
        seen: bool [rows, vocab], ids present in the prompt or the output (repetition penalty).
    """

    def __init__(self, rows: int, vocab: int, device: torch.device | str) -> None:
        f = dict(dtype=torch.float32, device=device)
        self.temperature = torch.zeros(rows, **f)
        self.top_p = torch.ones(rows, **f)
        self.min_p = torch.zeros(rows, **f)
        self.presence = torch.zeros(rows, **f)
        self.frequency = torch.zeros(rows, **f)
        self.repetition = torch.ones(rows, **f)
        self.top_k = torch.zeros(rows, dtype=torch.int64, device=device)
        self.seed = torch.zeros(rows, dtype=torch.int64, device=device)
        self.counter = torch.zeros(rows, dtype=torch.int64, device=device)
        self.counts = torch.zeros(rows, vocab, dtype=torch.int32, device=device)
        self.seen = torch.zeros(rows, vocab, dtype=torch.bool, device=device)

    def load(self, row: int, cfg: SamplingConfig, seed: int, prompt: list[int]) -> None:
        """Set row ``row`` for a new request: ``cfg``'s values, ``seed`` (in [0, 2**32)), the
        prompt's ids marked seen, no generated tokens."""
        self.temperature[row] = cfg.temperature
        self.top_p[row] = cfg.top_p
        self.min_p[row] = cfg.min_p
        self.presence[row] = cfg.presence_penalty
        self.frequency[row] = cfg.frequency_penalty
        self.repetition[row] = cfg.repetition_penalty
        self.top_k[row] = cfg.top_k
        self.seed[row] = seed & _MASK32
        self.counter[row] = 0
        self.counts[row].zero_()
        self.seen[row].zero_()
        if prompt:
            self.seen[row, torch.tensor(prompt, dtype=torch.int64, device=self.seen.device)] = True

    def select(self, logits: torch.Tensor, rows: torch.Tensor | int, key: tuple[bool, ...]
               ) -> torch.Tensor:
        """Pick and record one token per row.

        Args:
            logits: float32 [n, V] of the rows ``rows`` (an int n: rows 0..n-1, read through
                views, graph-safe; an int64 tensor [n]: those rows, gathered, for the prefill).
            key: :func:`row_key` of the rows' configs — which stages run (static in a graph).

        Returns:
            int64 [n]; the rows' ``counts``, ``seen`` and ``counter`` are updated in place.
        """
        sampled, filtered, penalised = key
        if isinstance(rows, int):
            def take(t: torch.Tensor) -> torch.Tensor:
                return t[:rows]
        else:
            def take(t: torch.Tensor) -> torch.Tensor:
                return t.index_select(0, rows)
        if penalised:
            counts = take(self.counts).float()
            logits = logits - take(self.frequency)[:, None] * counts
            logits = logits - take(self.presence)[:, None] * (counts > 0).float()
            rep = take(self.repetition)[:, None]
            penalised_rep = torch.where(logits > 0, logits / rep, logits * rep)
            logits = torch.where(take(self.seen), penalised_rep, logits)
        best = logits.argmax(dim=-1)
        if sampled:
            temp = take(self.temperature)
            greedy = temp == 0
            scaled = logits / torch.where(greedy, 1.0, temp)[:, None]
            if filtered:
                scaled = _filter_rows(scaled, take(self.top_k), take(self.top_p), take(self.min_p))
            probs = scaled.softmax(dim=-1)
            race = -torch.log(row_uniforms(take(self.seed), take(self.counter), logits.shape[-1]))
            best = torch.where(greedy, best, (probs / race).argmax(dim=-1))
        self._record(rows, best)
        return best

    def _record(self, rows: torch.Tensor | int, tokens: torch.Tensor) -> None:
        one = torch.ones_like(tokens, dtype=torch.int32)[:, None]
        if isinstance(rows, int):
            self.counts[:rows].scatter_add_(1, tokens[:, None], one)
            self.seen[:rows].scatter_(1, tokens[:, None], True)
            self.counter[:rows].add_(1)
        else:
            self.counts.index_put_((rows, tokens), one[:, 0], accumulate=True)
            self.seen.index_put_((rows, tokens), torch.ones_like(tokens, dtype=torch.bool))
            self.counter.index_add_(0, rows, torch.ones_like(rows))


def _filter_rows(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                 min_p: torch.Tensor) -> torch.Tensor:
    """Per-row top-k (0 = off), top-p and min-p on temperature-scaled logits [n, V] (the order and
    semantics of :func:`filter_logits`; each keeps at least the most likely token)."""
    vocab = logits.shape[-1]
    neg_inf = float("-inf")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab) - 1
    kth = sorted_logits.gather(-1, k[:, None])
    logits = logits.masked_fill(logits < kth, neg_inf)
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, neg_inf)
    probs = sorted_logits.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs
    drop_sorted = before >= top_p[:, None]
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    logits = logits.masked_fill(drop, neg_inf)
    probs = logits.softmax(dim=-1)
    return logits.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), neg_inf)


def row_key(configs: list[SamplingConfig]) -> tuple[bool, bool, bool]:
    """Which stages of :meth:`RowSampler.select` a set of rows needs: (any sampled, any top-k /
    top-p / min-p filter, any penalty). Graphs are captured per key."""
    sampled = [c for c in configs if not c.greedy]
    return (
        bool(sampled),
        any(c.top_k > 0 or c.top_p < 1.0 or c.min_p > 0.0 for c in sampled),
        any(c.presence_penalty or c.frequency_penalty or c.repetition_penalty != 1.0
            for c in configs),
    )
