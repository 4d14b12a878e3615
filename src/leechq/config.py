"""The resolved quantization configuration, recorded inside every artifact.

Implements the configuration side of docs/quantizer.md §1 (the recipe table) and pitfalls P4 ("name
and log the resolved configuration") / P14 (record the full resolved configuration in the artifact)
of docs/quantizer.md §9.
:class:`QuantConfig` is a frozen dataclass: what a run does is exactly what ``to_dict()`` says, and
a resumed run refuses to continue under a configuration whose :meth:`QuantConfig.digest` differs
(P12).

This module is importable without torch (``import leechq.config`` stays lean).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from leechq.errors import IncompatibleVersion, InvalidInput

SCHEMA_VERSION = 1
"""Version of the serialized :class:`QuantConfig` (and of the artifact's
``quantization_config``)."""

BASE_ROTATION_SEED = 0x110FEED
"""Base seed of the incoherence rotation (docs/quantizer.md §3); effective seeds are derived per
(block, activation) and stored per matrix."""

TAIL_POLICIES = ("keep_exact", "refuse")
DEVICES = ("auto", "cpu", "cuda")
PROPAGATIONS = ("auto", "exact", "lazy")
DTYPES = ("float32", "float64", "bfloat16", "float16")
HESSIAN_DTYPES = ("float32", "float64")
RAW_ENCODINGS = ("keep", "int8", "int4", "lattice")
"""Encodings of the token embedding (and an untied head, for the group-affine ones)."""
CONTROL_CODEBOOKS = ("identity", "scalar-round")
"""Codebook names that select a control quantizer (docs/quantizer.md §5 controls); they write no
artifact."""


@dataclass(frozen=True)
class QuantConfig:
    """Everything that determines a quantized artifact (given the model and calibration tokens).

    Attributes:
        codebook: direction codebook name in :mod:`leechq.codebooks` ("ball" or "tetra").
        gain_bits: gain bits per 24-block (0, 1 or 2): ``2**gain_bits`` per-matrix centroids
            relative to the frozen row scale (docs/codebooks.md §1, docs/quantizer.md §4). 0 bits is
            one constant per matrix.
        centroid_iters: Lloyd–Max iterations for the gain centroids (40 in the reference).
        damping: relative Hessian damping λ: ``H + λ·mean(diag H)·I`` (docs/quantizer.md §2).
        rotate: apply the input-side incoherence rotation (docs/quantizer.md §3).
        rotation_seed: base seed; effective seed = ``base ⊕ (block << 32) ⊕ (act << 16)``.
        error_feedback: GPTQ error propagation (False = plain rounding with the same codebook).
        propagation: how the error feedback is applied: "exact" (element-wise, row-batch
            invariant, bit-reproducible), "lazy" (GPTQ's lazy batch updates with matrix products;
            equal to "exact" up to rounding, several times faster) or "auto" (exact on the CPU,
            lazy on accelerators).
        calib_windows: number of calibration windows (64 in the reference).
        calib_window_len: tokens per window (2048 in the reference).
        calib_batch: windows pushed through a block per forward call (numerics only).
        tail_policy: "keep_exact" (d_in mod 24 columns kept as f32 in the rotated basis,
        docs/quantizer.md §6) or
            "refuse" (a ragged width is an error).
        device: "auto" (CUDA when present, else CPU), "cpu" or "cuda".
        dtype: compute dtype of the blocks during calibration ("float32" in the reference).
        hessian_dtype: accumulation dtype of the Hessians ("float32" on the device in the
        reference).
        int4_modules: module-name suffixes (e.g. "self_attn.v_proj") kept as int4 g128 instead of
            the lattice (docs/quantizer.md §7); may be qualified by layer as
            "layers.12.mlp.down_proj".
        int4_group: int4 group size along the row.
        int4_gptq: GPTQ-compensate int4 matrices (False = round-to-nearest of the original tensor,
            as the published recipe does).
        embedding_encoding: "keep" (as stored in the checkpoint), "int8" or "int4" group-affine for
            the token embedding and an untied head (docs/format.md §3), or "lattice": an untied
            token embedding coded on the lattice like a projection with an identity Hessian
            (``leechq.quant.embedding``; the head is kept as stored, a tied table is refused).
        embedding_group: group size of the group-affine embedding encoding.
        lattice_head: code an untied output head on the lattice like a projection, with the
            Hessian of its inputs (the final norm's output), as one more block after the last
            decoder layer (:mod:`leechq.models.head`); False keeps it as ``embedding_encoding``
            says. A tied head is refused.
        calibration: free-form provenance of the calibration text (dataset, revision, split).
    """

    codebook: str = "ball"
    gain_bits: int = 1
    centroid_iters: int = 40
    damping: float = 0.01
    rotate: bool = True
    rotation_seed: int = BASE_ROTATION_SEED
    error_feedback: bool = True
    propagation: str = "auto"
    calib_windows: int = 64
    calib_window_len: int = 2048
    calib_batch: int = 4
    tail_policy: str = "keep_exact"
    device: str = "auto"
    dtype: str = "float32"
    hessian_dtype: str = "float32"
    int4_modules: tuple[str, ...] = ()
    int4_group: int = 128
    int4_gptq: bool = False
    embedding_encoding: str = "keep"
    embedding_group: int = 64
    lattice_head: bool = False
    calibration: str = ""
    schema_version: int = field(default=SCHEMA_VERSION)

    def __post_init__(self) -> None:
        # Tuples survive JSON as lists: normalize so that equality and hashing are stable.
        object.__setattr__(self, "int4_modules", tuple(self.int4_modules))
        self.validate()

    def validate(self) -> None:
        """Raise :class:`InvalidInput` naming the first bad field."""
        checks: list[tuple[bool, str]] = [
            (isinstance(self.codebook, str) and bool(self.codebook), "codebook must be a name"),
            (self.gain_bits in (0, 1, 2), f"gain_bits must be 0, 1 or 2, got {self.gain_bits!r}"),
            (
                _is_int(self.centroid_iters) and self.centroid_iters >= 0,
                "centroid_iters must be >= 0",
            ),
            (
                isinstance(self.damping, (int, float)) and 0.0 < float(self.damping) < 1.0,
                f"damping must be in (0, 1), got {self.damping!r}",
            ),
            (isinstance(self.rotate, bool), "rotate must be a bool"),
            (
                _is_int(self.rotation_seed) and 0 <= self.rotation_seed < 2**64,
                "rotation_seed must be a 64-bit unsigned integer",
            ),
            (isinstance(self.error_feedback, bool), "error_feedback must be a bool"),
            (
                self.propagation in PROPAGATIONS,
                f"propagation must be one of {PROPAGATIONS}, got {self.propagation!r}",
            ),
            (_is_int(self.calib_windows) and self.calib_windows >= 1, "calib_windows must be >= 1"),
            (
                _is_int(self.calib_window_len) and self.calib_window_len >= 2,
                "calib_window_len must be >= 2",
            ),
            (_is_int(self.calib_batch) and self.calib_batch >= 1, "calib_batch must be >= 1"),
            (self.tail_policy in TAIL_POLICIES, f"tail_policy must be one of {TAIL_POLICIES}"),
            (self.device in DEVICES, f"device must be one of {DEVICES}, got {self.device!r}"),
            (self.dtype in DTYPES, f"dtype must be one of {DTYPES}, got {self.dtype!r}"),
            (
                self.hessian_dtype in HESSIAN_DTYPES,
                f"hessian_dtype must be one of {HESSIAN_DTYPES}",
            ),
            (
                all(isinstance(m, str) and m for m in self.int4_modules),
                "int4_modules must be non-empty strings",
            ),
            (
                _is_int(self.int4_group) and self.int4_group >= 2 and self.int4_group % 2 == 0,
                "int4_group must be an even integer >= 2",
            ),
            (isinstance(self.int4_gptq, bool), "int4_gptq must be a bool"),
            (
                self.embedding_encoding in RAW_ENCODINGS,
                f"embedding_encoding must be one of {RAW_ENCODINGS}",
            ),
            (
                _is_int(self.embedding_group) and self.embedding_group >= 2,
                "embedding_group must be >= 2",
            ),
            (isinstance(self.lattice_head, bool), "lattice_head must be a bool"),
            (isinstance(self.calibration, str), "calibration must be a string"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidInput(f"QuantConfig: {message}")
        if self.schema_version != SCHEMA_VERSION:
            raise IncompatibleVersion(
                f"QuantConfig schema_version {self.schema_version} is not {SCHEMA_VERSION}"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field (the rotation seed also as hex, for humans);
        ``lattice_head`` only when set, so that a configuration without it keeps the digest it
        had before the field existed (checkpoints resume, artifacts keep their identity)."""
        out = dataclasses.asdict(self)
        if not self.lattice_head:
            del out["lattice_head"]
        out["int4_modules"] = list(self.int4_modules)
        out["rotation_seed_hex"] = f"{self.rotation_seed:#x}"
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuantConfig:
        """Inverse of :meth:`to_dict`.

        Raises:
            IncompatibleVersion: a schema version newer (or older) than this build's.
            InvalidInput: unknown keys or invalid values.
        """
        if not isinstance(data, dict):
            raise InvalidInput(f"QuantConfig.from_dict needs a dict, got {type(data).__name__}")
        data = dict(data)
        version = data.get("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise IncompatibleVersion(
                f"quantization config schema_version {version!r}; this build reads {SCHEMA_VERSION}"
            )
        seed_hex = data.pop("rotation_seed_hex", None)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise InvalidInput(f"QuantConfig: unknown keys {unknown}")
        cfg = cls(**data)
        if seed_hex is not None and int(seed_hex, 16) != cfg.rotation_seed:
            raise InvalidInput("QuantConfig: rotation_seed and rotation_seed_hex disagree")
        return cfg

    def replace(self, **changes: Any) -> QuantConfig:
        """A copy with some fields changed (validated)."""
        return dataclasses.replace(self, **changes)

    def digest(self) -> str:
        """sha256 (hex) of the canonical JSON of :meth:`to_dict`: the identity of a
        configuration."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def describe(self) -> str:
        """One line naming the resolved recipe, for logs (P4: never a hard-coded string)."""
        rot = f"rotation seed {self.rotation_seed:#x}" if self.rotate else "no rotation"
        fb = (
            f"GPTQ error feedback ({self.propagation} propagation)"
            if self.error_feedback
            else "plain rounding (no feedback)"
        )
        int4 = (
            f", int4 g{self.int4_group} for {list(self.int4_modules)}" if self.int4_modules else ""
        )
        if self.codebook in CONTROL_CODEBOOKS:
            code = f"CONTROL coder {self.codebook!r} (no lattice codes, gain bits unused)"
        else:
            code = (
                f"codebook={self.codebook} + {self.gain_bits} gain bit(s) (norm rule, "
                f"frozen row scales, {2**self.gain_bits} centroid(s)/matrix)"
            )
        return (
            f"{code}, {rot}, {fb}, damping {self.damping:g}·mean(diag H), "
            f"tail {self.tail_policy}, "
            f"calibration {self.calib_windows}×{self.calib_window_len} tokens, "
            f"compute {self.dtype}, Hessian {self.hessian_dtype}{int4}, "
            f"embedding {self.embedding_encoding}"
            + (", head on the lattice" if self.lattice_head else "")
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
