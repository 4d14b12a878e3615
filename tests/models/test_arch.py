"""Architecture facts: block paths, the seven projections, shared inputs, tied embeddings."""

from __future__ import annotations

import pytest
import torch
from leechq_tiny import FAMILIES, family_model, ids

from leechq.errors import UnsupportedArchitecture
from leechq.models.arch import (
    ARCHITECTURES,
    DENSE_LEAVES,
    arch_for_gguf,
    arch_for_model_type,
    arch_of,
)
from leechq.models.experts import ExpertLinears, split_experts


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
    with pytest.raises(
        UnsupportedArchitecture,
        match=r"'gpt2'.*gemma2, gemma3, glm, .*mixtral, olmo, olmo2, .*qwen3_moe",
    ):
        arch_for_model_type("gpt2")
    with pytest.raises(UnsupportedArchitecture, match=r"no config\.model_type"):
        arch_of(object())
    with pytest.raises(UnsupportedArchitecture, match="GGUF architecture 'falcon'"):
        arch_for_gguf("falcon")
    assert arch_for_gguf("phi3").name == "phi3" and arch_for_gguf("gemma3").name == "gemma3"
    assert arch_for_gguf("qwen2").name == "qwen2"


def test_missing_submodule_is_named() -> None:
    model = _tiny("llama")
    del model.model.layers[0].mlp.up_proj
    with pytest.raises(UnsupportedArchitecture, match=r"mlp\.up_proj"):
        list(arch_of(model).iter_linears(model))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_walk_finds_its_linears_and_shared_inputs_are_shared(family: str) -> None:
    """The generic walk: every nn.Linear of a block but the routers, in groups whose members see
    the identical input tensor, distinct groups distinct inputs; fused experts split first."""
    model = family_model(family)
    split_experts(model)
    arch = arch_of(model)
    block = arch.layers(model)[0]
    projections = arch.block_projections(block)
    linears = {n for n, m in block.named_modules() if isinstance(m, torch.nn.Linear)}
    dense = {n for n in linears if n.rsplit(".", 1)[-1] in DENSE_LEAVES}  # routers
    assert {p.name for p in projections} == linears - dense
    assert [p.name for p in projections[: len(arch.projections)]] == [
        p.name for p in arch.projections
    ]
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        block.get_submodule(p.name).register_forward_pre_hook(
            lambda _m, a, n=p.name: seen.__setitem__(n, a[0])
        )
        for p in projections
    ]
    with torch.no_grad():
        model(ids(16, 2))
    for h in hooks:
        h.remove()
    groups = arch.block_groups(block)
    firsts = []
    for names in groups.values():
        called = [n for n in names if n in seen]
        for n in called[1:]:
            assert seen[n] is seen[called[0]], (n, called[0])
        if called:
            firsts.append(seen[called[0]])
    if family != "cohere":  # Cohere's parallel block feeds attention and MLP one tensor
        assert all(a is not b for i, a in enumerate(firsts) for b in firsts[i + 1 :])
    if arch.moe:
        experts = [p for p in projections if ".experts." in p.name]
        assert len(experts) == 2 * 4 and len({p.act for p in experts}) == 8
        assert not any(p.name.rsplit(".", 1)[-1] in DENSE_LEAVES for p in projections)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "qwen2_moe", "olmoe", "phimoe"])
def test_split_experts_computes_what_the_fused_module_does(family: str) -> None:
    model = family_model(family)
    x = ids(16, 2)
    with torch.no_grad():
        ref = model(x).logits
        names = split_experts(model)
        out = model(x).logits
    assert names == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    assert all(isinstance(model.get_submodule(n), ExpertLinears) for n in names)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert split_experts(model) == []  # nothing fused is left


def test_split_experts_refuses_another_layout() -> None:
    class Odd(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_up_proj = torch.nn.Parameter(torch.zeros(2, 8, 4))
            self.down_proj = torch.nn.Parameter(torch.zeros(2, 4, 4))
            self.down_proj_bias = torch.nn.Parameter(torch.zeros(2, 4))
            self.act_fn = torch.nn.SiLU()

    root = torch.nn.Module()
    root.experts = Odd()
    with pytest.raises(UnsupportedArchitecture, match=r"experts.*down_proj_bias"):
        split_experts(root)
