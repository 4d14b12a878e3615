"""Generation through transformers' own modules, for the families the serving engine does not run.

The CUDA-graph engine (:mod:`leechq.serve.model`) covers the Llama-shaped and Gemma-2/3 blocks; a
quantized Phi-3, Olmo2 or mixture-of-experts model still runs — its quantized linears are
``LeechqLinear`` modules inside transformers' own blocks — through this plain loop: one forward of
the prompt, then one forward per new token with transformers' KV cache, the next token picked by
the engine's own sampler (:func:`leechq.serve.sampling.select_tokens`, same filters and repetition
penalty). Rows are generated one after the other (no batching, no graphs): correct everywhere, not
fast.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from leechq.errors import InvalidInput
from leechq.serve.sampling import SamplerState, SamplingConfig, select_tokens


@torch.no_grad()
def generate_ids_hf(
    model: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: SamplingConfig,
    stop: Sequence[int],
    callback: Callable[[int, int], Any] | None = None,
) -> tuple[list[list[int]], float, float, int]:
    """New tokens of every prompt, each row through the first stop id (included).

    Args:
        model: a transformers causal LM (any family), in eval mode.
        prompts: token ids per row (non-empty).
        max_new_tokens: tokens to generate per row (> 0).
        sampling: token selection.
        stop: end-of-sequence ids.
        callback: ``callback(row, token)`` for each new token.

    Returns:
        ``(tokens per row, prefill seconds, decode seconds, decode steps of the longest row)``.
    """
    if max_new_tokens <= 0:
        raise InvalidInput(f"max_new_tokens must be > 0, got {max_new_tokens}")
    device = next(model.parameters()).device
    vocab = int(model.config.get_text_config().vocab_size)
    state = SamplerState(device)
    state.load(sampling)
    key = sampling.key()
    if sampling.seed is not None:
        torch.manual_seed(sampling.seed)
    stops = set(int(s) for s in stop)
    out: list[list[int]] = []
    prefill_s = decode_s = 0.0
    steps = 0
    for row, prompt in enumerate(prompts):
        if not prompt:
            raise InvalidInput(f"prompt {row} is empty")
        ids = torch.tensor([list(prompt)], dtype=torch.int64, device=device)
        seen = torch.zeros(1, vocab, dtype=torch.bool, device=device)
        seen[0, ids[0].clamp(max=vocab - 1)] = True
        t0 = time.perf_counter()
        res = model(input_ids=ids, use_cache=True)
        cache = res.past_key_values
        new: list[int] = []
        for step in range(max_new_tokens):
            tok = int(select_tokens(res.logits[:, -1].float(), state, key, seen)[0])
            new.append(tok)
            seen[0, tok] = True
            if callback is not None:
                callback(row, tok)
            if step == 0:
                prefill_s += time.perf_counter() - t0
                t0 = time.perf_counter()
            if tok in stops or step == max_new_tokens - 1:
                break
            res = model(
                input_ids=torch.tensor([[tok]], device=device),
                past_key_values=cache,
                use_cache=True,
            )
            cache = res.past_key_values
        decode_s += time.perf_counter() - t0
        steps = max(steps, len(new) - 1)
        out.append(new)
    return out, prefill_s, decode_s, steps
