"""Architecture facts: block paths, the seven projections, shared inputs, tied embeddings."""

from __future__ import annotations

import pytest
import torch

from leechq.errors import UnsupportedArchitecture
from leechq.models.arch import ARCHITECTURES, arch_for_gguf, arch_for_model_type, arch_of


def _tiny(kind: str, tie: bool = False):
    import transformers

    common = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
    )
    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }
    cfg_cls, model_cls = classes[kind]
    extra = {"head_dim": 8} if kind == "qwen3" else {}
    return model_cls(cfg_cls(**common, **extra))


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral"])
def test_projections_and_shapes(kind: str) -> None:
    model = _tiny(kind)
    arch = arch_of(model)
    assert arch.name == kind
    found = list(arch.iter_linears(model))
    assert len(found) == 2 * 7
    shapes = {p.short: tuple(m.weight.shape) for _, p, m, _ in found}
    q_out = 4 * (8 if kind == "qwen3" else 32 // 4)
    assert shapes["q_proj"] == (q_out, 32)
    assert shapes["o_proj"] == (32, q_out)
    assert shapes["gate_proj"] == (48, 32) and shapes["up_proj"] == (48, 32)
    assert shapes["down_proj"] == (32, 48)
    names = dict(model.named_modules())
    for _, _, module, qualified in found:
        assert names[qualified] is module
    # q/k/v carry a bias exactly in Qwen2
    assert (
        arch.block_linears(arch.layers(model)[0])["self_attn.q_proj"].bias is not None
    ) == arch.qkv_bias
    for norm in arch.block_norms + arch.extra_norms:
        assert norm in dict(arch.layers(model)[0].named_modules())
    assert names[arch.final_norm_path] is not None


def test_groups_follow_leech_core_5_2() -> None:
    groups = ARCHITECTURES["llama"].groups()
    assert groups == {
        0: ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        1: ("self_attn.o_proj",),
        2: ("mlp.gate_proj", "mlp.up_proj"),
        3: ("mlp.down_proj",),
    }


def test_shared_inputs_really_are_shared() -> None:
    """Projections of one activation group see the identical input tensor in a forward pass."""
    model = _tiny("qwen2").eval()
    arch = arch_of(model)
    block = arch.layers(model)[0]
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        m.register_forward_pre_hook(lambda _m, a, n=n: seen.__setitem__(n, a[0].clone()))
        for n, m in arch.block_linears(block).items()
    ]
    model(torch.randint(0, 64, (1, 5)))
    for h in hooks:
        h.remove()
    for names in arch.groups().values():
        for n in names[1:]:
            assert torch.equal(seen[n], seen[names[0]])
    assert not torch.equal(seen["self_attn.q_proj"][..., :32], seen["mlp.gate_proj"][..., :32])


@pytest.mark.parametrize("tie", [True, False])
def test_tied_embeddings(tie: bool) -> None:
    model = _tiny("llama", tie=tie)
    assert arch_of(model).tied_embeddings(model) is tie


def test_unsupported_architecture_message() -> None:
    with pytest.raises(UnsupportedArchitecture, match=r"'gpt2'.*llama, mistral, qwen2, qwen3"):
        arch_for_model_type("gpt2")
    with pytest.raises(UnsupportedArchitecture, match=r"no config\.model_type"):
        arch_of(object())
    with pytest.raises(UnsupportedArchitecture, match="GGUF architecture 'phi3'"):
        arch_for_gguf("phi3")
    assert arch_for_gguf("qwen2").name == "qwen2"


def test_missing_submodule_is_named() -> None:
    model = _tiny("llama")
    del model.model.layers[0].mlp.up_proj
    with pytest.raises(UnsupportedArchitecture, match=r"mlp\.up_proj"):
        list(arch_of(model).iter_linears(model))
