"""The leechq artifact: an HF-style directory holding a quantized model in canonical form.

A directory holds

* ``config.json`` — the base model config plus ``quantization_config`` = {``quant_method:
  "leechq"``, ``schema_version``, the resolved :class:`~leechq.config.QuantConfig`, codebook name +
  fingerprint, ``records`` {module: descriptor}, ``rotations`` {key: descriptor}, ``raw`` {tensor:
  descriptor}, ``tied`` {alias: tensor}};
* ``model.safetensors`` — per lattice record ``<module>.codes`` (U8: one big-endian integer ``(label
  << gain_bits) | gain`` of ``ceil((label_bits + gain_bits)/8)`` bytes per block, row-major by (row,
  block); for 47 + 1 bits this is exactly the published Tetra disk stream, 6 bytes a block,
  docs/codebooks.md §3.5), ``<module>.row_scales`` (F64), ``<module>.centroids`` (F64),
  ``<module>.tail`` (F32, rotated basis, only when ``d_in mod 24 > 0``); rotation tables
  ``leechq.rotations.<d_in>_<seed:016x>.signs`` (F64 ±1) and ``.small`` (F64 ``Q_odd``)
  de-duplicated by (width, effective seed); int4 records ``<module>.qweight/.scales/.biases``
  (docs/format.md §5); every other tensor under its own name, as stored in the checkpoint, or
  group-affine quantized (``<name>.qweight/.scales/.biases``) when the config asks for it;
* tokenizer files, copied; ``leechq-manifest.json`` — byte sizes and sha256 of every file.

:class:`GroupAffine` lives in :mod:`leechq.formats.group_affine`, the safetensors header parser
and tensor checks in :mod:`leechq.formats.safetensors_io`, the checks every reader applies in
:mod:`leechq.formats.integrity` (docs/integrity.md); all are re-exported names here.

The directory is assembled under a hidden temporary name and renamed into place: the rename is the
commit point, so a crash never leaves a directory that looks complete (the destination checks and
the temporary directory are :mod:`leechq.formats.output_paths`'). Readers validate everything and
name the file / tensor at fault. Kernels repack at load; nothing here depends on a served
layout.

The three accounting rates of a written artifact (docs/format.md §4) are
:func:`leechq.formats.accounting.artifact_report`'s.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from leechq.codebooks.base import BLOCK
from leechq.config import CONTROL_CODEBOOKS, SCHEMA_VERSION, QuantConfig
from leechq.errors import (
    ArtifactError,
    FingerprintMismatch,
    IncompatibleVersion,
    InvalidInput,
    LeechqError,
)
from leechq.formats.group_affine import GroupAffine
from leechq.formats.integrity import (
    CONTENT_KEY,
    check_config_fields,
    check_record_magnitudes,
    content_digest,
    load_json,
    verify_manifest,
)
from leechq.formats.output_paths import check_output_path, check_replaceable, partial_directory
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import RotationTables, split_width
from leechq.formats.safetensors_io import DTYPE_NAMES as _DTYPE_NAMES
from leechq.formats.safetensors_io import ST_DTYPES as _ST_DTYPES
from leechq.formats.safetensors_io import TensorFile, swap_into_place
from leechq.formats.safetensors_io import fsync_write as _fsync_write
from leechq.formats.safetensors_io import parse_header as _parse_header
from leechq.utils.hashing import sha256_file

QUANT_METHOD = "leechq"
CODE_ORDER = "msb_first_block"
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
MANIFEST_FILE = "leechq-manifest.json"
ROTATION_PREFIX = "leechq.rotations."



# --------------------------------------------------------------------------------------------------
# code streams


def block_bytes(label_bits: int, gain_bits: int) -> int:
    """Bytes per coded block: ``ceil((label_bits + gain_bits) / 8)``."""
    return -(-(label_bits + gain_bits) // 8)


def pack_codes(
    labels: torch.Tensor, gains: torch.Tensor, label_bits: int, gain_bits: int
) -> torch.Tensor:
    """Pack labels/gains [d_out, n_blocks] into the on-disk stream: uint8 [d_out·n_blocks·B].

    Each block is the big-endian ``B``-byte integer ``(label << gain_bits) | gain``.
    """
    if label_bits + gain_bits > 63:
        raise InvalidInput(f"{label_bits}+{gain_bits} bits do not fit the 63-bit packer")
    lab = labels.reshape(-1).to(torch.int64)
    gai = gains.reshape(-1).to(torch.int64)
    if lab.numel() and (int(lab.min()) < 0 or int(lab.max()) >= (1 << label_bits)):
        raise InvalidInput(f"labels out of range for {label_bits} label bits")
    if gai.numel() and (int(gai.min()) < 0 or int(gai.max()) >= (1 << gain_bits)):
        raise InvalidInput(f"gains out of range for {gain_bits} gain bits")
    words = (lab << gain_bits) | gai
    nbytes = block_bytes(label_bits, gain_bits)
    shifts = torch.tensor([8 * (nbytes - 1 - k) for k in range(nbytes)], dtype=torch.int64)
    return ((words[:, None] >> shifts[None, :]) & 0xFF).to(torch.uint8).reshape(-1)


def unpack_codes(
    stream: torch.Tensor, d_out: int, n_blocks: int, label_bits: int, gain_bits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`pack_codes`: (labels int64, gains uint8), both [d_out, n_blocks].

    Raises:
        ArtifactError: wrong stream length or set bits above ``label_bits + gain_bits``.
    """
    nbytes = block_bytes(label_bits, gain_bits)
    if stream.numel() != d_out * n_blocks * nbytes:
        raise ArtifactError(
            f"code stream has {stream.numel()} bytes, expected {d_out * n_blocks * nbytes}"
        )
    by = stream.reshape(-1, nbytes).to(torch.int64)
    words = torch.zeros(by.shape[0], dtype=torch.int64)
    for k in range(nbytes):
        words = (words << 8) | by[:, k]
    if words.numel() and int((words >> (label_bits + gain_bits)).max()) != 0:
        raise ArtifactError(f"code stream has bits set above bit {label_bits + gain_bits}")
    gains = (words & ((1 << gain_bits) - 1)).to(torch.uint8)
    labels = words >> gain_bits
    return labels.reshape(d_out, n_blocks), gains.reshape(d_out, n_blocks)


# --------------------------------------------------------------------------------------------------
# the in-memory artifact


@dataclass
class Artifact:
    """What :func:`read_artifact` returns.

    Attributes:
        path: the directory.
        config: the whole ``config.json`` (base model config + ``quantization_config``).
        quant_config: the resolved :class:`QuantConfig`.
        records: module name → :class:`QuantizedWeight` or :class:`Int4Weight`.
        raw: tensor name → dense tensor (as stored).
        raw_quant: tensor name → :class:`GroupAffine`.
        tied: alias tensor name → stored tensor name (e.g. ``lm_head.weight`` → the embedding).
    """

    path: Path
    config: dict[str, Any]
    quant_config: QuantConfig
    records: dict[str, QuantizedWeight | Int4Weight]
    raw: dict[str, torch.Tensor] = field(default_factory=dict)
    raw_quant: dict[str, GroupAffine] = field(default_factory=dict)
    tied: dict[str, str] = field(default_factory=dict)

    @property
    def quantization_config(self) -> dict[str, Any]:
        return self.config["quantization_config"]

    def dense_state_dict(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Every tensor dense, under its model name (records as ``<module>.weight``, decoded
        exactly; tied aliases included). ``dtype`` casts float tensors (None keeps f32 records and
        stored raw tensors as they are)."""
        out: dict[str, torch.Tensor] = {}
        for name, rec in self.records.items():
            out[f"{name}.weight"] = rec.dequantize(torch.float32)
        for name, t in self.raw.items():
            out[name] = t
        for name, ga in self.raw_quant.items():
            out[name] = ga.dequantize(torch.float32)
        for alias, target in self.tied.items():
            out[alias] = out[target]
        if dtype is not None:
            out = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in out.items()}
        return out


# --------------------------------------------------------------------------------------------------
# writing


def _rotation_key(rot: RotationTables) -> str:
    return f"{rot.n}_{rot.seed:016x}"


class TensorSink:
    """What a writer collects (this module's artifact and ``tetra_write``'s Tetra directory):
    tensors by name, each name once, as detached contiguous CPU copies; and the rotation tables
    its lattice records share, one per key, stored under ``rotation_prefix``."""

    def __init__(self, rotation_prefix: str = "leechq.rotations.") -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._rotations: dict[str, RotationTables] = {}
        self._prefix = rotation_prefix

    def put(self, key: str, t: torch.Tensor) -> None:
        """Store ``t`` under ``key``; :class:`InvalidInput` if the name is taken."""
        if key in self.tensors:
            raise InvalidInput(f"tensor name {key!r} would be written twice")
        self.tensors[key] = t.detach().cpu().contiguous().clone()

    def rotation(self, name: str, rot: RotationTables) -> str:
        """The key of record ``name``'s rotation (registered on first use); two different tables
        under one key raise :class:`InvalidInput`."""
        key = _rotation_key(rot)
        prev = self._rotations.setdefault(key, rot)
        if prev is not rot and not (
            np.array_equal(prev.signs, rot.signs) and np.array_equal(prev.small, rot.small)
        ):
            raise InvalidInput(f"record {name}: two different rotation tables share the key {key}")
        return key

    def put_rotations(self) -> dict[str, Any]:
        """Store every registered rotation's ``signs`` and ``small`` tables (float64, key order)
        and return their descriptors (seed as a string, n, and its 2^m · k split)."""
        desc: dict[str, Any] = {}
        for key, rot in sorted(self._rotations.items()):
            m, k = split_width(rot.n)
            for part in ("signs", "small"):
                table = np.ascontiguousarray(getattr(rot, part), dtype="<f8")
                self.put(f"{self._prefix}{key}.{part}", torch.from_numpy(table))
            desc[key] = {"seed": str(rot.seed), "n": rot.n, "pow2": m, "odd": k}
        return desc


def _codebook_fingerprint(name: str) -> str:
    from leechq.codebooks import get

    return get(name).fingerprint()


def build_tensors(
    records: Mapping[str, QuantizedWeight | Int4Weight],
    raw: Mapping[str, torch.Tensor | GroupAffine],
    codebook: str,
    gain_bits: int,
) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The safetensors dict and the ``records`` / ``rotations`` / ``raw`` descriptors."""
    from leechq.codebooks import get

    label_bits = get(codebook).label_bits
    sink = TensorSink(ROTATION_PREFIX)
    put = sink.put
    rec_desc: dict[str, Any] = {}
    raw_desc: dict[str, Any] = {}

    for name, rec in records.items():
        if isinstance(rec, QuantizedWeight):
            if rec.codebook != codebook:
                raise InvalidInput(
                    f"record {name} uses codebook {rec.codebook!r}, the artifact {codebook!r}"
                )
            if rec.gain_bits != gain_bits:
                raise InvalidInput(
                    f"record {name} has {rec.gain_bits} gain bits, the config {gain_bits}"
                )
            rot_key = None if rec.rotation is None else sink.rotation(name, rec.rotation)
            put(f"{name}.codes", pack_codes(rec.labels, rec.gains, label_bits, gain_bits))
            put(f"{name}.row_scales", rec.row_scales.to(torch.float64))
            put(f"{name}.centroids", rec.centroids.to(torch.float64))
            if rec.tail_cols:
                put(f"{name}.tail", rec.tail.to(torch.float32))
            bb = block_bytes(label_bits, gain_bits)
            rec_desc[name] = {
                "kind": "lattice",
                "codebook": codebook,
                "d_out": rec.d_out,
                "d_in": rec.d_in,
                "label_bits": label_bits,
                "gain_bits": gain_bits,
                "n_centroids": int(rec.centroids.numel()),
                "nblocks": rec.n_blocks,
                "tail_cols": rec.tail_cols,
                "block_bytes": bb,
                "code_bytes": bb * rec.d_out * rec.n_blocks,
                "rotation": rot_key,
            }
        elif isinstance(rec, Int4Weight):
            put(f"{name}.qweight", rec.qweight)
            put(f"{name}.scales", rec.scales)
            put(f"{name}.biases", rec.biases)
            rec_desc[name] = {
                "kind": "int4",
                "d_out": rec.d_out,
                "d_in": rec.d_in,
                "bits": 4,
                "group": rec.group,
                "groups_per_row": -(-rec.d_in // rec.group),
            }
        else:
            raise InvalidInput(
                f"record {name} of type {type(rec).__name__} cannot be stored "
                "(control coders produce no codes)"
            )
    rot_desc = sink.put_rotations()
    for name, t in raw.items():
        if name.startswith(ROTATION_PREFIX):
            raise InvalidInput(
                f"raw tensor name {name!r} uses the reserved prefix {ROTATION_PREFIX}"
            )
        if isinstance(t, GroupAffine):
            put(f"{name}.qweight", t.qweight)
            put(f"{name}.scales", t.scales)
            put(f"{name}.biases", t.biases)
            raw_desc[name] = {
                "encoding": "quant",
                "dims": list(t.dims),
                "bits": t.bits,
                "group": t.group,
                "rows": t.rows,
                "groups_per_row": -(-t.cols // t.group),
            }
        else:
            if t.dtype not in _DTYPE_NAMES:
                raise InvalidInput(f"raw tensor {name} has unsupported dtype {t.dtype}")
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise InvalidInput(f"raw tensor {name} has non-finite values")
            put(name, t)
            raw_desc[name] = {
                "encoding": "dense",
                "dtype": _DTYPE_NAMES[t.dtype],
                "dims": list(t.shape),
            }
    return sink.tensors, rec_desc, rot_desc, raw_desc


def write_artifact(
    out_dir: str | os.PathLike[str],
    *,
    base_config: Mapping[str, Any],
    quant_config: QuantConfig,
    records: Mapping[str, QuantizedWeight | Int4Weight],
    raw: Mapping[str, torch.Tensor | GroupAffine],
    tied: Mapping[str, str] | None = None,
    tokenizer: Any = None,
    extra_files: Mapping[str, bytes] | None = None,
    provenance: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write an artifact directory atomically.

    Args:
        out_dir: the directory to create.
        base_config: the base model's config dict (``model.config.to_dict()``).
        quant_config: the resolved configuration.
        records: module name → lattice or int4 record.
        raw: every other tensor under its model name, dense or :class:`GroupAffine`.
        tied: alias tensor name → stored tensor name (a tied head).
        tokenizer: an object with ``save_pretrained(dir)`` (its files are copied), or None.
        extra_files: further files to write verbatim (name → bytes).
        provenance: free-form JSON (model id, calibration digest, timings) stored in the config.
        overwrite: replace an existing directory (only after the new one is complete).

    Returns:
        The directory path.
    """
    out = Path(out_dir)
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise ArtifactError(f"{out} already exists (pass overwrite=True to replace it)")
    check_output_path(out)
    check_replaceable(out)
    if quant_config.codebook in CONTROL_CODEBOOKS:
        raise InvalidInput(
            f"codebook {quant_config.codebook!r} is a control and produces no artifact"
        )
    tied = dict(tied or {})
    tensors, rec_desc, rot_desc, raw_desc = build_tensors(
        records, raw, quant_config.codebook, quant_config.gain_bits
    )
    for alias, target in tied.items():
        if target not in raw_desc:
            raise InvalidInput(
                f"tied alias {alias} points at {target}, which is not a stored raw tensor"
            )
    cfg = dict(base_config)
    cfg["quantization_config"] = {
        "quant_method": QUANT_METHOD,
        "schema_version": SCHEMA_VERSION,
        "config": quant_config.to_dict(),
        "codebook": quant_config.codebook,
        "codebook_fingerprint": _codebook_fingerprint(quant_config.codebook),
        "block_dim": BLOCK,
        "code_order": CODE_ORDER,
        "records": rec_desc,
        "rotations": rot_desc,
        "raw": raw_desc,
        "tied": tied,
        "provenance": dict(provenance or {}),
    }
    tmp = partial_directory(out, "artifact")
    try:
        from safetensors.torch import save_file

        save_file(
            tensors,
            str(tmp / MODEL_FILE),
            # One key only: safetensors writes the metadata map in hash order, so a second key
            # would make two identical artifacts differ in bytes (the version is in config.json).
            metadata={"format": "pt"},
        )
        _fsync_write(
            tmp / CONFIG_FILE, json.dumps(cfg, indent=2, sort_keys=True, default=str).encode()
        )
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        for name, data in (extra_files or {}).items():
            if (
                "/" in name
                or name.startswith(".")
                or name in (MODEL_FILE, CONFIG_FILE, MANIFEST_FILE)
            ):
                raise InvalidInput(f"extra file name {name!r} is not allowed")
            _fsync_write(tmp / name, data)
        files = {
            p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted(tmp.iterdir())
            if p.is_file()
        }
        manifest = {"quant_method": QUANT_METHOD, "schema_version": SCHEMA_VERSION, "files": files}
        _fsync_write(tmp / MANIFEST_FILE, json.dumps(manifest, indent=1, sort_keys=True).encode())
        swap_into_place(tmp, out, check_replaceable)  # still only a leechq artifact, replaced
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ArtifactError(f"{out}: writing the artifact failed: {exc}") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# --------------------------------------------------------------------------------------------------
# reading


def _int_field(desc: Mapping[str, Any], key: str, where: str) -> int:
    v = desc.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ArtifactError(
            f"{where}: descriptor field {key!r} must be a non-negative integer, got {v!r}"
        )
    return v


def read_artifact(directory: str | os.PathLike[str], verify: bool = True) -> Artifact:
    """Read and validate an artifact directory.

    Args:
        directory: the artifact.
        verify: check every file's size and sha256 against the manifest.

    Raises:
        ArtifactError: missing/corrupt/inconsistent files or tensors (the message names them).
        IncompatibleVersion: a schema version this build does not read.
        FingerprintMismatch: the stored codebook fingerprint differs from this build's codebook.
    """
    root = Path(directory)
    where = str(root)
    if not root.is_dir():
        raise ArtifactError(f"{where}: not a directory")
    cfg_path = root / CONFIG_FILE
    cfg = load_json(cfg_path)
    qc = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    if not isinstance(qc, dict) or qc.get("quant_method") != QUANT_METHOD:
        raise ArtifactError(
            f"{cfg_path}: no quantization_config with quant_method {QUANT_METHOD!r}"
        )
    version = qc.get("schema_version")
    if not isinstance(version, int) or version != SCHEMA_VERSION:
        raise IncompatibleVersion(
            f"{cfg_path}: artifact schema_version {version!r}; this build reads {SCHEMA_VERSION}"
        )
    model_path = root / MODEL_FILE
    manifest_path = root / MANIFEST_FILE
    sealed: str | None = None
    if manifest_path.exists() or manifest_path.is_symlink() or not model_path.is_file():
        verify_manifest(root, MANIFEST_FILE, (CONFIG_FILE, MODEL_FILE), verify=verify)
    else:  # written by save_pretrained: the tensors carry their own content digest
        meta = _parse_header(model_path).get("__metadata__")
        sealed = meta.get(CONTENT_KEY) if isinstance(meta, dict) else None
        if not isinstance(sealed, str):
            raise ArtifactError(
                f"{manifest_path}: missing (the artifact was never completed), and "
                f"{MODEL_FILE} carries no {CONTENT_KEY}"
            )
    check_config_fields(qc.get("config"), str(cfg_path))
    try:
        quant_config = QuantConfig.from_dict(qc.get("config"))
    except (LeechqError, TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, IncompatibleVersion):
            raise
        raise ArtifactError(f"{cfg_path}: invalid quantization_config.config: {exc}") from exc
    codebook = qc.get("codebook")
    if codebook != quant_config.codebook:
        raise ArtifactError(
            f"{cfg_path}: codebook {codebook!r} disagrees with config {quant_config.codebook!r}"
        )
    from leechq.codebooks import get

    try:
        cb = get(codebook)
    except LeechqError as exc:
        raise ArtifactError(
            f"{cfg_path}: codebook {codebook!r} is not available in this build: {exc}"
        ) from exc
    if qc.get("codebook_fingerprint") != cb.fingerprint():
        raise FingerprintMismatch(
            f"{cfg_path}: codebook {codebook!r} fingerprint "
            f"{qc.get('codebook_fingerprint')!r} differs from this build's {cb.fingerprint()!r}: "
            "the labels would decode to different points"
        )
    if qc.get("block_dim") != BLOCK or qc.get("code_order") != CODE_ORDER:
        raise ArtifactError(f"{cfg_path}: block_dim/code_order must be {BLOCK}/{CODE_ORDER!r}")
    for key in ("records", "rotations", "raw", "tied"):
        if not isinstance(qc.get(key), dict):
            raise ArtifactError(f"{cfg_path}: quantization_config.{key} must be an object")
    for section in ("records", "rotations", "raw"):
        for name, desc in qc[section].items():
            if not isinstance(desc, dict):
                raise ArtifactError(
                    f"{cfg_path}: quantization_config.{section}.{name} must be an object, "
                    f"got {type(desc).__name__}"
                )
    for alias, target in qc["tied"].items():
        if not isinstance(target, str):
            raise ArtifactError(f"{cfg_path}: quantization_config.tied.{alias} must be a string")

    stored = TensorFile(model_path)
    if sealed is not None and verify and content_digest(stored.tensors) != sealed:
        raise ArtifactError(
            f"{model_path}: tensors differ from their {CONTENT_KEY} (corrupt file)"
        )
    take = stored.take

    rotations: dict[str, RotationTables] = {}
    for key, desc in qc["rotations"].items():
        ctx = f"rotation {key}"
        n = _int_field(desc, "n", ctx)
        m, k = split_width(n) if n > 0 else (0, 0)
        try:
            seed = int(desc["seed"])
            if isinstance(desc["seed"], (bool, float)) or not 0 <= seed < 1 << 64:
                raise ValueError(desc["seed"])
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ArtifactError(f"{cfg_path}: {ctx} has no valid seed") from exc
        if key != f"{n}_{seed:016x}" or desc.get("pow2") != m or desc.get("odd") != k:
            raise ArtifactError(f"{cfg_path}: {ctx} descriptor is inconsistent with its key")
        signs = take(f"{ROTATION_PREFIX}{key}.signs", torch.float64, (n,), ctx).numpy()
        small = take(f"{ROTATION_PREFIX}{key}.small", torch.float64, (k, k), ctx).numpy()
        if not np.all(np.abs(signs) == 1.0):
            raise ArtifactError(f"{model_path}: {ctx} signs are not all ±1")
        if np.abs(small @ small.T - np.eye(k)).max() > 1e-9:
            raise ArtifactError(f"{model_path}: {ctx} Q_odd is not orthogonal")
        rotations[key] = RotationTables(n=n, seed=seed, signs=signs.copy(), small=small.copy())

    records: dict[str, QuantizedWeight | Int4Weight] = {}
    for name, desc in qc["records"].items():
        ctx = f"record {name}"
        kind = desc.get("kind") if isinstance(desc, dict) else None
        d_out, d_in = _int_field(desc, "d_out", ctx), _int_field(desc, "d_in", ctx)
        if kind == "lattice":
            nb, tail = d_in // BLOCK, d_in % BLOCK
            label_bits, gain_bits = (
                _int_field(desc, "label_bits", ctx),
                _int_field(desc, "gain_bits", ctx),
            )
            n_c = _int_field(desc, "n_centroids", ctx)
            bb = block_bytes(label_bits, gain_bits)
            if (
                desc.get("codebook") != codebook
                or label_bits != cb.label_bits
                or gain_bits > 2
                or n_c != 2**gain_bits
                or desc.get("nblocks") != nb
                or desc.get("tail_cols") != tail
                or desc.get("block_bytes") != bb
                or desc.get("code_bytes") != bb * d_out * nb
            ):
                raise ArtifactError(
                    f"{cfg_path}: {ctx} descriptor is inconsistent (codebook, bits or sizes)"
                )
            stream = take(f"{name}.codes", torch.uint8, (bb * d_out * nb,), ctx)
            labels, gains = unpack_codes(stream, d_out, nb, label_bits, gain_bits)
            rot_key = desc.get("rotation")
            if rot_key is not None and rot_key not in rotations:
                raise ArtifactError(f"{cfg_path}: {ctx} names unknown rotation {rot_key!r}")
            rot = rotations[rot_key] if rot_key is not None else None
            if rot is not None and rot.n != d_in:
                raise ArtifactError(f"{cfg_path}: {ctx} rotation width {rot.n} != d_in {d_in}")
            tail_t = (
                take(f"{name}.tail", torch.float32, (d_out, tail), ctx)
                if tail
                else torch.zeros(d_out, 0, dtype=torch.float32)
            )
            try:
                records[name] = QuantizedWeight(
                    codebook=codebook,
                    d_out=d_out,
                    d_in=d_in,
                    labels=labels,
                    gains=gains,
                    row_scales=take(f"{name}.row_scales", torch.float64, (d_out,), ctx),
                    centroids=take(f"{name}.centroids", torch.float64, (n_c,), ctx),
                    tail=tail_t,
                    rotation=rot,
                )
            except InvalidInput as exc:
                raise ArtifactError(f"{model_path}: {ctx}: {exc}") from exc
        elif kind == "int4":
            group = _int_field(desc, "group", ctx)
            if group < 2 or d_in % 2 or desc.get("groups_per_row") != -(-d_in // group):
                raise ArtifactError(f"{cfg_path}: {ctx} descriptor is inconsistent")
            gpr = -(-d_in // group)
            try:
                records[name] = Int4Weight(
                    d_out=d_out,
                    d_in=d_in,
                    group=group,
                    qweight=take(f"{name}.qweight", torch.uint8, (d_out, d_in // 2), ctx),
                    scales=take(f"{name}.scales", torch.float16, (d_out, gpr), ctx),
                    biases=take(f"{name}.biases", torch.float16, (d_out, gpr), ctx),
                )
            except InvalidInput as exc:
                raise ArtifactError(f"{model_path}: {ctx}: {exc}") from exc
        else:
            raise ArtifactError(f"{cfg_path}: {ctx} has unknown kind {kind!r}")

    raw: dict[str, torch.Tensor] = {}
    raw_quant: dict[str, GroupAffine] = {}
    for name, desc in qc["raw"].items():
        ctx = f"raw tensor {name}"
        enc = desc.get("encoding") if isinstance(desc, dict) else None
        dims = desc.get("dims") if isinstance(desc, dict) else None
        if not isinstance(dims, list) or not all(isinstance(d, int) and d >= 0 for d in dims):
            raise ArtifactError(f"{cfg_path}: {ctx} has invalid dims {dims!r}")
        if enc == "dense":
            dt = _ST_DTYPES.get(desc.get("dtype"))
            if dt is None:
                raise ArtifactError(f"{cfg_path}: {ctx} has unknown dtype {desc.get('dtype')!r}")
            raw[name] = take(name, dt, tuple(dims), ctx)
        elif enc == "quant":
            bits, group = desc.get("bits"), _int_field(desc, "group", ctx)
            if bits not in (4, 8) or not dims or group < 2:
                raise ArtifactError(f"{cfg_path}: {ctx} has an invalid quant descriptor")
            rows, cols = math.prod(dims[:-1]), dims[-1]
            if bits == 4 and cols % 2:
                raise ArtifactError(f"{cfg_path}: {ctx} 4-bit row length must be even")
            gpr = -(-cols // group)
            raw_quant[name] = GroupAffine(
                dims=tuple(dims),
                bits=bits,
                group=group,
                qweight=take(
                    f"{name}.qweight", torch.uint8, (rows, cols // 2 if bits == 4 else cols), ctx
                ),
                scales=take(f"{name}.scales", torch.float16, (rows, gpr), ctx),
                biases=take(f"{name}.biases", torch.float16, (rows, gpr), ctx),
            )
        else:
            raise ArtifactError(f"{cfg_path}: {ctx} has unknown encoding {enc!r}")
    tied = dict(qc["tied"])
    for alias, target in tied.items():
        if target not in raw and target not in raw_quant:
            raise ArtifactError(
                f"{cfg_path}: tied alias {alias} points at missing tensor {target!r}"
            )
    stored.check_all_taken(CONFIG_FILE)
    check_record_magnitudes(records, str(model_path))
    return Artifact(
        path=root,
        config=cfg,
        quant_config=quant_config,
        records=records,
        raw=raw,
        raw_quant=raw_quant,
        tied=tied,
    )
