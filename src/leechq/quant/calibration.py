"""Deterministic calibration windows from a token stream.

Implements the windowing of docs/quantizer.md §2: the calibration text is tokenized once (no special
tokens) and cut into ``n`` contiguous, non-overlapping windows of ``length`` tokens starting at
token 0 (the reference takes 64 × 2048 = 131 072 tokens). No hub access happens here: the text comes
from the caller (``leechq.data``), and :func:`token_digest` pins the exact tokens a run used
(pitfall P14).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from leechq.errors import InvalidInput


def calibration_windows(
    tokens: torch.Tensor | list[int], n_windows: int, length: int
) -> torch.Tensor:
    """The first ``n_windows`` contiguous windows of ``length`` tokens.

    Args:
        tokens: 1-D token ids (int64 tensor or list of ints).
        n_windows: number of windows.
        length: tokens per window.

    Returns:
        int64 [n_windows, length].

    Raises:
        InvalidInput: fewer than ``n_windows·length`` tokens (the message says how many are
        missing).
    """
    ids = torch.as_tensor(tokens, dtype=torch.int64).reshape(-1)
    need = n_windows * length
    if n_windows < 1 or length < 2:
        raise InvalidInput(f"need n_windows >= 1 and length >= 2, got {n_windows} and {length}")
    if ids.numel() < need:
        raise InvalidInput(
            f"calibration needs {n_windows}×{length} = {need} tokens, got {ids.numel()} "
            f"({need - ids.numel()} missing): supply more text or fewer/shorter windows"
        )
    return ids[:need].reshape(n_windows, length).clone()


def tokenize_text(tokenizer: Any, text: str) -> torch.Tensor:
    """Tokenize ``text`` once, without special tokens: int64 [n_tokens]."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.int64)


def token_digest(windows: torch.Tensor) -> str:
    """sha256 (hex, first 16 digits) of the windows' int64 little-endian bytes and shape."""
    arr = windows.detach().cpu().to(torch.int64).contiguous().numpy()
    h = hashlib.sha256(str(tuple(arr.shape)).encode())
    h.update(arr.astype("<i8").tobytes())
    return h.hexdigest()[:16]
