"""One record ↔ its artifact tensors: what a ``LeechqLinear`` loads from and serializes to.

The artifact (``leechq.formats.artifact``) stores each quantized matrix as a few tensors named
``<module>.<suffix>``: ``codes`` / ``row_scales`` / ``centroids`` / ``tail`` for a lattice record,
``qweight`` / ``scales`` / ``biases`` for an int4 record, and the rotation tables under
``leechq.rotations.<key>.signs|small``. A module swapped into a transformers skeleton must expose
buffers with exactly these suffixes, shapes and dtypes so that the host framework's ordinary loader
fills them (docs/kernels.md), and a saved module must produce the same bytes again.

This module owns that per-record view. Serialization reuses the artifact's own writer
(:func:`leechq.formats.artifact.build_tensors`) so the bytes cannot drift from the file format;
parsing mirrors :func:`leechq.formats.artifact.read_artifact` for one record, with its checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from leechq.codebooks.base import BLOCK
from leechq.errors import ArtifactError, InvalidInput
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import RotationTables, split_width

Record = QuantizedWeight | Int4Weight


def rotation_key(rot: RotationTables) -> str:
    """The artifact key of a rotation: ``f"{n}_{seed:016x}"``."""
    return f"{rot.n}_{rot.seed:016x}"


def rotation_prefix() -> str:
    """The tensor-name prefix of stored rotation tables (``"leechq.rotations."``)."""
    from leechq.formats.artifact import ROTATION_PREFIX

    return ROTATION_PREFIX


def record_tensors(record: Record) -> dict[str, torch.Tensor]:
    """The artifact tensors of one record, keyed by suffix (``"codes"``, ``"row_scales"``, ...).

    Rotation tables are not included (they are shared; see :func:`rotation_tensors`).
    """
    from leechq.formats.artifact import build_tensors

    if isinstance(record, QuantizedWeight):
        codebook, gain_bits = record.codebook, record.gain_bits
    elif isinstance(record, Int4Weight):
        codebook, gain_bits = "ball", 1  # unused for int4 records
    else:
        raise InvalidInput(f"not a quantized record: {type(record).__name__}")
    tensors, _, _, _ = build_tensors({"r": record}, {}, codebook, gain_bits)
    return {k[2:]: v for k, v in tensors.items() if k.startswith("r.")}


def rotation_tensors(rot: RotationTables) -> dict[str, torch.Tensor]:
    """``{"<prefix><key>.signs": f64 [n], "<prefix><key>.small": f64 [k, k]}`` of one rotation."""
    key = rotation_prefix() + rotation_key(rot)
    return {
        f"{key}.signs": torch.from_numpy(np.ascontiguousarray(rot.signs, dtype=np.float64)).clone(),
        f"{key}.small": torch.from_numpy(np.ascontiguousarray(rot.small, dtype=np.float64)).clone(),
    }


def record_tensor_specs(desc: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Suffix → (shape, dtype) of the tensors a record descriptor (``quantization_config.records``
    entry) stores."""
    kind = desc.get("kind")
    try:
        d_out, d_in = int(desc["d_out"]), int(desc["d_in"])
        if kind == "lattice":
            nb, tail = d_in // BLOCK, d_in % BLOCK
            specs: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
                "codes": ((int(desc["code_bytes"]),), torch.uint8),
                "row_scales": ((d_out,), torch.float64),
                "centroids": ((int(desc["n_centroids"]),), torch.float64),
            }
            if int(desc["block_bytes"]) * d_out * nb != int(desc["code_bytes"]):
                raise ArtifactError(f"record descriptor sizes disagree: {dict(desc)}")
            if tail:
                specs["tail"] = ((d_out, tail), torch.float32)
            return specs
        if kind == "int4":
            gpr = -(-d_in // int(desc["group"]))
            return {
                "qweight": ((d_out, d_in // 2), torch.uint8),
                "scales": ((d_out, gpr), torch.float16),
                "biases": ((d_out, gpr), torch.float16),
            }
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"malformed record descriptor {dict(desc)}: {exc}") from exc
    raise ArtifactError(f"record descriptor has unknown kind {kind!r}")


def record_from_tensors(
    name: str,
    desc: Mapping[str, Any],
    tensors: Mapping[str, torch.Tensor],
    rotations: Mapping[str, RotationTables],
) -> Record:
    """Rebuild one record from its descriptor and suffix-keyed tensors (checked like the reader).

    Args:
        name: module name, for messages.
        desc: the record descriptor from ``quantization_config.records``.
        tensors: suffix → tensor (any device; moved to the CPU).
        rotations: rotation key → tables.

    Raises:
        ArtifactError: a missing tensor, a wrong shape or dtype, or an inconsistent descriptor.
    """
    from leechq.codebooks import get
    from leechq.formats.artifact import unpack_codes

    specs = record_tensor_specs(desc)
    got: dict[str, torch.Tensor] = {}
    for suffix, (shape, dtype) in specs.items():
        t = tensors.get(suffix)
        if t is None:
            raise ArtifactError(f"record {name}: missing tensor {name}.{suffix}")
        if t.device.type == "meta":
            raise ArtifactError(
                f"record {name}: tensor {name}.{suffix} was never loaded (still meta)"
            )
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ArtifactError(
                f"record {name}: tensor {name}.{suffix} is {t.dtype} {list(t.shape)}, "
                f"expected {dtype} "
                f"{list(shape)}"
            )
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ArtifactError(f"record {name}: tensor {name}.{suffix} has NaN or inf values")
        got[suffix] = t.detach().to("cpu")
    d_out, d_in = int(desc["d_out"]), int(desc["d_in"])
    try:
        if desc["kind"] == "int4":
            return Int4Weight(
                d_out=d_out,
                d_in=d_in,
                group=int(desc["group"]),
                qweight=got["qweight"],
                scales=got["scales"],
                biases=got["biases"],
            )
        codebook = desc.get("codebook")
        cb = get(str(codebook))
        label_bits, gain_bits = int(desc["label_bits"]), int(desc["gain_bits"])
        if label_bits != cb.label_bits:
            raise ArtifactError(
                f"record {name}: {label_bits} label bits, codebook {codebook} has {cb.label_bits}"
            )
        nb = d_in // BLOCK
        labels, gains = unpack_codes(got["codes"], d_out, nb, label_bits, gain_bits)
        rot_key = desc.get("rotation")
        rot = None
        if rot_key is not None:
            if rot_key not in rotations:
                raise ArtifactError(f"record {name}: unknown rotation {rot_key!r}")
            rot = rotations[rot_key]
        tail = got.get("tail", torch.zeros(d_out, 0, dtype=torch.float32))
        return QuantizedWeight(
            codebook=str(codebook),
            d_out=d_out,
            d_in=d_in,
            labels=labels,
            gains=gains,
            row_scales=got["row_scales"],
            centroids=got["centroids"],
            tail=tail,
            rotation=rot,
        )
    except InvalidInput as exc:
        raise ArtifactError(f"record {name}: {exc}") from exc


def rotation_from_tensors(
    key: str, desc: Mapping[str, Any], signs: torch.Tensor, small: torch.Tensor
) -> RotationTables:
    """Rebuild rotation tables from their descriptor (``quantization_config.rotations`` entry) and
    tensors, with the reader's checks (±1 signs, orthogonal ``Q_odd``)."""
    try:
        n, seed = int(desc["n"]), int(desc["seed"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"rotation {key}: malformed descriptor {dict(desc)}") from exc
    _, k = split_width(n)
    if key != f"{n}_{seed:016x}":
        raise ArtifactError(f"rotation {key}: key disagrees with n={n}, seed={seed:#x}")
    for label, t, shape in (("signs", signs, (n,)), ("small", small, (k, k))):
        if t.device.type == "meta":
            raise ArtifactError(f"rotation {key}: {label} was never loaded (still meta)")
        if tuple(t.shape) != shape or t.dtype != torch.float64:
            raise ArtifactError(
                f"rotation {key}: {label} is {t.dtype} {list(t.shape)}, expected "
                f"torch.float64 {list(shape)}"
            )
    s = signs.detach().cpu().numpy().copy()
    q = small.detach().cpu().numpy().copy()
    if not np.all(np.abs(s) == 1.0):
        raise ArtifactError(f"rotation {key}: signs are not all ±1")
    if np.abs(q @ q.T - np.eye(k)).max() > 1e-9:
        raise ArtifactError(f"rotation {key}: Q_odd is not orthogonal")
    return RotationTables(n=n, seed=seed, signs=s, small=q)
