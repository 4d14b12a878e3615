"""Shared fixtures for the evaluation tests: a toy word tokenizer and tiny random causal LMs."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch


class ToyTokenizer:
    """Whitespace-attached word tokenizer with a growing vocabulary (id 0 = EOS).

    ``encode`` splits text into runs of leading whitespace plus one non-space word, so ``" A"`` is
    one token; ``decode`` concatenates the pieces (trailing whitespace of a text is dropped).
    """

    eos_token_id = 0

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {"<eos>": 0}
        self.pieces: list[str] = ["<eos>"]

    def encode(
        self, text: str, add_special_tokens: bool = False, verbose: bool = False
    ) -> list[int]:
        out = []
        for piece in re.findall(r"\s*\S+", text):
            if piece not in self.vocab:
                self.vocab[piece] = len(self.pieces)
                self.pieces.append(piece)
            out.append(self.vocab[piece])
        return out

    def decode(self, ids: Any) -> str:
        return "".join(self.pieces[int(i)] for i in ids if int(i) != 0)


@pytest.fixture
def toy_tokenizer() -> ToyTokenizer:
    return ToyTokenizer()


def tiny_model(
    kind: str = "llama",
    *,
    vocab: int = 96,
    hidden: int = 64,
    layers: int = 2,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    tie: bool = False,
) -> Any:
    """A tiny random ``*ForCausalLM`` of the given family (no download)."""
    import transformers

    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
        max_position_embeddings=256,
    )
    cfg_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[kind]
    extra = {"head_dim": hidden // 4} if kind == "qwen3" else {}
    model = model_cls(cfg_cls(**common, **extra)).to(dtype).eval()
    # random init of transformers is small (std 0.02); widen it so logits are not all ~uniform
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
    return model


@pytest.fixture
def make_tiny_model() -> Any:
    return tiny_model
