"""Bit accounting of quantized models: the three rates of docs/format.md §4, never mixed.

* :func:`record_bits` — one record's bits under every rule (weights, code, kernel, served, stored);
* :func:`raw_served_bits` — one raw tensor's served bits (float at 16 bits, integers at their width,
  group-affine tables at their code bits plus f16 scale and offset per group);
* :func:`whole_model_bits` — rule 2 ("whole-model b/param") of records still in memory, for
  planning: the full-model recipe chooses int4 matrices and table widths under a budget before
  anything is on disk;
* :func:`artifact_report` / :func:`accounting_report` — per-matrix rates and the kernel, whole-model
  and on-disk rates of a written artifact (any reader's records for the latter).

Both paths use the same two per-item rules, and a test pins :func:`whole_model_bits` to
``artifact_report``'s ``whole_model_bits_per_param`` on a written artifact.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from leechq.formats.artifact import MODEL_FILE, block_bytes, read_artifact
from leechq.formats.group_affine import GroupAffine
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight


@dataclass(frozen=True)
class ModelBits:
    """Served bits and parameters of a model held as records + raw tensors.

    Attributes:
        served_bits: every weight bit the served model keeps (rule 2).
        parameters: all parameters, embedding included, a tied head counted once.
        record_bits: the part of ``served_bits`` in quantized records.
        record_weights: weights in quantized records.
    """

    served_bits: float
    parameters: int
    record_bits: float
    record_weights: int

    @property
    def bits_per_param(self) -> float:
        """Whole-model bits per parameter."""
        return self.served_bits / max(1, self.parameters)


def record_bits(rec: QuantizedWeight | Int4Weight, label_bits: int) -> dict[str, float]:
    """Bits of one record under the three accounting rules (docs/format.md §4)."""
    if isinstance(rec, QuantizedWeight):
        blocks = rec.d_out * rec.n_blocks
        code = blocks * (label_bits + rec.gain_bits)
        tail = rec.d_out * rec.tail_cols
        return {
            "weights": rec.d_out * rec.d_in,
            "code": code,
            # kernel: payload + tail at 32 + row scale at 32 (centroids excluded)
            "kernel": code + 32 * tail + 32 * rec.d_out,
            # served: payload + f16 tail + f32 row scales + f32 centroids
            "served": code + 16 * tail + 32 * rec.d_out + 32 * rec.centroids.numel(),
            # stored: byte-aligned codes, f64 scales and centroids, f32 tail
            "stored": 8 * block_bytes(label_bits, rec.gain_bits) * blocks
            + 64 * rec.d_out
            + 64 * rec.centroids.numel()
            + 32 * tail,
        }
    groups = rec.scales.numel()
    n = rec.d_out * rec.d_in
    return {
        "weights": n,
        "code": 4 * n,
        "kernel": 4 * n + 32 * groups,
        "served": 4 * n + 32 * groups,
        "stored": 4 * n + 32 * groups,
    }


def record_served_bits(rec: QuantizedWeight | Int4Weight) -> float:
    """Served bits of one record (rule 2: payload, f16 tail, f32 row scales and centroids; int4
    with f16 scale and offset per group)."""
    label_bits = 0
    if isinstance(rec, QuantizedWeight):
        from leechq.codebooks import get

        label_bits = get(rec.codebook).label_bits
    return float(record_bits(rec, label_bits)["served"])


def raw_served_bits(t: torch.Tensor | GroupAffine | QuantizedWeight) -> tuple[float, int]:
    """``(served bits, parameters)`` of one raw tensor (float at 16 bits, integers at their width,
    group-affine at its code bits plus 32 bits per group, a lattice-coded table at its record's
    served bits)."""
    if isinstance(t, QuantizedWeight):
        return record_served_bits(t), t.d_out * t.d_in
    if isinstance(t, GroupAffine):
        n = t.rows * t.cols
        return float(n * t.bits + 32 * t.scales.numel()), n
    bits = 16 if t.is_floating_point() else 8 * t.element_size()
    return float(t.numel() * bits), int(t.numel())


def whole_model_bits(
    records: Mapping[str, QuantizedWeight | Int4Weight],
    raw: Mapping[str, torch.Tensor | GroupAffine],
) -> ModelBits:
    """Rule-2 bits of a model given as records and raw tensors (tied aliases excluded from ``raw``).

    Returns:
        :class:`ModelBits`; ``bits_per_param`` equals the artifact's ``whole_model_bits_per_param``
        once written.
    """
    rec_bits = 0.0
    rec_weights = 0
    for rec in records.values():
        rec_bits += record_served_bits(rec)
        rec_weights += rec.d_out * rec.d_in
    raw_bits = 0.0
    raw_params = 0
    for t in raw.values():
        b, n = raw_served_bits(t)
        raw_bits += b
        raw_params += n
    return ModelBits(rec_bits + raw_bits, rec_weights + raw_params, rec_bits, rec_weights)


def artifact_report(directory: str | os.PathLike[str], *, verify: bool = True) -> dict[str, Any]:
    """Per-matrix rates and the three accounting rates of an artifact, reported separately.

    Returns a JSON-ready dict with ``matrices`` (per record: kind, shape, code/kernel/stored bits
    per weight) and ``rates``:

    * ``kernel_bits_per_weight`` — bits a kernel streams per quantized weight (payload + 32-bit tail
      + 32-bit row scale), over the records only (the projections, and a lattice-coded embedding;
      tail columns in the denominator);
    * ``whole_model_bits_per_param`` — every weight bit the served model keeps (f16 tails, f32 row
      scales, int4 with f16 scale/offset, group-affine tables, float tensors at 16 bits) over all
      parameters, embedding included and a tied head counted once;
    * ``on_disk_bits_per_param`` — ``model.safetensors`` bytes × 8 over all parameters (also given
      for the whole directory), plus ``projection_stored_bits_per_weight``, the exact stored bits of
      the records over the quantized weights.

    ``verified`` says whether every file's sha256 was checked against the manifest (``verify``);
    everything else of :func:`read_artifact` (sizes, schema, tensors, magnitudes) is always checked.
    """
    art = read_artifact(directory, verify=verify)
    from leechq.codebooks import get

    label_bits = get(art.quant_config.codebook).label_bits
    return {
        "codebook": art.quant_config.codebook,
        "verified": bool(verify),
        "config": art.quant_config.to_dict(),
        **accounting_report(art.records, [*art.raw.values(), *art.raw_quant.values()],
                            label_bits, directory),
    }


def accounting_report(records: dict[str, Any], raw: list[Any], label_bits: int,
                      directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``matrices``, ``counts`` and ``rates`` of :func:`artifact_report` for any reader's
    records (``QuantizedWeight`` / ``Int4Weight``) and raw values (tensors, counted at 16 bits
    when floating and at their element size otherwise, or ``GroupAffine`` tables) of the model
    stored in ``directory`` (its ``model.safetensors`` and files give the on-disk rates)."""
    matrices: dict[str, Any] = {}
    tot = {"weights": 0.0, "code": 0.0, "kernel": 0.0, "served": 0.0, "stored": 0.0}
    for name, rec in records.items():
        b = record_bits(rec, label_bits)
        for k in tot:
            tot[k] += b[k]
        w = b["weights"]
        matrices[name] = {
            "kind": "lattice" if isinstance(rec, QuantizedWeight) else "int4",
            "shape": [rec.d_out, rec.d_in],
            "code_bits_per_weight": b["code"] / w,
            "kernel_bits_per_weight": b["kernel"] / w,
            "stored_bits_per_weight": b["stored"] / w,
        }
    raw_params = 0
    raw_served = 0.0
    for value in raw:
        bits, n = raw_served_bits(value)
        raw_served += bits
        raw_params += n
    params = tot["weights"] + raw_params
    model_bytes = (Path(directory) / MODEL_FILE).stat().st_size
    dir_bytes = sum(p.stat().st_size for p in Path(directory).iterdir() if p.is_file())
    return {
        "matrices": matrices,
        "counts": {
            "quantized_weights": int(tot["weights"]),
            "parameters": int(params),
            "lattice_records": sum(isinstance(r, QuantizedWeight) for r in records.values()),
            "int4_records": sum(isinstance(r, Int4Weight) for r in records.values()),
            "model_safetensors_bytes": model_bytes,
            "directory_bytes": dir_bytes,
        },
        "rates": {
            "code_bits_per_weight": tot["code"] / max(1.0, tot["weights"]),
            "kernel_bits_per_weight": tot["kernel"] / max(1.0, tot["weights"]),
            "projection_stored_bits_per_weight": tot["stored"] / max(1.0, tot["weights"]),
            "whole_model_bits_per_param": (tot["served"] + raw_served) / max(1.0, params),
            "on_disk_bits_per_param": 8.0 * model_bytes / max(1.0, params),
            "on_disk_directory_bits_per_param": 8.0 * dir_bytes / max(1.0, params),
        },
    }
