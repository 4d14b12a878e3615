"""Calibration windows: contiguous from token 0, exact counts, clear errors, stable digest."""

from __future__ import annotations

import pytest
import torch

from leechq.errors import InvalidInput
from leechq.quant.calibration import calibration_windows, token_digest, tokenize_text


def test_windows_are_contiguous_from_token_zero() -> None:
    toks = torch.arange(100)
    w = calibration_windows(toks, 3, 20)
    assert w.shape == (3, 20) and w.dtype == torch.int64
    assert torch.equal(w.reshape(-1), torch.arange(60))
    assert torch.equal(calibration_windows(list(range(100)), 3, 20), w)


def test_too_few_tokens_says_how_many() -> None:
    with pytest.raises(InvalidInput, match="41 missing"):
        calibration_windows(torch.arange(19), 3, 20)


def test_digest_is_sensitive_and_stable() -> None:
    w = calibration_windows(torch.arange(100), 3, 20)
    assert token_digest(w) == token_digest(w.clone())
    w2 = w.clone()
    w2[2, 19] += 1
    assert token_digest(w2) != token_digest(w)
    assert token_digest(w.reshape(6, 10)) != token_digest(w)


def test_tokenize_text_uses_no_special_tokens() -> None:
    class Tok:
        def __call__(self, text: str, add_special_tokens: bool) -> dict[str, list[int]]:
            assert add_special_tokens is False
            return {"input_ids": [ord(c) for c in text]}

    assert tokenize_text(Tok(), "ab").tolist() == [97, 98]
