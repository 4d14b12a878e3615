"""The integrity gate: what every load path checks before a byte of an artifact is trusted.

Every entry point that reads a leechq artifact (``leechq.load``, ``from_pretrained`` through
:mod:`leechq.integrations.transformers`, ``leechq inspect``, ``leechq run/chat/eval``) goes through
:func:`check_artifact`, and the Tetra-directory reader (:mod:`leechq.formats.tetra_read`) uses the
same pieces. The checks (docs/integrity.md states the guarantee of each entry point):

* **names** — every file name in a manifest is a plain name inside the directory
  (:func:`check_plain_name`); nothing outside the directory is opened or hashed;
* **manifest** — its schema (``files``: name → {``bytes`` int, ``sha256`` 64 hex}), sizes, and the
  sha256 of every listed file, streamed once per load (:func:`verify_manifest`); a directory that
  ``save_pretrained`` wrote has no manifest: its ``model.safetensors`` metadata carries
  :data:`CONTENT_KEY`, the :func:`content_digest` of its tensors, checked instead;
* **metadata schema** — the stored :class:`~leechq.config.QuantConfig` fields have the JSON types
  the dataclass declares, the error naming the field (:func:`check_config_fields`);
* **decoded magnitudes** — every lattice record's largest decoded weight is bounded below the f32
  maximum (:func:`check_record_magnitudes`), so finite but huge row scales (1e300, 3e38) are
  refused instead of decoding to inf;
* every tensor the descriptors name is present with its dtype and shape, every float tensor finite,
  no undescribed tensor (done while parsing, in :func:`leechq.formats.artifact.read_artifact`).

Every failure is an :class:`~leechq.errors.ArtifactError` (or a subclass) naming the file, record or
field at fault.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from leechq.errors import ArtifactError
from leechq.utils.hashing import sha256_file

F32_MAX = float(torch.finfo(torch.float32).max)
# Decoded weights must stay this far below the f32 maximum, so that the f32 products a kernel forms
# (scale x centroid x point coordinate, an activation times a weight) cannot overflow by rounding.
MAGNITUDE_LIMIT = F32_MAX / 2**16
MAX_NAME_LEN = 255
CONTENT_KEY = "leechq_content_sha256"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def content_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 (hex) over every tensor, by sorted name: name, dtype, shape and row-major bytes.

    What ``save_pretrained`` stores under :data:`CONTENT_KEY` in the safetensors metadata, where no
    manifest is written: the gate checks the loaded tensors against it.
    """
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        flat = t.reshape(-1)
        if flat.numel():
            h.update(memoryview(flat.view(torch.uint8).numpy()))
    return h.hexdigest()


def content_metadata(tensors: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """The safetensors metadata that seals ``tensors``: ``{CONTENT_KEY: content_digest(...)}``."""
    return {CONTENT_KEY: content_digest(tensors)}


def check_plain_name(name: Any, where: str) -> str:
    """``name`` if it is a plain file name (no separator, no ``..``, no NUL, ≤ 255 characters).

    Raises:
        ArtifactError: anything else (checked before any file is opened).
    """
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\x00" in name
        or len(name) > MAX_NAME_LEN
        or os.path.isabs(name)
    ):
        raise ArtifactError(f"{where}: file name {name!r} is not a plain name inside the directory")
    return name


def load_json(path: Path, what: str = "") -> Any:
    """Parse a JSON file; a missing, unreadable or malformed file is an :class:`ArtifactError`."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ArtifactError(f"{path}: missing{what}") from exc
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ArtifactError(f"{path}: unreadable or not JSON: {exc}") from exc


def verify_manifest(
    root: Path, manifest_name: str, required: Iterable[str], verify: bool = True
) -> dict[str, dict[str, Any]]:
    """Check a manifest's schema, names, sizes and (when ``verify``) every file's sha256.

    Args:
        root: the directory.
        manifest_name: the manifest file in it (``{"files": {name: {"bytes", "sha256"}}}``).
        required: names the manifest must list.
        verify: hash every listed file (streamed, once); sizes are always checked.

    Returns:
        The ``files`` map.

    Raises:
        ArtifactError: missing manifest, a malformed entry (the field named), a name that is not a
            plain name, a missing or resized file, or a sha256 that differs.
    """
    path = root / manifest_name
    manifest = load_json(path, " (the artifact was never completed)")
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise ArtifactError(f"{path}: field 'files' must be an object")
    for name, info in files.items():
        check_plain_name(name, str(path))
        if not isinstance(info, dict):
            raise ArtifactError(f"{path}: entry {name!r} must be an object")
        size, sha = info.get("bytes"), info.get("sha256")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ArtifactError(f"{path}: entry {name!r} field 'bytes' must be an integer >= 0")
        if not isinstance(sha, str) or not _HEX64.match(sha):
            raise ArtifactError(f"{path}: entry {name!r} field 'sha256' must be 64 lowercase hex")
    for name in required:
        if name not in files:
            raise ArtifactError(f"{path}: does not list {name}")
    for name, info in files.items():
        p = root / name
        if not p.is_file():  # a link to a file is fine: the hub cache stores files as links
            raise ArtifactError(f"{p}: listed in the manifest but missing (or not a file)")
        size = p.stat().st_size
        if size != info["bytes"]:
            # a link's target may lie outside the directory: its size is not echoed
            got = "a different size" if p.is_symlink() else f"{size} bytes"
            raise ArtifactError(f"{p}: {got}, the manifest says {info['bytes']} (truncated?)")
    if verify:
        for name, info in files.items():
            if sha256_file(root / name) != info["sha256"]:
                raise ArtifactError(
                    f"{root / name}: sha256 differs from the manifest (corrupt file)"
                )
    return files


def _json_type_ok(value: Any, default: Any) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, tuple):
        return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
    return True


def check_config_fields(data: Any, where: str) -> None:
    """Check the JSON types of a stored :class:`~leechq.config.QuantConfig` dict, field by field.

    ``rotation_seed_hex`` must be a hexadecimal string; every other known field must have the JSON
    type of the dataclass default (bool, int, number, string, list of strings). Values are checked
    afterwards by :meth:`QuantConfig.validate`.

    Raises:
        ArtifactError: the first field of the wrong type, named.
    """
    from leechq.config import QuantConfig

    if not isinstance(data, dict):
        raise ArtifactError(f"{where}: quantization_config.config must be an object")
    for f in dataclasses.fields(QuantConfig):
        if f.name not in data:
            continue
        default = f.default
        if not _json_type_ok(data[f.name], default):
            raise ArtifactError(
                f"{where}: quantization_config.config.{f.name} has type "
                f"{type(data[f.name]).__name__}, expected {type(default).__name__}"
            )
    seed_hex = data.get("rotation_seed_hex")
    if seed_hex is not None:
        ok = isinstance(seed_hex, str) and re.fullmatch(r"(0x)?[0-9a-fA-F]{1,16}", seed_hex)
        if not ok:
            raise ArtifactError(
                f"{where}: quantization_config.config.rotation_seed_hex {seed_hex!r} is not a "
                "64-bit hexadecimal string"
            )


def check_record_magnitudes(records: Mapping[str, Any], where: str) -> None:
    """Refuse lattice records whose decoded weights could overflow f32.

    A decoded block is a lattice direction of norm ``|centroid[gain]·row_scale|``; an orthogonal
    rotation keeps each row's norm, so every decoded coordinate of row ``r`` is at most
    ``sqrt(n_blocks·(row_scale[r]·max|centroid|)² + ‖tail[r]‖²)``. That bound, computed in f64,
    must stay below :data:`MAGNITUDE_LIMIT`.

    Raises:
        ArtifactError: the record and row whose bound is not finite or too large.
    """
    from leechq.formats.quantized_weight import QuantizedWeight

    for name, rec in records.items():
        if not isinstance(rec, QuantizedWeight) or rec.d_out == 0:
            continue
        cmax = float(rec.centroids.abs().max()) if rec.centroids.numel() else 0.0
        with torch.no_grad():
            block = rec.row_scales.abs().to(torch.float64) * cmax
            sq = block * block * float(max(rec.n_blocks, 1))
            if rec.tail_cols:
                sq = sq + rec.tail.to(torch.float64).pow(2).sum(dim=1)
            bound = sq.sqrt()
        bad = ~(torch.isfinite(bound) & (bound < MAGNITUDE_LIMIT))
        if bool(bad.any()):
            row = int(bad.nonzero()[0, 0])
            raise ArtifactError(
                f"{where}: record {name} row {row}: row scale {float(rec.row_scales[row]):.6g} "
                f"with centroids up to {cmax:.6g} decodes to weights of magnitude "
                f"{float(bound[row]):.6g}, beyond what f32 holds safely ({MAGNITUDE_LIMIT:.3g})"
            )
        if not math.isfinite(cmax):
            raise ArtifactError(f"{where}: record {name} has non-finite centroids")


def check_artifact(path: str | os.PathLike[str], *, verify: bool = True) -> Any:
    """The gate: read and validate a leechq artifact, or raise.

    Runs :func:`leechq.formats.artifact.read_artifact`, which applies every check of this module
    (names, manifest schema, sizes, sha256 when ``verify``, metadata schema, tensor presence /
    dtype / shape / finiteness, decoded magnitudes).

    Returns:
        The :class:`~leechq.formats.artifact.Artifact`.

    Raises:
        ArtifactError: (or a subclass) naming what is wrong.
    """
    from leechq.formats.artifact import read_artifact

    return read_artifact(path, verify=verify)


def check_model_keys(
    keys: Iterable[str], available: Iterable[str], tied_ok: Iterable[str], where: str
) -> None:
    """Every tensor a model skeleton expects must be in the artifact (or tied to one that is).

    Args:
        keys: the skeleton's state-dict names (after leechq's placeholders went in).
        available: tensor names the artifact provides (file tensors and dequantized group-affine
            targets).
        tied_ok: names the model fills by tying (a tied head), allowed to be absent.
        where: the artifact, for the message.

    Raises:
        ArtifactError: the missing names (up to five shown).
    """
    have, tied = set(available), set(tied_ok)
    missing = sorted(k for k in keys if k not in have and k not in tied)
    if missing:
        raise ArtifactError(
            f"{where}: the artifact lacks {len(missing)} tensor(s) the model needs, e.g. "
            f"{missing[:5]}"
        )


def check_pretrained(model: Any, checkpoint_files: Any, *, verify: bool = True) -> Any:
    """The gate for ``from_pretrained``: verify the artifact behind a model skeleton.

    Called by the transformers integration first thing in its before-loading hook, before leechq
    reads a descriptor or transformers reads a weight: runs :func:`check_artifact` on the directory
    holding ``checkpoint_files`` (or ``model.config._name_or_path`` when transformers passes none).

    Args:
        model: the skeleton (a torch module with ``config``).
        checkpoint_files: the file list transformers resolved, or None.
        verify: hash every file (always, from the integration).

    Returns:
        The :class:`~leechq.formats.artifact.Artifact` read.

    Raises:
        ArtifactError: the directory cannot be located, or fails any check (named).
    """
    from leechq.formats.artifact import MODEL_FILE

    root: Path | None = None
    files = list(checkpoint_files or [])
    if files:
        parents = {Path(f).parent for f in files}
        names = {Path(f).name for f in files}
        if len(parents) != 1 or names != {MODEL_FILE}:
            raise ArtifactError(
                f"a leechq artifact is one {MODEL_FILE}; transformers resolved {files[:3]}"
            )
        root = parents.pop()
    else:
        guess = getattr(getattr(model, "config", None), "_name_or_path", None)
        if isinstance(guess, str) and guess and Path(guess).is_dir():
            root = Path(guess)
    if root is None:
        raise ArtifactError(
            "cannot locate the leechq artifact directory to verify it (from_pretrained reads "
            "leechq artifacts from a local directory)"
        )
    with torch.device("cpu"):  # from_pretrained builds the skeleton under a meta default
        return check_artifact(root, verify=verify)


def check_pretrained_keys(model: Any, art: Any) -> None:
    """After leechq's placeholders went into the skeleton: every state-dict tensor must be stored
    in the artifact, produced from a group-affine table, or tied (an alias of the artifact, or a
    head the config ties), so that transformers leaves no parameter to random initialisation.

    Raises:
        ArtifactError: the missing names.
    """
    from leechq.formats.artifact import MODEL_FILE, _parse_header

    header = _parse_header(Path(art.path) / MODEL_FILE)
    available = {k for k in header if k != "__metadata__"} | set(art.raw_quant)
    tied_ok = set(art.tied)
    if bool(getattr(model.config, "tie_word_embeddings", False)):
        # transformers 5 declares the tied names as {target: source} (older: a list of targets)
        tied_ok |= {str(k) for k in (getattr(model, "_tied_weights_keys", None) or ())}
    check_model_keys(model.state_dict().keys(), available, tied_ok, str(art.path))
