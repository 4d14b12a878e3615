"""Model glue on tiny random Llama / Qwen2 / Qwen3 models (no download): controls, artifact,
resume."""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quant"))
from standin_codebook import register, registered

from leechq.config import QuantConfig
from leechq.errors import InvalidInput, UnsupportedArchitecture
from leechq.formats.accounting import artifact_report
from leechq.formats.artifact import GroupAffine, read_artifact
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.models.quantize import quantize_model, quantize_model_in_place

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _standin() -> Iterator[str]:
    with registered() as name:
        yield name


def _llama(layers: int = 2, hidden: int = 96):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 24,
        num_key_value_heads=hidden // 48,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


def _qwen3_ragged():  # type: ignore[no-untyped-def]
    """Widths 100 and 200: 4 (resp. 8) tail columns, Q_odd of size 25."""
    torch.manual_seed(1)
    cfg = transformers.Qwen3Config(
        vocab_size=128,
        hidden_size=100,
        intermediate_size=200,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        max_position_embeddings=64,
    )
    return transformers.Qwen3ForCausalLM(cfg).eval()


def _qwen2_tied():  # type: ignore[no-untyped-def]
    """Tied embeddings and q/k/v biases."""
    torch.manual_seed(2)
    cfg = transformers.Qwen2Config(
        vocab_size=128,
        hidden_size=72,
        intermediate_size=168,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        tie_word_embeddings=True,
        max_position_embeddings=64,
    )
    return transformers.Qwen2ForCausalLM(cfg).eval()


MODELS = {"llama": _llama, "qwen3-ragged": _qwen3_ragged, "qwen2-tied": _qwen2_tied}


def _windows(n: int = 5, seq: int = 24, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 128, (n, seq), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        return model(ids).logits


def _cfg(**kw) -> QuantConfig:  # type: ignore[no-untyped-def]
    base = dict(
        codebook=register(), calib_windows=5, calib_window_len=24, calib_batch=2, device="cpu"
    )
    base.update(kw)
    return QuantConfig(**base)


def _tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(
        models.WordLevel({f"w{i}": i for i in range(128)} | {"[UNK]": 127}, unk_token="[UNK]")
    )
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


@pytest.mark.parametrize("name", list(MODELS))
def test_rotation_with_identity_reproduces_the_logits(name: str) -> None:
    model = MODELS[name]()
    ids = _windows(3, 20, seed=9)
    ref = _logits(model, ids)
    mq = quantize_model_in_place(model, _windows(), _cfg(codebook="identity"), progress=False)
    out = _logits(model, ids)
    assert torch.allclose(out, ref, rtol=0, atol=1e-5 * float(ref.abs().max())), float(
        (out - ref).abs().max()
    )
    assert len(mq.records) == 14
    if name == "qwen2-tied":
        assert mq.tied == {"lm_head.weight": "model.embed_tokens.weight"}
        assert "model.layers.0.self_attn.q_proj.bias" in mq.raw


def test_identity_without_rotation_is_bit_exact() -> None:
    model = _llama(layers=1)
    ids = _windows(2, 16, seed=3)
    ref = _logits(model, ids)
    quantize_model_in_place(
        model, _windows(), _cfg(codebook="identity", rotate=False), progress=False
    )
    assert torch.equal(_logits(model, ids), ref)


@pytest.mark.parametrize("name", ["llama", "qwen3-ragged", "qwen2-tied"])
def test_artifact_decodes_to_the_evaluated_model(tmp_path: Path, name: str) -> None:
    """P13 at model level: the artifact, decoded into a fresh model, gives the in-memory logits
    exactly."""
    model = MODELS[name]()
    fresh = copy.deepcopy(model)
    ids = _windows(2, 16, seed=4)
    ref = _logits(model, ids)
    path = quantize_model(
        model,
        _tokenizer(),
        _windows(),
        _cfg(),
        tmp_path / "art",
        progress=False,
        model_id=f"tiny-{name}",
    )
    assert (path / "tokenizer.json").exists() and not (tmp_path / "art.ckpt").exists()
    quantized = _logits(model, ids)
    assert not torch.allclose(quantized, ref)
    art = read_artifact(path)
    assert art.quantization_config["provenance"]["model_id"] == f"tiny-{name}"
    missing, unexpected = fresh.load_state_dict(art.dense_state_dict(), strict=False)
    assert not unexpected and all("rotary" in m for m in missing)
    assert torch.equal(_logits(fresh, ids), quantized)
    for rec_name, rec in art.records.items():
        assert isinstance(rec, QuantizedWeight) and rec.rotation is not None
        layer = int(rec_name.split(".")[2])
        assert rec.rotation.seed >> 32 == layer  # the effective seed, never the base seed


def test_lazy_propagation_on_cpu_keeps_p13_and_tracks_exact(tmp_path: Path) -> None:
    """propagation="lazy" (the demo's CPU choice): the artifact still decodes to exactly the
    evaluated model (P13), and its logits stay close to the exact-propagation run."""
    ids = _windows(2, 16, seed=4)
    runs = {}
    for mode in ("exact", "lazy"):
        model = MODELS["llama"]()
        fresh = copy.deepcopy(model)
        path = quantize_model(
            model, _tokenizer(), _windows(), _cfg(propagation=mode), tmp_path / mode,
            progress=False,
        )
        art = read_artifact(path)
        assert art.quant_config.propagation == mode
        fresh.load_state_dict(art.dense_state_dict(), strict=False)
        runs[mode] = _logits(model, ids)
        assert torch.equal(_logits(fresh, ids), runs[mode])
    diff = (runs["lazy"] - runs["exact"]).abs().max() / runs["exact"].abs().max()
    assert float(diff) < 0.05


def test_resume_after_crash_gives_the_same_bytes(tmp_path: Path) -> None:
    template = _llama(layers=3, hidden=48)
    cfg = _cfg()
    clean = quantize_model(
        copy.deepcopy(template), None, _windows(), cfg, tmp_path / "clean", progress=False
    )

    class Crash(RuntimeError):
        pass

    def crash(t: int) -> None:
        if t == 1:
            raise Crash

    ckpt = tmp_path / "resumed.ckpt"
    with pytest.raises(Crash):
        quantize_model_in_place(
            copy.deepcopy(template),
            _windows(),
            cfg,
            progress=False,
            checkpoint_dir=ckpt,
            on_block=crash,
        )
    with pytest.raises(InvalidInput, match="different run"):
        quantize_model_in_place(
            copy.deepcopy(template),
            _windows(),
            cfg.replace(damping=0.02),
            progress=False,
            checkpoint_dir=ckpt,
        )
    with pytest.raises(InvalidInput, match="different run"):
        quantize_model_in_place(
            copy.deepcopy(template), _windows(seed=1), cfg, progress=False, checkpoint_dir=ckpt
        )
    resumed = quantize_model(
        copy.deepcopy(template),
        None,
        _windows(),
        cfg,
        tmp_path / "resumed",
        progress=False,
        checkpoint_dir=ckpt,
    )
    assert read_artifact(resumed).quantization_config["provenance"]["resumed_blocks"] == 2
    assert (resumed / "model.safetensors").read_bytes() == (
        clean / "model.safetensors"
    ).read_bytes()


def test_int4_modules_and_int8_embedding(tmp_path: Path) -> None:
    model = _qwen2_tied()
    fresh = copy.deepcopy(model)
    cfg = _cfg(
        int4_modules=("self_attn.v_proj", "layers.1.mlp.down_proj"),
        embedding_encoding="int8",
        embedding_group=24,
    )
    path = quantize_model(model, None, _windows(), cfg, tmp_path / "art", progress=False)
    art = read_artifact(path)
    assert isinstance(art.records["model.layers.0.self_attn.v_proj"], Int4Weight)
    assert isinstance(art.records["model.layers.1.mlp.down_proj"], Int4Weight)
    assert isinstance(art.records["model.layers.0.mlp.down_proj"], QuantizedWeight)
    assert isinstance(art.raw_quant["model.embed_tokens.weight"], GroupAffine)
    assert art.tied == {"lm_head.weight": "model.embed_tokens.weight"}
    fresh.load_state_dict(art.dense_state_dict(), strict=False)
    ids = _windows(2, 16, seed=5)
    assert torch.equal(_logits(fresh, ids), _logits(model, ids))
    rates = artifact_report(path)["rates"]
    assert (
        rates["kernel_bits_per_weight"]
        < rates["whole_model_bits_per_param"]
        < rates["on_disk_bits_per_param"]
    )


def test_rejects_unsupported_models_and_bad_weights() -> None:
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=1, n_embd=48, n_head=2, vocab_size=64)
    )
    with pytest.raises(UnsupportedArchitecture, match="gpt2"):
        quantize_model_in_place(gpt2, _windows(), _cfg(), progress=False)
    model = _llama(layers=1)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[3, 5] = float("nan")
    with pytest.raises(InvalidInput, match=r"up_proj\.weight"):
        quantize_model_in_place(model, _windows(), _cfg(), progress=False)
    with pytest.raises(InvalidInput, match="vocab"):
        quantize_model_in_place(_llama(1), _windows() + 1000, _cfg(), progress=False)
    with pytest.raises(InvalidInput, match="control"):
        quantize_model(
            _llama(1),
            None,
            _windows(),
            _cfg(codebook="identity"),
            Path("/nonexistent/x"),
            progress=False,
        )


@pytest.mark.slow
def test_quality_sanity_with_the_ball_codebook(tmp_path: Path) -> None:
    """Real Λ24(12) + 1 gain bit on a one-block model: the logits stay correlated with the original
    and
    the weight SQNR is in the range the Gaussian source predicts (≈ 11 dB before feedback)."""
    torch.manual_seed(5)
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    orig = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = _windows(2, 24, seed=6)
    ref = _logits(model, ids)
    path = quantize_model(
        model, None, _windows(), _cfg(codebook="ball"), tmp_path / "art", progress=False
    )
    out = _logits(model, ids)
    corr = torch.corrcoef(
        torch.stack([(out - out.mean()).flatten(), (ref - ref.mean()).flatten()])
    )[0, 1]
    assert float(corr) > 0.9
    art = read_artifact(path)
    for name, rec in art.records.items():
        w = orig[f"{name}.weight"]
        sqnr_db = 10 * torch.log10(w.pow(2).sum() / (rec.dequantize() - w).pow(2).sum())
        assert 8.0 < float(sqnr_db) < 14.0, (name, float(sqnr_db))
    assert artifact_report(path)["rates"]["code_bits_per_weight"] == pytest.approx(2.0)
