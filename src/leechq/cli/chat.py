"""``leechq chat OUT``: an interactive conversation with a quantized model.

A thin shell over :func:`leechq.models.load.load` and :func:`leechq.serve.chat.chat_loop` (which
re-renders the conversation with the tokenizer's chat template every turn and streams the reply).
"""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    """Load ``args.artifact`` and chat until ``/exit`` or end of input."""
    from leechq.cli.generate import sampling_from_args
    from leechq.models.load import load
    from leechq.serve.chat import HELP, chat_loop

    model, tokenizer = load(args.artifact, device=args.device, dtype=args.dtype)
    print(f"leechq chat — {args.artifact}; {HELP}")
    chat_loop(
        model,
        tokenizer,
        sampling_from_args(args),
        system=args.system,
        max_new_tokens=args.max_new_tokens,
    )
    return 0
