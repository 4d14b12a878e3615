"""Perplexity on fixed, non-overlapping token windows (docs/evaluation.md protocol).

``ppl = exp(total NLL / total predicted tokens)``: each window of ``T`` tokens is scored on its own
(no context carried across windows), predicting tokens 1..T−1 from their prefixes, so a window
contributes ``T − 1`` predictions. NLLs are computed from f32 (or f64 when the model runs in f64)
log-softmax and summed in f64. The result carries the token fingerprint of the windows, so two
arms can prove they scored identical tokens.

A model is anything callable on ``int64 [B, T]`` token ids that returns logits ``[B, T, V]``: a
plain tensor, an object with ``.logits`` (transformers outputs) or a tuple whose first element is
the logits. transformers models are called with ``use_cache=False`` (no KV cache is built). This
module also owns those small adapters, shared by :mod:`leechq.eval.kl` and
:mod:`leechq.eval.agreement`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from leechq.data.corpus import TokenWindows, token_fingerprint
from leechq.errors import InvalidInput

LogitsFn = Callable[[torch.Tensor], torch.Tensor]


def model_device(model: Any) -> torch.device:
    """Device of a model's first parameter (CPU for parameterless callables)."""
    params = getattr(model, "parameters", None)
    if callable(params):
        for p in params():
            return p.device
    return torch.device("cpu")


def logits_fn(model: Any) -> LogitsFn:
    """Adapt a model to ``ids int64 [B, T] -> logits [B, T, V]`` (on the model's device).

    transformers models (objects with a ``config``) are called as ``model(input_ids=ids,
    use_cache=False)``; other callables as ``model(ids)``.
    """
    is_hf = hasattr(model, "config") and hasattr(model, "forward")
    device = model_device(model)

    def call(ids: torch.Tensor) -> torch.Tensor:
        ids = ids.to(device)
        out = model(input_ids=ids, use_cache=False) if is_hf else model(ids)
        if isinstance(out, torch.Tensor):
            logits = out
        elif hasattr(out, "logits"):
            logits = out.logits
        elif isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
            logits = out[0]
        else:
            raise InvalidInput(f"model returned {type(out).__name__}; expected logits [B, T, V]")
        if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(ids.shape):
            raise InvalidInput(
                f"model returned logits of shape {tuple(logits.shape)} for ids of shape "
                f"{tuple(ids.shape)}; expected [B, T, V] with B, T = {tuple(ids.shape)}"
            )
        return logits

    return call


def as_ids(windows: TokenWindows | torch.Tensor) -> tuple[torch.Tensor, str]:
    """``(ids int64 [N, T], fingerprint)`` of a :class:`TokenWindows` or a raw id tensor."""
    if isinstance(windows, TokenWindows):
        return windows.ids, windows.fingerprint
    if not isinstance(windows, torch.Tensor) or windows.dim() != 2:
        raise InvalidInput("windows must be TokenWindows or an int64 tensor [n_windows, window]")
    if windows.dtype != torch.int64:
        raise InvalidInput(f"window ids must be int64, got {windows.dtype}")
    if windows.shape[1] < 2:
        raise InvalidInput(f"windows need at least 2 tokens, got shape {tuple(windows.shape)}")
    return windows, token_fingerprint(windows)


def iter_batches(ids: torch.Tensor, batch_size: int) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(first window index, ids [b, T])`` batches in order."""
    if batch_size <= 0:
        raise InvalidInput(f"batch_size must be positive, got {batch_size}")
    for start in range(0, ids.shape[0], batch_size):
        yield start, ids[start : start + batch_size]


def score_dtype(logits: torch.Tensor) -> torch.dtype:
    """Dtype for log-softmax: f64 for f64 logits, else f32."""
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def window_nll(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Summed next-token NLL of each window.

    Args:
        logits: [B, T, V] logits for ``ids``.
        ids: int64 [B, T] token ids.

    Returns:
        float64 [B]: ``Σ_{t=1}^{T-1} −log p(ids[t] | ids[:t])`` per window.
    """
    lp = torch.log_softmax(logits[:, :-1].to(score_dtype(logits)), dim=-1)
    target = ids[:, 1:].to(lp.device).unsqueeze(-1)
    return -lp.gather(-1, target).squeeze(-1).to(torch.float64).sum(dim=-1)


@dataclass
class PerplexityResult:
    """Perplexity of one model on one set of windows.

    Attributes:
        ppl: ``exp(nll_sum / n_predicted)``.
        nll_sum: total NLL in nats (f64).
        n_predicted: predicted tokens, ``n_windows · (window − 1)``.
        n_windows: number of windows.
        window: tokens per window.
        tokens_fingerprint: fingerprint of the window ids.
        window_nll: mean NLL per predicted token, one value per window (for paired statistics).
        seconds: wall time.
    """

    ppl: float
    nll_sum: float
    n_predicted: int
    n_windows: int
    window: int
    tokens_fingerprint: str
    window_nll: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {
            "ppl": self.ppl,
            "nll_sum": self.nll_sum,
            "n_predicted": self.n_predicted,
            "n_windows": self.n_windows,
            "window": self.window,
            "tokens_fingerprint": self.tokens_fingerprint,
            "window_nll": self.window_nll,
            "seconds": self.seconds,
        }


@torch.inference_mode()
def perplexity(
    model: Any, windows: TokenWindows | torch.Tensor, *, batch_size: int = 1
) -> PerplexityResult:
    """Perplexity of ``model`` on non-overlapping windows.

    Args:
        model: callable on ids int64 [B, T] returning logits [B, T, V] (see :func:`logits_fn`).
        windows: :class:`~leechq.data.corpus.TokenWindows` or ids int64 [N, T].
        batch_size: windows per forward pass.

    Returns:
        :class:`PerplexityResult`.
    """
    start = time.perf_counter()
    ids, fp = as_ids(windows)
    fn = logits_fn(model)
    per_window: list[float] = []
    for _, batch in iter_batches(ids, batch_size):
        per_window.extend(window_nll(fn(batch), batch).tolist())
    n_windows, window = ids.shape
    n_pred = n_windows * (window - 1)
    total = math.fsum(per_window)
    return PerplexityResult(
        ppl=math.exp(total / n_pred),
        nll_sum=total,
        n_predicted=n_pred,
        n_windows=n_windows,
        window=window,
        tokens_fingerprint=fp,
        window_nll=[v / (window - 1) for v in per_window],
        seconds=time.perf_counter() - start,
    )
