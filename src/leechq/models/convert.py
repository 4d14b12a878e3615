"""Published Tetra checkpoints (``quant_method: "llvq"``) as leechq artifacts, losslessly.

A Tetra directory (read by :func:`leechq.formats.tetra_read.read_tetra_dir`, field digests checked)
holds the same canonical weights a leechq artifact does: Tetra-coded lattice records with one gain
bit (labels, gains, f64 row scales and centroids, f32 tails, rotation tables), int4 g128 records,
float16 carried tensors and 4-bit group-affine tables. :func:`tetra_dir_to_artifact` writes them,
field for field, into a leechq artifact (:func:`leechq.formats.artifact.write_artifact`), with the
directory's other files (tokenizer, generation config) copied verbatim; nothing is re-quantized or
rounded, so ``leechq.load``, the CLI and ``from_pretrained`` then serve exactly the weights
``llvq-tetra`` materializes (up to the dense path's last-ulp square root, see
:mod:`leechq.formats.tetra_dir`). :func:`read_tetra_as_artifact` does the same into a temporary
directory and returns the artifact read back, so a Tetra directory can be given wherever an artifact
directory is expected (``leechq.load``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from leechq.config import QuantConfig
from leechq.errors import ArtifactError
from leechq.formats.artifact import Artifact, GroupAffine, read_artifact, write_artifact
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight

_SKIP_FILES = ("config.json", "model.safetensors", "llvq-digest.json", "llvq-dense-digest.json")


def is_tetra_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory whose ``config.json`` declares ``quant_method: "llvq"``."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    try:
        qc = json.loads(cfg.read_text(encoding="utf-8")).get("quantization_config")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(qc, dict) and qc.get("quant_method") == "llvq"


def _quant_config(
    records: dict[str, Any], raw: dict[str, Any], base: dict[str, Any]
) -> QuantConfig:
    """The configuration that describes the directory's weights (what they are, not how they were
    made: calibration is unknown)."""
    lattice = [r for r in records.values() if isinstance(r, QuantizedWeight)]
    int4 = tuple(sorted(n for n, r in records.items() if isinstance(r, Int4Weight)))
    emb = raw.get("model.embed_tokens.weight")
    extra: dict[str, Any] = {}
    if isinstance(emb, GroupAffine):
        extra = {"embedding_encoding": f"int{emb.bits}", "embedding_group": emb.group}
    return QuantConfig(
        codebook="tetra",
        gain_bits=1,
        rotate=any(r.rotation is not None for r in lattice),
        int4_modules=int4,
        calibration="unknown (converted from a published Tetra checkpoint)",
        **extra,
    )


def tetra_dir_to_artifact(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    verify_dense: bool = False,
) -> Path:
    """Convert a Tetra directory into a leechq artifact directory (atomic, lossless).

    Args:
        source: the Tetra directory.
        out: the artifact directory to create.
        overwrite: replace an existing ``out``.
        verify_dense: also check ``llvq-dense-digest.json`` (dequantizes every record: slow).

    Returns:
        The artifact path.

    Raises:
        ArtifactError, FingerprintMismatch, IncompatibleVersion: see
            :func:`leechq.formats.tetra_read.read_tetra_dir`; ``out`` exists without ``overwrite``.
    """
    from leechq.formats.tetra_read import read_tetra_dir

    d = read_tetra_dir(source, verify=True, verify_dense=verify_dense)
    base = d.base_config
    raw: dict[str, Any] = dict(d.raw)  # a tied head is absent: the loaders tie it from the config
    qc = d.quantization_config
    provenance = {
        "converted_from": "llvq",
        "source": str(Path(source).resolve()),
        "llvq_layout_version": qc.get("llvq_layout_version"),
        "artifact_sha256": qc.get("artifact_sha256"),
        "artifact_version": qc.get("artifact_version"),
    }
    files = {n: b for n, b in d.files.items() if n not in _SKIP_FILES}
    return write_artifact(
        out,
        base_config=base,
        quant_config=_quant_config(d.records, raw, base),
        records=d.records,
        raw=raw,
        extra_files=files,
        provenance=provenance,
        overwrite=overwrite,
    )


def read_tetra_as_artifact(source: str | os.PathLike[str]) -> Artifact:
    """A Tetra directory as an in-memory :class:`Artifact` (converted through a temporary directory
    that is removed again); ``path`` is the Tetra directory, so its tokenizer files are found."""
    src = Path(source)
    tmp = Path(tempfile.mkdtemp(prefix="leechq-llvq-"))
    try:
        art = read_artifact(tetra_dir_to_artifact(src, tmp / "artifact"), verify=False)
    except ArtifactError as exc:
        raise ArtifactError(f"{src}: cannot be read as a Tetra checkpoint: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    art.path = src
    return art
