"""Writing a published Tetra directory (docs/format.md §5; the model in
:mod:`leechq.formats.tetra_dir`), atomically, with both digest files; and converting a leechq
artifact into one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from leechq._version import __version__
from leechq.codebooks.base import BLOCK
from leechq.codebooks.tetra import disk_bytes_from_words, words_from_labels_gains
from leechq.codebooks.tetra_tables import FINGERPRINT
from leechq.errors import ArtifactError, InvalidInput
from leechq.formats.artifact import (
    CONFIG_FILE,
    MANIFEST_FILE,
    MODEL_FILE,
    Artifact,
    GroupAffine,
    TensorSink,
    _fsync_write,
    _rotation_key,
    read_artifact,
)
from leechq.formats.integrity import load_json
from leechq.formats.output_paths import check_output_path, partial_directory
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.safetensors_io import existing_directory, swap_into_place
from leechq.formats.tetra_dir import (
    _RESERVED_FILES,
    _WORD_BYTES,
    CODE_ORDER,
    DENSE_CONVENTION,
    DENSE_DIGEST_FILE,
    DIGEST_FILE,
    FIELD_CONVENTION,
    GAIN_BITS,
    INDEX_BITS,
    INT4_KIND,
    INT4_RECORD_GROUP,
    LAYOUT_VERSION,
    QUANT_METHOD,
    ROTATION_PREFIX,
    SHELL_CAP,
    TETRA_KIND,
    RawValue,
    TetraDirectory,
    _check_against_config,
    _field_digests,
    _raw_dims,
    dense_digest,
)
from leechq.utils.hashing import sha256_file

# --------------------------------------------------------------------------------------------------
# writing


_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


def _as_group_affine(name: str, value: Any) -> GroupAffine:
    if isinstance(value, GroupAffine):
        return value
    if isinstance(value, Int4Weight):
        return GroupAffine((value.d_out, value.d_in), 4, value.group, value.qweight, value.scales,
                           value.biases)
    raise InvalidInput(f"raw tensor {name}: unsupported value of type {type(value).__name__} "
                       "(expected a float16 tensor, GroupAffine or Int4Weight)")


def build_tetra_tensors(
    records: Mapping[str, QuantizedWeight | Int4Weight],
    raw: Mapping[str, Any],
    *,
    allow_8bit_raw: bool = False,
) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any], dict[str, Any],
           dict[str, QuantizedWeight | Int4Weight], dict[str, RawValue]]:
    """The safetensors dict and the ``records`` / ``rotations`` / ``raw`` descriptors (§3.1–§3.2).

    Args:
        records: module path → record (Tetra codebook with 1 gain bit, or int4 group 128).
        raw: tensor name → float16 tensor, :class:`GroupAffine`, :class:`Int4Weight` (a 4-bit
            table, e.g. group 64 for the embedding) or an 8-bit table (only with
            ``allow_8bit_raw``).

    Returns:
        ``(tensors, record descriptors, rotation descriptors, raw descriptors, records, raw)`` —
        the last two normalized (raw group-affine values as :class:`GroupAffine`).

    Raises:
        InvalidInput: a record or tensor the format (or ``llvq-tetra``) cannot carry; the message
            names it and says why.
    """
    sink = TensorSink(ROTATION_PREFIX)
    put = sink.put
    rec_desc: dict[str, Any] = {}
    raw_desc: dict[str, Any] = {}

    def check_name(name: str, what: str) -> None:
        if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name:
            raise InvalidInput(f"{what} name {name!r} is not a dotted module path")
        if name == "llvq" or name.startswith("llvq."):
            raise InvalidInput(f"{what} name {name!r} uses the reserved prefix 'llvq.'")

    if not records:
        raise InvalidInput("llvq-tetra refuses a quantization_config without records; give at "
                           "least one")
    for name, rec in records.items():
        check_name(name, "record")
        if name.endswith(".weight"):
            raise InvalidInput(f"record {name!r}: key records by module path, without '.weight'")
        if isinstance(rec, QuantizedWeight):
            if rec.codebook != "tetra":
                raise InvalidInput(
                    f"record {name} is coded with the {rec.codebook!r} codebook; the Tetra format "
                    "carries only Tetra-coded records (47-bit labels of the Tetra map). "
                    "Re-quantize with codebook='tetra' to export it"
                )
            if rec.centroids.numel() != 1 << GAIN_BITS:
                raise InvalidInput(f"record {name} has {rec.gain_bits} gain bit(s); the Tetra "
                                   f"format needs exactly {GAIN_BITS} (48-bit words)")
            rot_key = None
            if rec.rotation is not None:
                if not 0 <= rec.rotation.seed < 1 << 64:
                    raise InvalidInput(f"record {name}: rotation seed {rec.rotation.seed} is "
                                       "outside [0, 2^64)")
                rot_key = sink.rotation(name, rec.rotation)
            words = words_from_labels_gains(rec.labels.reshape(-1), rec.gains.reshape(-1))
            put(f"{name}.codes", disk_bytes_from_words(words))
            put(f"{name}.row_scales", rec.row_scales.to(torch.float64))
            put(f"{name}.centroids", rec.centroids.to(torch.float64))
            if rec.tail_cols:
                put(f"{name}.tail", rec.tail.to(torch.float32))
            rec_desc[f"{name}.weight"] = {
                "kind": TETRA_KIND,
                "prefix": name,
                "d_out": rec.d_out,
                "d_in": rec.d_in,
                "shell_cap": SHELL_CAP,
                "n_centroids": 1 << GAIN_BITS,
                "index_bits": INDEX_BITS,
                "gain_bits": GAIN_BITS,
                "nblocks": rec.n_blocks,
                "tail_cols": rec.tail_cols,
                "code_bytes": _WORD_BYTES * rec.d_out * rec.n_blocks,
                "rotation": rot_key,
            }
        elif isinstance(rec, Int4Weight):
            if rec.group != INT4_RECORD_GROUP:
                raise InvalidInput(f"int4 record {name} has group {rec.group}; the format's "
                                   f"{INT4_KIND!r} records use group {INT4_RECORD_GROUP}")
            put(f"{name}.qweight", rec.qweight)
            put(f"{name}.scales", rec.scales)
            put(f"{name}.biases", rec.biases)
            rec_desc[f"{name}.weight"] = {
                "kind": INT4_KIND,
                "prefix": name,
                "d_out": rec.d_out,
                "d_in": rec.d_in,
                "bits": 4,
                "group": rec.group,
                "groups_per_row": -(-rec.d_in // rec.group),
            }
        else:
            raise InvalidInput(f"record {name} of type {type(rec).__name__} cannot be written to "
                               "the Tetra format (only Tetra-coded QuantizedWeight and Int4Weight)")
    rot_desc = sink.put_rotations()

    norm_raw: dict[str, RawValue] = {}
    for name, value in raw.items():
        check_name(name, "raw tensor")
        if isinstance(value, torch.Tensor):
            if value.dtype != torch.float16:
                raise InvalidInput(f"raw tensor {name} is {value.dtype}; the Tetra format carries "
                                   "float16 or group-affine tensors only (cast it first)")
            if not bool(torch.isfinite(value).all()):
                raise InvalidInput(f"raw tensor {name} has non-finite values")
            put(name, value)
            raw_desc[name] = {"encoding": "f16", "dims": list(value.shape), "tensor": name}
            norm_raw[name] = value.detach().cpu().contiguous()
            continue
        ga = _as_group_affine(name, value)
        if ga.bits == 8 and not allow_8bit_raw:
            raise InvalidInput(
                f"raw tensor {name} is 8-bit group-affine: the format defines it, but llvq-tetra "
                "0.1.0 cannot read it (docs/format.md §5); use 4 bits or pass allow_8bit_raw=True"
            )
        if ga.bits not in (4, 8) or (ga.bits == 4 and ga.cols % 2):
            raise InvalidInput(f"raw tensor {name}: {ga.bits}-bit rows of {ga.cols} columns "
                               "cannot be stored (4 bits needs an even row length)")
        prefix = name.removesuffix(".weight")
        check_name(prefix, "raw tensor prefix")
        put(f"{prefix}.qweight", ga.qweight)
        put(f"{prefix}.scales", ga.scales)
        put(f"{prefix}.biases", ga.biases)
        raw_desc[name] = {
            "encoding": "quant",
            "dims": list(ga.dims),
            "prefix": prefix,
            "bits": ga.bits,
            "group": ga.group,
            "rows": ga.rows,
            "groups_per_row": -(-ga.cols // ga.group),
        }
        norm_raw[name] = ga
    return sink.tensors, rec_desc, rot_desc, raw_desc, dict(records), norm_raw


def _artifact_kinds(records: Mapping[str, QuantizedWeight | Int4Weight]) -> str:
    kinds = []
    if any(isinstance(r, QuantizedWeight) for r in records.values()):
        kinds.append("Tetra")
    if any(isinstance(r, Int4Weight) for r in records.values()):
        kinds.append("Int4G128")
    return "+".join(kinds)


def _file_bytes(name: str, src: bytes | str | os.PathLike[str]) -> bytes:
    if isinstance(src, bytes):
        return src
    try:
        return Path(src).read_bytes()
    except OSError as exc:
        raise InvalidInput(f"file {name}: cannot read {src}: {exc}") from exc


def write_tetra_dir(
    out: str | os.PathLike[str],
    base_config: Mapping[str, Any],
    records: Mapping[str, QuantizedWeight | Int4Weight],
    raw: Mapping[str, Any],
    *,
    tokenizer_files: Mapping[str, bytes | str | os.PathLike[str]] | None = None,
    check_config: bool = True,
    allow_8bit_raw: bool = False,
    overwrite: bool = False,
) -> Path:
    """Write a published-format Tetra directory, atomically.

    The directory is assembled under a hidden temporary name beside ``out`` and renamed into
    place; on any error the temporary directory is removed and ``out`` is untouched.

    Args:
        out: the directory to create.
        base_config: the base model config (``model.config.to_dict()``); ``quantization_config``
            is replaced. A config naming no ``dtype``/``torch_dtype`` gets ``dtype: "float32"``.
        records: module path (no ``.weight``) → Tetra-coded :class:`QuantizedWeight` (codebook
            ``"tetra"``, 2 centroids; rotation tables or None) or :class:`Int4Weight` (group 128).
        raw: every other tensor under its model name: float16 tensors, or group-affine tables
            (:class:`GroupAffine`, or :class:`Int4Weight` such as the group-64 embedding).
        tokenizer_files: files copied verbatim (name → bytes or a path), e.g. ``tokenizer.json``.
        check_config: for a llama-family config, require every record to be a linear layer of the
            model with its shape, and every model weight to be present (so that the transformers
            load reports 0 missing / 0 unexpected keys).
        allow_8bit_raw: permit 8-bit raw tables (legal in the format, unreadable by llvq-tetra).
        overwrite: replace an existing directory (only once the new one is complete).

    Returns:
        The directory path.

    Raises:
        InvalidInput: a record or tensor the format cannot carry (e.g. a Ball-coded record), a
            shape the config contradicts, a missing weight.
        ArtifactError: ``out`` exists and ``overwrite`` is False.
    """
    dest = Path(out)
    if (dest.exists() or dest.is_symlink()) and not overwrite:
        raise ArtifactError(f"{dest} already exists (pass overwrite=True to replace it)")
    check_output_path(dest)
    check_tetra_replaceable(dest)
    base = {k: v for k, v in dict(base_config).items() if k != "quantization_config"}
    if base.get("dtype") is None and base.get("torch_dtype") is None:
        # transformers' dtype="auto" would otherwise take the file's first floating tensor (an
        # f64 row scale or rotation) and build an f64 model; f32 is what llvq-tetra materializes.
        base["dtype"] = "float32"
    tensors, rec_desc, rot_desc, raw_desc, recs, norm_raw = build_tetra_tensors(
        records, raw, allow_8bit_raw=allow_8bit_raw
    )
    if check_config:
        _check_against_config(
            base,
            {n: (r.d_out, r.d_in) for n, r in recs.items()},
            {n: _raw_dims(v) for n, v in norm_raw.items()},
            "write_tetra_dir", InvalidInput, complete=True,
        )
    files = {n: _file_bytes(n, s) for n, s in (tokenizer_files or {}).items()}
    for name in files:
        if "/" in name or "\\" in name or name.startswith(".") or not name or \
                name in (*_RESERVED_FILES, MANIFEST_FILE):
            raise InvalidInput(f"tokenizer file name {name!r} is not allowed")
    dense = dense_digest(recs, norm_raw)
    field_recs, field_rots, field_raw = _field_digests(recs, norm_raw)

    tmp = partial_directory(dest, "directory")
    try:
        from safetensors.torch import save_file

        save_file(tensors, str(tmp / MODEL_FILE), metadata={"format": "pt"})
        model_sha = sha256_file(tmp / MODEL_FILE)
        kinds = _artifact_kinds(recs)
        qc = {
            "quant_method": QUANT_METHOD,
            "llvq_layout_version": LAYOUT_VERSION,
            "artifact_version": None,
            "artifact_sha256": model_sha,
            "artifact_kinds": kinds,
            "codebook_fingerprint": None,
            "tetra_fingerprint": FINGERPRINT,
            "block_dim": BLOCK,
            "code_order": CODE_ORDER,
            "records": rec_desc,
            "rotations": rot_desc,
            "raw": raw_desc,
            "writer": f"leechq {__version__}",
        }
        cfg = dict(base)
        cfg["quantization_config"] = qc
        _fsync_write(tmp / CONFIG_FILE, json.dumps(cfg, indent=2, default=str).encode())
        for name, data in files.items():
            _fsync_write(tmp / name, data)
        artifact = {"file": MODEL_FILE, "sha256": model_sha, "version": None}
        _fsync_write(tmp / DENSE_DIGEST_FILE, json.dumps({
            "artifact": artifact,
            "convention": DENSE_CONVENTION,
            "reference": "leechq.formats.quantized_weight (docs/format.md §2, §5)",
            "records": dense["records"],
            "raw": dense["raw"],
        }, indent=2).encode())
        _fsync_write(tmp / DIGEST_FILE, json.dumps({
            "artifact": {**artifact, "matrices": len(recs), "kinds": kinds},
            "convention": FIELD_CONVENTION,
            "counts": {
                "lattice": sum(isinstance(r, QuantizedWeight) for r in recs.values()),
                "int4": sum(isinstance(r, Int4Weight) for r in recs.values()),
                "raw_tensors": len(norm_raw),
                "rotations": len(rot_desc),
                "tensors": len(tensors),
            },
            "records": field_recs,
            "rotations": field_rots,
            "raw": field_raw,
            "blobs": {n: {"sha256": hashlib.sha256(b).hexdigest(), "written_verbatim": True}
                      for n, b in files.items()},
            "config_base": base,
        }, indent=2, default=str).encode())
        swap_into_place(tmp, dest, check_tetra_replaceable)  # still only a Tetra directory
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ArtifactError(f"{dest}: writing the directory failed: {exc}") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def check_tetra_replaceable(out: str | os.PathLike[str]) -> None:
    """Refuse to replace ``out`` unless it is a complete Tetra directory this writer could have
    written, and nothing else: a real directory whose ``config.json`` names ``quant_method``
    "llvq", with ``model.safetensors`` and an ``llvq-digest.json`` whose ``blobs`` list every
    other file it holds. A folder of the user's files is never deleted.

    Raises:
        ArtifactError: the reason, naming ``out``; nothing is touched.
    """
    found = existing_directory(out, "Tetra directory")
    if found is None:
        return
    path, refuse = found
    try:
        cfg = load_json(path / CONFIG_FILE)
        digest = load_json(path / DIGEST_FILE)
    except ArtifactError as exc:
        raise ArtifactError(f"{refuse} ({exc})") from exc
    qc = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    blobs = digest.get("blobs") if isinstance(digest, dict) else None
    if not isinstance(qc, dict) or qc.get("quant_method") != QUANT_METHOD:
        raise ArtifactError(f"{refuse} (config.json does not name quant_method {QUANT_METHOD!r})")
    if not isinstance(blobs, dict) or not (path / MODEL_FILE).is_file():
        raise ArtifactError(f"{refuse} (no {MODEL_FILE}, or {DIGEST_FILE} lists no blobs)")
    known = {*_RESERVED_FILES, *blobs}
    foreign = sorted(p.name for p in path.iterdir() if p.name not in known)
    if foreign:
        raise ArtifactError(f"{refuse} (it holds files the digest does not list: {foreign[:3]})")


# --------------------------------------------------------------------------------------------------
# leechq artifact → Tetra directory


def artifact_to_tetra_dir(
    source: str | os.PathLike[str] | Artifact,
    out: str | os.PathLike[str],
    *,
    allow_lossy_raw: bool = False,
    copy_files: bool = True,
    check_config: bool = True,
    overwrite: bool = False,
) -> Path:
    """Convert a leechq artifact whose lattice records are Tetra-coded (1 gain bit).

    Records carry over field for field (labels, gains, f64 scales and centroids, f32 tails,
    rotation tables; int4 records as they are). Dense raw tensors are stored as float16 — exactly
    when their values are f16-representable (bf16 norms usually are), else only with
    ``allow_lossy_raw``. 4-bit group-affine raw tables carry over; 8-bit ones are refused
    (llvq-tetra cannot read them). A tied alias is dropped when the base config ties the
    embeddings (transformers re-ties it), else written as a copy.

    Args:
        source: an artifact directory or an already-read :class:`Artifact`.
        out: the Tetra directory to create.
        allow_lossy_raw: permit dense raw tensors that change when narrowed to float16.
        copy_files: copy the artifact's other files (tokenizer, ...) verbatim.
        check_config, overwrite: as in :func:`write_tetra_dir`.

    Raises:
        InvalidInput: a Ball-coded record, a gain width other than 1 bit, a lattice-coded
            embedding, an 8-bit raw table, a raw tensor that f16 cannot hold exactly (without
            ``allow_lossy_raw``).
    """
    art = source if isinstance(source, Artifact) else read_artifact(source)
    if art.quant_config.codebook != "tetra" or art.quant_config.gain_bits != GAIN_BITS:
        raise InvalidInput(
            f"artifact {art.path} is coded with codebook {art.quant_config.codebook!r} and "
            f"{art.quant_config.gain_bits} gain bit(s); the Tetra format carries only "
            f"Tetra-coded records with {GAIN_BITS} gain bit. Ball-coded weights have no Tetra "
            "word: re-quantize with codebook='tetra', gain_bits=1"
        )
    if art.quant_config.embedding_encoding == "lattice":
        raise InvalidInput(
            f"artifact {art.path} codes its token embedding on the lattice; the Tetra format "
            "records linear layers only (its readers would load the table as a linear): "
            "re-quantize without --lattice-embedding to convert")
    base = {k: v for k, v in art.config.items() if k != "quantization_config"}
    raw: dict[str, Any] = {}
    for name, t in art.raw.items():
        if not t.is_floating_point():
            raise InvalidInput(f"raw tensor {name} is {t.dtype}; the Tetra format carries float "
                               "tensors only")
        half = t.to(torch.float16)
        if not allow_lossy_raw and not torch.equal(half.to(t.dtype), t):
            raise InvalidInput(f"raw tensor {name} ({t.dtype}) is not exactly representable in "
                               "float16; pass allow_lossy_raw=True to round it")
        if not bool(torch.isfinite(half).all()):
            raise InvalidInput(f"raw tensor {name} overflows float16")
        raw[name] = half
    for name, ga in art.raw_quant.items():
        if ga.bits != 4:
            raise InvalidInput(f"raw tensor {name} is {ga.bits}-bit group-affine; llvq-tetra "
                               "0.1.0 reads only 4-bit carried tables (re-quantize it with raw "
                               "int4)")
        raw[name] = ga
    tie = bool(base.get("tie_word_embeddings", False))
    for alias, target in art.tied.items():
        if tie and alias.removesuffix(".weight") == "lm_head":
            continue
        raw[alias] = raw[target]
    files: dict[str, bytes | str | os.PathLike[str]] = {}
    if copy_files:
        for p in sorted(art.path.iterdir()):
            if p.is_file() and p.name not in (CONFIG_FILE, MODEL_FILE, MANIFEST_FILE,
                                              *_RESERVED_FILES) and not p.name.startswith("."):
                files[p.name] = p
    return write_tetra_dir(
        out, base, art.records, raw, tokenizer_files=files, check_config=check_config,
        overwrite=overwrite,
    )


def tetra_dir_summary(d: TetraDirectory) -> dict[str, Any]:
    """Counts of a read directory (records by kind, rotations, raw tensors, quantized weights)."""
    lattice = [r for r in d.records.values() if isinstance(r, QuantizedWeight)]
    int4 = [r for r in d.records.values() if isinstance(r, Int4Weight)]
    return {
        "tetra_records": len(lattice),
        "int4_records": len(int4),
        "rotations": len({_rotation_key(r.rotation) for r in lattice if r.rotation is not None}),
        "raw_tensors": len(d.raw),
        "tetra_blocks": sum(r.d_out * r.n_blocks for r in lattice),
        "quantized_weights": sum(r.d_out * r.d_in for r in d.records.values()),
    }
