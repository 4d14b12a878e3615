"""Incremental detokenization: the new text of a growing token sequence, one token at a time."""

from __future__ import annotations

from typing import Any


class Detokenizer:
    """Decodes one sequence incrementally: each :meth:`push` returns only the text the new token
    added, decoding a short window of ids (a prefix offset and a read offset, as
    text-generation-inference does) rather than the whole sequence, and withholding an incomplete
    UTF-8 sequence until a later token completes it. Special tokens are skipped."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.ids = tokenizer, []
        self.prefix = self.read = 0

    def push(self, token: int) -> str:
        """Append ``token``; returns the text it completes (possibly empty)."""
        self.ids.append(token)
        dec = self.tokenizer.decode
        before = dec(self.ids[self.prefix : self.read], skip_special_tokens=True)
        now = dec(self.ids[self.prefix :], skip_special_tokens=True)
        if len(now) <= len(before) or now.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return now[len(before) :]
