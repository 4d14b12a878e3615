"""``leechq.load``: exact against the dequantized dense model, save round trip, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from leechq_tiny import ARCHS, ids, make_artifact, tiny_model

from leechq.errors import ArtifactError, IncompatibleVersion, UnsupportedArchitecture
from leechq.models.load import load
from leechq.nn.linear import LeechqLinear


@pytest.mark.parametrize("arch", ARCHS)
def test_load_equals_dense_dequantized_model(tmp_path: Path, arch: str) -> None:
    from leechq.formats.artifact import read_artifact

    out, dense = make_artifact(tmp_path, arch)
    model, tok = load(out, device="cpu")
    assert tok is not None and tok.eos_token_id == 2
    n_q = sum(isinstance(m, LeechqLinear) for m in model.modules())
    assert n_q == 7 * dense.config.num_hidden_layers
    assert all(m.execution.path == "dense" for m in model.modules() if isinstance(m, LeechqLinear))
    dense.load_state_dict(read_artifact(out).dense_state_dict(), strict=True)
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, dense(x).logits, rtol=0, atol=0)
    if dense.config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_load_bfloat16(tmp_path: Path) -> None:
    out, _ = make_artifact(tmp_path, "qwen2")
    m32, _ = load(out, device="cpu", dtype="float32", tokenizer=False)
    m16, tok = load(out, device="cpu", dtype=torch.bfloat16, tokenizer=False)
    assert tok is None and m16.model.embed_tokens.weight.dtype == torch.bfloat16
    x = ids()
    with torch.no_grad():
        a, b = m32(x).logits, m16(x).logits.float()
    assert b.dtype == torch.float32 and (a - b).abs().max() < 0.1 * a.abs().max()


def test_save_round_trip_is_byte_identical(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from leechq.models.save import save

    out, _ = make_artifact(tmp_path, "llama")
    model, tok = load(out, device="cpu")
    again = save(model, tmp_path / "again", tokenizer=tok)
    a, b = load_file(str(out / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].numpy().tobytes() == b[k].numpy().tobytes(), k
    qa = json.loads((out / "config.json").read_text())["quantization_config"]
    qb = json.loads((again / "config.json").read_text())["quantization_config"]
    for key in ("records", "rotations", "raw", "tied", "config", "codebook_fingerprint"):
        assert qa[key] == qb[key], key
    m2, _ = load(again, device="cpu", tokenizer=False)
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(m2(x).logits, model(x).logits, rtol=0, atol=0)


def test_missing_tokenizer(tmp_path: Path) -> None:
    out, _ = make_artifact(tmp_path, "llama", tokenizer=False)
    with pytest.raises(ArtifactError, match="no tokenizer files"):
        load(out, device="cpu")
    model, tok = load(out, device="cpu", tokenizer=False)
    assert tok is None and model is not None


def test_unsupported_architecture(tmp_path: Path) -> None:
    from leechq_tiny import quantize_randomly

    from leechq.config import QuantConfig
    from leechq.formats.artifact import write_artifact
    from leechq.models.save import model_records, raw_tensors
    from leechq.nn.replace import replace_with_records

    model = tiny_model("llama")
    replace_with_records(model, quantize_randomly(model))
    records = model_records(model)
    raw, tied = raw_tensors(model, records)
    base = model.config.to_dict()
    base["model_type"] = "not-a-model"
    out = write_artifact(
        tmp_path / "bogus",
        base_config=base,
        quant_config=QuantConfig(codebook="tetra"),
        records=records,
        raw=raw,
        tied=tied,
    )
    with pytest.raises(UnsupportedArchitecture, match=r"not\-a\-model"):
        load(out, device="cpu", tokenizer=False)


def test_records_for_another_model(tmp_path: Path) -> None:
    """An artifact whose config says 2 layers but whose records name a third layer."""
    out, _ = make_artifact(tmp_path, "llama", tokenizer=False)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["num_hidden_layers"] = 1
    _rewrite(out, cfg)
    with pytest.raises(UnsupportedArchitecture, match=r"model\.layers\.1"):
        load(out, device="cpu", tokenizer=False)


def test_future_schema(tmp_path: Path) -> None:
    out, _ = make_artifact(tmp_path, "llama", tokenizer=False)
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"]["schema_version"] = 99
    _rewrite(out, cfg)
    with pytest.raises(IncompatibleVersion, match="99"):
        load(out, device="cpu", tokenizer=False)


def test_corrupt_and_truncated(tmp_path: Path) -> None:
    out, _ = make_artifact(tmp_path, "llama", tokenizer=False)
    f = out / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-10] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256"):
        load(out, device="cpu", tokenizer=False)
    f.write_bytes(bytes(data[:-100]))
    with pytest.raises(ArtifactError, match="truncated"):
        load(out, device="cpu", tokenizer=False)
    with pytest.raises(ArtifactError, match="not a directory"):
        load(tmp_path / "nowhere", device="cpu")


def _rewrite(out: Path, cfg: dict) -> None:
    """Rewrite config.json and fix its manifest entry (a consistent, hand-edited artifact)."""
    import hashlib

    path = out / "config.json"
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))
    man_path = out / "leechq-manifest.json"
    man = json.loads(man_path.read_text())
    data = path.read_bytes()
    man["files"]["config.json"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    man_path.write_text(json.dumps(man))


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ARCHS)
def test_load_on_cuda(tmp_path: Path, arch: str) -> None:
    """On CUDA every lattice and int4 module runs a fused kernel; logits agree with the CPU load."""
    out, _ = make_artifact(tmp_path, arch)
    cpu, _ = load(out, device="cpu", dtype=torch.float32, tokenizer=False)
    gpu, _ = load(out, device="cuda", dtype=torch.float32, tokenizer=False)
    paths = {m.execution.path for m in gpu.modules() if isinstance(m, LeechqLinear)}
    assert paths == {"fused"}
    x = ids()
    with torch.no_grad():
        a = cpu(x).logits
        b = gpu(x.cuda()).logits.cpu()
    assert (a - b).abs().max() <= 1e-4 * a.abs().max()
    g16, _ = load(out, device="cuda", dtype=torch.bfloat16, tokenizer=False)
    with torch.no_grad():
        c = g16(x.cuda()).logits.float().cpu()
    assert (a - c).abs().max() <= 5e-2 * a.abs().max()
