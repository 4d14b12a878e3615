"""What every evaluation task shares: the result record, the task registry, greedy generation.

A task (nanochat style) turns local data files into prompts, runs a model on them and scores the
answers; it reports one headline metric plus details, and a fingerprint of the prompt tokens so two
arms can prove they were asked the same questions in the same tokens. Models are plain callables
(ids int64 [B, T] → logits [B, T, V], see :func:`leechq.eval.ppl.logits_fn`); transformers models
additionally get a KV cache during generation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from leechq.eval.ppl import logits_fn, model_device
from leechq.registry import Registry


@dataclass
class TaskResult:
    """Outcome of one task run.

    Attributes:
        task: task name.
        metric: name of the headline metric (e.g. ``"accuracy_micro"``).
        value: its value.
        n: number of scored items.
        prompts_fingerprint: sha256 (16 hex) over every scored prompt's token ids, in order.
        details: further metrics and per-subject/per-item data.
    """

    task: str
    metric: str
    value: float
    n: int
    prompts_fingerprint: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {
            "task": self.task,
            "metric": self.metric,
            "value": self.value,
            "n": self.n,
            "prompts_fingerprint": self.prompts_fingerprint,
            "details": self.details,
        }


class Task(Protocol):
    """An evaluation task over local data."""

    name: str

    def run(self, model: Any, tokenizer: Any, *, limit: int | None = None,
            progress: str | None = None) -> TaskResult:
        """Score ``model`` (with its ``tokenizer``); ``limit`` caps the number of items;
        ``progress`` names a bar on stderr that counts the items scored (None: no bar)."""
        ...


TASKS: Registry[Callable[..., Task]] = Registry("task")


class PromptHasher:
    """Running fingerprint of the token ids of every prompt scored."""

    def __init__(self) -> None:
        self._h = hashlib.sha256(b"leechq-prompts-v1\0")

    def add(self, ids: Sequence[int]) -> None:
        """Fold one prompt's ids (int64 little-endian, length-prefixed) into the fingerprint."""
        self._h.update(len(ids).to_bytes(8, "little"))
        self._h.update(b"".join(int(i).to_bytes(8, "little", signed=True) for i in ids))

    def hexdigest(self) -> str:
        """16 hex digits."""
        return self._h.hexdigest()[:16]


@torch.inference_mode()
def last_logits(model: Any, ids: Sequence[int]) -> torch.Tensor:
    """Logits at the last position of one prompt: float32 [V]."""
    fn = logits_fn(model)
    return fn(torch.tensor([list(ids)], dtype=torch.int64))[0, -1].float()


@torch.inference_mode()
def greedy_generate(
    model: Any,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    stop_ids: Sequence[int] = (),
    stop_check: Callable[[list[int]], bool] | None = None,
) -> tuple[list[int], str]:
    """Greedy decoding from ``prompt_ids``.

    transformers models (objects with ``config``) use their KV cache; other callables are re-run
    on the whole sequence at every step (slow, fine for tests and small models).

    Args:
        model: the model.
        prompt_ids: prompt token ids.
        max_new_tokens: generation cap.
        stop_ids: token ids that end generation (not included in the output).
        stop_check: called with the generated ids after each step; True ends generation.

    Returns:
        ``(generated ids, reason)`` with reason ``"eos"``, ``"stop"`` or ``"cap"``.
    """
    stops = set(int(i) for i in stop_ids)
    device = model_device(model)
    out: list[int] = []
    seq = torch.tensor([list(prompt_ids)], dtype=torch.int64, device=device)
    is_hf = hasattr(model, "config") and hasattr(model, "forward")
    fn = None if is_hf else logits_fn(model)
    past = None
    step_input = seq
    for _ in range(max_new_tokens):
        if is_hf:
            res = model(input_ids=step_input, past_key_values=past, use_cache=True)
            past = res.past_key_values
            nxt = int(res.logits[0, -1].argmax())
        else:
            nxt = int(fn(seq)[0, -1].argmax())  # type: ignore[misc]
        if nxt in stops:
            return out, "eos"
        out.append(nxt)
        step_input = torch.tensor([[nxt]], dtype=torch.int64, device=device)
        seq = torch.cat([seq, step_input], dim=1)
        if stop_check is not None and stop_check(out):
            return out, "stop"
    return out, "cap"


def eos_ids(tokenizer: Any) -> list[int]:
    """End-of-sequence ids a tokenizer declares (``eos_token_id``, possibly a list)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, (list, tuple)) else [int(eos)]
