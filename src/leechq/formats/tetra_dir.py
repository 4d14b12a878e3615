"""The published Tetra checkpoint directory (``quant_method: "llvq"``, ``llvq_layout_version`` 1).

Implements the published Tetra directory format (docs/format.md §5, word conventions in
docs/codebooks.md) bit for bit, in both directions, with the dense path of docs/format.md
§2. This module holds the format model (constants, :class:`TetraDirectory`,
the dequantization and digest conventions, the shapes a base config implies); the jobs live in

* :mod:`leechq.formats.tetra_read` — ``read_tetra_dir`` opens a directory that ``llvq-tetra`` 0.1.0
  reads (``config.json`` with its ``quantization_config``, ``model.safetensors``, optional
  ``llvq-digest.json`` / ``llvq-dense-digest.json``) into leechq's canonical weights: one
  :class:`QuantizedWeight` (codebook ``"tetra"``, 1 gain bit) per ``kind: "tetra"`` record, one
  :class:`Int4Weight` per ``int4g128`` record, f16 tensors and :class:`GroupAffine` tables for the
  carried (``raw``) tensors, :class:`RotationTables` from the stored ``signs``/``small``; it
  verifies the bytes (docs/integrity.md);
* :mod:`leechq.formats.tetra_write` — ``write_tetra_dir`` writes such a directory from leechq's
  weights, atomically (a hidden temporary directory renamed into place), with both digest files,
  so that ``python -m llvq_tetra.checkdense`` accepts it and ``llvq-tetra``'s transformers
  quantizer loads it with 0 missing / 0 unexpected keys; ``artifact_to_tetra_dir`` converts a
  leechq artifact whose lattice records all use the Tetra codebook with 1 gain bit.

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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from leechq.codebooks.base import BLOCK
from leechq.codebooks.tetra import (
    disk_bytes_from_words,
    words_from_labels_gains,
)
from leechq.codebooks.tetra_tables import LABEL_BITS
from leechq.errors import (
    ArtifactError,
    LeechqError,
)
from leechq.formats.artifact import (
    CONFIG_FILE,
    MODEL_FILE,
    GroupAffine,
    _rotation_key,
)
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import apply_rotation_transpose

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


def _raw_dims(value: RawValue) -> tuple[int, ...]:
    return tuple(value.dims) if isinstance(value, GroupAffine) else tuple(value.shape)


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
