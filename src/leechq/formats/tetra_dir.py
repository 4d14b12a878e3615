"""The published Tetra checkpoint directory (``quant_method: "llvq"``, ``llvq_layout_version`` 1).

Implements docs/format.md §5 bit for bit, in both directions, with the word conventions of
docs/codebooks.md §3.5
and the dense path of docs/format.md §2:

* :func:`read_tetra_dir` opens a directory that ``llvq-tetra`` 0.1.0 reads (``config.json`` with its
  ``quantization_config``, ``model.safetensors``, optional ``llvq-digest.json`` /
  ``llvq-dense-digest.json``) into leechq's canonical weights: one :class:`QuantizedWeight`
  (codebook ``"tetra"``, 1 gain bit) per ``kind: "tetra"`` record, one :class:`Int4Weight` per
  ``int4g128`` record, f16 tensors and :class:`GroupAffine` tables for the carried (``raw``)
  tensors, :class:`RotationTables` from the stored ``signs``/``small``.
* :func:`write_tetra_dir` writes such a directory from leechq's weights, atomically (a hidden
  temporary directory renamed into place), with both digest files, so that
  ``python -m llvq_tetra.checkdense`` accepts it and ``llvq-tetra``'s transformers quantizer loads
  it with 0 missing / 0 unexpected keys.
* :func:`artifact_to_tetra_dir` converts a leechq artifact (:mod:`leechq.formats.artifact`) whose
  lattice records all use the Tetra codebook with 1 gain bit.
* :func:`dense_digest` is the ``llvq-dense-digest.json`` content: sha256 of each dequantized f32
  matrix (little-endian, row-major) from :func:`dequantize_record`, the docs/format.md §2 path with
  a correctly rounded f64 square root (torch's CPU f64 ``sqrt`` is not, for three Tetra shells).

Names: leechq keys records by module path (``model.layers.0.self_attn.q_proj``); the file keys
them ``<module>.weight`` with ``prefix = <module>``, and stores the fields as ``<module>.codes`` and
so on (docs/format.md §5). Raw tensors keep their model names; a quantized raw tensor ``X.weight``
stores
``X.qweight/.scales/.biases``.

What a writer without the author's sealed ``.llvq`` cannot reproduce is recorded honestly:
``artifact_sha256`` is the sha256 of ``model.safetensors`` (docs/format.md §5),
``artifact_version`` is null,
``codebook_fingerprint`` (the Ball map's) is null.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from leechq._version import __version__
from leechq.codebooks.base import BLOCK
from leechq.codebooks.tetra import (
    disk_bytes_from_words,
    labels_gains_from_words,
    words_from_disk_bytes,
    words_from_labels_gains,
)
from leechq.codebooks.tetra_tables import FINGERPRINT, LABEL_BITS, PUBLISHED_DIGESTS, tetra_tables
from leechq.errors import (
    ArtifactError,
    FingerprintMismatch,
    IncompatibleVersion,
    InvalidInput,
    LeechqError,
)
from leechq.formats.artifact import (
    CONFIG_FILE,
    MANIFEST_FILE,
    MODEL_FILE,
    Artifact,
    GroupAffine,
    _expect,
    _fsync_write,
    _parse_header,
    _sha256,
    read_artifact,
)
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import RotationTables, apply_rotation_transpose, split_width

QUANT_METHOD = "llvq"
LAYOUT_VERSION = 1
CODE_ORDER = "msb_first_dense"
DIGEST_FILE = "llvq-digest.json"
DENSE_DIGEST_FILE = "llvq-dense-digest.json"
ROTATION_PREFIX = "llvq.rotations."
TETRA_KIND = "tetra"
INT4_KIND = "int4g128"
INDEX_BITS = LABEL_BITS
GAIN_BITS = 1
INT4_RECORD_GROUP = 128
SHELL_CAP = 12
"""Legacy descriptor field the published writer emits and no reader uses (docs/format.md §5)."""

DENSE_CONVENTION = "sha256 over the dequantized f32 values, little-endian, row-major"
FIELD_CONVENTION = "sha256 over little-endian bit patterns, in the order the field stores them"
_RESERVED_FILES = (CONFIG_FILE, MODEL_FILE, DIGEST_FILE, DENSE_DIGEST_FILE)
_WORD_BYTES = (INDEX_BITS + GAIN_BITS) // 8

RawValue = torch.Tensor | GroupAffine
"""A carried tensor: an f16 tensor (``encoding: "f16"``) or a group-affine table (``"quant"``)."""


# --------------------------------------------------------------------------------------------------
# the in-memory directory


@dataclass
class TetraDirectory:
    """What :func:`read_tetra_dir` returns.

    Attributes:
        path: the directory read (None for one built in memory).
        config: the whole ``config.json`` (base model config + ``quantization_config``).
        records: module path → :class:`QuantizedWeight` (codebook "tetra", 2 centroids) or
            :class:`Int4Weight` (group 128).
        raw: tensor name → float16 tensor of its dims, or :class:`GroupAffine` (4-bit in the
            published file; 8-bit is legal in the format but ``llvq-tetra`` cannot read it).
        files: further files of the directory (tokenizer, ...) name → bytes.
    """

    path: Path | None
    config: dict[str, Any]
    records: dict[str, QuantizedWeight | Int4Weight]
    raw: dict[str, RawValue] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def quantization_config(self) -> dict[str, Any]:
        """The ``quantization_config`` block."""
        qc: dict[str, Any] = self.config["quantization_config"]
        return qc

    @property
    def base_config(self) -> dict[str, Any]:
        """``config.json`` without its ``quantization_config``."""
        return {k: v for k, v in self.config.items() if k != "quantization_config"}

    def dense_state_dict(self) -> dict[str, torch.Tensor]:
        """Every tensor dense as ``llvq-tetra`` materializes it: records as ``<module>.weight`` f32
        (docs/format.md §2, §5 arithmetic), raw tensors as f32 of their dims (f16 widened
        exactly)."""
        out = {f"{name}.weight": dequantize_record(rec) for name, rec in self.records.items()}
        for name, value in self.raw.items():
            out[name] = dense_raw(value)
        return out


def _sqrt_f64(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded f64 square root (numpy's IEEE ``sqrt``).

    torch 2.13's CPU f64 ``sqrt`` is 1 ulp off for some inputs, among them three Tetra norms:
    ``sqrt(32)``, ``sqrt(128)``, ``sqrt(304)`` (shells 2, 8, 19). The reference decoders (Rust
    ``f64::sqrt``, llvq-tetra's ``np.sqrt``) round correctly, so the dense path must too.
    """
    return torch.from_numpy(np.sqrt(x.detach().cpu().numpy()))


def dequantize_record_f64(rec: QuantizedWeight) -> torch.Tensor:
    """The f64 matrix [d_out, d_in] of a Tetra record in the natural basis, before the narrowing.

    docs/format.md §2 steps 1–3: per block ``scale = (centroid[g]·row_scale[i]) /
    sqrt(f64(‖y‖²))`` and ``w_j = f64(y_j)·scale`` (origin → 0), the f32 tail widened, then the rows
    un-rotated in f64 (``Qᵀ``).
    """
    pts = rec.points().to(torch.float64).cpu()
    n2 = (pts * pts).sum(dim=-1)  # exact: integers ≤ 416
    picked = rec.centroids[rec.gains.long()] * rec.row_scales[:, None]
    live = n2 > 0
    scale = torch.where(live, picked / torch.where(live, _sqrt_f64(n2), 1.0), 0.0)
    w = torch.empty(rec.d_out, rec.d_in, dtype=torch.float64)
    w[:, : rec.n_blocks * BLOCK] = (pts * scale[..., None]).reshape(rec.d_out, -1)
    w[:, rec.n_blocks * BLOCK :] = rec.tail.to(torch.float64)
    if rec.rotation is not None:
        w = apply_rotation_transpose(w, rec.rotation)
    return w


def dequantize_record(rec: QuantizedWeight | Int4Weight) -> torch.Tensor:
    """The dense f32 matrix [d_out, d_in] exactly as docs/format.md §2, §5 define it.

    Tetra records: :func:`dequantize_record_f64` narrowed to f32 once. Int4:
    ``f32(scale)·f32(q) + f32(bias)``. Bit-identical to ``llvq_tetra.PackedModel.dequantize``
    (tested). :meth:`QuantizedWeight.dequantize` is the same recipe but divides by torch's ``sqrt``
    (see :func:`_sqrt_f64`), so its f64 values differ by an ulp on three shells.
    """
    if isinstance(rec, Int4Weight):
        return rec.dequantize(torch.float32)
    return dequantize_record_f64(rec).to(torch.float32)


def dense_raw(value: RawValue) -> torch.Tensor:
    """A carried tensor as f32 of its dims: f16 widened exactly, group-affine dequantized."""
    if isinstance(value, GroupAffine):
        return value.dequantize(torch.float32)
    return value.to(torch.float32)


def _f32_sha(t: torch.Tensor) -> str:
    arr = np.ascontiguousarray(t.detach().cpu().numpy(), dtype="<f4")
    return hashlib.sha256(arr.tobytes()).hexdigest()


def _bits_sha(t: torch.Tensor | np.ndarray, dtype: str) -> str:
    """sha256 of the little-endian bit patterns, C order (the ``llvq-digest.json`` convention)."""
    arr = t.detach().cpu().contiguous().numpy() if isinstance(t, torch.Tensor) else t
    return hashlib.sha256(np.ascontiguousarray(arr, dtype=dtype).tobytes()).hexdigest()


def _f16_bits(t: torch.Tensor) -> np.ndarray:
    """The uint16 bit patterns of a float16 tensor."""
    return t.detach().cpu().contiguous().view(torch.int16).numpy().view(np.uint16)


def dense_digest(
    records: Mapping[str, QuantizedWeight | Int4Weight], raw: Mapping[str, RawValue]
) -> dict[str, dict[str, str]]:
    """The ``records`` and ``raw`` maps of ``llvq-dense-digest.json`` (docs/format.md §5).

    Args:
        records: module path → record; digested under ``<module>.weight``.
        raw: tensor name → carried tensor; only group-affine ones are digested (f16 ones are not,
            as in the published file).

    Returns:
        ``{"records": {name: sha256 hex}, "raw": {name: sha256 hex}}`` over the f32 values,
        little-endian, row-major.
    """
    return {
        "records": {f"{n}.weight": _f32_sha(dequantize_record(r)) for n, r in records.items()},
        "raw": {n: _f32_sha(v.dequantize(torch.float32)) for n, v in raw.items()
                if isinstance(v, GroupAffine)},
    }


# --------------------------------------------------------------------------------------------------
# shapes implied by the base config (llama family; formats may not import leechq.models)

_LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")


def expected_shapes(base_config: Mapping[str, Any]) -> dict[str, tuple[int, ...]] | None:
    """Parameter shapes a transformers model of this config has, or None for an unknown family.

    Covers the decoder families leechq quantizes (Llama, Mistral, Qwen2, Qwen3): the seven
    projections of each block (``<module>`` → ``(out, in)``), and the dense tensors
    (``<name>`` → dims): embedding, norms (Qwen3's per-head ``q_norm``/``k_norm``), q/k/v biases
    (Qwen2, or ``attention_bias``), and the head when it is not tied.
    """
    mt = base_config.get("model_type")
    if mt not in _LLAMA_FAMILY:
        return None
    try:
        hidden = int(base_config["hidden_size"])
        inter = int(base_config["intermediate_size"])
        n_heads = int(base_config["num_attention_heads"])
        n_kv = int(base_config.get("num_key_value_heads") or n_heads)
        layers = int(base_config["num_hidden_layers"])
        vocab = int(base_config["vocab_size"])
        head_dim = int(base_config.get("head_dim") or hidden // n_heads)
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"base config of model_type {mt!r} lacks a size field: {exc}") from exc
    q_out, kv_out = n_heads * head_dim, n_kv * head_dim
    qkv_bias = mt == "qwen2" or bool(base_config.get("attention_bias", False))
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
    }
    if not base_config.get("tie_word_embeddings", False):
        out["lm_head"] = (vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}"
        for proj, shape in (
            ("self_attn.q_proj", (q_out, hidden)),
            ("self_attn.k_proj", (kv_out, hidden)),
            ("self_attn.v_proj", (kv_out, hidden)),
            ("self_attn.o_proj", (hidden, q_out)),
            ("mlp.gate_proj", (inter, hidden)),
            ("mlp.up_proj", (inter, hidden)),
            ("mlp.down_proj", (hidden, inter)),
        ):
            out[f"{p}.{proj}"] = shape
        out[f"{p}.input_layernorm.weight"] = (hidden,)
        out[f"{p}.post_attention_layernorm.weight"] = (hidden,)
        if mt == "qwen3":
            out[f"{p}.self_attn.q_norm.weight"] = (head_dim,)
            out[f"{p}.self_attn.k_norm.weight"] = (head_dim,)
        if qkv_bias:
            out[f"{p}.self_attn.q_proj.bias"] = (q_out,)
            out[f"{p}.self_attn.k_proj.bias"] = (kv_out,)
            out[f"{p}.self_attn.v_proj.bias"] = (kv_out,)
    return out


def _check_against_config(
    base_config: Mapping[str, Any],
    record_shapes: Mapping[str, tuple[int, int]],
    raw_dims: Mapping[str, tuple[int, ...]],
    where: str,
    err: type[LeechqError],
    complete: bool,
) -> None:
    """Records must be linear layers of the configured model with its shapes; known raw tensors
    must have their dims; with ``complete``, every weight of the model must be present."""
    expect = expected_shapes(base_config)
    if expect is None:
        return
    mt = base_config.get("model_type")
    for name, shape in record_shapes.items():
        want = expect.get(name)
        if want is None or len(want) != 2 or name.endswith((".weight", ".bias")):
            raise err(f"{where}: record {name} names no linear layer of this {mt} config")
        if tuple(shape) != want:
            raise err(
                f"{where}: record {name} is {shape[0]}x{shape[1]} (d_out x d_in) but the "
                f"{mt} config gives {want[0]}x{want[1]}"
            )
    for name, dims in raw_dims.items():
        want = expect.get(name) or expect.get(name.removesuffix(".weight"))
        if want is not None and tuple(dims) != want:
            raise err(f"{where}: raw tensor {name} has dims {list(dims)}, the {mt} config "
                      f"gives {list(want)}")
    if complete:
        have = set(record_shapes) | set(raw_dims) | {n.removesuffix(".weight") for n in raw_dims}
        missing = sorted(n for n in expect if n not in have)
        if missing:
            raise err(f"{where}: the {mt} config needs {len(missing)} tensor(s) that are neither "
                      f"a record nor a raw tensor, e.g. {missing[:4]}")


# --------------------------------------------------------------------------------------------------
# reading


def check_tables() -> None:
    """Refuse to decode when this build's Tetra tables are not the published map.

    Raises:
        FingerprintMismatch: a rebuilt table's sha256 differs from the published digest
            (docs/codebooks.md §3.6).
    """
    got = tetra_tables().digests()
    bad = sorted(n for n, want in PUBLISHED_DIGESTS.items() if got.get(n) != want)
    if bad:
        raise FingerprintMismatch(
            f"this build's Tetra tables {bad} differ from the published digests (docs/codebooks.md "
            "§3.6): its labels would decode to different points than llvq-tetra's"
        )


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ArtifactError(f"{path}: missing") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: unreadable or not JSON: {exc}") from exc


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
    """Validate the ``quantization_config`` constants (docs/format.md §5) before reading tensors."""
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
    verify_digests: bool = True,
    verify_dense: bool = False,
    check_config: bool = True,
) -> TetraDirectory:
    """Read a published Tetra directory into leechq's canonical weights.

    Args:
        directory: the directory (``config.json`` + ``model.safetensors``).
        verify_digests: when ``llvq-digest.json`` is present, check every field digest it lists
            (codes, labels, gains, scales, centroids, tails, int4 fields, rotation tables, raw).
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
    cfg = _load_json(cfg_path)
    if not isinstance(cfg, dict):
        raise ArtifactError(f"{cfg_path}: not a JSON object")
    qc = _check_header(cfg.get("quantization_config"), cfg_path)
    check_tables()

    model_path = root / MODEL_FILE
    if not model_path.is_file():
        raise ArtifactError(f"{model_path}: missing")
    header = _parse_header(model_path)
    try:
        from safetensors.torch import load_file

        tensors = load_file(str(model_path))
    except Exception as exc:  # safetensors raises its own types; name the file
        raise ArtifactError(f"{model_path}: unreadable safetensors: {exc}") from exc
    used: set[str] = set()

    def take(key: str, dtype: torch.dtype, shape: tuple[int, ...], ctx: str) -> torch.Tensor:
        t = _expect(tensors, key, dtype, shape, f"{model_path} ({ctx})")
        used.add(key)
        return t

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
            records[prefix] = _read_tetra_record(desc, d_out, d_in, prefix, where, ctx, take,
                                                 tensors, rotations, model_path)
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

    extra = sorted(k for k in header if k != "__metadata__" and k not in used)
    if extra:
        raise ArtifactError(f"{model_path}: {len(extra)} tensor(s) not described by "
                            f"config.json, e.g. {extra[:4]}")
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
    if verify_digests and (root / DIGEST_FILE).is_file():
        _verify_field_digests(out, _load_json(root / DIGEST_FILE), root / DIGEST_FILE, tensors)
    if verify_dense and (root / DENSE_DIGEST_FILE).is_file():
        _verify_dense(out, _load_json(root / DENSE_DIGEST_FILE), root / DENSE_DIGEST_FILE)
    return out


def _read_tetra_record(
    desc: Mapping[str, Any], d_out: int, d_in: int, prefix: str, where: str, ctx: str,
    take: Any, tensors: Mapping[str, torch.Tensor], rotations: Mapping[str, RotationTables],
    model_path: Path,
) -> QuantizedWeight:
    nblocks, tail_cols = d_in // BLOCK, d_in % BLOCK
    if desc.get("index_bits") != INDEX_BITS or desc.get("gain_bits") != GAIN_BITS \
            or desc.get("n_centroids") != 1 << GAIN_BITS:
        raise ArtifactError(f"{where}: only {INDEX_BITS}+{GAIN_BITS}-bit Tetra records with "
                            f"{1 << GAIN_BITS} centroids exist, got index_bits "
                            f"{desc.get('index_bits')!r}, gain_bits {desc.get('gain_bits')!r}, "
                            f"n_centroids {desc.get('n_centroids')!r}")
    # The stream first: its length must be whole words before any size is compared.
    key = f"{prefix}.codes"
    stream = tensors.get(key)
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


def _raw_dims(value: RawValue) -> tuple[int, ...]:
    return tuple(value.dims) if isinstance(value, GroupAffine) else tuple(value.shape)


def _read_raw(name: str, desc: Any, where: str, ctx: str, take: Any) -> RawValue:
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


def _field_digests(
    records: Mapping[str, QuantizedWeight | Int4Weight], raw: Mapping[str, RawValue],
) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """Per-field sha256 (``llvq-digest.json`` convention) of records, rotations and raw tensors."""
    recs: dict[str, dict[str, str]] = {}
    rots: dict[str, dict[str, str]] = {}
    for name, rec in records.items():
        if isinstance(rec, QuantizedWeight):
            words = words_from_labels_gains(rec.labels.reshape(-1), rec.gains.reshape(-1))
            d = {
                "codes": _bits_sha(disk_bytes_from_words(words), "u1"),
                "indices": _bits_sha(rec.labels.reshape(-1), "<u8"),
                "gains": _bits_sha(rec.gains.reshape(-1), "<u4"),
                "row_scales": _bits_sha(rec.row_scales, "<f8"),
                "centroids": _bits_sha(rec.centroids, "<f8"),
            }
            if rec.tail_cols:
                d["tail"] = _bits_sha(rec.tail, "<f4")
            recs[f"{name}.weight"] = d
            if rec.rotation is not None:
                rots[_rotation_key(rec.rotation)] = {
                    "signs": _bits_sha(rec.rotation.signs, "<f8"),
                    "small": _bits_sha(rec.rotation.small, "<f8"),
                }
        else:
            recs[f"{name}.weight"] = {
                "qweight": _bits_sha(rec.qweight, "u1"),
                "scales": _bits_sha(_f16_bits(rec.scales), "<u2"),
                "biases": _bits_sha(_f16_bits(rec.biases), "<u2"),
            }
    raws: dict[str, dict[str, str]] = {}
    for name, value in raw.items():
        if isinstance(value, GroupAffine):
            raws[name] = {
                "qweight": _bits_sha(value.qweight, "u1"),
                "scales": _bits_sha(_f16_bits(value.scales), "<u2"),
                "biases": _bits_sha(_f16_bits(value.biases), "<u2"),
            }
        else:
            raws[name] = {"values": _bits_sha(_f16_bits(value), "<u2")}
    return recs, rots, raws


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
            for fname, sha in (fields or {}).items():
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


# --------------------------------------------------------------------------------------------------
# writing


def _rotation_key(rot: RotationTables) -> str:
    return f"{rot.n}_{rot.seed:016x}"


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
    """The safetensors dict and the ``records`` / ``rotations`` / ``raw`` descriptors
    (docs/format.md §5).

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
    tensors: dict[str, torch.Tensor] = {}
    rec_desc: dict[str, Any] = {}
    rot_desc: dict[str, Any] = {}
    raw_desc: dict[str, Any] = {}
    rot_tables: dict[str, RotationTables] = {}

    def put(key: str, t: torch.Tensor) -> None:
        if key in tensors:
            raise InvalidInput(f"tensor name {key!r} would be written twice")
        tensors[key] = t.detach().cpu().contiguous().clone()

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
                rot_key = _rotation_key(rec.rotation)
                prev = rot_tables.setdefault(rot_key, rec.rotation)
                if prev is not rec.rotation and not (
                    np.array_equal(prev.signs, rec.rotation.signs)
                    and np.array_equal(prev.small, rec.rotation.small)
                ):
                    raise InvalidInput(f"record {name}: two different rotation tables share the "
                                       f"key {rot_key}")
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
    for key, rot in sorted(rot_tables.items()):
        m, k = split_width(rot.n)
        put(f"{ROTATION_PREFIX}{key}.signs", torch.from_numpy(np.array(rot.signs, dtype="<f8")))
        put(f"{ROTATION_PREFIX}{key}.small", torch.from_numpy(np.array(rot.small, dtype="<f8")))
        rot_desc[key] = {"seed": str(rot.seed), "n": rot.n, "pow2": m, "odd": k}

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
    return tensors, rec_desc, rot_desc, raw_desc, dict(records), norm_raw


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
    if dest.exists() and not overwrite:
        raise ArtifactError(f"{dest} already exists (pass overwrite=True to replace it)")
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

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        from safetensors.torch import save_file

        save_file(tensors, str(tmp / MODEL_FILE), metadata={"format": "pt"})
        model_sha = _sha256(tmp / MODEL_FILE)
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
        if dest.exists():
            old = dest.parent / f".{dest.name}.old-{os.getpid()}"
            os.replace(dest, old)
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)  # the commit point
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


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
        InvalidInput: a Ball-coded record, a gain width other than 1 bit, an 8-bit raw table, a
            raw tensor that f16 cannot hold exactly (without ``allow_lossy_raw``).
    """
    art = source if isinstance(source, Artifact) else read_artifact(source)
    if art.quant_config.codebook != "tetra" or art.quant_config.gain_bits != GAIN_BITS:
        raise InvalidInput(
            f"artifact {art.path} is coded with codebook {art.quant_config.codebook!r} and "
            f"{art.quant_config.gain_bits} gain bit(s); the Tetra format carries only "
            f"Tetra-coded records with {GAIN_BITS} gain bit. Ball-coded weights have no Tetra "
            "word: re-quantize with codebook='tetra', gain_bits=1"
        )
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


__all__ = [
    "CODE_ORDER",
    "DENSE_DIGEST_FILE",
    "DIGEST_FILE",
    "LAYOUT_VERSION",
    "QUANT_METHOD",
    "TetraDirectory",
    "artifact_to_tetra_dir",
    "build_tetra_tensors",
    "check_tables",
    "dense_digest",
    "dense_raw",
    "dequantize_record",
    "dequantize_record_f64",
    "expected_shapes",
    "read_tetra_dir",
    "tetra_dir_summary",
    "write_tetra_dir",
]
