"""KL(reference ‖ model) of next-token distributions, streamed over windows.

For every predicted position t (1..T−1 of each window, the positions perplexity scores) the
reference and the model each give a next-token distribution; the reported figure is the mean over
positions of ``KL(p_ref ‖ p_model) = Σ_v p_ref(v)·(log p_ref(v) − log p_model(v))`` in nats.

Memory: one batch of windows is run through both models at a time, and the log-softmax/KL is done
in chunks of ``chunk`` positions in f64, so at most ``2·batch·T·V`` logits plus one f64 chunk are
alive — logits of the whole evaluation are never held. Because the logits are at hand anyway, the
same pass also yields both perplexities and the greedy agreement (:mod:`leechq.eval.agreement`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from leechq.data.corpus import TokenWindows
from leechq.errors import InvalidInput
from leechq.eval.agreement import agreement_counts
from leechq.eval.ppl import as_ids, iter_batches, logits_fn, window_nll


@dataclass
class KLResult:
    """KL of a model to its reference, with the by-products of the same pass.

    Attributes:
        kl: mean KL(ref ‖ model) per predicted token, nats.
        kl_max: largest per-position KL seen.
        n_tokens: predicted positions compared.
        window_kl: mean KL per window.
        agreement: greedy top-1 agreement rate.
        ref_ppl: reference perplexity on the same windows.
        model_ppl: model perplexity on the same windows.
        tokens_fingerprint: fingerprint of the window ids.
        seconds: wall time.
    """

    kl: float
    kl_max: float
    n_tokens: int
    window_kl: list[float] = field(default_factory=list)
    agreement: float = float("nan")
    ref_ppl: float = float("nan")
    model_ppl: float = float("nan")
    tokens_fingerprint: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {
            "kl": self.kl,
            "kl_max": self.kl_max,
            "n_tokens": self.n_tokens,
            "window_kl": self.window_kl,
            "agreement": self.agreement,
            "ref_ppl": self.ref_ppl,
            "model_ppl": self.model_ppl,
            "tokens_fingerprint": self.tokens_fingerprint,
            "seconds": self.seconds,
        }


def kl_of_logits(
    ref_logits: torch.Tensor, logits: torch.Tensor, *, chunk: int = 64
) -> tuple[torch.Tensor, float]:
    """Per-position KL(ref ‖ model) over positions 0..T−2, computed in f64 chunks.

    Args:
        ref_logits: [B, T, V] reference logits.
        logits: [B, T, V] model logits (same shape).
        chunk: positions per f64 chunk.

    Returns:
        ``(kl float64 [B, T−1], max)``.
    """
    if ref_logits.shape != logits.shape:
        raise InvalidInput(
            f"reference logits {tuple(ref_logits.shape)} and model logits "
            f"{tuple(logits.shape)} differ in shape"
        )
    b, t, _ = ref_logits.shape
    out = torch.empty(b, t - 1, dtype=torch.float64, device=ref_logits.device)
    for s in range(0, t - 1, chunk):
        e = min(t - 1, s + chunk)
        lr = torch.log_softmax(ref_logits[:, s:e].to(torch.float64), dim=-1)
        lq = torch.log_softmax(
            logits[:, s:e].to(device=ref_logits.device, dtype=torch.float64), dim=-1
        )
        # exp(lr)·(lr − lq); clamp tiny negative round-off of a true zero
        out[:, s:e] = (lr.exp() * (lr - lq)).sum(dim=-1).clamp_min(0.0)
    return out, float(out.max()) if out.numel() else 0.0


@torch.inference_mode()
def kl_to_reference(
    ref_model: Any,
    model: Any,
    windows: TokenWindows | torch.Tensor,
    *,
    batch_size: int = 1,
    chunk: int = 64,
) -> KLResult:
    """Mean KL(ref ‖ model) per predicted token, plus agreement and both perplexities.

    Args:
        ref_model: reference callable (ids int64 [B, T] -> logits [B, T, V]).
        model: model under test, same contract.
        windows: token windows.
        batch_size: windows per forward pass.
        chunk: positions per f64 KL chunk.

    Returns:
        :class:`KLResult`.
    """
    start = time.perf_counter()
    ids, fp = as_ids(windows)
    f_ref, f_model = logits_fn(ref_model), logits_fn(model)
    window_kl: list[float] = []
    kl_max = 0.0
    agree = total = 0
    nll_ref: list[float] = []
    nll_model: list[float] = []
    for _, batch in iter_batches(ids, batch_size):
        lr = f_ref(batch)
        lq = f_model(batch)
        kl, m = kl_of_logits(lr, lq, chunk=chunk)
        window_kl.extend(kl.mean(dim=-1).tolist())
        kl_max = max(kl_max, m)
        a, n = agreement_counts(lr, lq)
        agree += a
        total += n
        nll_ref.extend(window_nll(lr, batch).tolist())
        nll_model.extend(window_nll(lq, batch).tolist())
        del lr, lq
    n_windows = ids.shape[0]
    return KLResult(
        kl=math.fsum(window_kl) / n_windows,
        kl_max=kl_max,
        n_tokens=total,
        window_kl=window_kl,
        agreement=agree / total,
        ref_ppl=math.exp(math.fsum(nll_ref) / total),
        model_ppl=math.exp(math.fsum(nll_model) / total),
        tokens_fingerprint=fp,
        seconds=time.perf_counter() - start,
    )
