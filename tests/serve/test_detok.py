"""Incremental detokenization: the pieces add up to the whole decode, split UTF-8 waits."""

from __future__ import annotations

from leechq.serve.detok import Detokenizer


class _Bytes:
    """Token i is the byte i (a byte-level tokenizer); 0 is a special token."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        data = bytes(i for i in ids if not (skip_special_tokens and i == 0))
        return data.decode("utf-8", errors="replace")


def test_pieces_reassemble_and_split_utf8_waits() -> None:
    text = "naïve café — ok"
    ids = list(text.encode())
    d = Detokenizer(_Bytes())
    pieces = [d.push(i) for i in ids]
    assert "".join(pieces) == text
    k = ids.index(0xC3)  # the first byte of "ï" alone decodes to nothing yet
    assert pieces[k] == "" and pieces[k + 1] == "ï"


def test_special_tokens_are_skipped() -> None:
    d = Detokenizer(_Bytes())
    assert [d.push(i) for i in (104, 0, 105)] == ["h", "", "i"]
