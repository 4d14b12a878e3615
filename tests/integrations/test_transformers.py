"""transformers integration, the three tiers of docs/architecture.md §2 on CPU: config round trip,
replacement on the meta skeleton (through from_pretrained), same logits as ``leechq.load``,
``save_pretrained`` round trip with byte-identical records, and clear errors."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from leechq_tiny import ARCHS, ids, make_artifact

import leechq.integrations.transformers as integ
from leechq.errors import FingerprintMismatch, IncompatibleVersion
from leechq.models.load import load
from leechq.nn.embedding import PackedEmbedding, PackedHead
from leechq.nn.linear import LeechqLinear


def _from_pretrained(path: Path, **kwargs):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), **kwargs)


def test_registration_uses_public_api() -> None:
    from transformers.quantizers.auto import (
        AUTO_QUANTIZATION_CONFIG_MAPPING,
        AUTO_QUANTIZER_MAPPING,
    )

    assert AUTO_QUANTIZATION_CONFIG_MAPPING["leechq"] is integ.LeechqHfConfig
    assert AUTO_QUANTIZER_MAPPING["leechq"] is integ.LeechqHfQuantizer
    assert integ.LeechqHfQuantizer.requires_calibration is True


def test_config_round_trip(tmp_path: Path) -> None:
    out, _ = make_artifact(tmp_path, "llama", tokenizer=False)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    cfg = integ.LeechqHfConfig.from_dict(qc)
    assert cfg.to_dict() == qc
    assert cfg.quant_config().codebook == "tetra"
    with pytest.raises(IncompatibleVersion):
        integ.LeechqHfConfig.from_dict({**qc, "schema_version": 2})
    with pytest.raises(FingerprintMismatch):
        integ.LeechqHfConfig.from_dict({**qc, "codebook_fingerprint": "0" * 16})


@pytest.mark.parametrize("arch", ARCHS)
def test_same_logits_as_leechq_load(tmp_path: Path, arch: str) -> None:
    out, dense = make_artifact(tmp_path, arch)
    ours, _ = load(out, device="cpu")
    hf = _from_pretrained(out, dtype=torch.float32)
    n_q = sum(isinstance(m, LeechqLinear) for m in hf.modules())
    assert n_q == 7 * dense.config.num_hidden_layers
    assert not hasattr(hf, "leechq")  # the rotation store is dropped after loading
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x).logits, rtol=0, atol=0)


def test_default_dtype_and_bfloat16(tmp_path: Path) -> None:
    out, _ = make_artifact(tmp_path, "qwen2", tokenizer=False)
    hf = _from_pretrained(out)
    assert hf.dtype == torch.float32
    hf16 = _from_pretrained(out, dtype=torch.bfloat16)
    ours16, _ = load(out, device="cpu", dtype=torch.bfloat16, tokenizer=False)
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(hf16(x).logits, ours16(x).logits, rtol=0, atol=0)


def test_save_pretrained_round_trip(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    out, _ = make_artifact(tmp_path, "qwen2")
    hf = _from_pretrained(out, dtype=torch.float32)
    hf.save_pretrained(tmp_path / "saved")
    a = load_file(str(out / "model.safetensors"))
    b = load_file(str(tmp_path / "saved" / "model.safetensors"))
    assert set(a) == set(b)
    for k in a:  # records, rotation tables and raw tensors, byte for byte
        assert a[k].dtype == b[k].dtype and a[k].numpy().tobytes() == b[k].numpy().tobytes(), k
    qa = json.loads((out / "config.json").read_text())["quantization_config"]
    qb = json.loads((tmp_path / "saved" / "config.json").read_text())["quantization_config"]
    assert qa == qb
    again = _from_pretrained(tmp_path / "saved", dtype=torch.float32)
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(again(x).logits, hf(x).logits, rtol=0, atol=0)


def test_group_affine_embedding(tmp_path: Path) -> None:
    """A 4-bit embedding (three stored keys) stays packed after loading (the tied head reads the
    same table) and is written back as the same three tensors."""
    from leechq_tiny import quantize_randomly, tiny_model
    from safetensors.torch import load_file

    from leechq.config import QuantConfig
    from leechq.formats.artifact import GroupAffine, write_artifact
    from leechq.models.save import raw_tensors

    dense = tiny_model("llama")
    records = quantize_randomly(dense)
    raw, tied = raw_tensors(dense, {})
    raw = {k: v for k, v in raw.items() if not (k.endswith(".weight") and k[:-7] in records)}
    emb = "model.embed_tokens.weight"
    raw[emb] = GroupAffine.quantize(raw[emb], 4, 64)
    out = write_artifact(
        tmp_path / "ga",
        base_config=dense.config.to_dict(),
        quant_config=QuantConfig(codebook="tetra", embedding_encoding="int4"),
        records=records,
        raw=raw,
        tied=tied,
    )
    ours, _ = load(out, device="cpu", tokenizer=False)
    hf = _from_pretrained(out, dtype=torch.float32)
    assert isinstance(hf.model.embed_tokens, PackedEmbedding)
    assert isinstance(hf.lm_head, PackedHead) and hf.lm_head.table is hf.model.embed_tokens
    torch.testing.assert_close(hf.model.embed_tokens.dequantize_rows(), raw[emb].dequantize(),
                               rtol=0, atol=0)
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x).logits, rtol=0, atol=0)
    hf.save_pretrained(tmp_path / "saved")
    a, b = (
        load_file(str(out / "model.safetensors")),
        load_file(str(tmp_path / "saved/model.safetensors")),
    )
    assert set(a) == set(b)
    for k in a:
        assert a[k].numpy().tobytes() == b[k].numpy().tobytes(), k


def _qwen3_with_a_coded_table(tmp_path: Path, cfg: Any, table: str,
                              code: Any) -> tuple[Path, torch.nn.Module]:
    """A tiny untied Qwen3 artifact (random projection records) whose module ``table`` is recorded
    as ``code(dense module)`` makes it, under config ``cfg``: its path and leechq.load's model."""
    from leechq_tiny import quantize_randomly, tiny_model, tiny_tokenizer

    from leechq.formats.artifact import write_artifact
    from leechq.models.save import raw_tensors

    dense = tiny_model("qwen3")
    records = quantize_randomly(dense)
    records[table] = code(dense.get_submodule(table))
    raw, tied = raw_tensors(dense, {})
    raw = {k: v for k, v in raw.items() if not (k.endswith(".weight") and k[:-7] in records)}
    out = write_artifact(tmp_path / table, base_config=dense.config.to_dict(), quant_config=cfg,
                         records=records, raw=raw, tied=tied, tokenizer=tiny_tokenizer())
    return out, load(out, device="cpu", tokenizer=False)[0]


def _written_back(hf: torch.nn.Module, out: Path, saved: Path) -> set[str]:
    """``hf.save_pretrained(saved)`` writes ``out``'s tensors byte for byte; their names."""
    from safetensors.torch import load_file

    hf.save_pretrained(saved)
    a, b = load_file(str(out / "model.safetensors")), load_file(str(saved / "model.safetensors"))
    assert set(a) == set(b)
    for k in a:
        assert a[k].numpy().tobytes() == b[k].numpy().tobytes(), k
    return set(a)


def test_lattice_coded_embedding(tmp_path: Path) -> None:
    """A lattice-coded embedding (a record under the embedding's module name) loads as a
    LatticeEmbedding with leechq.load's logits and is written back as the same tensors."""
    from leechq.config import QuantConfig
    from leechq.nn.lattice_embedding import LatticeEmbedding
    from leechq.quant.embedding import encode_embedding

    cfg = QuantConfig(codebook="tetra", embedding_encoding="lattice", device="cpu")
    out, ours = _qwen3_with_a_coded_table(tmp_path, cfg, "model.embed_tokens",
                                          lambda m: encode_embedding(m.weight, cfg))
    hf = _from_pretrained(out, dtype=torch.float32)
    assert isinstance(hf.model.embed_tokens, LatticeEmbedding)
    assert hf.get_input_embeddings() is hf.model.embed_tokens
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x).logits, rtol=0, atol=0)
    _written_back(hf, out, tmp_path / "saved")
    again, _ = load(tmp_path / "saved", device="cpu", tokenizer=False)
    with torch.no_grad():
        torch.testing.assert_close(again(x).logits, ours(x).logits, rtol=0, atol=0)


def test_lattice_coded_head(tmp_path: Path) -> None:
    """A lattice-coded head (a record under the head's module name, ``lattice_head``) loads as a
    LeechqLinear with leechq.load's logits and is written back as the same tensors."""
    from leechq_tiny import lattice_record

    from leechq.config import QuantConfig

    cfg = QuantConfig(codebook="tetra", lattice_head=True, device="cpu")
    out, ours = _qwen3_with_a_coded_table(
        tmp_path, cfg, "lm_head",
        lambda m: lattice_record("tetra", *m.weight.shape, seed=7, weight=m.weight.detach()))
    hf = _from_pretrained(out, dtype=torch.float32)
    assert isinstance(hf.lm_head, LeechqLinear) and hf.get_output_embeddings() is hf.lm_head
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x).logits, rtol=0, atol=0)
    assert "lm_head.weight" not in _written_back(hf, out, tmp_path / "saved")


def test_artifact_for_another_model(tmp_path: Path) -> None:
    from leechq.errors import ArtifactError, UnsupportedArchitecture

    out, _ = make_artifact(tmp_path, "llama", tokenizer=False)
    cfg = json.loads((out / "config.json").read_text())
    cfg["intermediate_size"] = 104
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ArtifactError, match="config.json"):  # the gate: config.json was edited
        _from_pretrained(out, dtype=torch.float32)
    manifest = json.loads((out / "leechq-manifest.json").read_text())
    data = (out / "config.json").read_bytes()
    manifest["files"]["config.json"] = {
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    (out / "leechq-manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UnsupportedArchitecture, match="mlp"):
        _from_pretrained(out, dtype=torch.float32)


def test_registration_is_explicit() -> None:
    """``import leechq`` (and the standalone loader) registers nothing with transformers; importing
    the integration module does (docs/architecture.md §2: the one documented import line)."""
    code = (
        "import leechq, leechq.models.load\n"
        "from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING as Q\n"
        "before = 'leechq' in Q\n"
        "import leechq.integrations.transformers\n"
        "print(before, 'leechq' in Q)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "True"]


def test_dequantize_gives_plain_linears(tmp_path: Path) -> None:
    out, _ = make_artifact(tmp_path, "qwen2", tokenizer=False)
    hf = _from_pretrained(out, dtype=torch.float32)
    x = ids()
    with torch.no_grad():
        before = hf(x).logits
    hf = hf.dequantize()
    assert not any(isinstance(m, LeechqLinear) for m in hf.modules())
    assert not hasattr(hf.config, "quantization_config")
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, before, rtol=0, atol=0)
