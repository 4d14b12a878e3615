"""The serving decoder against transformers' own modeling (tiny random Llama / Qwen2 / Qwen3 /
Gemma-2 / Gemma-3 text)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from leechq.errors import InvalidInput, UnsupportedArchitecture
from leechq.serve.build import from_hf_model, from_state_dict, random_dense
from leechq.serve.cache import KVCache
from leechq.serve.model import ModelArgs, attention_mask

from .conftest import tiny_hf_model

pytest.importorskip("transformers")


def _full_logits(model: Any, tokens: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
    b, t = tokens.shape
    cache = KVCache(model.args, b, 64, torch.float32, "cpu")
    pad = torch.zeros(b, dtype=torch.int64) if pad is None else pad
    return model(tokens, torch.arange(t), pad, cache.k, cache.v, last_only=False)


@torch.no_grad()
def test_logits_match_transformers(hf_model: Any) -> None:
    model = from_hf_model(hf_model)
    tokens = torch.randint(
        0, hf_model.config.vocab_size, (3, 13), generator=torch.Generator().manual_seed(1)
    )
    ours = _full_logits(model, tokens)
    ref = hf_model(tokens).logits
    assert ours.shape == ref.shape
    err = (ours - ref).abs().max().item()
    assert err < 1e-4 * ref.abs().max().item(), err


@torch.no_grad()
def test_incremental_decode_matches_one_shot(hf_model: Any) -> None:
    """Prefill of 5 positions, then 8 single-position steps == one forward over all 13."""
    model = from_hf_model(hf_model)
    tokens = torch.randint(
        0, hf_model.config.vocab_size, (2, 13), generator=torch.Generator().manual_seed(2)
    )
    one_shot = _full_logits(model, tokens)
    cache = KVCache(model.args, 2, 64, torch.float32, "cpu")
    pad = torch.zeros(2, dtype=torch.int64)
    steps = [model(tokens[:, :5], torch.arange(5), pad, cache.k, cache.v, last_only=False)]
    for s in range(5, 13):
        steps.append(model(tokens[:, s : s + 1], torch.tensor([s]), pad, cache.k, cache.v))
    inc = torch.cat(steps, dim=1)
    assert (inc - one_shot).abs().max().item() < 1e-4


@torch.no_grad()
def test_left_padding_equals_unpadded_rows() -> None:
    hf = tiny_hf_model("qwen3")
    model = from_hf_model(hf)
    g = torch.Generator().manual_seed(3)
    short = torch.randint(0, 97, (1, 6), generator=g)
    long = torch.randint(0, 97, (1, 10), generator=g)
    batch = torch.cat([torch.cat([torch.full((1, 4), 5), short], dim=1), long])
    out = _full_logits(model, batch, pad=torch.tensor([4, 0]))
    alone = _full_logits(model, short)
    assert (out[0, 4:] - alone[0]).abs().max().item() < 1e-4
    assert torch.isfinite(out).all()  # pad queries attend to themselves: no NaN rows
    assert (out[1] - _full_logits(model, long)[0]).abs().max().item() < 1e-4


def test_state_dict_build_matches_module_build() -> None:
    hf = tiny_hf_model("llama")
    a = from_hf_model(hf)
    b = from_state_dict(hf.config, hf.state_dict(), dtype=torch.float32)
    tokens = torch.randint(0, 97, (1, 9))
    with torch.no_grad():
        assert torch.equal(_full_logits(a, tokens), _full_logits(b, tokens))


def test_state_dict_missing_tensor_is_named() -> None:
    hf = tiny_hf_model("qwen2")
    sd = dict(hf.state_dict())
    del sd["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(InvalidInput, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        from_state_dict(hf.config, sd, dtype=torch.float32)


def test_args_from_dict_equal_args_from_config(hf_model: Any) -> None:
    cfg = hf_model.config
    assert ModelArgs.from_hf_config(cfg) == ModelArgs.from_hf_config(cfg.to_dict())


def test_qwen2_and_qwen3_flags() -> None:
    q2 = ModelArgs.from_hf_config(tiny_hf_model("qwen2").config)
    q3 = ModelArgs.from_hf_config(tiny_hf_model("qwen3").config)
    assert q2.attention_bias and not q2.o_bias and not q2.qk_norm
    assert q3.qk_norm and q3.tie_word_embeddings and q3.head_dim == 32


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"model_type": "gpt2"}, "model_type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    ],
)
def test_unsupported_configs_are_named(change: dict[str, Any], match: str) -> None:
    cfg = {
        "model_type": "llama",
        "vocab_size": 10,
        "hidden_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 16,
        "rope_theta": 10000.0,
    }
    cfg.update(change)
    with pytest.raises(UnsupportedArchitecture, match=match):
        args = ModelArgs.from_hf_config(cfg)
        from leechq.serve.model import rope_inv_freq

        rope_inv_freq(args)


def test_attention_mask_semantics() -> None:
    m = attention_mask(torch.arange(4), torch.tensor([0, 2]), seq_len=6, groups=2)
    assert m.shape == (2, 1, 8, 6)
    row0 = m[0, 0, :4]
    assert torch.equal(row0, torch.tril(torch.ones(4, 6, dtype=torch.bool)))
    row1 = m[1, 0, :4]
    assert row1[0].tolist() == [True, False, False, False, False, False]  # pad query: itself only
    assert row1[3].tolist() == [False, False, True, True, False, False]  # real query: no pad keys
    assert torch.equal(m[:, :, :4], m[:, :, 4:])  # the second query group sees the same


def test_random_dense_runs_and_is_seeded() -> None:
    args = ModelArgs(
        arch="qwen3",
        vocab_size=50,
        dim=48,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        intermediate_size=64,
        qk_norm=True,
    )
    a = random_dense(args, dtype=torch.float32, seed=7)
    b = random_dense(args, dtype=torch.float32, seed=7)
    tokens = torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        la, lb = _full_logits(a, tokens), _full_logits(b, tokens)
    assert torch.equal(la, lb) and torch.isfinite(la).all()


def test_decode_kernel_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    from leechq.serve import model as serve_model
    from leechq.serve.model import decode_kernel_enabled

    cpu = torch.device("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not decode_kernel_enabled(cpu, 1, 128)  # the CPU keeps SDPA unless asked
    monkeypatch.setattr(serve_model, "INTERPRETED_DECODE_KERNEL", True)
    assert not decode_kernel_enabled(cpu, 2, 128)  # prompts: SDPA
    assert decode_kernel_enabled(cpu, 1, 128)
    assert not decode_kernel_enabled(cpu, 1, 512)  # wider than the kernel takes
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not decode_kernel_enabled(cpu, 1, 128)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the Triton interpreter (TRITON_INTERPRET=1) is off")
@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
@torch.no_grad()
def test_decode_kernel_step_matches_sdpa(monkeypatch: pytest.MonkeyPatch, arch: str) -> None:
    """A decode step through the split-key kernel (left-padded batch) == the SDPA step; Gemma-3's
    sliding layers (window 5 < 9 positions) through the kernel's window."""
    pytest.importorskip("triton")
    model = from_hf_model(tiny_hf_model(arch))
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, 97, (2, 9), generator=g)
    pad = torch.tensor([3, 0])
    cache = KVCache(model.args, 2, 96, torch.float32, "cpu")
    model(tokens[:, :8], torch.arange(8), pad, cache.k, cache.v)
    steps, caches = {}, {}
    from leechq.serve import model as serve_model

    for flag in ("0", "1"):
        monkeypatch.setattr(serve_model, "INTERPRETED_DECODE_KERNEL", flag == "1")
        k = [c.clone() for c in cache.k]
        v = [c.clone() for c in cache.v]
        steps[flag] = model(tokens[:, 8:], torch.tensor([8]), pad, k, v)
        caches[flag] = torch.stack(k + v)
    assert (steps["1"] - steps["0"]).abs().max().item() < 1e-4
    # The kernel wrote slot 8 as index_copy_ did: exactly in layer 0 (its keys come from the
    # embedding), within the attention's rounding in the layers after it.
    n = model.args.n_layers
    assert torch.equal(caches["1"][[0, n]], caches["0"][[0, n]])
    assert (caches["1"] - caches["0"]).abs().max().item() < 1e-4
    assert caches["1"][:, :, :, 8].abs().sum() > 0


# --------------------------------------------------------------------------------------------------
# Gemma-2 / Gemma-3 text


def test_gemma_flags() -> None:
    g3 = ModelArgs.from_hf_config(tiny_hf_model("gemma3").config)
    assert g3.arch == "gemma3_text" and g3.gemma_block and g3.qk_norm
    assert g3.layer_windows == (5, 0, 5) and g3.local_rope_theta == 1e4
    assert g3.rope_theta == 1e6 and g3.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert g3.embed_scale == 64**0.5 and g3.softmax_scale == 24**-0.5
    assert g3.final_softcap == 5.0 and g3.attn_softcap is None
    g2 = ModelArgs.from_hf_config(tiny_hf_model("gemma2").config)
    assert g2.gemma_block and not g2.qk_norm and g2.local_rope_theta is None
    assert g2.layer_windows == (5, 0) and g2.attn_softcap == 3.0


def test_gemma3_legacy_config_keys_read_as_the_current_ones() -> None:
    """A config.json of the older format (``rope_theta``, ``rope_local_base_freq``,
    ``rope_scaling``, ``sliding_window_pattern``; no ``layer_types``) reads as transformers' own
    config of the same model."""
    legacy = {
        "model_type": "gemma3_text", "vocab_size": 97, "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 7, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "query_pre_attn_scalar": 24,
        "sliding_window": 5, "sliding_window_pattern": 3, "rope_theta": 1e6,
        "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 256,
    }
    import transformers

    cfg = transformers.Gemma3TextConfig(**{k: v for k, v in legacy.items() if k != "model_type"})
    ours = ModelArgs.from_hf_config(legacy)
    assert ours == ModelArgs.from_hf_config(cfg)
    assert ours.layer_windows == (5, 5, 0, 5, 5, 0, 5)


@torch.no_grad()
def test_gemma3_saved_and_reloaded_matches_transformers(tmp_path: Any) -> None:
    """A tiny Gemma-3 saved with ``save_pretrained``: its config.json and tensors build the serving
    model (``from_state_dict``), whose logits over 13 positions (window 5) match the reloaded
    transformers model's, and equal the module-built serving model's."""
    import json

    import transformers
    from safetensors.torch import load_file

    tiny_hf_model("gemma3").save_pretrained(tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    config = json.loads((tmp_path / "config.json").read_text())
    state = load_file(tmp_path / "model.safetensors")
    state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])  # tied, saved once
    model = from_state_dict(config, state, dtype=torch.float32)
    tokens = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(7))
    ours, ref = _full_logits(model, tokens), hf(tokens).logits
    assert (ours - ref).abs().max().item() < 1e-4 * ref.abs().max().item()
    assert torch.equal(ours, _full_logits(from_hf_model(hf), tokens))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"hidden_activation": "relu"}, "hidden_activation"),
        ({"use_bidirectional_attention": True}, "bidirectional"),
        ({"layer_types": ["sliding_attention", "chunked_attention"]}, "chunked_attention"),
        ({"layer_types": ["full_attention"]}, "layer_types has 1 entries"),
    ],
)
def test_unsupported_gemma_configs_are_named(change: dict[str, Any], match: str) -> None:
    cfg = {
        "model_type": "gemma3_text", "vocab_size": 10, "hidden_size": 8,
        "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 16,
        "sliding_window": 4,
    }
    cfg.update(change)
    with pytest.raises(UnsupportedArchitecture, match=match):
        ModelArgs.from_hf_config(cfg)


@torch.no_grad()
@pytest.mark.parametrize(("arch", "overrides", "windows"), [
    ("mistral", {}, (5, 5)),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}, (0, 4)),
    ("qwen2", {"sliding_window": 4}, ()),  # use_sliding_window off: full attention
])
def test_sliding_windows_of_other_families_match_transformers(
        arch: str, overrides: dict[str, Any], windows: tuple[int, ...]) -> None:
    """Mistral's window on every layer, Qwen2's on the layers from ``max_window_layers`` (with
    ``use_sliding_window``): the serving model's logits over 13 positions of a batch of two
    match transformers' (eager attention, its own sliding mask)."""
    hf = tiny_hf_model(arch, **overrides)
    model = from_hf_model(hf)
    assert model.args.layer_windows == windows
    tokens = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(9))
    ours, ref = _full_logits(model, tokens), hf(tokens).logits
    assert (ours - ref).abs().max().item() < 1e-4 * ref.abs().max().item()
    full = tiny_hf_model(arch, **{**overrides, "sliding_window": None})
    if windows:  # the window changed the numbers: it is not a no-op
        assert (hf(tokens).logits - full(tokens).logits).abs().max().item() > 1e-3


def test_sliding_window_mask_semantics() -> None:
    """Window 3: a query at slot t sees t-2 .. t (transformers' ``kv > q - window``), never the
    row's padding; a pad query still sees itself."""
    m = attention_mask(torch.arange(6), torch.tensor([0, 2]), seq_len=6, groups=1, window=3)
    assert m[0, 0, 5].tolist() == [False, False, False, True, True, True]
    assert m[0, 0, 1].tolist() == [True, True, False, False, False, False]
    assert m[1, 0, 3].tolist() == [False, False, True, True, False, False]
    assert m[1, 0, 0].tolist() == [True, False, False, False, False, False]
