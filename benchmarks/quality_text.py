"""Training text the reference model writes itself, for the quality report's ``--tune-text`` arms
(``benchmarks/quality.py``): windows sampled from the teacher (data-free distillation's text), and
their mix with the calibration text's windows.

Each window starts at a token drawn uniformly from the tokenizer's ordinary tokens (no special
token) and continues by sampling the reference's next-token distribution at temperature 1, the
special tokens (end of text among them) excluded, so every window is as long as the calibration
windows it stands beside.
"""

from __future__ import annotations

from typing import Any

import torch

TEXT_KINDS = ("generated", "mix")


def special_ids(tokenizer: Any) -> list[int]:
    """The ids a transformers ``tokenizer`` reserves: its special tokens and every added token
    (chat and fill-in-the-middle markers among them)."""
    ids = set(getattr(tokenizer, "all_special_ids", None) or [])
    ids |= set((getattr(tokenizer, "added_tokens_decoder", None) or {}).keys())
    return sorted(int(i) for i in ids)


@torch.no_grad()
def teacher_windows(model: Any, n: int, length: int, banned: list[int], vocab: int, *,
                    seed: int = 0, batch: int = 64, device: str | torch.device = "cpu") \
        -> torch.Tensor:
    """``n`` windows of ``length`` tokens sampled from ``model`` (a transformers causal LM).

    Args:
        model: the reference; moved to ``device`` for the sampling and back to where it was.
        n, length: windows and tokens per window (``length`` >= 1).
        banned: token ids never sampled (the tokenizer's special tokens).
        vocab: first tokens are drawn from ids ``[0, vocab)`` not in ``banned``; ids ``>= vocab``
            (head rows the tokenizer never emits) are never sampled either (``vocab`` <= the
            head's rows).
        seed: the sampling's seed (the same seed, model and sizes give the same windows).
        batch: windows sampled together.

    Returns:
        int64 [n, length] on the CPU.
    """
    if n < 1 or length < 1 or batch < 1:
        raise ValueError(f"teacher_windows: n, length and batch must be >= 1, got {n}, {length}, "
                         f"{batch}")
    home = next(model.parameters()).device
    model.to(device)
    g = torch.Generator().manual_seed(seed)
    # never drawn, first tokens included: ``banned`` and the head's ids >= vocab
    never = torch.ones(model.get_output_embeddings().weight.shape[0], dtype=torch.bool)
    never[:vocab] = False
    never[[b for b in banned if 0 <= b < vocab]] = True
    firsts = (~never[:vocab]).nonzero().squeeze(1)
    out = torch.empty(n, length, dtype=torch.int64)
    try:
        for s in range(0, n, batch):
            b = min(batch, n - s)
            out[s:s + b, 0] = firsts[torch.randint(0, firsts.numel(), (b,), generator=g)]
            past, cur = None, out[s:s + b, :1].to(device)
            for t in range(1, length):
                o = model(input_ids=cur, past_key_values=past, use_cache=True)
                past = o.past_key_values
                logits = o.logits[:, -1].float().cpu().masked_fill_(never, float("-inf"))
                nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=g)
                out[s:s + b, t] = nxt[:, 0]
                cur = nxt.to(device)
    finally:
        model.to(home)
    return out


def mixed_windows(calibration: torch.Tensor, generated: torch.Tensor) -> torch.Tensor:
    """The ``mix`` arm's training windows: ``calibration`` (int64 [N, T]) with every other window
    (the odd ones) replaced by one of ``generated`` (int64 [>= N // 2, T]): half the text each."""
    out = calibration.clone()
    out[1::2] = generated[: out[1::2].shape[0]]
    return out
