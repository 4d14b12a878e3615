"""The published Tetra directory (docs/format.md §5): leechq ↔ dir identity, and the oracle
``llvq-tetra`` 0.1.0 (checkdense, ``PackedModel.dequantize``, its transformers quantizer) accepting
what leechq writes, bit for bit; hostile directories refused with a clear error."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from leechq.errors import ArtifactError, FingerprintMismatch, IncompatibleVersion, InvalidInput
from leechq.formats import tetra_read, tetra_write
from leechq.formats.artifact import GroupAffine
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import generate_rotation, rotation_seed
from leechq.formats.tetra_dir import (
    DENSE_DIGEST_FILE,
    DIGEST_FILE,
    dequantize_record,
    dequantize_record_f64,
    expected_shapes,
)
from leechq.formats.tetra_read import read_tetra_dir
from leechq.formats.tetra_write import artifact_to_tetra_dir, tetra_dir_summary, write_tetra_dir

pytest.importorskip("llvq_tetra")
from llvq_tetra.reader import PackedModel

# --------------------------------------------------------------------------------------------------
# a tiny Qwen3-shaped model: widths 88 = 3·24 + 16 (k = 11), 72 = 3·24 (k = 9),
# 64 = 2·24 + 16 (k = 1)


def _qwen3_config() -> dict[str, Any]:
    from transformers import Qwen3Config

    cfg = Qwen3Config(vocab_size=128, hidden_size=88, intermediate_size=72, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                      tie_word_embeddings=True, max_position_embeddings=64)
    return dict(cfg.to_dict())


def _tetra(d_out: int, d_in: int, g: torch.Generator, rot_seed: int | None) -> QuantizedWeight:
    nb = d_in // 24
    return QuantizedWeight(
        codebook="tetra", d_out=d_out, d_in=d_in,
        labels=torch.randint(0, 1 << 47, (d_out, nb), generator=g),
        gains=torch.randint(0, 2, (d_out, nb), generator=g).to(torch.uint8),
        row_scales=torch.rand(d_out, generator=g, dtype=torch.float64) * 0.1 + 0.01,
        centroids=torch.sort(torch.rand(2, generator=g, dtype=torch.float64) + 0.5).values,
        tail=torch.randn(d_out, d_in % 24, generator=g) * 0.05,
        rotation=None if rot_seed is None else generate_rotation(d_in, rot_seed),
    )


def _contents() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(base config, records, raw) covering every field: tails, rotations with k = 1, 9, 11 and
    none, int4 g128 records, the int4 g64 embedding (short last group), f16 norms."""
    base = _qwen3_config()
    g = torch.Generator().manual_seed(7)
    records: dict[str, Any] = {}
    raw: dict[str, Any] = {}
    acts = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "o_proj": 1, "gate_proj": 2, "up_proj": 2,
            "down_proj": 3}
    shapes = expected_shapes(base)
    assert shapes is not None
    for name, shape in shapes.items():
        if name.endswith(".weight"):
            if name == "model.embed_tokens.weight":
                raw[name] = Int4Weight.quantize(torch.randn(*shape, generator=g), group=64)
            else:
                raw[name] = (1.0 + 0.1 * torch.randn(*shape, generator=g)).half()
            continue
        layer, short = int(name.split(".")[2]), name.rsplit(".", 1)[-1]
        d_out, d_in = shape
        if short == "v_proj" or (short == "o_proj" and layer == 0):
            records[name] = Int4Weight.quantize(torch.randn(d_out, d_in, generator=g) * 0.05)
        elif short == "down_proj" and layer == 1:
            records[name] = _tetra(d_out, d_in, g, None)
        else:
            records[name] = _tetra(d_out, d_in, g, rotation_seed(layer, acts[short]))
    return base, records, raw


TOKENIZER = {"tokenizer.json": b'{"tiny": true}', "tokenizer_config.json": b'{"x": 1}'}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any, Any]:
    base, records, raw = _contents()
    out = tmp_path_factory.mktemp("tetra") / "qwen3-tiny"
    write_tetra_dir(out, base, records, raw, tokenizer_files=TOKENIZER)
    return out, base, records, raw


def _bits_equal(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> bool:
    a_np = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else a
    b_np = b.detach().cpu().numpy() if isinstance(b, torch.Tensor) else b
    return (a_np.dtype == b_np.dtype and a_np.shape == b_np.shape
            and a_np.tobytes() == b_np.tobytes())


def _assert_same_record(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(a, QuantizedWeight):
        assert (a.codebook, a.d_out, a.d_in) == (b.codebook, b.d_out, b.d_in)
        for f in ("labels", "gains", "row_scales", "centroids", "tail"):
            assert _bits_equal(getattr(a, f), getattr(b, f)), f
        assert (a.rotation is None) == (b.rotation is None)
        if a.rotation is not None:
            assert (a.rotation.n, a.rotation.seed) == (b.rotation.n, b.rotation.seed)
            assert _bits_equal(a.rotation.signs, b.rotation.signs)
            assert _bits_equal(a.rotation.small, b.rotation.small)
    else:
        assert (a.d_out, a.d_in, a.group) == (b.d_out, b.d_in, b.group)
        for f in ("qweight", "scales", "biases"):
            assert _bits_equal(getattr(a, f), getattr(b, f)), f


# --------------------------------------------------------------------------------------------------
# both directions


def test_round_trip_identity(written: tuple[Path, Any, Any, Any], tmp_path: Path) -> None:
    out, base, records, raw = written
    d = read_tetra_dir(out, verify_dense=True)
    assert d.base_config == {**json.loads(json.dumps(base)), "dtype": "float32"}
    assert set(d.records) == set(records)
    for name, rec in records.items():
        _assert_same_record(rec, d.records[name])
    assert set(d.raw) == set(raw)
    for name, value in raw.items():
        got = d.raw[name]
        if isinstance(value, Int4Weight):
            assert isinstance(got, GroupAffine)
            assert (got.dims, got.bits, got.group) == ((value.d_out, value.d_in), 4, 64)
            for f in ("qweight", "scales", "biases"):
                assert _bits_equal(getattr(value, f), getattr(got, f))
        else:
            assert _bits_equal(value, got)
    assert d.files == TOKENIZER
    qc = d.quantization_config
    assert qc["tetra_fingerprint"] == "9c3060086c7a13e6" and qc["code_order"] == "msb_first_dense"
    model_bytes = (out / "model.safetensors").read_bytes()
    assert qc["artifact_sha256"] == hashlib.sha256(model_bytes).hexdigest()
    assert tetra_dir_summary(d) == {
        "tetra_records": 11, "int4_records": 3, "rotations": 6, "raw_tensors": 10,
        "tetra_blocks": sum(r.d_out * r.n_blocks for r in records.values()
                            if isinstance(r, QuantizedWeight)),
        "quantized_weights": sum(r.d_out * r.d_in for r in records.values())}
    # k = 1 stores small = [[1.0]] (docs/quantizer.md §3); rotations are de-duplicated by (n, seed).
    want_keys = {f"88_{rotation_seed(i, a):016x}" for i in (0, 1) for a in (0, 2)}
    want_keys |= {f"72_{rotation_seed(0, 3):016x}", f"64_{rotation_seed(1, 1):016x}"}
    assert set(qc["rotations"]) == want_keys
    assert qc["rotations"][f"64_{rotation_seed(1, 1):016x}"] == {
        "seed": str(rotation_seed(1, 1)), "n": 64, "pow2": 64, "odd": 1}
    assert qc["rotations"][f"88_{rotation_seed(0, 0):016x}"]["odd"] == 11
    assert d.records["model.layers.1.self_attn.o_proj"].rotation.small.tolist() == [[1.0]]
    # dir → leechq → dir reproduces the tensor file byte for byte.
    again = write_tetra_dir(tmp_path / "again", d.base_config, d.records, d.raw,
                            tokenizer_files=d.files)
    assert (again / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    for name in ("config.json", DIGEST_FILE, DENSE_DIGEST_FILE, "tokenizer.json"):
        assert (again / name).read_bytes() == (out / name).read_bytes(), name


def test_disk_bytes_match_the_spec_vectors(tmp_path: Path) -> None:
    """docs/codebooks.md §3.5: word → the 6 disk bytes, and the decoded points, via our writer."""
    vectors = [
        ("000000000000", "000000000000"), ("800000000000", "000000000001"),
        ("000000000001", "000000000002"), ("7fffffffffff", "fffffffffffe"),
        ("12c4d7902316", "2589af20462c"), ("12c4d8902316", "2589b120462c"),
        ("f994070f3202", "f3280e1e6405"),
    ]
    words = [int(w, 16) for w, _ in vectors]
    labels = torch.tensor([[w & ((1 << 47) - 1) for w in words]])
    gains = torch.tensor([[w >> 47 for w in words]], dtype=torch.uint8)
    rec = QuantizedWeight("tetra", 1, 24 * len(words), labels, gains,
                          torch.ones(1, dtype=torch.float64),
                          torch.tensor([0.5, 1.5], dtype=torch.float64), torch.zeros(1, 0))
    out = write_tetra_dir(tmp_path / "v", {"model_type": "custom"}, {"blk": rec}, {})
    from safetensors.numpy import load_file

    codes = load_file(str(out / "model.safetensors"))["blk.codes"]
    assert codes.tobytes().hex() == "".join(b for _, b in vectors)
    with PackedModel(out) as m:
        points, got_gains = m.points("blk.weight")
    assert got_gains.tolist() == [w >> 47 for w in words]
    assert points[3].tolist() == [-1, 1, -5, -5, -5, -1, 7, -1, -1, 5, -3, -3, 3, -1, 1, 5, -1, -1,
                                  -1, -1, -5, 1, -3, 3]
    assert torch.equal(rec.points()[0].to(torch.int32), torch.from_numpy(points))


def test_packed_model_dequantize_is_bit_identical(written: tuple[Path, Any, Any, Any]) -> None:
    out, _, records, raw = written
    with PackedModel(out) as m:
        assert set(m.records) == {f"{n}.weight" for n in records}
        for name, rec in records.items():
            ours = dequantize_record(rec).numpy()
            assert _bits_equal(m.dequantize(f"{name}.weight"), ours), name
        assert set(m.raw) == set(raw)
        for name, value in raw.items():
            ours = value.dequantize(torch.float32) if isinstance(value, Int4Weight) \
                else value.to(torch.float32)
            assert _bits_equal(m.dequantize_raw(name), ours.numpy()), name


@functools.cache
def _every_shell_labels() -> torch.Tensor:
    """Labels covering the origin and shells 2..26 (all that 40,000 random labels reach, plus
    label 1 = (1^23, -3) for m = 2 and the docs/codebooks.md §3.5 vector of m = 26), each at many
    positions, as [rows, 13] (d_in = 13·24 + 8 = 320 = 5·64: a tail, and a rotation with a 5×5
    mix)."""
    from leechq.codebooks.tetra import decode

    g = torch.Generator().manual_seed(3)
    pool = torch.randint(0, 1 << 47, (40000,), generator=g)
    m = (decode(pool).long() ** 2).sum(-1) // 16
    picks = [torch.tensor([0, 1, 1, 0x7994070F3202, 0x7994070F3202, 0x7FFFFFFFFFFF])]
    picks += [pool[m == shell][:12] for shell in range(3, 26)]
    labels = torch.cat(picks)
    labels = torch.cat([labels, labels.flip(0)])
    labels = torch.cat([labels, labels[: -labels.numel() % 13]]).reshape(-1, 13)
    found = set(((decode(labels).long() ** 2).sum(-1) // 16).unique().tolist())
    assert {0, 2, 8, 19, 26} <= found and len(found) >= 18, found  # 2, 8, 19: torch's sqrt is off
    return labels


def _every_shell_record(rot: bool) -> QuantizedWeight:
    labels = _every_shell_labels()
    g = torch.Generator().manual_seed(4)
    d_out, d_in = labels.shape[0], labels.shape[1] * 24 + 8
    return QuantizedWeight(
        "tetra", d_out, d_in, labels,
        torch.randint(0, 2, labels.shape, generator=g).to(torch.uint8),
        torch.rand(d_out, generator=g, dtype=torch.float64) + 0.1,
        torch.tensor([0.61, 1.37], dtype=torch.float64), torch.randn(d_out, 8, generator=g),
        generate_rotation(d_in, 0x110FEED) if rot else None)


def _oracle_f64(rec: QuantizedWeight) -> np.ndarray:
    """llvq-tetra's own f64 chain (reconstruct_blocks, tail, unrotate_rows), before narrowing."""
    from llvq_tetra.dequant import reconstruct_blocks, unrotate_rows
    from llvq_tetra.tetra import TetraTables

    pts = TetraTables.load().decode(rec.labels.reshape(-1).numpy().astype(np.uint64))
    w = np.zeros((rec.d_out, rec.d_in))
    w[:, : rec.n_blocks * 24] = reconstruct_blocks(
        pts, rec.gains.reshape(-1).numpy().astype(np.intp), rec.centroids.numpy(),
        rec.row_scales.numpy(), rec.d_out, rec.n_blocks)
    w[:, rec.n_blocks * 24 :] = rec.tail.numpy().astype(np.float64)
    if rec.rotation is not None:
        w = unrotate_rows(w, rec.rotation.signs, rec.rotation.small)
    return w


@pytest.mark.parametrize("rot", [False, True])
def test_dense_path_is_exact_on_every_shell(tmp_path: Path, rot: bool) -> None:
    rec = _every_shell_record(rot)
    assert _bits_equal(dequantize_record_f64(rec), _oracle_f64(rec))  # f64, before narrowing
    out = write_tetra_dir(tmp_path / "s", {"model_type": "custom"}, {"blk": rec}, {})
    with PackedModel(out) as m:
        assert _bits_equal(m.dequantize("blk.weight"), dequantize_record(rec).numpy())
    assert json.loads((out / DENSE_DIGEST_FILE).read_text())["records"]["blk.weight"] == \
        hashlib.sha256(dequantize_record(rec).numpy().tobytes()).hexdigest()


def test_quantized_weight_dequantize_matches_the_oracle_in_f64() -> None:
    rec = _every_shell_record(False)
    assert _bits_equal(rec.dequantize_rotated(), _oracle_f64(rec))


def test_checkdense_accepts_our_directory(written: tuple[Path, Any, Any, Any]) -> None:
    out = written[0]
    proc = subprocess.run([sys.executable, "-m", "llvq_tetra.checkdense", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "15 digests identical" in proc.stdout  # 14 records + the quantized embedding


def test_checkdense_refuses_a_tampered_digest(written: tuple[Path, Any, Any, Any],
                                              tmp_path: Path) -> None:
    """The oracle is able to fail: one digest changed → exit 1 (run in-process)."""
    from llvq_tetra.checkdense import main

    bad = tmp_path / "bad"
    shutil.copytree(written[0], bad)
    dd = json.loads((bad / DENSE_DIGEST_FILE).read_text())
    first = next(iter(dd["records"]))
    dd["records"][first] = "0" * 64
    (bad / DENSE_DIGEST_FILE).write_text(json.dumps(dd))
    assert main(["checkdense", str(bad)]) == 1
    with pytest.raises(ArtifactError, match="dense digest"):
        read_tetra_dir(bad, verify_dense=True)


def _llvq_quantizer_available() -> str | None:
    """None when llvq-tetra's transformers integration imports, else why not."""
    import llvq_tetra

    if getattr(llvq_tetra, "_quantizer", None) is None:
        return "llvq_tetra skipped its transformers registration (torch/transformers missing)"
    return None


def test_transformers_load_through_llvq_tetra(written: tuple[Path, Any, Any, Any]) -> None:
    reason = _llvq_quantizer_available()
    if reason:
        pytest.skip(reason)
    import transformers

    out, base, records, raw = written
    model, info = transformers.AutoModelForCausalLM.from_pretrained(str(out),
                                                                    output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"] and not info["error_msgs"], info
    dense = read_tetra_dir(out).dense_state_dict()
    state = model.state_dict()
    for name, t in dense.items():
        assert _bits_equal(state[name], t), name
    assert _bits_equal(state["lm_head.weight"], dense["model.embed_tokens.weight"])  # tied
    # The same logits as a stock Qwen3 holding our dequantized weights.
    stock = transformers.AutoModelForCausalLM.from_config(
        transformers.Qwen3Config(**{k: v for k, v in base.items() if k != "quantization_config"}))
    missing, unexpected = stock.load_state_dict(dense, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    stock.tie_weights()
    ids = torch.tensor([[1, 5, 9, 77, 3]])
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, stock.eval()(ids).logits)


def test_reads_a_directory_written_from_the_spec_alone(tmp_path: Path) -> None:
    """A directory laid out as hfpack writes it (no safetensors metadata, artifact_version 5, a
    Ball codebook_fingerprint, an upper-case tetra fingerprint, a foreign orthogonal ``small``,
    an 88-wide int4 record, a 4-bit group-64 embedding), built with numpy only: the reader
    recovers every field and dequantizes as llvq-tetra does."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(5)
    d_out, d_in, nb = 8, 50, 2
    labels = rng.integers(0, 1 << 47, size=(d_out, nb), dtype=np.int64)
    gains = rng.integers(0, 2, size=(d_out, nb))
    codes = b"".join(int((lab << 1) | g).to_bytes(6, "big")
                     for lab, g in zip(labels.ravel().tolist(), gains.ravel().tolist()))
    small = np.linalg.qr(rng.standard_normal((25, 25)))[0]  # any orthogonal Q_odd is legal
    signs = np.where(rng.standard_normal(50) < 0, -1.0, 1.0)
    key = "50_0000000000005eed"
    q4 = rng.integers(0, 256, size=(4, 44), dtype=np.uint8)
    emb_q = rng.integers(0, 256, size=(10, 44), dtype=np.uint8)
    tensors = {
        "blk.codes": np.frombuffer(codes, dtype=np.uint8).copy(),
        "blk.row_scales": rng.random(d_out) + 0.1,
        "blk.centroids": np.array([0.75, 1.25]),
        "blk.tail": rng.standard_normal((d_out, 2)).astype(np.float32),
        f"llvq.rotations.{key}.signs": signs, f"llvq.rotations.{key}.small": small,
        "i4.qweight": q4, "i4.scales": (rng.random((4, 1)) * 0.01).astype(np.float16),
        "i4.biases": (rng.random((4, 1)) - 0.5).astype(np.float16),
        "emb.qweight": emb_q, "emb.scales": (rng.random((10, 2)) * 0.01).astype(np.float16),
        "emb.biases": (rng.random((10, 2)) - 0.5).astype(np.float16),
        "norm.weight": rng.random(88).astype(np.float16),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    qc = {
        "quant_method": "llvq", "llvq_layout_version": 1, "artifact_version": 5,
        "artifact_sha256": "ab" * 32, "artifact_kinds": "Tetra+Int4G128",
        "codebook_fingerprint": "338f420f11866319", "tetra_fingerprint": "9C3060086C7A13E6",
        "block_dim": 24, "code_order": "msb_first_dense",
        "records": {
            "blk.weight": {"kind": "tetra", "prefix": "blk", "d_out": d_out, "d_in": d_in,
                           "shell_cap": 12, "n_centroids": 2, "index_bits": 47, "gain_bits": 1,
                           "nblocks": nb, "tail_cols": 2, "code_bytes": 6 * d_out * nb,
                           "rotation": key},
            "i4.weight": {"kind": "int4g128", "prefix": "i4", "d_out": 4, "d_in": 88, "bits": 4,
                          "group": 128, "groups_per_row": 1},
        },
        "rotations": {key: {"seed": str(0x5EED), "n": 50, "pow2": 2, "odd": 25}},
        "raw": {
            "emb.weight": {"encoding": "quant", "dims": [10, 88], "prefix": "emb", "bits": 4,
                           "group": 64, "rows": 10, "groups_per_row": 2},
            "norm.weight": {"encoding": "f16", "dims": [88], "tensor": "norm.weight"},
        },
    }
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "custom", "torch_dtype": "bfloat16", "quantization_config": qc}))
    # No digest file and an artifact_sha256 of a sealed file we do not have: unverifiable.
    with pytest.raises(ArtifactError, match="cannot be verified"):
        read_tetra_dir(tmp_path)
    d = read_tetra_dir(tmp_path, verify=False)
    rec = d.records["blk"]
    assert isinstance(rec, QuantizedWeight) and rec.rotation is not None
    assert rec.labels.tolist() == labels.tolist() and rec.gains.tolist() == gains.tolist()
    assert rec.rotation.seed == 0x5EED and _bits_equal(rec.rotation.small, small)
    assert _bits_equal(rec.row_scales, tensors["blk.row_scales"])
    assert _bits_equal(d.records["i4"].qweight, q4)  # type: ignore[union-attr]
    emb = d.raw["emb.weight"]
    assert isinstance(emb, GroupAffine) and (emb.bits, emb.group, emb.dims) == (4, 64, (10, 88))
    with PackedModel(tmp_path) as m:
        assert _bits_equal(m.dequantize("blk.weight"), dequantize_record(rec).numpy())
        assert _bits_equal(m.dequantize("i4.weight"), dequantize_record(d.records["i4"]).numpy())
        assert _bits_equal(m.dequantize_raw("emb.weight"), emb.dequantize().numpy())
    # Writing it back keeps every field (the fingerprint is normalized to lower case).
    again = read_tetra_dir(write_tetra_dir(tmp_path / "w", d.base_config, d.records, d.raw))
    for name in d.records:
        _assert_same_record(d.records[name], again.records[name])
    assert again.quantization_config["tetra_fingerprint"] == "9c3060086c7a13e6"
    assert again.base_config["torch_dtype"] == "bfloat16" and "dtype" not in again.base_config


# --------------------------------------------------------------------------------------------------
# hostile directories


def _copy(written: tuple[Path, Any, Any, Any], tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(written[0], dst)
    return dst


def _edit_config(path: Path, edit: Any) -> None:
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))


def _edit_tensors(path: Path, edit: Any) -> None:
    from safetensors.torch import load_file, save_file

    t = load_file(str(path / "model.safetensors"))
    edit(t)
    save_file(t, str(path / "model.safetensors"))


Q = "model.layers.0.self_attn.q_proj"


def test_stream_not_whole_words(written: tuple[Path, Any, Any, Any], tmp_path: Path) -> None:
    p = _copy(written, tmp_path)
    _edit_tensors(p, lambda t: t.__setitem__(f"{Q}.codes", torch.cat(
        [t[f"{Q}.codes"], torch.zeros(1, dtype=torch.uint8)])))
    with pytest.raises(ArtifactError, match="not a multiple of 6"):
        read_tetra_dir(p, verify=False)


def test_stream_of_the_wrong_word_count(written: tuple[Path, Any, Any, Any],
                                        tmp_path: Path) -> None:
    p = _copy(written, tmp_path)
    _edit_tensors(p, lambda t: t.__setitem__(f"{Q}.codes", t[f"{Q}.codes"][:-6].clone()))
    with pytest.raises(ArtifactError, match=rf"{Q}.codes.*shape"):
        read_tetra_dir(p, verify=False)


@pytest.mark.parametrize(
    ("key", "value", "error", "match"),
    [
        ("tetra_fingerprint", "ebc752638c8db089", FingerprintMismatch, "tetra_fingerprint"),
        ("tetra_fingerprint", None, FingerprintMismatch, "tetra_fingerprint"),
        ("code_order", "lsb_first_dense", ArtifactError, "code_order"),
        ("block_dim", 16, ArtifactError, "block_dim"),
        ("llvq_layout_version", 2, IncompatibleVersion, "llvq_layout_version"),
        ("quant_method", "leechq", ArtifactError, "quant_method"),
        ("raw", None, ArtifactError, "raw must be an object"),
    ],
)
def test_header_refusals(written: tuple[Path, Any, Any, Any], tmp_path: Path, key: str,
                         value: Any, error: type[Exception], match: str) -> None:
    p = _copy(written, tmp_path)
    _edit_config(p, lambda c: c["quantization_config"].__setitem__(key, value))
    with pytest.raises(error, match=match):
        read_tetra_dir(p)


def test_fingerprint_is_case_insensitive(written: tuple[Path, Any, Any, Any],
                                         tmp_path: Path) -> None:
    p = _copy(written, tmp_path)
    _edit_config(p, lambda c: c["quantization_config"].__setitem__("tetra_fingerprint",
                                                                   "9C3060086C7A13E6"))
    assert len(read_tetra_dir(p).records) == 14


def test_tables_whose_digests_differ(written: tuple[Path, Any, Any, Any],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    real = tetra_read.tetra_tables()

    class Broken:
        def digests(self) -> dict[str, str]:
            d = dict(real.digests())
            d["rows"] = "0" * 64
            return d

    monkeypatch.setattr(tetra_read, "tetra_tables", lambda: Broken())
    with pytest.raises(FingerprintMismatch, match="rows"):
        read_tetra_dir(written[0])


def test_rotation_table_digest_differs(written: tuple[Path, Any, Any, Any],
                                       tmp_path: Path) -> None:
    p = _copy(written, tmp_path)
    key = f"88_{rotation_seed(0, 0):016x}"
    _edit_tensors(p, lambda t: t[f"llvq.rotations.{key}.signs"].mul_(-1.0))  # still ±1
    with pytest.raises(ArtifactError, match=rf"rotations {key} field 'signs' digest differs"):
        read_tetra_dir(p)
    assert len(read_tetra_dir(p, verify=False).records) == 14  # otherwise well formed


def test_shape_disagreements(written: tuple[Path, Any, Any, Any], tmp_path: Path) -> None:
    p = _copy(written, tmp_path)
    _edit_config(p, lambda c: c["quantization_config"]["records"][f"{Q}.weight"]
                 .__setitem__("d_out", 32))
    with pytest.raises(ArtifactError, match="disagree|shape"):
        read_tetra_dir(p)
    p2 = tmp_path / "p2"
    shutil.copytree(written[0], p2)
    _edit_config(p2, lambda c: c.__setitem__("intermediate_size", 96))
    with pytest.raises(ArtifactError, match="mlp.gate_proj is 72x88 .* config gives 96x88"):
        read_tetra_dir(p2)
    assert len(read_tetra_dir(p2, check_config=False).records) == 14
    p3 = tmp_path / "p3"
    shutil.copytree(written[0], p3)
    _edit_config(p3, lambda c: c["quantization_config"]["raw"]["model.norm.weight"]
                 .__setitem__("dims", [89]))
    with pytest.raises(ArtifactError, match="model.norm.weight"):
        read_tetra_dir(p3)


def test_missing_extra_and_retyped_tensors(written: tuple[Path, Any, Any, Any],
                                           tmp_path: Path) -> None:
    cases = {
        "missing": (lambda t: t.pop(f"{Q}.row_scales"), "missing tensor"),
        "extra": (lambda t: t.__setitem__("stray.tensor", torch.zeros(3)), "not described"),
        "dtype": (lambda t: t.__setitem__(f"{Q}.row_scales", t[f"{Q}.row_scales"].float()),
                  "dtype"),
        "tail": (lambda t: t.pop(f"{Q}.tail"), "missing tensor"),
        "nan": (lambda t: t[f"{Q}.centroids"].fill_(float("nan")), "NaN"),
        "signs": (lambda t: t[f"llvq.rotations.64_{rotation_seed(1, 1):016x}.signs"].fill_(0.5),
                  "±1"),
    }
    for label, (edit, match) in cases.items():
        p = tmp_path / label
        shutil.copytree(written[0], p)
        _edit_tensors(p, edit)
        with pytest.raises(ArtifactError, match=match):
            read_tetra_dir(p, verify=False)


def test_truncated_or_missing_files(written: tuple[Path, Any, Any, Any], tmp_path: Path) -> None:
    p = _copy(written, tmp_path)
    data = (p / "model.safetensors").read_bytes()
    for cut in (4, 200, len(data) - 1):
        (p / "model.safetensors").write_bytes(data[:cut])
        with pytest.raises(ArtifactError, match="model.safetensors"):
            read_tetra_dir(p)
    (p / "model.safetensors").unlink()
    with pytest.raises(ArtifactError, match="missing"):
        read_tetra_dir(p)
    (p / "config.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="config.json"):
        read_tetra_dir(p)
    with pytest.raises(ArtifactError, match="not a directory"):
        read_tetra_dir(tmp_path / "nowhere")


# --------------------------------------------------------------------------------------------------
# writer refusals and atomicity


def test_writer_refuses_what_the_format_cannot_carry(tmp_path: Path) -> None:
    base, records, raw = _contents()
    q = records[Q]

    def attempt(recs: dict[str, Any], raws: dict[str, Any], match: str, **kw: Any) -> None:
        with pytest.raises(InvalidInput, match=match):
            write_tetra_dir(tmp_path / "x", base, recs, raws, **kw)
        assert not (tmp_path / "x").exists()

    ball = QuantizedWeight("ball", q.d_out, q.d_in, q.labels % (1 << 40), q.gains, q.row_scales,
                           q.centroids, q.tail, q.rotation)
    attempt({**records, Q: ball}, raw, "'ball' codebook")
    two_bits = QuantizedWeight("tetra", q.d_out, q.d_in, q.labels, q.gains, q.row_scales,
                               torch.tensor([0.5, 0.8, 1.0, 1.3], dtype=torch.float64), q.tail,
                               q.rotation)
    attempt({**records, Q: two_bits}, raw, "2 gain bit")
    attempt({**records, Q: Int4Weight.quantize(torch.randn(64, 88), group=64)}, raw, "group 64")
    attempt({**records, Q: _tetra(64, 96, torch.Generator(), None)}, raw, "config gives 64x88")
    attempt({**records, "model.layers.0.mlp.act": q}, raw, "names no linear layer")
    attempt(records, {k: v for k, v in raw.items() if k != "model.norm.weight"},
            "model.norm.weight")
    attempt(records, {**raw, "model.norm.weight": raw["model.norm.weight"].float()}, "float16")
    emb8 = GroupAffine.quantize(torch.randn(128, 88), 8, 64)
    attempt(records, {**raw, "model.embed_tokens.weight": emb8}, "8-bit")
    attempt({f"{Q}.weight": q}, raw, "without '.weight'", check_config=False)
    attempt({}, raw, "without records")
    attempt(records, {**raw, "llvq.rotations.x": raw["model.norm.weight"]}, "reserved")
    attempt(records, raw, "not allowed", tokenizer_files={"../evil": b""})
    other = generate_rotation(88, rotation_seed(0, 0))
    clash = QuantizedWeight("tetra", q.d_out, q.d_in, q.labels, q.gains, q.row_scales,
                            q.centroids, q.tail,
                            type(other)(88, other.seed, -other.signs, other.small))
    attempt({**records, Q: clash}, raw, "share the key")


def test_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base, records, raw = _contents()
    out = write_tetra_dir(tmp_path / "d", base, records, raw)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ArtifactError, match="exists"):
        write_tetra_dir(out, base, records, raw)

    def boom(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(tetra_write, "_fsync_write", boom)  # fails after model.safetensors
    with pytest.raises(ArtifactError, match="disk full"):
        write_tetra_dir(out, base, records, raw, overwrite=True)
    with pytest.raises(ArtifactError, match="disk full"):
        write_tetra_dir(tmp_path / "new", base, records, raw)
    assert sorted(os.listdir(tmp_path)) == ["d"]  # no partial directory left behind
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_overwrite_replaces_only_a_tetra_directory(tmp_path: Path) -> None:
    base, records, raw = _contents()
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("keep")
    with pytest.raises(ArtifactError, match="not a complete Tetra directory"):
        write_tetra_dir(user, base, records, raw, overwrite=True)
    assert (user / "notes.txt").read_text() == "keep"
    out = write_tetra_dir(tmp_path / "d", base, records, raw, tokenizer_files=TOKENIZER)
    write_tetra_dir(out, base, records, raw, tokenizer_files=TOKENIZER, overwrite=True)
    (out / "extra.bin").write_bytes(b"mine")
    with pytest.raises(ArtifactError, match="extra.bin"):
        write_tetra_dir(out, base, records, raw, overwrite=True)
    assert (out / "extra.bin").read_bytes() == b"mine"


# --------------------------------------------------------------------------------------------------
# leechq artifact → Tetra directory


def _artifact(tmp: Path, arch: str, codebook: str = "tetra", embed_bits: int = 4,
              lattice_head: bool = False) -> Path:
    from leechq_tiny import lattice_record, quantize_randomly, tiny_model

    from leechq.config import QuantConfig
    from leechq.formats.artifact import write_artifact
    from leechq.models.save import raw_tensors

    model = tiny_model(arch)
    records = quantize_randomly(model, codebook=codebook)
    if lattice_head:  # an untied head coded on the lattice (QuantConfig.lattice_head)
        w = model.lm_head.weight.detach()
        records["lm_head"] = lattice_record(codebook, *w.shape, seed=5, weight=w)
    raw, tied = raw_tensors(model, {})
    raw = {k: v for k, v in raw.items() if k.removesuffix(".weight") not in records}
    raw = {k: v.to(torch.bfloat16) for k, v in raw.items()}  # bf16 norms convert exactly
    for name in ("model.embed_tokens.weight", "lm_head.weight"):  # as embedding_encoding="int4"
        if name in raw:
            raw[name] = GroupAffine.quantize(raw[name].float(), embed_bits, 64)
    out = tmp / f"art-{arch}-{codebook}-{embed_bits}{'-head' if lattice_head else ''}"
    write_artifact(out, base_config=model.config.to_dict(),
                   quant_config=QuantConfig(codebook=codebook, int4_modules=("self_attn.v_proj",),
                                            lattice_head=lattice_head),
                   records=records, raw=raw, tied=tied)
    (out / "tokenizer.json").write_text('{"t": 1}')  # copied verbatim (not in the manifest)
    return out


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_artifact_converts_and_llvq_tetra_reads_it(tmp_path: Path, arch: str) -> None:
    from leechq.formats.artifact import read_artifact

    src = _artifact(tmp_path, arch)
    art = read_artifact(src, verify=False)
    out = artifact_to_tetra_dir(src, tmp_path / "tetra")
    d = read_tetra_dir(out, verify_dense=True)
    assert set(d.records) == set(art.records)
    for name, rec in art.records.items():
        _assert_same_record(rec, d.records[name])
    emb = d.raw["model.embed_tokens.weight"]
    assert isinstance(emb, GroupAffine) and _bits_equal(
        emb.qweight, art.raw_quant["model.embed_tokens.weight"].qweight)
    for name, t in art.raw.items():
        assert torch.equal(d.raw[name].to(t.dtype), t), name
    for name, ga in art.raw_quant.items():
        assert _bits_equal(d.raw[name].dequantize(), ga.dequantize()), name
    assert ("lm_head.weight" in d.raw) == (arch == "qwen3")  # untied head in the tiny Qwen3
    assert set(d.raw) == set(art.raw) | set(art.raw_quant)
    assert d.files["tokenizer.json"] == b'{"t": 1}'
    with PackedModel(out) as m:
        for name, rec in art.records.items():
            assert _bits_equal(m.dequantize(f"{name}.weight"), dequantize_record(rec).numpy()), name
        assert _bits_equal(m.dequantize_raw("model.embed_tokens.weight"),
                           art.raw_quant["model.embed_tokens.weight"].dequantize().numpy())
    if _llvq_quantizer_available() is None and arch == "qwen2":  # biases ride along
        import transformers

        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            str(out), output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        bias = f"{Q}.bias"
        assert torch.equal(model.state_dict()[bias], art.raw[bias].to(torch.float16).float())


def test_a_lattice_coded_head_converts_as_a_linear(tmp_path: Path) -> None:
    """The Tetra format's readers replace every recorded linear, the head included: its record
    goes over bit for bit and ``llvq-tetra`` decodes it as ours does."""
    from leechq.formats.artifact import read_artifact

    src = _artifact(tmp_path, "qwen3", lattice_head=True)
    art = read_artifact(src, verify=False)
    assert "lm_head" in art.records and "lm_head.weight" not in art.raw_quant
    out = artifact_to_tetra_dir(src, tmp_path / "tetra")
    d = read_tetra_dir(out, verify_dense=True)
    _assert_same_record(art.records["lm_head"], d.records["lm_head"])
    assert "lm_head.weight" not in d.raw
    with PackedModel(out) as m:
        assert _bits_equal(m.dequantize("lm_head.weight"),
                           dequantize_record(art.records["lm_head"]).numpy())


def test_artifact_conversion_refusals(tmp_path: Path) -> None:
    from leechq.codebooks import names

    if "ball" in names():
        src = _artifact(tmp_path, "qwen2", codebook="ball")
        with pytest.raises(InvalidInput, match="Ball-coded"):
            artifact_to_tetra_dir(src, tmp_path / "o1")
    src8 = _artifact(tmp_path, "qwen2", embed_bits=8)
    with pytest.raises(InvalidInput, match="8-bit"):
        artifact_to_tetra_dir(src8, tmp_path / "o2")
    # f32 norms are not f16-exact: refused unless rounding is asked for.
    from leechq.formats.artifact import read_artifact

    art = read_artifact(_artifact(tmp_path, "qwen3"), verify=False)
    art.raw["model.norm.weight"] = art.raw["model.norm.weight"].float() + 1e-7
    with pytest.raises(InvalidInput, match="float16"):
        artifact_to_tetra_dir(art, tmp_path / "o3")
    out = artifact_to_tetra_dir(art, tmp_path / "o3", allow_lossy_raw=True)
    assert read_tetra_dir(out).raw["model.norm.weight"].dtype == torch.float16
    from dataclasses import replace

    art.quant_config = replace(art.quant_config, embedding_encoding="lattice")
    with pytest.raises(InvalidInput, match="codes its token embedding on the lattice"):
        artifact_to_tetra_dir(art, tmp_path / "o4", allow_lossy_raw=True)
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())
