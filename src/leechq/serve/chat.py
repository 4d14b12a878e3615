"""Chat: prompt formatting with the tokenizer's chat template, and the interactive loop of ``leechq
chat``.

The loop keeps the conversation as a list of ``{"role", "content"}`` messages, re-renders it with
the model's own chat template every turn (so the template decides what history the model sees, e.g.
Qwen3 drops earlier reasoning blocks), and streams the reply through
:func:`leechq.serve.generate.generate`. Commands: ``/reset`` forgets the conversation, ``/exit`` (or
end of input) leaves.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from leechq.serve.generate import generate
from leechq.serve.sampling import SamplingConfig


def _stdout_write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()  # streamed pieces must show up as they come


HELP = "commands: /reset (forget the conversation), /exit (leave); end of input also leaves"


def format_chat(
    tokenizer: Any, messages: list[dict[str, str]], **template_kwargs: Any
) -> list[int]:
    """Token ids of ``messages`` followed by the assistant's turn opening.

    Uses the tokenizer's chat template when it has one (extra keyword arguments such as Qwen3's
    ``enable_thinking`` go to the template); otherwise a plain ``Role: text`` transcript.
    """
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **template_kwargs
        )
        return list(tokenizer.encode(text, add_special_tokens=False))
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return list(tokenizer.encode("\n".join([*lines, "Assistant:"]), add_special_tokens=True))


def chat_loop(
    model: Any,
    tokenizer: Any,
    sampling: SamplingConfig | None = None,
    system: str | None = None,
    max_new_tokens: int = 1024,
    read: Callable[[str], str] = input,
    write: Callable[[str], Any] = _stdout_write,
    template_kwargs: dict[str, Any] | None = None,
) -> list[dict[str, str]]:
    """Interactive chat until ``/exit`` or end of input; returns the conversation.

    Args:
        model: anything :func:`leechq.serve.generate.generate` accepts (a loaded leechq model).
        tokenizer: its tokenizer.
        sampling: token selection (default: the model's generation_config, else greedy).
        system: an optional system message.
        max_new_tokens: reply length limit per turn.
        read: prompt function (``input`` by default; tests pass a scripted one).
        write: text sink for the streamed reply (stdout by default).
        template_kwargs: extra chat-template arguments (e.g. ``{"enable_thinking": False}``).
    """
    base = [{"role": "system", "content": system}] if system else []
    messages = list(base)
    while True:
        try:
            line = read(">>> ")
        except (EOFError, KeyboardInterrupt):
            write("\n")
            break
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            messages = list(base)
            write("(conversation reset)\n")
            continue
        if text.startswith("/"):
            write(HELP + "\n")
            continue
        messages.append({"role": "user", "content": text})
        ids = format_chat(tokenizer, messages, **(template_kwargs or {}))
        out = generate(
            model,
            tokenizer,
            [ids],
            max_new_tokens,
            sampling,
            stream=lambda _row, piece: write(piece),
        )
        write("\n")
        messages.append({"role": "assistant", "content": out.texts[0]})
    return messages
