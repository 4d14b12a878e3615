"""Tiny random transformers models (no download) for the serving tests."""

from __future__ import annotations

from typing import Any

import pytest
import torch


def tiny_hf_model(arch: str, seed: int = 0, **overrides: Any) -> Any:
    """A tiny random ``*ForCausalLM`` of family ``arch`` in float32, eval mode, eager attention."""
    import transformers

    common: dict[str, Any] = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    if arch == "llama":
        common.update(
            attention_bias=True,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
        cfg_cls, model_cls = transformers.LlamaConfig, transformers.LlamaForCausalLM
    elif arch == "qwen2":
        common.update(rope_theta=1000000.0)
        cfg_cls, model_cls = transformers.Qwen2Config, transformers.Qwen2ForCausalLM
    elif arch == "mistral":
        common.update(sliding_window=5, head_dim=16)  # a window shorter than the prompts
        cfg_cls, model_cls = transformers.MistralConfig, transformers.MistralForCausalLM
    elif arch == "qwen3":
        common.update(head_dim=32, rope_theta=1000000.0, tie_word_embeddings=True)
        cfg_cls, model_cls = transformers.Qwen3Config, transformers.Qwen3ForCausalLM
    elif arch == "gemma3":
        # A window shorter than the tests' prompts; the global layer's RoPE scaled linearly, the
        # local one plain; a score scale and a logit cap of their own so that both show.
        common.update(
            head_dim=16,
            tie_word_embeddings=True,
            query_pre_attn_scalar=24,
            sliding_window=5,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            num_hidden_layers=3,
            final_logit_softcapping=5.0,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        )
        cfg_cls, model_cls = transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM
    elif arch == "gemma2":
        common.update(
            head_dim=16,
            tie_word_embeddings=True,
            query_pre_attn_scalar=24,
            sliding_window=5,
            attn_logit_softcapping=3.0,
            final_logit_softcapping=5.0,
        )
        cfg_cls, model_cls = transformers.Gemma2Config, transformers.Gemma2ForCausalLM
    else:
        raise ValueError(arch)
    common.update(overrides)
    cfg = cfg_cls(**common)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    # Default init leaves norms at 1 and biases at 0; perturb them so the test sees them.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0.0, 0.05)
            elif p.dim() == 2:
                p.normal_(0.0, 0.15)
    return model


@pytest.fixture(params=["llama", "qwen2", "qwen3", "gemma2", "gemma3"])
def hf_model(request: pytest.FixtureRequest) -> Any:
    pytest.importorskip("transformers")
    return tiny_hf_model(request.param)
