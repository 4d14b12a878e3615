"""The integrity gate (leechq.formats.integrity), one named case each: contained manifest names,
decoded magnitudes, metadata field types, from_pretrained trusting nothing on disk, and the Tetra
reader's byte verification. The writer's output-path rules are in
tests/formats/test_output_paths.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from leechq_tiny import ids
from safetensors.torch import load_file, save_file

from leechq.errors import ArtifactError, LeechqError
from leechq.formats.artifact import MANIFEST_FILE, read_artifact
from leechq.formats.tetra_dir import DENSE_DIGEST_FILE, DIGEST_FILE
from leechq.formats.tetra_read import read_tetra_dir
from leechq.formats.tetra_write import artifact_to_tetra_dir


def refresh_manifest(d: Path) -> None:
    """Recompute every listed file's size and sha256 (so only the structure is wrong)."""
    doc = json.loads((d / MANIFEST_FILE).read_text())
    for name in doc["files"]:
        p = d / name
        if p.is_file() and "/" not in name:
            doc["files"][name] = {
                "bytes": p.stat().st_size,
                "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
            }
    (d / MANIFEST_FILE).write_text(json.dumps(doc))


def edit_tensors(d: Path, edit: Any) -> None:
    f = d / "model.safetensors"
    tensors = load_file(str(f))
    edit(tensors)
    save_file(tensors, str(f), metadata={"format": "pt"})
    refresh_manifest(d)


def edit_qc(d: Path, edit: Any) -> None:
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg["quantization_config"])
    (d / "config.json").write_text(json.dumps(cfg))
    refresh_manifest(d)


def _first_scales(tensors: dict[str, torch.Tensor]) -> str:
    return sorted(k for k in tensors if k.endswith(".row_scales"))[0]


# --------------------------------------------------------------------------------------------------
# names, magnitudes, metadata


def test_manifest_names_are_contained(art: Path, tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("not yours")
    doc = json.loads((art / MANIFEST_FILE).read_text())
    doc["files"]["../secret.txt"] = {
        "bytes": outside.stat().st_size,
        "sha256": hashlib.sha256(outside.read_bytes()).hexdigest(),
    }
    (art / MANIFEST_FILE).write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="not a plain name"):
        read_artifact(art)
    for bad in ("../../../etc/hostname", "/etc/hostname", "a/b", "..", "x" * 300):
        doc["files"] = {bad: {"bytes": 1, "sha256": "0" * 64}}
        (art / MANIFEST_FILE).write_text(json.dumps(doc))
        with pytest.raises(ArtifactError, match="not a plain name"):
            read_artifact(art)


@pytest.mark.parametrize("value", [1e300, 3e38, 1e34])
def test_finite_scales_that_overflow_are_refused(art: Path, value: float) -> None:
    def blow(t: dict[str, torch.Tensor]) -> None:
        key = _first_scales(t)
        t[key] = t[key].clone()
        t[key][0] = value

    edit_tensors(art, blow)
    with pytest.raises(ArtifactError, match=r"row 0.*beyond what f32 holds"):
        read_artifact(art)
    from leechq.models.load import load

    with pytest.raises(ArtifactError, match=r"beyond what f32 holds"):
        load(art, device="cpu", tokenizer=False)


@pytest.mark.parametrize(
    "edit,field",
    [
        (lambda qc: qc["config"].update(rotation_seed_hex="zz"), "rotation_seed_hex"),
        (lambda qc: qc["config"].update(int4_modules=5), "int4_modules"),
        (lambda qc: qc["config"].update(damping="x"), "damping"),
        (lambda qc: qc["config"].update(rotate=1), "rotate"),
        (lambda qc: qc["records"].update({next(iter(qc["records"])): [1, 2]}), "records"),
        (lambda qc: qc["raw"].update({next(iter(qc["raw"])): "x"}), "raw"),
        (lambda qc: qc["rotations"].update({next(iter(qc["rotations"])): 5}), "rotations"),
        (lambda qc: qc["tied"].update({"lm_head.weight": 5}), "tied"),
    ],
)
def test_metadata_types_name_the_field(art: Path, edit: Any, field: str) -> None:
    edit_qc(art, edit)
    with pytest.raises(ArtifactError, match=field):
        read_artifact(art)


def test_manifest_schema_names_the_field(art: Path) -> None:
    doc = json.loads((art / MANIFEST_FILE).read_text())
    doc["files"]["config.json"]["bytes"] = "12"
    (art / MANIFEST_FILE).write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="'bytes'"):
        read_artifact(art)
    doc["files"] = []
    (art / MANIFEST_FILE).write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="'files'"):
        read_artifact(art)


# --------------------------------------------------------------------------------------------------
# from_pretrained trusts nothing on disk


def _from_pretrained(d: Path) -> Any:
    from transformers import AutoModelForCausalLM

    import leechq.integrations.transformers  # noqa: F401

    return AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)


def test_from_pretrained_refuses_a_flipped_code_byte(art: Path) -> None:
    data = bytearray((art / "model.safetensors").read_bytes())
    data[-100] ^= 0x01  # inside the data section: a code, scale or raw byte
    (art / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256 differs"):
        _from_pretrained(art)


def test_from_pretrained_refuses_a_missing_tensor(art: Path) -> None:
    name = "model.layers.0.input_layernorm.weight"

    def drop(t: dict[str, torch.Tensor]) -> None:
        del t[name]

    edit_tensors(art, drop)
    edit_qc(art, lambda qc: qc["raw"].pop(name))
    with pytest.raises(ArtifactError, match="input_layernorm"):
        _from_pretrained(art)


def test_from_pretrained_refuses_nan_in_a_norm(art: Path) -> None:
    name = "model.norm.weight"

    def nan(t: dict[str, torch.Tensor]) -> None:
        t[name] = t[name].clone()
        t[name][0] = float("nan")

    edit_tensors(art, nan)
    with pytest.raises(ArtifactError, match="NaN"):
        _from_pretrained(art)


def test_from_pretrained_matches_load_when_intact(art: Path) -> None:
    from leechq.models.load import load

    model, _ = load(art, device="cpu", dtype="float32", tokenizer=False)
    with torch.no_grad():
        assert torch.equal(_from_pretrained(art)(ids()).logits, model(ids()).logits)


def test_save_pretrained_output_is_sealed(art: Path, tmp_path: Path) -> None:
    hf = _from_pretrained(art)
    saved = tmp_path / "saved"
    hf.save_pretrained(saved)
    assert not (saved / MANIFEST_FILE).exists()
    _from_pretrained(saved)  # verified by the content digest in the safetensors metadata
    tensors = load_file(str(saved / "model.safetensors"))
    from safetensors import safe_open

    with safe_open(str(saved / "model.safetensors"), "pt") as fh:
        meta = fh.metadata()
    key = _first_scales(tensors)
    tensors[key] = tensors[key] * 2
    save_file(tensors, str(saved / "model.safetensors"), metadata=meta)
    with pytest.raises(ArtifactError, match="leechq_content_sha256"):
        _from_pretrained(saved)


# --------------------------------------------------------------------------------------------------
# the Tetra-directory reader


@pytest.fixture
def tetra(pristine: Path, tmp_path: Path) -> Path:
    return Path(artifact_to_tetra_dir(pristine, tmp_path / "t", allow_lossy_raw=True))


def _flip_code(d: Path) -> None:
    tensors = load_file(str(d / "model.safetensors"))
    key = sorted(k for k in tensors if k.endswith(".codes"))[0]
    t = tensors[key].clone()
    t[5] ^= 0x10
    tensors[key] = t
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})


def test_tetra_flipped_codes_without_digests_are_refused(tetra: Path) -> None:
    read_tetra_dir(tetra)
    _flip_code(tetra)
    with pytest.raises(ArtifactError, match="digest differs"):
        read_tetra_dir(tetra)
    (tetra / DIGEST_FILE).unlink()
    (tetra / DENSE_DIGEST_FILE).unlink()
    with pytest.raises(ArtifactError, match="artifact_sha256"):
        read_tetra_dir(tetra)
    assert read_tetra_dir(tetra, verify=False).records  # explicit opt-out: structure only


def test_tetra_digest_must_cover_every_record(tetra: Path) -> None:
    doc = json.loads((tetra / DIGEST_FILE).read_text())
    doc["records"].pop(sorted(doc["records"])[0])
    (tetra / DIGEST_FILE).write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="does not cover"):
        read_tetra_dir(tetra)
    doc = json.loads((tetra / DIGEST_FILE).read_text())
    name = sorted(doc["records"])[0]
    doc["records"][name] = {k: v for k, v in doc["records"][name].items() if k != "codes"}
    (tetra / DIGEST_FILE).write_text(json.dumps(doc))
    with pytest.raises(ArtifactError):
        read_tetra_dir(tetra)


def test_tetra_overflowing_scale_is_refused(tetra: Path) -> None:
    tensors = load_file(str(tetra / "model.safetensors"))
    key = _first_scales(tensors)
    tensors[key] = tensors[key].clone()
    tensors[key][0] = 1e300
    save_file(tensors, str(tetra / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(LeechqError, match=r"beyond what f32 holds"):
        read_tetra_dir(tetra, verify=False)


@pytest.mark.gpu
def test_gate_on_cuda_paths(art: Path) -> None:
    """The gate is the same when the model goes to CUDA (leechq.load and from_pretrained with a
    CUDA device map)."""
    from leechq.models.load import load

    def blow(t: dict[str, torch.Tensor]) -> None:
        key = _first_scales(t)
        t[key] = t[key].clone()
        t[key][0] = 3e38

    edit_tensors(art, blow)
    with pytest.raises(ArtifactError, match="beyond what f32 holds"):
        load(art, device="cuda", tokenizer=False)
    from transformers import AutoModelForCausalLM

    import leechq.integrations.transformers  # noqa: F401

    with pytest.raises(ArtifactError, match="beyond what f32 holds"):
        AutoModelForCausalLM.from_pretrained(str(art), dtype=torch.bfloat16, device_map="cuda")
