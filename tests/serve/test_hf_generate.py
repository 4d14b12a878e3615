"""Generation through transformers' own modules (``leechq.serve.hf_generate``) for a family the
serving engine does not run, and the engine for one it does (Gemma-3 text): which one ``generate``
takes, and that both decode greedily as transformers' ``generate`` does."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from leechq_tiny import family_model

from leechq.errors import InvalidInput
from leechq.serve.generate import generate
from leechq.serve.hf_generate import generate_ids_hf
from leechq.serve.sampling import SamplingConfig

from .conftest import tiny_hf_model

pytest.importorskip("transformers")

PROMPTS = [[5, 9, 13, 2, 77, 31, 4], [8, 8, 1]]


class _Ids:
    """A stand-in tokenizer over token ids (``encode`` is never called: prompts are ids)."""

    eos_token_id = None
    pad_token_id = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(str(i) for i in ids)


def _hf_greedy(hf: Any, prompt: list[int], n: int) -> list[int]:
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                      do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


@torch.no_grad()
def test_fallback_family_decodes_as_transformers_with_one_note(
    capsys: pytest.CaptureFixture[str],
) -> None:
    hf = family_model("phi3")
    out = generate(hf, _Ids(), PROMPTS, max_new_tokens=6)
    assert out.tokens == [_hf_greedy(hf, p, 6) for p in PROMPTS]
    assert out.texts[0] == " ".join(str(t) for t in out.tokens[0])
    generate(hf, _Ids(), PROMPTS[:1], max_new_tokens=2)
    err = capsys.readouterr().err
    assert err.count("serving through transformers") == 1 and "phi3" in err


@torch.no_grad()
def test_gemma3_runs_on_the_engine_without_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    hf = tiny_hf_model("gemma3")
    hf.generation_config.eos_token_id = None  # its eos id 1 would end a row early
    out = generate(hf, _Ids(), PROMPTS, max_new_tokens=12)  # past the window of 5
    assert out.tokens == [_hf_greedy(hf, p, 12) for p in PROMPTS]
    assert "serving through transformers" not in capsys.readouterr().err


@torch.no_grad()
def test_stop_ids_end_a_row_and_bad_counts_are_named() -> None:
    hf = family_model("phi3")
    full = generate_ids_hf(hf, PROMPTS[:1], 6, SamplingConfig(), stop=())[0][0]
    tokens, _, _, steps = generate_ids_hf(hf, PROMPTS[:1], 6, SamplingConfig(), stop=[full[2]])
    assert tokens[0] == full[: full.index(full[2]) + 1] and steps == len(tokens[0]) - 1
    with pytest.raises(InvalidInput, match="max_new_tokens"):
        generate_ids_hf(hf, PROMPTS, 0, SamplingConfig(), stop=())
    with pytest.raises(InvalidInput, match="prompt 1 is empty"):
        generate_ids_hf(hf, [[1], []], 2, SamplingConfig(), stop=())
