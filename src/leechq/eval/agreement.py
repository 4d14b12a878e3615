"""Greedy-token agreement between a model and its reference.

On the same teacher-forced windows, the fraction of predicted positions (1..T−1 of each window,
the positions perplexity scores) where the model's argmax next token equals the reference's. It is
1.0 for a model compared with itself and falls as quantization changes the ranking of the top
token; it is the cheap proxy for "does greedy decoding still say the same thing". Ties resolve to
the lowest token id in both models (``torch.argmax``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from leechq.data.corpus import TokenWindows
from leechq.errors import InvalidInput
from leechq.eval.ppl import as_ids, iter_batches, logits_fn


@dataclass
class AgreementResult:
    """Top-1 agreement.

    Attributes:
        rate: ``n_agree / n_tokens``.
        n_agree: positions where both argmaxes coincide.
        n_tokens: positions compared, ``n_windows · (window − 1)``.
        tokens_fingerprint: fingerprint of the window ids.
        seconds: wall time.
    """

    rate: float
    n_agree: int
    n_tokens: int
    tokens_fingerprint: str
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {
            "rate": self.rate,
            "n_agree": self.n_agree,
            "n_tokens": self.n_tokens,
            "tokens_fingerprint": self.tokens_fingerprint,
            "seconds": self.seconds,
        }


def agreement_counts(ref_logits: torch.Tensor, logits: torch.Tensor) -> tuple[int, int]:
    """``(agreeing positions, positions)`` over positions 0..T−2 of logits [B, T, V]."""
    if ref_logits.shape != logits.shape:
        raise InvalidInput(
            f"reference logits {tuple(ref_logits.shape)} and model logits "
            f"{tuple(logits.shape)} differ in shape"
        )
    a = ref_logits[:, :-1].argmax(dim=-1)
    b = logits[:, :-1].to(ref_logits.device).argmax(dim=-1)
    return int((a == b).sum()), int(a.numel())


@torch.inference_mode()
def greedy_agreement(
    ref_model: Any, model: Any, windows: TokenWindows | torch.Tensor, *, batch_size: int = 1
) -> AgreementResult:
    """Fraction of positions where ``model`` and ``ref_model`` predict the same next token.

    Args:
        ref_model: reference callable (ids int64 [B, T] -> logits [B, T, V]).
        model: model under test, same contract.
        windows: token windows (see :func:`~leechq.eval.ppl.perplexity`).
        batch_size: windows per forward pass.
    """
    start = time.perf_counter()
    ids, fp = as_ids(windows)
    f_ref, f_model = logits_fn(ref_model), logits_fn(model)
    agree = total = 0
    for _, batch in iter_batches(ids, batch_size):
        a, n = agreement_counts(f_ref(batch), f_model(batch))
        agree += a
        total += n
    return AgreementResult(agree / total, agree, total, fp, time.perf_counter() - start)
