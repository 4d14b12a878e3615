"""``leechq run OUT --prompt P``: answer one prompt with a quantized model, streaming the tokens.

A thin shell (docs/architecture.md §1 ``cli/generate.py``) over :func:`leechq.models.load.load` and
:func:`leechq.serve.generate.generate`. The prompt goes through the tokenizer's chat template when
it has one (unless ``--raw``), through :func:`leechq.serve.chat.format_chat`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any


def sampling_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~leechq.serve.sampling.SamplingConfig` of ``--temperature`` / ``--top-p``."""
    from leechq.serve.sampling import SamplingConfig

    return SamplingConfig(temperature=args.temperature, top_p=args.top_p)


def prompt_ids(
    tokenizer: Any, prompt: str, system: str | None = None, raw: bool = False
) -> list[int]:
    """Token ids of ``prompt``: chat-templated (with the assistant turn opened) unless ``raw``."""
    if raw:
        return list(tokenizer.encode(prompt))
    from leechq.serve.chat import format_chat

    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}
    ]
    return format_chat(tokenizer, messages)


def answer(
    model: Any,
    tokenizer: Any,
    ids: list[int],
    max_new_tokens: int,
    sampling: Any,
    write: Callable[[str], Any],
) -> str:
    """Generate from ``ids``, streaming each new piece of text to ``write``; returns the text."""
    from leechq.serve.generate import generate

    out = generate(
        model, tokenizer, [ids], max_new_tokens, sampling, stream=lambda _row, piece: write(piece)
    )
    return str(out.texts[0])


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
    """Load ``args.artifact`` and answer ``args.prompt``."""
    from leechq.models.load import load

    model, tokenizer = load(args.artifact, device=args.device, dtype=args.dtype)
    ids = prompt_ids(tokenizer, args.prompt, args.system, args.raw)
    answer(model, tokenizer, ids, args.max_new_tokens, sampling_from_args(args), _write)
    _write("\n")
    return 0
