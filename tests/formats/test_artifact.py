"""The artifact directory: code packing, write→read identity, hostile files, accounting."""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quant"))
from standin_codebook import NAME, register, registered

from leechq.codebooks import names
from leechq.config import QuantConfig
from leechq.errors import ArtifactError, FingerprintMismatch, IncompatibleVersion, InvalidInput
from leechq.formats.accounting import artifact_report
from leechq.formats.artifact import (
    GroupAffine,
    block_bytes,
    pack_codes,
    read_artifact,
    unpack_codes,
    write_artifact,
)
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import generate_rotation, rotation_seed


@pytest.fixture(autouse=True)
def _standin() -> Iterator[str]:
    with registered() as name:
        yield name


@pytest.mark.parametrize(
    "label_bits,gain_bits,nbytes", [(47, 1, 6), (47, 0, 6), (47, 2, 7), (24, 1, 4)]
)
def test_pack_round_trip(label_bits: int, gain_bits: int, nbytes: int) -> None:
    g = torch.Generator().manual_seed(label_bits + gain_bits)
    labels = torch.randint(0, 2**label_bits, (5, 7), generator=g, dtype=torch.int64)
    labels[0, 0] = 2**label_bits - 1
    labels[0, 1] = 0
    gains = torch.randint(0, 2**gain_bits, (5, 7), generator=g).to(torch.uint8)
    stream = pack_codes(labels, gains, label_bits, gain_bits)
    assert block_bytes(label_bits, gain_bits) == nbytes and stream.numel() == 35 * nbytes
    back = unpack_codes(stream, 5, 7, label_bits, gain_bits)
    assert torch.equal(back[0], labels) and torch.equal(back[1], gains)
    with pytest.raises(InvalidInput, match="labels out of range"):
        pack_codes(labels + 2**label_bits, gains, label_bits, gain_bits)


def test_47_plus_1_is_the_published_tetra_disk_stream() -> None:
    """docs/codebooks.md §3.5 vectors: int.from_bytes(6 bytes, "big") == (label << 1) | gain."""
    words = [0x000000000000, 0x800000000000, 0x000000000001, 0x7FFFFFFFFFFF, 0x12C4D7902316]
    disk = ["000000000000", "000000000001", "000000000002", "fffffffffffe", "2589af20462c"]
    labels = torch.tensor([w & (2**47 - 1) for w in words], dtype=torch.int64)[None]
    gains = torch.tensor([w >> 47 for w in words], dtype=torch.uint8)[None]
    stream = pack_codes(labels, gains, 47, 1)
    assert bytes(stream.numpy()).hex() == "".join(disk)
    from llvq_tetra.tetra import split_stream

    lab, gai = split_stream(stream.numpy(), len(words), 47, 1)
    assert lab.tolist() == labels[0].tolist() and gai.tolist() == gains[0].tolist()


def _lattice(
    codebook: str, label_bits: int, d_out: int, d_in: int, seed: int, rot_seed: int | None
) -> QuantizedWeight:
    g = torch.Generator().manual_seed(seed)
    nb = d_in // 24
    return QuantizedWeight(
        codebook=codebook,
        d_out=d_out,
        d_in=d_in,
        labels=torch.randint(0, 2**label_bits, (d_out, nb), generator=g, dtype=torch.int64),
        gains=torch.randint(0, 2, (d_out, nb), generator=g).to(torch.uint8),
        row_scales=torch.rand(d_out, generator=g, dtype=torch.float64) + 0.1,
        centroids=torch.tensor([0.87, 1.11], dtype=torch.float64),
        tail=torch.randn(d_out, d_in % 24, generator=g),
        rotation=None if rot_seed is None else generate_rotation(d_in, rot_seed),
    )


def _contents(codebook: str | None = None):  # type: ignore[no-untyped-def]
    codebook = codebook or register()
    from leechq.codebooks import get

    lb = get(codebook).label_bits
    g = torch.Generator().manual_seed(11)
    s0, s2 = rotation_seed(0, 0), rotation_seed(0, 2)
    records = {
        "model.layers.0.self_attn.q_proj": _lattice(codebook, lb, 8, 48, 1, s0),
        "model.layers.0.self_attn.k_proj": _lattice(
            codebook, lb, 4, 48, 2, s0
        ),  # shares the rotation
        "model.layers.0.mlp.up_proj": _lattice(
            codebook, lb, 6, 56, 3, s2
        ),  # ragged: 8 tail columns
        "model.layers.0.mlp.down_proj": _lattice(codebook, lb, 4, 72, 4, None),
        "model.layers.0.self_attn.v_proj": Int4Weight.quantize(torch.randn(4, 48, generator=g)),
    }
    emb = torch.randn(10, 48, generator=g)
    raw = {
        "model.embed_tokens.weight": GroupAffine.quantize(emb, 8, 16),
        "model.norm.weight": torch.ones(48, dtype=torch.bfloat16),
        "model.layers.0.self_attn.q_proj.bias": torch.randn(8, generator=g).half(),
        "lm_head.weight": GroupAffine.quantize(emb, 4, 16),
    }
    cfg = QuantConfig(codebook=codebook, calibration="unit test")
    return cfg, records, raw


def _write(tmp: Path, codebook: str | None = None, **kw) -> Path:  # type: ignore[no-untyped-def]
    cfg, records, raw = _contents(codebook)

    class Tok:
        def save_pretrained(self, d: str) -> None:
            Path(d, "tokenizer.json").write_text('{"tiny": true}')

    return write_artifact(
        tmp / "art",
        base_config={"model_type": "llama", "hidden_size": 48},
        quant_config=cfg,
        records=records,
        raw=raw,
        tokenizer=Tok(),
        tied={"model.shared.weight": "model.norm.weight"},
        **kw,
    )


def _available_codebooks() -> list[str]:
    out = [NAME]
    if "tetra" in names():
        out.append("tetra")
    return out


@pytest.mark.parametrize("codebook", _available_codebooks())
def test_write_read_identity(tmp_path: Path, codebook: str) -> None:
    cfg, records, raw = _contents(codebook)
    path = _write(tmp_path, codebook)
    assert sorted(p.name for p in path.iterdir()) == [
        "config.json",
        "leechq-manifest.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    art = read_artifact(path)
    assert art.quant_config == cfg
    assert (
        art.config["model_type"] == "llama"
        and art.config["quantization_config"]["quant_method"] == "leechq"
    )
    assert set(art.records) == set(records)
    for name, rec in records.items():
        got = art.records[name]
        assert type(got) is type(rec)
        assert torch.equal(got.dequantize(), rec.dequantize()), name
        if isinstance(rec, QuantizedWeight):
            assert isinstance(got, QuantizedWeight)
            assert torch.equal(got.labels, rec.labels) and torch.equal(got.gains, rec.gains)
            assert torch.equal(got.row_scales, rec.row_scales) and torch.equal(got.tail, rec.tail)
            assert (got.rotation is None) == (rec.rotation is None)
            if rec.rotation is not None:
                assert got.rotation is not None and got.rotation.seed == rec.rotation.seed
                assert np.array_equal(got.rotation.small, rec.rotation.small)
    assert torch.equal(art.raw["model.norm.weight"], raw["model.norm.weight"])
    assert art.raw["model.norm.weight"].dtype == torch.bfloat16
    assert torch.equal(
        art.raw_quant["lm_head.weight"].dequantize(), raw["lm_head.weight"].dequantize()
    )
    dense = art.dense_state_dict()
    assert torch.equal(dense["model.shared.weight"], dense["model.norm.weight"])
    qc = art.quantization_config
    assert len(qc["rotations"]) == 2  # de-duplicated by (width, seed)
    assert qc["records"]["model.layers.0.mlp.down_proj"]["rotation"] is None
    emb = raw["model.embed_tokens.weight"]
    assert isinstance(emb, GroupAffine)
    assert (
        art.raw_quant["model.embed_tokens.weight"].dequantize() - emb.dequantize()
    ).abs().max() == 0


def test_write_is_atomic_and_refuses_to_clobber(tmp_path: Path) -> None:
    path = _write(tmp_path)
    with pytest.raises(ArtifactError, match="already exists"):
        _write(tmp_path)
    cfg, records, raw = _contents()
    bad_raw = dict(raw)
    bad_raw["model.bad"] = torch.tensor([float("nan")])
    with pytest.raises(InvalidInput, match=r"model\.bad"):
        write_artifact(
            tmp_path / "art2", base_config={}, quant_config=cfg, records=records, raw=bad_raw
        )
    assert not (tmp_path / "art2").exists()

    class BrokenTokenizer:
        def save_pretrained(self, d: str) -> None:
            Path(d, "tokenizer.json").write_text("{")
            raise OSError("disk full")

    with pytest.raises(ArtifactError, match="disk full"):
        write_artifact(
            tmp_path / "art3",
            base_config={},
            quant_config=cfg,
            records=records,
            raw=raw,
            tokenizer=BrokenTokenizer(),
        )
    assert not (tmp_path / "art3").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["art"]  # no partial directory left behind
    _write(tmp_path, overwrite=True)
    read_artifact(path)


def _rewrite_tensors(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    """Apply ``edit`` to the tensors and refresh the manifest so that only the structure is
    wrong."""
    f = path / "model.safetensors"
    tensors = load_file(str(f))
    edit(tensors)
    save_file(tensors, str(f))
    _refresh_manifest(path)


def _refresh_manifest(path: Path) -> None:
    import hashlib

    man = json.loads((path / "leechq-manifest.json").read_text())
    for name in man["files"]:
        data = (path / name).read_bytes()
        man["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (path / "leechq-manifest.json").write_text(json.dumps(man))


def _edit_config(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg["quantization_config"])
    (path / "config.json").write_text(json.dumps(cfg))
    _refresh_manifest(path)


def test_truncated_file(tmp_path: Path) -> None:
    path = _write(tmp_path)
    f = path / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:-100])
    with pytest.raises(ArtifactError, match=r"model\.safetensors.*truncated"):
        read_artifact(path)
    _refresh_manifest(path)  # even with a consistent manifest, the structure check catches it
    with pytest.raises(ArtifactError, match=r"model\.safetensors"):
        read_artifact(path)
    f.write_bytes(data[:5])
    _refresh_manifest(path)
    with pytest.raises(ArtifactError, match="truncated"):
        read_artifact(path)


def test_flipped_byte_in_header_and_data(tmp_path: Path) -> None:
    path = _write(tmp_path)
    f = path / "model.safetensors"
    data = bytearray(f.read_bytes())
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    hdr = bytearray(data)
    hdr[8 + n // 2] ^= 0x5A
    f.write_bytes(bytes(hdr))
    with pytest.raises(ArtifactError, match="sha256"):
        read_artifact(path)
    _refresh_manifest(path)
    with pytest.raises(ArtifactError, match=r"model\.safetensors"):
        read_artifact(path)
    body = bytearray(data)
    body[-3] ^= 0x01
    f.write_bytes(bytes(body))
    with pytest.raises(ArtifactError, match="sha256"):  # data bytes: only the digest can see it
        read_artifact(path)


def test_missing_tensor_wrong_dtype_wrong_shape_nan(tmp_path: Path) -> None:
    path = _write(tmp_path)
    q = "model.layers.0.self_attn.q_proj"
    _rewrite_tensors(path, lambda t: t.pop(f"{q}.row_scales"))
    with pytest.raises(ArtifactError, match=f"missing tensor '{q}.row_scales'"):
        read_artifact(path)
    path = _write(tmp_path, overwrite=True)
    _rewrite_tensors(path, lambda t: t.update({f"{q}.row_scales": t[f"{q}.row_scales"].float()}))
    with pytest.raises(ArtifactError, match="dtype"):
        read_artifact(path)
    path = _write(tmp_path, overwrite=True)
    _rewrite_tensors(
        path, lambda t: t.update({f"{q}.centroids": torch.ones(3, dtype=torch.float64)})
    )
    with pytest.raises(ArtifactError, match="shape"):
        read_artifact(path)
    path = _write(tmp_path, overwrite=True)
    _rewrite_tensors(path, lambda t: t[f"{q}.row_scales"].__setitem__(0, float("inf")))
    with pytest.raises(ArtifactError, match="NaN or inf"):
        read_artifact(path)
    path = _write(tmp_path, overwrite=True)
    _rewrite_tensors(path, lambda t: t.update({"smuggled": torch.zeros(1)}))
    with pytest.raises(ArtifactError, match="smuggled"):
        read_artifact(path)
    path = _write(tmp_path, overwrite=True)
    _edit_config(path, lambda qc: qc["records"][q].update({"d_out": 9}))
    with pytest.raises(ArtifactError, match="inconsistent"):
        read_artifact(path)


def test_fingerprint_version_and_completeness(tmp_path: Path) -> None:
    path = _write(tmp_path)
    _edit_config(path, lambda qc: qc.update({"codebook_fingerprint": "0123456789abcdef"}))
    with pytest.raises(FingerprintMismatch):
        read_artifact(path)
    path = _write(tmp_path, overwrite=True)
    _edit_config(path, lambda qc: qc.update({"schema_version": 2}))
    with pytest.raises(IncompatibleVersion):
        read_artifact(path)
    path = _write(tmp_path, overwrite=True)
    _edit_config(path, lambda qc: qc["config"].update({"schema_version": 7}))
    with pytest.raises(IncompatibleVersion):
        read_artifact(path)
    path = _write(tmp_path, overwrite=True)
    os.remove(path / "leechq-manifest.json")
    with pytest.raises(ArtifactError, match="never completed"):
        read_artifact(path)
    with pytest.raises(ArtifactError, match="not a complete leechq artifact"):
        _write(tmp_path, overwrite=True)  # no manifest: not replaced
    shutil.rmtree(path)
    path = _write(tmp_path, overwrite=True)
    _edit_config(path, lambda qc: qc.update({"quant_method": "llvq"}))
    with pytest.raises(ArtifactError, match="quant_method"):
        read_artifact(path)


def test_accounting_rates_are_separate(tmp_path: Path) -> None:
    path = _write(tmp_path)
    rep = artifact_report(path)
    cb_bits = 24 + 1  # stand-in labels + 1 gain bit, 4 bytes a block on disk
    m = rep["matrices"]["model.layers.0.mlp.up_proj"]  # 6 × 56: 2 blocks + 8 tail per row
    assert m["code_bits_per_weight"] == pytest.approx(2 * cb_bits / 56)
    assert m["kernel_bits_per_weight"] == pytest.approx((2 * cb_bits + 32 * 8 + 32) / 56)
    assert m["stored_bits_per_weight"] == pytest.approx((2 * 32 + 64 + 32 * 8 + 64 * 2 / 6) / 56)
    v = rep["matrices"]["model.layers.0.self_attn.v_proj"]
    assert v["kernel_bits_per_weight"] == pytest.approx(
        4 + 32 / 48
    )  # one short group of 48 per row
    rates = rep["rates"]
    counts = rep["counts"]
    quantized = 8 * 48 + 4 * 48 + 6 * 56 + 4 * 72 + 4 * 48
    assert counts["quantized_weights"] == quantized
    assert counts["parameters"] == quantized + 480 + 48 + 8 + 480
    assert rates["on_disk_bits_per_param"] == pytest.approx(
        8 * (path / "model.safetensors").stat().st_size / counts["parameters"]
    )
    assert (
        len(
            {
                rates["kernel_bits_per_weight"],
                rates["whole_model_bits_per_param"],
                rates["on_disk_bits_per_param"],
            }
        )
        == 3
    )
