"""Reading and verifying a published Tetra directory (docs/format.md §5; the model in
:mod:`leechq.formats.tetra_dir`).

:func:`read_tetra_dir` parses ``config.json`` and ``model.safetensors`` into canonical weights,
checking every descriptor, tensor dtype, shape and finiteness, and verifies the bytes: either
``model.safetensors`` hashes to ``quantization_config.artifact_sha256`` (what leechq writes), or
``llvq-digest.json`` covers every field of every record, rotation and raw tensor and each digest
matches (what a directory converted from a sealed ``.llvq`` carries). A directory that offers
neither is refused unless the caller passes ``verify=False`` (docs/integrity.md).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from leechq.codebooks.base import BLOCK
from leechq.codebooks.tetra import labels_gains_from_words, words_from_disk_bytes
from leechq.codebooks.tetra_tables import FINGERPRINT, PUBLISHED_DIGESTS, tetra_tables
from leechq.errors import ArtifactError, FingerprintMismatch, IncompatibleVersion, InvalidInput
from leechq.formats.artifact import CONFIG_FILE, MODEL_FILE, GroupAffine
from leechq.formats.integrity import check_record_magnitudes, load_json
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import RotationTables, split_width
from leechq.formats.safetensors_io import TensorFile
from leechq.formats.tetra_dir import (
    _RESERVED_FILES,
    _WORD_BYTES,
    CODE_ORDER,
    DENSE_DIGEST_FILE,
    DIGEST_FILE,
    GAIN_BITS,
    INDEX_BITS,
    INT4_KIND,
    LAYOUT_VERSION,
    QUANT_METHOD,
    ROTATION_PREFIX,
    TETRA_KIND,
    RawValue,
    TetraDirectory,
    _check_against_config,
    _field_digests,
    _raw_dims,
    dense_digest,
)
from leechq.utils.hashing import sha256_file


def check_tables() -> None:
    """Refuse to decode when this build's Tetra tables are not the published map.

    Raises:
        FingerprintMismatch: a rebuilt table's sha256 differs from the published digest (§2).
    """
    got = tetra_tables().digests()
    bad = sorted(n for n, want in PUBLISHED_DIGESTS.items() if got.get(n) != want)
    if bad:
        raise FingerprintMismatch(
            f"this build's Tetra tables {bad} differ from the published digests "
            "(docs/codebooks.md, table digests): its labels would decode to different points "
            "than llvq-tetra's"
        )


def _pos_int(desc: Mapping[str, Any], key: str, where: str, minimum: int = 1) -> int:
    v = desc.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise ArtifactError(f"{where}: field {key!r} must be an integer >= {minimum}, got {v!r}")
    return v


def _seed(desc: Mapping[str, Any], where: str) -> int:
    raw = desc.get("seed")
    try:
        if isinstance(raw, bool) or not isinstance(raw, (str, int)):
            raise ValueError(raw)
        seed = int(raw)
    except ValueError as exc:
        raise ArtifactError(f"{where}: seed {raw!r} is not a decimal integer") from exc
    if not 0 <= seed < 1 << 64:
        raise ArtifactError(f"{where}: seed {seed} is outside [0, 2^64)")
    return seed


def _check_header(qc: Any, cfg_path: Path) -> dict[str, Any]:
    """Validate the ``quantization_config`` constants (§3.1, §3.3) before any tensor is read."""
    if not isinstance(qc, dict) or qc.get("quant_method") != QUANT_METHOD:
        got = qc.get("quant_method") if isinstance(qc, dict) else None
        raise ArtifactError(f"{cfg_path}: quantization_config.quant_method is {got!r}, "
                            f"not {QUANT_METHOD!r}")
    if qc.get("llvq_layout_version") != LAYOUT_VERSION:
        raise IncompatibleVersion(f"{cfg_path}: llvq_layout_version "
                                  f"{qc.get('llvq_layout_version')!r}; this build reads "
                                  f"{LAYOUT_VERSION}")
    fp = qc.get("tetra_fingerprint")
    if not isinstance(fp, str) or fp.lower() != FINGERPRINT:
        raise FingerprintMismatch(
            f"{cfg_path}: tetra_fingerprint {fp!r} is not {FINGERPRINT!r}: the codes were written "
            "against another Tetra map and would decode to plausible wrong points"
        )
    if qc.get("block_dim") != BLOCK:
        raise ArtifactError(f"{cfg_path}: block_dim {qc.get('block_dim')!r}, expected {BLOCK}")
    if qc.get("code_order") != CODE_ORDER:
        raise ArtifactError(f"{cfg_path}: code_order {qc.get('code_order')!r} is not "
                            f"{CODE_ORDER!r}; this reader does not unpack it")
    for key in ("records", "rotations", "raw"):
        if not isinstance(qc.get(key), dict):
            raise ArtifactError(f"{cfg_path}: quantization_config.{key} must be an object")
    return qc


def read_tetra_dir(
    directory: str | os.PathLike[str],
    *,
    verify: bool = True,
    verify_dense: bool = False,
    check_config: bool = True,
) -> TetraDirectory:
    """Read a published Tetra directory into leechq's canonical weights.

    Args:
        directory: the directory (``config.json`` + ``model.safetensors``).
        verify: verify the bytes (see the module docstring): ``model.safetensors`` must hash to
            ``artifact_sha256``, or ``llvq-digest.json`` must cover every field of every record,
            rotation and raw tensor; a digest file that is present is always checked in full.
            ``verify=False`` skips both (the structural checks still run): for a directory whose
            origin the caller vouches for.
        verify_dense: when ``llvq-dense-digest.json`` is present, dequantize every record and
            quantized raw tensor and compare its sha256 (slow on a large model).
        check_config: check record and raw shapes against the base model config (llama family).

    Returns:
        The :class:`TetraDirectory`; its records are keyed by module path.

    Raises:
        FingerprintMismatch: a foreign ``tetra_fingerprint``, or this build's tables differ from
            the published ones.
        IncompatibleVersion: ``llvq_layout_version`` is not 1.
        ArtifactError: anything missing, truncated, inconsistent or corrupt; the message names the
            file, record and field.
    """
    root = Path(directory)
    if not root.is_dir():
        raise ArtifactError(f"{root}: not a directory")
    cfg_path = root / CONFIG_FILE
    cfg = load_json(cfg_path)
    if not isinstance(cfg, dict):
        raise ArtifactError(f"{cfg_path}: not a JSON object")
    qc = _check_header(cfg.get("quantization_config"), cfg_path)
    check_tables()

    model_path = root / MODEL_FILE
    if not model_path.is_file():
        raise ArtifactError(f"{model_path}: missing")
    has_digest = (root / DIGEST_FILE).is_file()
    if verify:
        want = qc.get("artifact_sha256")
        got = sha256_file(model_path)
        if not (isinstance(want, str) and want.lower() == got) and not has_digest:
            raise ArtifactError(
                f"{model_path}: sha256 {got} is not quantization_config.artifact_sha256 {want!r} "
                f"and no {DIGEST_FILE} vouches for the tensors: the file is corrupt or its origin "
                "cannot be verified (pass verify=False, or --no-verify, to read it unchecked)"
            )
    stored = TensorFile(model_path)
    tensors, take = stored.tensors, stored.take

    rotations: dict[str, RotationTables] = {}
    for key, desc in qc["rotations"].items():
        ctx = f"rotation {key}"
        if not isinstance(desc, dict):
            raise ArtifactError(f"{cfg_path}: {ctx} descriptor is not an object")
        n = _pos_int(desc, "n", f"{cfg_path}: {ctx}")
        m, k = split_width(n)
        seed = _seed(desc, f"{cfg_path}: {ctx}")
        if key != f"{n}_{seed:016x}" or desc.get("pow2") != m or desc.get("odd") != k:
            raise ArtifactError(f"{cfg_path}: {ctx} descriptor (n={n}, seed={seed}, "
                                f"pow2={desc.get('pow2')}, odd={desc.get('odd')}) disagrees with "
                                f"its key or with n = {m}·{k}")
        signs = take(f"{ROTATION_PREFIX}{key}.signs", torch.float64, (n,), ctx).numpy().copy()
        small = take(f"{ROTATION_PREFIX}{key}.small", torch.float64, (k, k), ctx).numpy().copy()
        if not np.all(np.abs(signs) == 1.0):
            raise ArtifactError(f"{model_path}: {ctx} signs are not all ±1")
        if k > 1 and np.abs(small @ small.T - np.eye(k)).max() > 1e-9:
            raise ArtifactError(f"{model_path}: {ctx} small (Q_odd) is not orthogonal")
        rotations[key] = RotationTables(n=n, seed=seed, signs=signs, small=small)

    records: dict[str, QuantizedWeight | Int4Weight] = {}
    for rec_name, desc in qc["records"].items():
        ctx = f"record {rec_name}"
        where = f"{cfg_path}: {ctx}"
        if not isinstance(desc, dict):
            raise ArtifactError(f"{where}: descriptor is not an object")
        prefix = desc.get("prefix")
        if not isinstance(prefix, str) or rec_name != f"{prefix}.weight":
            raise ArtifactError(f"{where}: prefix {prefix!r} is not the record name minus .weight")
        if prefix.startswith(ROTATION_PREFIX[:-1]):
            raise ArtifactError(f"{where}: prefix uses the reserved name 'llvq'")
        d_out, d_in = _pos_int(desc, "d_out", where), _pos_int(desc, "d_in", where)
        kind = desc.get("kind")
        if kind == TETRA_KIND:
            records[prefix] = _read_tetra_record(desc, d_out, d_in, prefix, where, ctx, stored,
                                                 rotations)
        elif kind == INT4_KIND:
            group = _pos_int(desc, "group", where, minimum=2)
            gpr = -(-d_in // group)
            if desc.get("bits") != 4 or desc.get("groups_per_row") != gpr or d_in % 2:
                raise ArtifactError(f"{where}: int4 descriptor is inconsistent (bits "
                                    f"{desc.get('bits')!r}, groups_per_row "
                                    f"{desc.get('groups_per_row')!r} for d_in {d_in}, group "
                                    f"{group}; d_in must be even)")
            try:
                records[prefix] = Int4Weight(
                    d_out=d_out, d_in=d_in, group=group,
                    qweight=take(f"{prefix}.qweight", torch.uint8, (d_out, d_in // 2), ctx),
                    scales=take(f"{prefix}.scales", torch.float16, (d_out, gpr), ctx),
                    biases=take(f"{prefix}.biases", torch.float16, (d_out, gpr), ctx),
                )
            except InvalidInput as exc:
                raise ArtifactError(f"{model_path}: {ctx}: {exc}") from exc
        else:
            raise ArtifactError(f"{where}: unknown kind {kind!r} (expected {TETRA_KIND!r} or "
                                f"{INT4_KIND!r})")

    raw: dict[str, RawValue] = {}
    for name, desc in qc["raw"].items():
        ctx = f"raw tensor {name}"
        raw[name] = _read_raw(name, desc, f"{cfg_path}: {ctx}", ctx, take)

    stored.check_all_taken(CONFIG_FILE)
    if check_config:
        base = {k: v for k, v in cfg.items() if k != "quantization_config"}
        _check_against_config(
            base,
            {n: (r.d_out, r.d_in) for n, r in records.items()},
            {n: _raw_dims(v) for n, v in raw.items()},
            str(cfg_path), ArtifactError, complete=False,
        )
    files = {
        p.name: p.read_bytes()
        for p in sorted(root.iterdir())
        if p.is_file() and p.name not in _RESERVED_FILES and not p.name.startswith(".")
    }
    out = TetraDirectory(path=root, config=cfg, records=records, raw=raw, files=files)
    check_record_magnitudes(out.records, str(model_path))
    if verify and has_digest:
        _verify_field_digests(out, load_json(root / DIGEST_FILE), root / DIGEST_FILE, tensors)
    if verify_dense and (root / DENSE_DIGEST_FILE).is_file():
        _verify_dense(out, load_json(root / DENSE_DIGEST_FILE), root / DENSE_DIGEST_FILE)
    return out


def _read_tetra_record(
    desc: Mapping[str, Any], d_out: int, d_in: int, prefix: str, where: str, ctx: str,
    stored: TensorFile, rotations: Mapping[str, RotationTables],
) -> QuantizedWeight:
    take, model_path = stored.take, stored.path
    nblocks, tail_cols = d_in // BLOCK, d_in % BLOCK
    if desc.get("index_bits") != INDEX_BITS or desc.get("gain_bits") != GAIN_BITS \
            or desc.get("n_centroids") != 1 << GAIN_BITS:
        raise ArtifactError(f"{where}: only {INDEX_BITS}+{GAIN_BITS}-bit Tetra records with "
                            f"{1 << GAIN_BITS} centroids exist, got index_bits "
                            f"{desc.get('index_bits')!r}, gain_bits {desc.get('gain_bits')!r}, "
                            f"n_centroids {desc.get('n_centroids')!r}")
    # The stream first: its length must be whole words before any size is compared.
    key = f"{prefix}.codes"
    stream = stored.tensors.get(key)
    if stream is None:
        raise ArtifactError(f"{model_path} ({ctx}): missing tensor {key!r}")
    if stream.dtype != torch.uint8 or stream.dim() != 1:
        raise ArtifactError(f"{model_path} ({ctx}): {key!r} must be a 1-D U8 stream, got "
                            f"{stream.dtype} {list(stream.shape)}")
    try:
        words = words_from_disk_bytes(stream)
    except ArtifactError as exc:
        raise ArtifactError(f"{model_path} ({ctx}): {key}: {exc}") from exc
    code_bytes = _WORD_BYTES * d_out * nblocks
    if desc.get("nblocks") != nblocks or desc.get("tail_cols") != tail_cols \
            or desc.get("code_bytes") != code_bytes:
        raise ArtifactError(f"{where}: descriptor sizes (nblocks {desc.get('nblocks')!r}, "
                            f"tail_cols {desc.get('tail_cols')!r}, code_bytes "
                            f"{desc.get('code_bytes')!r}) disagree with {d_out}x{d_in}: expected "
                            f"{nblocks}, {tail_cols}, {code_bytes}")
    stream = take(key, torch.uint8, (code_bytes,), ctx)
    labels, gains = labels_gains_from_words(words)
    rot_key = desc.get("rotation")
    rot = None
    if rot_key is not None:
        if rot_key not in rotations:
            raise ArtifactError(f"{where}: names rotation {rot_key!r}, which the file lacks")
        rot = rotations[rot_key]
        if rot.n != d_in:
            raise ArtifactError(f"{where}: rotation {rot_key} has width {rot.n}, d_in is {d_in}")
    tail = (take(f"{prefix}.tail", torch.float32, (d_out, tail_cols), ctx) if tail_cols
            else torch.zeros(d_out, 0, dtype=torch.float32))
    try:
        return QuantizedWeight(
            codebook="tetra", d_out=d_out, d_in=d_in,
            labels=labels.reshape(d_out, nblocks),
            gains=gains.to(torch.uint8).reshape(d_out, nblocks),
            row_scales=take(f"{prefix}.row_scales", torch.float64, (d_out,), ctx),
            centroids=take(f"{prefix}.centroids", torch.float64, (1 << GAIN_BITS,), ctx),
            tail=tail, rotation=rot,
        )
    except InvalidInput as exc:
        raise ArtifactError(f"{model_path}: {ctx}: {exc}") from exc


def _read_raw(
    name: str, desc: Any, where: str, ctx: str, take: Callable[..., torch.Tensor]
) -> RawValue:
    if not isinstance(desc, dict):
        raise ArtifactError(f"{where}: descriptor is not an object")
    dims = desc.get("dims")
    if not isinstance(dims, list) or not dims or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims
    ):
        raise ArtifactError(f"{where}: invalid dims {dims!r}")
    enc = desc.get("encoding")
    if enc == "f16":
        if desc.get("tensor", name) != name:
            raise ArtifactError(f"{where}: descriptor names tensor {desc.get('tensor')!r}")
        t: torch.Tensor = take(name, torch.float16, tuple(dims), ctx)
        return t
    if enc == "quant":
        bits, group = desc.get("bits"), _pos_int(desc, "group", where, minimum=2)
        rows, cols = math.prod(dims[:-1]), dims[-1]
        gpr = -(-cols // group)
        prefix = name.removesuffix(".weight")
        if (bits not in (4, 8) or desc.get("prefix") != prefix or desc.get("rows") != rows
                or desc.get("groups_per_row") != gpr or (bits == 4 and cols % 2)):
            raise ArtifactError(f"{where}: quant descriptor is inconsistent (bits {bits!r}, prefix "
                                f"{desc.get('prefix')!r}, rows {desc.get('rows')!r}, "
                                f"groups_per_row {desc.get('groups_per_row')!r}; expected prefix "
                                f"{prefix!r}, rows {rows}, {gpr} groups, an even row at 4 bits)")
        width = cols // 2 if bits == 4 else cols
        return GroupAffine(
            dims=tuple(dims), bits=int(bits), group=group,
            qweight=take(f"{prefix}.qweight", torch.uint8, (rows, width), ctx),
            scales=take(f"{prefix}.scales", torch.float16, (rows, gpr), ctx),
            biases=take(f"{prefix}.biases", torch.float16, (rows, gpr), ctx),
        )
    raise ArtifactError(f"{where}: unknown encoding {enc!r} (expected 'f16' or 'quant')")


def _verify_field_digests(
    d: TetraDirectory, want: Any, path: Path, tensors: Mapping[str, torch.Tensor]
) -> None:
    if not isinstance(want, dict):
        raise ArtifactError(f"{path}: not a JSON object")
    recs, rots, raws = _field_digests(d.records, d.raw)
    for section, got in (("records", recs), ("rotations", rots), ("raw", raws)):
        listed = want.get(section, {})
        if not isinstance(listed, dict):
            raise ArtifactError(f"{path}: {section} is not an object")
        for name, fields in listed.items():
            if name not in got:
                raise ArtifactError(f"{path}: lists {section} entry {name!r}, which the "
                                    "directory does not hold")
            if not isinstance(fields, dict):
                raise ArtifactError(f"{path}: {section} entry {name!r} is not an object")
        for name, fields in got.items():
            if name not in listed:
                raise ArtifactError(f"{path}: does not cover {section} entry {name!r}: a digest "
                                    "file must vouch for every record, rotation and raw tensor")
            unlisted = sorted(set(fields) - set(listed[name]))
            if unlisted:
                raise ArtifactError(f"{path}: {section} {name} lacks the digest of {unlisted}")
            for fname, sha in listed[name].items():
                if fname in got[name] and got[name][fname] != sha:
                    raise ArtifactError(
                        f"{path}: {section} {name} field {fname!r} digest differs "
                        f"(file {sha}, read {got[name][fname]}): the tensors were altered or "
                        "the tables disagree"
                    )


def _verify_dense(d: TetraDirectory, want: Any, path: Path) -> None:
    if not isinstance(want, dict) or not isinstance(want.get("records"), dict):
        raise ArtifactError(f"{path}: no records map")
    art = want.get("artifact") or {}
    if art.get("sha256") != d.quantization_config.get("artifact_sha256"):
        raise ArtifactError(f"{path}: names artifact {art.get('sha256')!r}, config.json "
                            f"{d.quantization_config.get('artifact_sha256')!r}")
    got = dense_digest(d.records, d.raw)
    if set(want["records"]) != set(got["records"]):
        raise ArtifactError(f"{path}: record names differ from config.json's")
    for section in ("records", "raw"):
        for name, sha in (want.get(section) or {}).items():
            if got[section].get(name) != sha:
                raise ArtifactError(f"{path}: dense digest of {section} {name} differs (file "
                                    f"{sha}, decoded {got[section].get(name)})")

